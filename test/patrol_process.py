"""``reason_patrol`` as a user runs it, beside a camera that keeps publishing, until a pose.

One procedure for the patrol tests (a synthetic RGB-D camera, the demo recording): the camera
publishes from a thread at its rate; once ``ready()`` holds, the patrol (``python -m``, the
module its console script runs) cycles until an obstacle pose reaches ``poses``; then Ctrl-C.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from waiting import NEVER_S, wait_until

REPO_ROOT = Path(__file__).resolve().parent.parent


def patrol_until_a_pose(poses: list, publish_frame: Callable[[], None], period_s: float,
                        ready: Callable[[], None] = lambda: None) -> tuple[str, str]:
    """Run the patrol for obstacle 'pallet' until a pose arrives; return its stdout, stderr.

    Fails unless the patrol was still running when the pose came and exited 0 on SIGINT.
    """
    stop = threading.Event()

    def camera() -> None:
        while not stop.is_set():
            publish_frame()
            stop.wait(period_s)  # paces: the camera's frame rate

    thread = threading.Thread(target=camera, daemon=True)
    thread.start()
    proc = None
    try:
        ready()
        proc = subprocess.Popen(
            [sys.executable, "-m", "cosmos_reason_ros.planning.patrol", "--obstacle", "pallet",
             "--period-s", "0.2"], cwd=REPO_ROOT, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        # Cycles go on until a pose reaches this subscriber (early cycles may come before the
        # node has depth and CameraInfo, and discovery between processes decides which
        # cycle's pose is the first one it gets).
        wait_until(lambda: poses or proc.poll() is not None, NEVER_S, "an obstacle pose")
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=NEVER_S)
    finally:
        stop.set()
        thread.join()
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, f"stdout:\n{out}\nstderr:\n{err[-3000:]}"
    return out, err
