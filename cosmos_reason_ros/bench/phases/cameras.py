"""The cameras phase: goals about one camera vs two (front + a smaller wrist view), interleaved.

Each setting of each round has fresh pictures (a new front and wrist picture, published with
one stamp), so no answer starts from a cached image; the engine gets the same pictures (its
own vLLM, nothing cached) as one- and two-image requests built by the node's pipeline, the
node goals naming ``front`` or ``front, wrist``. Each round asks each side both ways, one side
after the other; sides and settings alternate their order. On the CPU a request waits
``CPU_SIDE_SWITCH_WAIT_S`` after the other side's (that engine's worker would still be
polling on the same core).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from cosmos_reason_ros.bench import report as benchreport
from cosmos_reason_ros.bench.results import Results
from cosmos_reason_ros.bench.workload import (
    CAMERA_NAMES,
    CAMERAS_FRONT_SIZE,
    CPU_SIDE_SWITCH_WAIT_S,
    LENGTHS,
    PROMPT,
    picture,
    rotated,
    size_name,
)

if TYPE_CHECKING:
    from cosmos_reason_ros.bench.runner import Bench

def run(bench: Bench, results: Results) -> None:
    """One camera vs two, engine and node, short answers, rounds interleaved."""
    modes = [m for m in ("engine", "node") if bench.up(m)]
    if not modes:
        raise RuntimeError("neither the engine nor the node is up")
    front = CAMERAS_FRONT_SIZE if CAMERAS_FRONT_SIZE in bench.sizes else bench.sizes[0]
    wrist = (max(1, front[0] // 2), max(1, front[1] // 2))
    sizes = {"size": size_name(front), "wrist_size": size_name(wrist)}
    deadline = bench.budget.phase_deadline("cameras")
    wanted = bench.args.repeats or bench.device.repeats
    counts = list(range(1, len(CAMERA_NAMES) + 1))
    switch_wait_s = CPU_SIDE_SWITCH_WAIT_S if bench.args.device == "cpu" else 0.0
    last_side, last_done = "", 0.0
    rounds = 0
    for r in range(-1, wanted):
        if r >= 1 and time.monotonic() > deadline:
            break
        # Fresh pictures per setting; a one-camera goal's wrist picture is published too, so
        # the node ingests the same for both settings.
        pictures = {n: list(zip(CAMERA_NAMES, (picture(front[0], front[1], bench.next_seed()),
                                               picture(wrist[0], wrist[1], bench.next_seed())),
                                strict=True)) for n in counts}
        # Each side's requests together (one side switch a round: the CPU wait below), the
        # sides in alternating order. A side comes first and after the switch every other
        # round, so its settings alternate every two rounds: each setting is as often the
        # side's first request, and the first after the switch.
        for side in rotated(modes, r):
            for n in rotated(counts, r // 2):
                front_rgb, wrist_rgb = (rgb for _, rgb in pictures[n])
                stamp = bench.publish_frame([side], front_rgb, wrist=wrist_rgb)
                if last_side and side != last_side:
                    time.sleep(max(0.0, last_done + switch_wait_s - time.monotonic()))
                out = bench.run_one(side, front_rgb, stamp, PROMPT, LENGTHS["short"], 0,
                                    cameras=pictures[n][:n])
                last_side, last_done = side, time.monotonic()
                results.sample(phase="cameras", mode=side, cameras=n, **sizes,
                               length="short", round=r, warmup=r < 0, **out)
        rounds += r >= 0
    results.extra("cameras", {**sizes, **benchreport.camera_cost(results.data["samples"])})
    results.mode("cameras", status="ran", rounds=rounds, wanted=wanted, **sizes)

