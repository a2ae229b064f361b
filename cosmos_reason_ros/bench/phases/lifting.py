"""The lifting phase: 3D lifting's cost per goal, no engine or node needed.

A synthetic registered 16UC1 depth frame (a wall 3 m away with 10 cards at 0.8-2.5 m, 1 %
noise, 5 % holes) sits in a depth history; each "goal" is what the node does per goal with
depth on: ``DepthLifter.pick`` (the depth frame nearest the colour frame) and
``DepthLifter.lift`` (decode the depth image, lift 10 boxes). Intrinsics are a RealSense-like
69 degree horizontal field of view; "typical" boxes are about a seventh of the image width,
"large" ones a third. With depth off the node has no lifter and calls neither (0 ms).
Wall and thread-CPU milliseconds are both kept: the machine may be shared.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from cosmos_reason_ros.bench.results import Results
from cosmos_reason_ros.core.answer3d import DepthLifter, DepthSettings, LiftCode
from cosmos_reason_ros.core.frames import FrameHistory
from cosmos_reason_ros.core.imaging import ImageMessage
from cosmos_reason_ros.core.lifting import LiftSettings
from cosmos_reason_ros.core.rgbd import CameraModel
from cosmos_reason_ros.core.stats import median, percentile
from cosmos_reason_ros.core.types import Box, ParsedAnswer, ReasonOutcome

if TYPE_CHECKING:
    from cosmos_reason_ros.bench.runner import Bench

SIZES = ((640, 480), (1280, 720))
ITEMS = 10
WALL_M = 3.0
STAMP_NS = 1_000_000_000
TARGET_P50_MS = 1.0  # the 3D target: 10 boxes per goal at 640x480 on this CPU


def camera(width: int, height: int) -> CameraModel:
    """Return a pinhole colour camera with a 69 degree horizontal field of view."""
    f = width / (2 * math.tan(math.radians(34.5)))
    return CameraModel(f, f, (width - 1) / 2, (height - 1) / 2, width, height, "bench")


def scene(cam: CameraModel, large: bool, seed: int = 0) -> tuple[ImageMessage, list[Box]]:
    """Return a 16UC1 depth image of 10 cards before a wall, and a box around each card."""
    rng = np.random.default_rng(seed)
    w, h = cam.width, cam.height
    depth = np.full((h, w), WALL_M)
    boxes = []
    for k in range(ITEMS):
        z = 0.8 + 1.7 * k / (ITEMS - 1)
        side = (0.35 if large else 0.15) * z * w / cam.fx  # metres for ~1/3 or ~1/7 of width
        u, v = w * (0.1 + 0.8 * rng.random()), h * (0.15 + 0.7 * rng.random())
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
    image = ImageMessage(STAMP_NS, "bench", w, h, "16UC1", False, w * 2, mm.tobytes())
    return image, boxes


def measure_goal(width: int, height: int, large: bool, runs: int) -> dict[str, Any]:
    """Time pick + lift of 10 boxes per goal; return wall/CPU medians, p95 and valid count."""
    cam = camera(width, height)
    image, boxes = scene(cam, large)
    history: FrameHistory[ImageMessage] = FrameHistory(4, clock=lambda: STAMP_NS)
    history.append(image, STAMP_NS, nbytes=len(image.data))
    lifter = DepthLifter(DepthSettings(scale=None, max_skew_s=0.05, registered_frame_id="",
                                       lift=LiftSettings()),
                         history, lambda m: m, lambda: cam)
    outcome = ReasonOutcome(ParsedAnswer(raw_text="", reasoning="", answer=""), boxes=tuple(boxes))

    def goal() -> Any:
        return lifter.lift(outcome, STAMP_NS, (width, height), "bench",
                           lifter.pick(STAMP_NS))

    answer = goal()  # warm-up, and the check that the lift worked
    assert answer.code is LiftCode.OK, answer.message
    wall, cpu = [], []
    for _ in range(runs):
        t0, c0 = time.perf_counter(), time.thread_time()
        goal()
        cpu.append((time.thread_time() - c0) * 1e3)
        wall.append((time.perf_counter() - t0) * 1e3)
    return {"size": f"{width}x{height}", "boxes": "large" if large else "typical",
            "runs": runs, "wall_p50_ms": median(wall), "wall_p95_ms": percentile(wall, 95),
            "cpu_p50_ms": median(cpu), "valid": sum(b.valid for b in answer.boxes)}


def run(bench: Bench, results: Results) -> None:
    """Measure lifting per goal at each size and box scale."""
    runs = bench.args.lifting_runs
    rows = [measure_goal(w, h, large, runs) for w, h in SIZES for large in (False, True)]
    results.extra("lifting", {"items": ITEMS, "depth_off_ms": 0.0, "rows": rows,
                              "target_p50_ms": TARGET_P50_MS})
    results.mode("lifting", status="ran")
