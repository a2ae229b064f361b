#!/usr/bin/env python3
"""CPU cost of the operator console (``console``): % of one core, idle and streaming.

Starts a camera publisher (the demo scene, 640x480 rgb8, ``--camera-hz``), the console as its
own process (``python -m cosmos_reason_ros.console.server --fps 5``) and, for the streaming
phase, one headless Chromium (Debian's ``chromium`` + ``chromium-driver`` through Selenium)
showing the page. The console's CPU time (user + system, psutil) is sampled over
``--windows`` windows of ``--window-s`` seconds per phase; the median and the range are
printed as % of one core, with the pictures per second the page actually received.

Phases: ``idle, no camera`` (the console alone), ``idle, camera`` (frames arrive and are
kept, no page open), ``streaming`` (one visible page at the console's --fps). No node is
needed: the console's cost does not depend on one (``/diagnostics`` and ``~/results`` are a
few small messages a second).

    python scripts/bench_console.py [--windows 5] [--window-s 5] [--camera-hz 15] [--fps 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent


class Camera:
    """Publishes pre-rendered demo frames (640x480 rgb8) on /image at ``hz``, from a thread."""

    def __init__(self, hz: float, width: int = 640, height: int = 480) -> None:
        import rclpy
        from rclpy.context import Context
        from rclpy.executors import SingleThreadedExecutor
        from sensor_msgs.msg import Image
        from std_msgs.msg import Header

        from cosmos_reason_ros.eval.demo_recording import render_frame
        from cosmos_reason_ros.ros.messages import ns_to_stamp, rgb_image

        self._ns_to_stamp = ns_to_stamp
        self.context = Context()
        rclpy.init(context=self.context)
        self.node = rclpy.create_node("bench_console_camera", context=self.context)
        self.publisher = self.node.create_publisher(Image, "/image", 5)
        # A few frames rendered once: the publisher must not compete with the console for CPU.
        self.frames = [rgb_image(render_frame(t, width, height).rgb, Header())
                       for t in (0.0, 0.5, 1.0, 1.5)]
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.period = 1.0 / hz
        self.on = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        i = 0
        next_at = time.monotonic()
        while not self._stop.is_set():
            if self.on.is_set():
                msg = self.frames[i % len(self.frames)]
                msg.header.stamp = self._ns_to_stamp(time.time_ns())
                self.publisher.publish(msg)
                i += 1
            next_at += self.period
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def close(self) -> None:
        """Stop publishing; close the node and its context."""
        import rclpy

        self._stop.set()
        self._thread.join(5.0)
        self.executor.shutdown(timeout_sec=1.0)
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)


def start_console(fps: float) -> tuple[subprocess.Popen[str], str]:
    """Start the console on a free port; return the process and its URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "cosmos_reason_ros.console.server", "--port", "0",
         "--fps", str(fps), "--node", "/bench_console_node",
         # No node to follow: the bench camera is reliable, as the node's would need to be
         # for 640x480 raw frames between processes (ros_bridge.py).
         "--camera-reliability", "reliable"],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 60.0
    for line in proc.stdout:
        match = re.search(r"console: serving (\S+)", line)
        if match:
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
            return proc, match.group(1)
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise RuntimeError("the console did not start")


def browser(url: str) -> Any:
    """One headless Chromium showing the page (the driver's path given: nothing downloaded)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    chromedriver = shutil.which("chromedriver")
    if chromium is None or chromedriver is None:
        raise SystemExit("bench_console: needs Debian's chromium and chromium-driver "
                         "(apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1440,960"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
    driver.get(url)
    return driver


def measure(pid: int, windows: int, window_s: float,
            frames: Any = None) -> tuple[list[float], list[float]]:
    """CPU % of one core per window, and pictures per second received (when ``frames``)."""
    import psutil

    process = psutil.Process(pid)
    cpu, rates = [], []
    for _ in range(windows):
        t0, c0 = time.monotonic(), process.cpu_times()
        n0 = frames() if frames else 0
        time.sleep(window_s)
        t1, c1 = time.monotonic(), process.cpu_times()
        used = (c1.user - c0.user) + (c1.system - c0.system)
        cpu.append(100.0 * used / (t1 - t0))
        if frames:
            rates.append((frames() - n0) / (t1 - t0))
    return cpu, rates


def row(name: str, cpu: list[float], rates: list[float]) -> str:
    """One markdown table row: median and range of CPU %, median pictures per second."""
    rate = f"{statistics.median(rates):.1f}" if rates else "-"
    return (f"| {name} | {statistics.median(cpu):.1f} | {min(cpu):.1f}-{max(cpu):.1f} | "
            f"{rate} |")


def main(argv: list[str] | None = None) -> int:
    """Run the three phases and print a markdown table."""
    ap = argparse.ArgumentParser(prog="bench_console", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--windows", type=int, default=5, help="windows per phase (default 5)")
    ap.add_argument("--window-s", type=float, default=5.0, help="seconds per window (default 5)")
    ap.add_argument("--camera-hz", type=float, default=15.0,
                    help="camera rate, 640x480 rgb8 (default 15, the demo recording's)")
    ap.add_argument("--fps", type=float, default=5.0, help="the console's --fps (default 5)")
    args = ap.parse_args(argv)
    os.environ.setdefault("ROS_DOMAIN_ID", str(random.randint(1, 101)))  # 0-101: see bench runner
    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    camera = Camera(args.camera_hz)
    proc, url = start_console(args.fps)
    driver = None
    rows = []
    try:
        time.sleep(2.0)  # start-up work (imports, discovery) out of the first window
        rows.append(row("idle, no camera", *measure(proc.pid, args.windows, args.window_s)))
        camera.on.set()
        time.sleep(1.0)
        rows.append(row(f"idle, camera {args.camera_hz:g} Hz, no page",
                        *measure(proc.pid, args.windows, args.window_s)))
        driver = browser(url)
        deadline = time.monotonic() + 30.0
        while not driver.execute_script("return window.consoleState.framesReceived;"):
            if time.monotonic() > deadline:
                raise RuntimeError("the page received no picture")
            time.sleep(0.1)
        page = driver

        def received() -> int:  # the page's own count of pictures received
            return int(page.execute_script("return window.consoleState.framesReceived;"))

        rows.append(row(f"streaming to 1 page at --fps {args.fps:g}",
                        *measure(proc.pid, args.windows, args.window_s, received)))
    finally:
        if driver is not None:
            driver.quit()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15.0)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        camera.close()
    print(f"console CPU, % of one core ({platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores; {args.windows} x {args.window_s:g} s per phase; "
          f"640x480 rgb8 camera)\n")
    print("| phase | median % | range % | pictures/s to the page |")
    print("|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
