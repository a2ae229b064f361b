"""A test hung in native code holding the GIL ends its process instead of the whole run.

pytest-timeout's handler needs the GIL, so a deadlock inside rclpy's destroy (Fast DDS,
docs/RELIABILITY.md) used to hang a CI leg until its hard limit; the ``hung_watchdog``
plugin ends such a test's process after its timeout and a margin.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from waiting import NEVER_S

HERE = Path(__file__).resolve().parent

HUNG = textwrap.dedent("""
    import ctypes

    import pytest


    MARKED
    def test_hangs_in_native_code_holding_the_gil():
        libc = ctypes.PyDLL(None)  # PyDLL keeps the GIL, as rclpy's destroy does
        mutex = ctypes.create_string_buffer(64)  # zeros: PTHREAD_MUTEX_INITIALIZER (glibc)
        libc.pthread_mutex_lock(mutex)
        libc.pthread_mutex_lock(mutex)  # a default mutex locked twice: never returns
""")


@pytest.mark.slow  # starts a process: the real tier
@pytest.mark.parametrize("option, marked", [
    ("--timeout=1", ""),  # the run's timeout
    ("--timeout=600", "@pytest.mark.timeout(1)"),  # the test's own, as pytest-timeout reads it
])
def test_a_test_hung_holding_the_gil_fails_instead_of_hanging_the_run(tmp_path, option, marked):
    (tmp_path / "test_hung.py").write_text(HUNG.replace("MARKED", marked))
    # The plugin alone: the suite's conftest would also clean Fast DDS's shared memory at the
    # end of the session, under the feet of other runs on the machine.
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "hung_watchdog", "-q",
         option, str(tmp_path / "test_hung.py")],
        cwd=tmp_path, capture_output=True, text=True, timeout=NEVER_S,
        env={**os.environ, "TEST_HUNG_MARGIN_S": "1",
             "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])})
    assert done.returncode != 0, done.stdout
    assert "test_hangs_in_native_code_holding_the_gil" in done.stderr, done.stderr[-2000:]
