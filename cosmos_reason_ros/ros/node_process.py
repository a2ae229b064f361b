"""The node as a child process (demo, soak): wait for its ready line, stop it.

The node logs ``]: ready: `` once its engine is warm and its action server is up; a process
started with ``start_new_session=True`` is stopped with SIGTERM, then its whole group killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
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


STOP_S = 15.0  # SIGTERM to exit: the node ends its goals and its engine (a few s when idle)
# After SIGKILL the kernel still tears the processes down (the engine's GBs of memory): on an
# overloaded machine that took more than 5 s. SIGKILL cannot be refused, so this is only a bound.
REAP_S = 120.0


def stop_node(proc: subprocess.Popen) -> int | None:
    """SIGTERM, then kill the process group if it does not end within STOP_S; the exit code.

    Never raises: a node that outlives its SIGKILL bound is reported and None returned.
    """
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_S)
        except subprocess.TimeoutExpired:
            print(f"node (pid {proc.pid}) still running {STOP_S:g} s after SIGTERM: killing "
                  "its process group", file=sys.stderr, flush=True)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            try:
                proc.wait(REAP_S)
            except subprocess.TimeoutExpired:
                print(f"node (pid {proc.pid}) not ended {REAP_S:g} s after SIGKILL",
                      file=sys.stderr, flush=True)
    return proc.returncode
