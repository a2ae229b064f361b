"""Run the real node as its own process for integration tests, and talk to it over DDS."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent


def text_schema(chars: int) -> str:
    """A response schema of one string of exactly ``chars`` characters.

    Under constrained decoding it forces a long answer: random weights stop only when made to.
    """
    return json.dumps({"type": "object", "properties": {"text": {
        "type": "string", "minLength": chars, "maxLength": chars}}, "required": ["text"],
        "additionalProperties": False})


# Goals that run until cancelled (or max_tokens): no answer of ENDLESS_TOKENS tokens can
# finish the string, and the tiny model writes 1500 characters in under a second, so shorter
# "busy" goals can end before a test's cancel or check. A node serving them needs
# ENDLESS_LIMITS.
ENDLESS_SCHEMA = text_schema(30000)
ENDLESS_TOKENS = 3000
ENDLESS_LIMITS = {"limits.max_tokens": ENDLESS_TOKENS}


class NodeProcess:
    """``python -m cosmos_reason_ros.ros.node`` with a preset and overrides, in its own group.

    Output is collected in ``self.lines``; ``wait_for_line`` waits on it without sleeping
    blind. ``stop()`` sends SIGTERM and, as a last resort, kills the whole process group.
    """

    def __init__(self, preset: str = "cpu_demo", params: dict[str, object] | None = None,
                 remaps: Sequence[str] = (), env: dict[str, str] | None = None) -> None:
        args = [sys.executable, "-m", "cosmos_reason_ros.ros.node", "--ros-args",
                "--params-file", str(REPO_ROOT / "config" / f"{preset}.yaml")]
        for name, value in (params or {}).items():
            args += ["-p", f"{name}:={_ros_value(value)}"]
        for remap in remaps:
            args += ["-r", remap]
        self.lines: list[str] = []
        self._eof = False
        self._cond = threading.Condition()
        self.proc = subprocess.Popen(
            args, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}, start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    @property
    def output(self) -> str:
        """Everything the node printed so far."""
        with self._cond:
            return "\n".join(self.lines)

    def wait_for_line(self, needle: str, timeout_s: float) -> bool:
        """Wait until a line contains ``needle``; False on timeout or process exit."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                if any(needle in line for line in self.lines):
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._eof:  # output ends when the process exits
                    return any(needle in line for line in self.lines)
                self._cond.wait(min(remaining, 0.5))

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        """Block until the node logs that it is ready; raise with its output otherwise."""
        if not self.wait_for_line("]: ready: ", timeout_s):
            self.stop()
            raise RuntimeError(f"node not ready within {timeout_s} s:\n{self.output[-4000:]}")

    def stop_cleanly(self, timeout_s: float = 10.0) -> None:
        """Stop the node; fail with the end of its output unless it exited with code 0."""
        code = self.stop(timeout_s)
        assert code == 0, f"node exited with {code}:\n{self.output[-3000:]}"

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM, wait, then SIGKILL the group; return the exit code (None if killed)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            return None
        return self.proc.returncode


def _ros_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(f"'{v}'" for v in value) + "]"
    return str(value)


def rgb_image_msg(rgb: np.ndarray, stamp_ns: int, frame_id: str = "camera"):
    """A ``sensor_msgs/Image`` (rgb8) with the given stamp."""
    from std_msgs.msg import Header

    from cosmos_reason_ros.ros.messages import ns_to_stamp, rgb_image

    return rgb_image(rgb, Header(stamp=ns_to_stamp(stamp_ns), frame_id=frame_id))


def scene(width: int, height: int, seed: int = 0) -> np.ndarray:
    """A deterministic test picture (a gradient with a few coloured rectangles)."""
    rng = np.random.default_rng(seed)
    img = np.zeros((height, width, 3), np.uint8)
    img[..., 0] = np.linspace(0, 255, width, dtype=np.uint8)[None, :]
    img[..., 1] = np.linspace(0, 255, height, dtype=np.uint8)[:, None]
    for _ in range(4):
        x, y = rng.integers(0, width - 40), rng.integers(0, height - 40)
        img[y:y + 40, x:x + 40] = rng.integers(0, 255, 3)
    return img
