#!/usr/bin/env python3
"""Micro-benchmark of the per-goal image path: view + colour conversion + resize to the budget.

For each camera size and encoding, times ``image_to_rgb(..., size=target)`` where the target
keeps the aspect ratio within a Qwen3-VL visual-token budget (32x32 pixels per token), plus
JPEG encoding of the result (the HTTP engine's data URL) and the ingest cost of
``FrameHistory.append`` (what the ROS image callback does). Prints a markdown table.

    python3 scripts/bench_codec.py [--runs 50] [--tokens 1280]
"""

from __future__ import annotations

import argparse
import array
import math
import platform
import statistics
import time
from collections.abc import Callable

import cv2
import numpy as np

from cosmos_reason_ros.core.frames import FrameHistory
from cosmos_reason_ros.core.imaging import encode_jpeg, image_to_rgb

SIZES = [(640, 480), (1280, 720), (1920, 1080)]
ENCODINGS = ["rgb8", "bgr8", "yuv422"]
PATCH = 32  # Qwen3-VL: 16 px patches merged 2x2 -> one visual token per 32x32 pixels


def target_size(width: int, height: int, max_tokens: int, unit: int = PATCH) -> tuple[int, int]:
    """Qwen-style smart resize: multiples of ``unit``, aspect kept, at most ``max_tokens``."""
    max_pixels = max_tokens * unit * unit
    w = max(unit, round(width / unit) * unit)
    h = max(unit, round(height / unit) * unit)
    if w * h > max_pixels:
        beta = math.sqrt(width * height / max_pixels)
        w = max(unit, math.floor(width / beta / unit) * unit)
        h = max(unit, math.floor(height / beta / unit) * unit)
    return w, h


def message_bytes(rgb: np.ndarray, encoding: str) -> tuple[bytes, int]:
    """Build a message's data and step from an RGB image."""
    height, width = rgb.shape[:2]
    if encoding == "rgb8":
        return rgb.tobytes(), width * 3
    if encoding == "bgr8":
        return cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR).tobytes(), width * 3
    # yuv422 (UYVY): the content does not matter for timing.
    return np.ascontiguousarray(rgb[..., :2]).tobytes(), width * 2


def measure(fn: Callable[[], object], runs: int) -> tuple[float, float]:
    """Return (median, p95) in milliseconds after a warm-up call."""
    fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    p95 = times[min(len(times) - 1, math.ceil(0.95 * len(times)) - 1)]
    return statistics.median(times), p95


def main() -> None:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--tokens", type=int, default=1280, help="visual token budget")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    rows = []
    for width, height in SIZES:
        rgb = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        tw, th = target_size(width, height, args.tokens)
        for encoding in ENCODINGS:
            data, step = message_bytes(rgb, encoding)
            data_aa = array.array("B", data)  # what rclpy hands over for uint8[]

            def convert(w=width, h=height, d=data_aa, enc=encoding, s=step, size=(tw, th)):
                return image_to_rgb(w, h, enc, 0, s, d, size=size)

            med, p95 = measure(convert, args.runs)
            out = convert()
            jmed, jp95 = measure(lambda out=out: encode_jpeg(out, 90), args.runs)
            rows.append((f"{width}x{height}", encoding, f"{tw}x{th}", med, p95, jmed, jp95))

    history: FrameHistory[object] = FrameHistory(max_frames=64)
    msg = object()
    counter = iter(range(10**9))
    n = 20_000
    t0 = time.perf_counter()
    for _ in range(n):
        history.append(msg, next(counter), nbytes=6_220_800)
    ingest_us = (time.perf_counter() - t0) / n * 1e6

    print(
        f"Python {platform.python_version()}, OpenCV {cv2.__version__}, numpy {np.__version__}, "
        f"{platform.machine()}; {args.runs} runs; budget {args.tokens} tokens x 32x32 px; "
        f"OpenCV threads {cv2.getNumThreads()}"
    )
    print()
    print(
        "| input | encoding | model input | convert+resize median ms | p95 ms "
        "| JPEG q90 median ms | p95 ms |"
    )
    print("|---|---|---|---:|---:|---:|---:|")
    for size, enc, target, med, p95, jmed, jp95 in rows:
        print(f"| {size} | {enc} | {target} | {med:.2f} | {p95:.2f} | {jmed:.2f} | {jp95:.2f} |")
    print()
    print(f"Ingest (FrameHistory.append, 64-frame bound, evicting): {ingest_us:.2f} us/frame")


if __name__ == "__main__":
    main()
