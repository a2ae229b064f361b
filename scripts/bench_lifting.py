#!/usr/bin/env python3
"""Micro-benchmark of 3D lifting per goal: depth decoding plus 10 boxes / 10 waypoints.

A synthetic registered 16UC1 depth frame (a wall 3 m away with 10 cards at 0.8-2.5 m, 1 %
noise, 5 % holes) is decoded with ``depth_to_metres`` and 10 boxes around the cards are lifted
with ``lift_boxes``; 10 trajectory waypoints with ``lift_trajectory``. Intrinsics are a
RealSense-like 69 degree horizontal field of view. "typical" boxes are about a seventh of the
image width, "large" ones about a third, to show that the strided read bounds the cost. Prints
a markdown table of median and p95 wall milliseconds per goal (one goal = the 10 items), with
the median thread CPU time, and the load average, since the machine may be shared.

    python3 scripts/bench_lifting.py [--runs 200]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import time
from collections.abc import Callable

import numpy as np

from cosmos_reason_ros.core.lifting import lift_boxes, lift_trajectory
from cosmos_reason_ros.core.rgbd import CameraModel, depth_to_metres
from cosmos_reason_ros.core.types import Box, Point, Trajectory

SIZES = [(640, 480), (1280, 720)]
ITEMS = 10
WALL_M = 3.0


def camera(width: int, height: int) -> CameraModel:
    """Return a pinhole colour camera with a 69 degree horizontal field of view."""
    f = width / (2 * math.tan(math.radians(34.5)))
    return CameraModel(f, f, (width - 1) / 2, (height - 1) / 2, width, height, "bench")


def scene(cam: CameraModel, large: bool, seed: int = 0) -> tuple[dict, list[Box], Trajectory]:
    """Return a 16UC1 depth message (fields), 10 boxes around cards in it, a 10-point path."""
    rng = np.random.default_rng(seed)
    w, h = cam.width, cam.height
    depth = np.full((h, w), WALL_M)
    boxes = []
    for k in range(ITEMS):
        z = 0.8 + 1.7 * k / (ITEMS - 1)
        side = (0.35 if large else 0.15) * z * w / cam.fx  # metres for ~1/3 or ~1/7 of width
        u = w * (0.1 + 0.8 * rng.random())
        v = h * (0.15 + 0.7 * rng.random())
        half = 0.5 * side * cam.fx / z
        u0, u1 = max(0, int(u - half)), min(w, int(u + half))
        v0, v1 = max(0, int(v - half)), min(h, int(v + half))
        depth[v0:v1, u0:u1] = np.minimum(depth[v0:v1, u0:u1], z)
        grow = 0.25 * half
        boxes.append(Box(max(0.0, u0 - grow), max(0.0, v0 - grow), min(w, u1 + grow),
                         min(h, v1 + grow), label=f"card {k}"))
    depth *= 1.0 + 0.01 * rng.standard_normal(depth.shape)
    depth[rng.random(depth.shape) < 0.05] = 0.0
    mm = np.round(depth * 1000).astype("<u2")
    fields = dict(encoding="16UC1", width=w, height=h, step=w * 2, data=mm.tobytes(),
                  is_bigendian=False)
    path = Trajectory(tuple(Point(w * (0.2 + 0.06 * k), h * (0.5 + 0.04 * k))
                            for k in range(ITEMS)))
    return fields, boxes, path


def measure(fn: Callable[[], object], runs: int) -> tuple[float, float, float]:
    """Return (median, p95) wall and median thread-CPU milliseconds after a warm-up call.

    CPU time is reported too because the machine may be shared: wall time then includes time
    the scheduler gave to other processes, CPU time does not.
    """
    fn()
    wall, cpu = [], []
    for _ in range(runs):
        start, start_cpu = time.perf_counter(), time.thread_time()
        fn()
        cpu.append((time.thread_time() - start_cpu) * 1e3)
        wall.append((time.perf_counter() - start) * 1e3)
    wall.sort()
    p95 = wall[min(len(wall) - 1, math.ceil(0.95 * len(wall)) - 1)]
    return statistics.median(wall), p95, statistics.median(cpu)


def _cell(m: tuple[float, float, float]) -> str:
    return f"{m[0]:.3f} / {m[1]:.3f} ({m[2]:.3f})"


def main() -> None:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"python {platform.python_version()}, numpy {np.__version__}, "
          f"{os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
          f"{args.runs} runs\n")
    print("Milliseconds, wall p50 / p95 (thread CPU p50), one goal = 10 items.\n")
    print("| size | boxes | decode 16UC1 | 10 boxes | 10 waypoints | goal: decode + 10 boxes "
          "| valid |")
    print("|---|---|---|---|---|---|---|")
    for width, height in SIZES:
        cam = camera(width, height)
        for large in (False, True):
            fields, boxes, path = scene(cam, large)
            depth = depth_to_metres(**fields)
            results = lift_boxes(depth, cam, boxes)
            decode = measure(lambda f=fields: depth_to_metres(**f), args.runs)
            lift = measure(lambda d=depth, c=cam, b=boxes: lift_boxes(d, c, b), args.runs)
            points = measure(lambda d=depth, c=cam, p=path: lift_trajectory(d, c, p), args.runs)
            goal = measure(lambda f=fields, c=cam, b=boxes: lift_boxes(depth_to_metres(**f), c, b),
                           args.runs)
            valid = sum(r.valid for r in results)
            print(f"| {width}x{height} | {'large' if large else 'typical'} | {_cell(decode)} "
                  f"| {_cell(lift)} | {_cell(points)} | {_cell(goal)} "
                  f"| {valid}/{len(results)} |")


if __name__ == "__main__":
    main()
