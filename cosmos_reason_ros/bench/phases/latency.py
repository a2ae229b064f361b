"""The latency phase: engine, node, baseline and floor interleaved per request.

Over sizes x lengths; the floor (a bare rclpy action, ``bench/floor.py``) is asked on short
answers only: it stands for the node's transport, which does not depend on the length.
"""

from __future__ import annotations

import math
import random
import time
from typing import TYPE_CHECKING

from cosmos_reason_ros.bench.results import Results
from cosmos_reason_ros.bench.workload import LENGTHS, PROMPT, picture, rotated, size_name

if TYPE_CHECKING:
    from cosmos_reason_ros.bench.runner import Bench


def run(bench: Bench, results: Results) -> None:
    """Run engine / node / baseline / floor interleaved per request over sizes x lengths."""
    wanted_modes = bench.latency_modes()
    modes = [m for m in wanted_modes if bench.up(m)]
    for m in wanted_modes:
        if not bench.up(m):
            results.mode(m, status="error", error=bench.available.get(m, "not started"))
    if not modes:
        return
    cells = [(s, name) for s in bench.sizes for name in bench.lengths]
    deadline = bench.budget.phase_deadline("latency")
    wanted = bench.args.repeats or bench.device.repeats
    # Round -1 warms each mode up at every size (first-call costs, allocator growth).
    rounds_done, t_round = 0, math.nan
    r = -1
    while r < wanted:
        if r >= 0:
            left = deadline - time.monotonic()
            if rounds_done >= 1 and (math.isnan(t_round) or left < t_round):
                break
            if time.monotonic() > bench.budget.deadline - bench.budget.reserve_s:
                break
        t0 = time.monotonic()
        order = list(cells) if r >= 0 else [(s, "short") for s in bench.sizes]
        random.Random(r).shuffle(order)
        for i, (size, length) in enumerate(order):
            seed = bench.next_seed()
            rgb = picture(size[0], size[1], seed)
            stamp = bench.publish_frame(modes, rgb)
            for mode in rotated(modes, r + i):
                if mode == "floor" and length != "short":
                    continue
                out = bench.run_one(mode, rgb, stamp, PROMPT, LENGTHS.get(length, 8), seed)
                results.sample(phase="latency", mode=mode, size=size_name(size),
                               length=length, target_tokens=LENGTHS[length], round=r,
                               warmup=r < 0, **out)
        if r >= 0:
            rounds_done += 1
            t_round = time.monotonic() - t0 if math.isnan(t_round) \
                else max(t_round, time.monotonic() - t0)
        r += 1
    for m in modes:
        results.mode(m, status="ran", rounds=rounds_done, wanted=wanted)
