"""The second-question phase: Q1 then Q2 about one fresh frame (prefix / vision cache)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from cosmos_reason_ros.bench.results import Results
from cosmos_reason_ros.bench.workload import LENGTHS, PROMPT, PROMPT_2, picture, size_name

if TYPE_CHECKING:
    from cosmos_reason_ros.bench.runner import Bench


def run(bench: Bench, results: Results) -> None:
    """Q1 then Q2 about the same fresh frame, per mode, interleaved."""
    modes = [m for m in ("engine", "node", "baseline") if bench.up(m)]
    if not modes:
        raise RuntimeError("no engine, node or baseline is up")
    deadline = bench.budget.phase_deadline("second")
    wanted = bench.args.repeats or bench.device.repeats
    rounds = 0
    for r in range(-1, wanted):
        if r >= 1 and time.monotonic() > deadline:
            break
        for i, size in enumerate(bench.sizes):
            seed = bench.next_seed()
            rgb = picture(size[0], size[1], seed)
            stamp = bench.publish_frame(modes, rgb)
            k = (r + i) % len(modes)
            for mode in modes[k:] + modes[:k]:
                for q, prompt in ((1, PROMPT), (2, PROMPT_2)):
                    out = bench.run_one(mode, rgb, stamp, prompt, LENGTHS["short"], seed)
                    results.sample(phase="second", mode=mode, size=size_name(size),
                                   question=q, round=r, warmup=r < 0, **out)
        rounds += r >= 0
    results.mode("second", status="ran", rounds=rounds, wanted=wanted)
