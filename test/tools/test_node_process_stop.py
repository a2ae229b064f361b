"""Stopping the node's child process (demo, soak): a node that ignores SIGTERM is killed with
its whole process group, and the caller gets the exit code instead of an exception."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from cosmos_reason_ros.ros import node_process

IGNORES_SIGTERM = ("import signal, subprocess, sys, time\n"
                   "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                   "child = subprocess.Popen([sys.executable, '-c',"
                   " 'import time; time.sleep(600)'])\n"
                   "print(child.pid, flush=True)\n"
                   "time.sleep(600)\n")

pytestmark = pytest.mark.slow  # starts processes: the real tier


def test_a_node_that_ignores_sigterm_is_killed_with_its_group(monkeypatch):
    monkeypatch.setattr(node_process, "STOP_S", 0.5)
    proc = subprocess.Popen([sys.executable, "-c", IGNORES_SIGTERM], stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    child_pid = int(proc.stdout.readline())  # SIGTERM is ignored from here on
    assert node_process.stop_node(proc) == -signal.SIGKILL
    # The group's other member (an engine core, in the node's case) went with it.
    assert subprocess.run(["ps", "-o", "stat=", "-p", str(child_pid)], capture_output=True,
                          text=True).stdout.strip() in ("", "Z")
    proc.stdout.close()
