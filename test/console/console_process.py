"""The console as its own process for tests: started on a free port, stopped by a signal."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading

from node_process import REPO_ROOT, ProcessTree
from waiting import NEVER_S


class ConsoleProcess:
    """``python -m cosmos_reason_ros.console.server`` on a free port, in its own group."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cosmos_reason_ros.console.server", "--port", "0", *args],
            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
        self.tree = ProcessTree(self.proc.pid)
        self.lines: list[str] = []
        found = threading.Event()
        self.url = ""

        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.lines.append(line.rstrip("\n"))
                match = re.search(r"console: serving (\S+)", line)
                if match:
                    self.url = match.group(1)
                    found.set()
            found.set()

        threading.Thread(target=read, daemon=True).start()
        if not found.wait(NEVER_S) or not self.url:
            self.stop()
            raise RuntimeError("console did not start:\n" + "\n".join(self.lines[-40:]))

    def stop(self, signum: int = signal.SIGTERM, timeout_s: float = NEVER_S) -> int | None:
        """Signal it; wait; kill the group as a last resort. Return the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
            try:
                return self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(NEVER_S)
                return None
        return self.proc.returncode
