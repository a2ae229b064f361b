"""The node as a child process (demo, soak): wait for its ready line, stop it.

The node logs ``]: ready: `` once its engine is warm and its action server is up; a process
started with ``start_new_session=True`` is stopped with SIGTERM, then its whole group killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time


def wait_ready(proc: subprocess.Popen, log: list[str], timeout_s: float) -> bool:
    """Collect the node's output; return once it logs 'ready' (False if it exits first)."""
    ready = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.append(line.rstrip())
            del log[:-500]  # bounded: only the tail is ever shown
            if "]: ready: " in line:
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if ready.wait(0.5):
            return True
    return ready.is_set()


def stop_node(proc: subprocess.Popen) -> int | None:
    """SIGTERM, then kill the process group if it does not end within 15 s; the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    return proc.returncode
