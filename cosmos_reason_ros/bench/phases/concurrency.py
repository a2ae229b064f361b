"""The concurrency phase: N simultaneous node goals and N engine requests, per level."""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING, Any

from cosmos_reason_ros.bench.results import Results, record_batch
from cosmos_reason_ros.bench.workload import LENGTHS, PROMPT, picture, rotated, size_name

if TYPE_CHECKING:
    from cosmos_reason_ros.bench.runner import Bench


def run(bench: Bench, results: Results) -> None:
    """N simultaneous goals (node, one fresh frame) and N engine requests (N pictures)."""
    modes = [m for m in ("engine", "node") if bench.up(m)]
    if not modes:
        raise RuntimeError("neither the engine nor the node is up")
    size = (1280, 720) if (1280, 720) in bench.sizes else bench.sizes[0]
    levels = bench.args.concurrency or bench.device.concurrency
    max_tokens = LENGTHS["128"]
    deadline = bench.budget.phase_deadline("concurrency")
    wanted = bench.args.repeats or bench.device.repeats
    rounds = 0
    for r in range(-1, wanted):
        if r >= 1 and time.monotonic() > deadline:
            break
        order = list(levels) if r >= 0 else [max(levels)]
        random.Random(100 + r).shuffle(order)
        for i, n in enumerate(order):
            for mode in rotated(modes, r + i):
                _batch(bench, results, mode, n, size, max_tokens, r)
        rounds += r >= 0
    results.mode("concurrency", status="ran", rounds=rounds, wanted=wanted,
                 size=size_name(size), max_tokens=max_tokens)


def _batch(bench: Bench, results: Results, mode: str, n: int, size: tuple[int, int],
           max_tokens: int, r: int) -> None:
    seeds = [bench.next_seed() for _ in range(n)]
    try:
        if mode == "node":
            assert bench.ros is not None
            ros = bench.ros
            t0 = 0.0

            def ask() -> list[dict[str, Any]]:
                nonlocal t0
                t0 = time.monotonic()
                return [w() for w in [ros.node_submit(PROMPT, max_tokens) for _ in range(n)]]

            rgb = picture(size[0], size[1], seeds[0])
            stamp, outs = bench.ask_node(bench.publish_frame(["node"], rgb), ask)
        else:
            assert bench.engine is not None
            rgbs = [picture(size[0], size[1], s) for s in seeds]
            t0 = time.monotonic()
            outs = [w() for w in [bench.engine.submit(rgb, PROMPT, max_tokens) for rgb in rgbs]]
            stamp = None
        wall = time.monotonic() - t0
    except Exception as e:  # noqa: BLE001
        results.batch(mode=mode, concurrency=n, round=r, warmup=r < 0, ok=False,
                      error=f"{type(e).__name__}: {e}")
        return
    bad = [o for o in outs if not o.get("ok") or (stamp is not None
                                                  and o.get("stamp_ns") != stamp)]
    record_batch(results, outs, bad, wall, r, mode=mode, concurrency=n)
