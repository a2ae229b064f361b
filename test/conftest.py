"""Test-wide isolation: ROS domain, DDS on loopback, vLLM on the CPU, cached tiny models.

Everything here runs before any test module imports rclpy or vllm, so environment variables
set at import time take effect in this process and in every child process it starts.
"""

from __future__ import annotations

import multiprocessing.process
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # the source tree, not an installed copy, is under test
    sys.path.insert(0, str(REPO_ROOT))

# A fresh DDS domain per test run keeps parallel runs (and a robot on the same LAN) apart;
# LOCALHOST keeps discovery on loopback. Jazzy must not also get ROS_LOCALHOST_ONLY.
os.environ.setdefault("ROS_DOMAIN_ID", str(random.Random(os.getpid()).randint(1, 100)))
# Under pytest-xdist (-n N), each worker is a run of its own: nodes of the same name in two
# workers must not meet. Worker k > 0 moves 20*k domains up, wrapping inside 0-101: DDS ports
# are 7400 + 250*domain + ..., and above domain 101 they fall in Linux's ephemeral port range
# (32768-60999), where any process's outgoing sockets may already hold them.
_worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
if _worker.startswith("gw") and _worker[2:].isdigit() and int(_worker[2:]) > 0:
    os.environ["ROS_DOMAIN_ID"] = str((int(os.environ["ROS_DOMAIN_ID"]) + 20 * int(_worker[2:]))
                                      % 102)
os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
# The tests' own participants (clients, cameras, recorders) get the node's Fast DDS profile:
# the CI machine holds a test process as long as a node (19-103 s measured), and a participant
# dropped at Fast DDS's default 20 s lease loses what was sent to it meanwhile
# (cosmos_reason_ros/dds.py). Before the first participant; a profile set by the caller stays.
from cosmos_reason_ros import dds  # noqa: E402

dds.use_profile(os.environ)

# Property tests (hypothesis) try the same examples on every run of the per-commit tiers: a
# random run once found a new counterexample in the middle of an unrelated change, so whether
# a change landed depended on the draw. HYPOTHESIS_PROFILE=explore searches afresh; keep what
# it finds as an @example beside the test.
try:
    from hypothesis import settings as hypothesis_settings
except ImportError:  # the tests that use it skip without it
    pass
else:
    hypothesis_settings.register_profile("per_commit", derandomize=True, database=None)
    hypothesis_settings.register_profile("explore", derandomize=False)
    hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "per_commit"))
os.environ.pop("ROS_LOCALHOST_ONLY", None)
# vLLM on the CPU: bounded KV cache, no hub, no telemetry, in-process engine core (2-3 s start).
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One OpenMP thread per engine: CI runs several engines and test legs on 2 cores, where a
# second thread spin-waits at each barrier for a descheduled partner (measured: the engine
# tests took ~12 % less CPU and ~7 % less time under load, the same on an idle machine).
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def tiny_qwen3_vl() -> Path:
    """A cached tiny random-weight Qwen3-VL checkpoint (Cosmos-Reason2's architecture)."""
    from cosmos_reason_ros.eval.tiny_model import ensure_tiny_model

    return ensure_tiny_model("qwen3_vl")


@pytest.fixture(scope="session")
def tiny_qwen2_5_vl() -> Path:
    """A cached tiny random-weight Qwen2.5-VL checkpoint (Cosmos-Reason1's architecture)."""
    from cosmos_reason_ros.eval.tiny_model import ensure_tiny_model

    return ensure_tiny_model("qwen2_5_vl")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run modules with slow or real-engine tests first (stable: a module's tests stay together,
    in order).

    Under ``-n 2 --dist loadfile --no-loadscope-reorder`` (.ci/run) each worker then takes the
    long modules early and the short ones fill the gaps at the end, instead of one worker
    finishing a long module alone.
    """
    slow = {item.nodeid.split("::")[0] for item in items
            if item.get_closest_marker("slow") or item.get_closest_marker("engine")}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in slow)


# The fast tier (make test-fast: neither ``engine`` nor ``slow``) runs in this process only:
# the in-process node, the scripted engine, one DDS participant. A test that starts a process
# (a node, a console, a server, a command) is the real tier's and must say so (``slow``); it
# is refused here at the spawn, so the fast tier cannot grow slow again unnoticed.
_FAST_TEST: list[str] = []  # the running test's id while it is a fast-tier test


class RealTierOnly(Exception):
    """A fast-tier test started a process."""


def _refuse_in_the_fast_tier(what: object) -> None:
    if _FAST_TEST:
        raise RealTierOnly(f"{_FAST_TEST[0]} started a process ({str(what)[:120]}): mark it "
                           "slow (the real tier) or use the in-process node")


_popen_init = subprocess.Popen.__init__
_process_start = multiprocessing.process.BaseProcess.start


def _guarded_popen_init(self: subprocess.Popen, args: Any, *rest: Any, **kwargs: Any) -> None:
    _refuse_in_the_fast_tier(args)
    _popen_init(self, args, *rest, **kwargs)


def _guarded_process_start(self: multiprocessing.process.BaseProcess) -> None:
    _refuse_in_the_fast_tier(f"multiprocessing {self.name}")
    _process_start(self)


subprocess.Popen.__init__ = _guarded_popen_init  # type: ignore[method-assign]
multiprocessing.process.BaseProcess.start = _guarded_process_start  # type: ignore[method-assign]


# A test hung in native code holding the GIL ends its process instead of the run.
pytest_plugins = ("hung_watchdog",)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """Mark the test as fast-tier (no process allowed) for its setup, call and teardown."""
    fast = not any(item.get_closest_marker(m) for m in ("slow", "engine", "drill"))
    if fast:
        _FAST_TEST.append(item.nodeid)
    try:
        yield
    finally:
        if fast:
            _FAST_TEST.clear()


_CPU_AT_SETUP = pytest.StashKey[float]()


def _cpu_s() -> float:
    """CPU seconds of this process and of every descendant it (or they) waited for."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> Any:
    item.stash[_CPU_AT_SETUP] = _cpu_s()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    """Each test's CPU, its fixtures' included, as the junit property ``cpu_s``: on CI's 2
    cores, busy throughout, CPU is what a test costs in wall time (.ci/run lists the costliest).
    """
    if call.when == "teardown" and _CPU_AT_SETUP in item.stash:
        item.user_properties.append(("cpu_s", round(_cpu_s() - item.stash[_CPU_AT_SETUP], 1)))
    yield


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove Fast DDS shared-memory files that killed processes leave behind."""
    try:
        subprocess.run(["fastdds", "shm", "clean"], capture_output=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        pass  # fastdds tool absent (no ROS in this venv): nothing to clean


@pytest.fixture
def ros_context():
    """A fresh rclpy context for one test (isolated from other tests' nodes)."""
    import rclpy

    context = rclpy.context.Context()
    rclpy.init(context=context)
    try:
        yield context
    finally:
        rclpy.try_shutdown(context=context)
