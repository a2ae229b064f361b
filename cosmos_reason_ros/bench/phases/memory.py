"""The memory phase: the node's RSS while it takes N frames and M goals at once."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import TYPE_CHECKING, Any

from cosmos_reason_ros.bench import stats as benchstats
from cosmos_reason_ros.bench.results import Results
from cosmos_reason_ros.bench.workload import LENGTHS, NODE_TOPIC, PROMPT, picture, size_name

if TYPE_CHECKING:
    from cosmos_reason_ros.bench.runner import Bench


def run(bench: Bench, results: Results) -> None:
    """Node RSS while it takes N frames and M goals (both streams at once)."""
    import psutil

    assert bench.ros is not None and bench.node_proc is not None
    proc = psutil.Process(bench.node_proc.proc.pid)
    deadline = bench.budget.phase_deadline("memory")
    size = bench.args.memory_frame_size
    n_frames, n_goals = bench.args.memory_frames, bench.args.memory_goals
    msgs = [bench.ros.image_msg(picture(size[0], size[1], bench.next_seed()), 0)
            for _ in range(4)]
    counts = {"frames": 0, "goals": 0, "goal_errors": 0}
    stop = threading.Event()

    def frames() -> None:
        from cosmos_reason_ros.ros.messages import ns_to_stamp

        for i in range(n_frames):
            if stop.is_set():
                return
            msg = msgs[i % len(msgs)]
            msg.header.stamp = ns_to_stamp(bench.ros.now_ns())
            bench.ros.publish(NODE_TOPIC, msg, timeout_s=5.0)
            counts["frames"] += 1

    def goals(parallel: int = 4) -> None:
        while counts["goals"] + counts["goal_errors"] < n_goals and not stop.is_set():
            n = min(parallel, n_goals - counts["goals"] - counts["goal_errors"])
            waits = [bench.ros.node_submit(PROMPT, LENGTHS["short"]) for _ in range(n)]
            for w in waits:
                counts["goals" if w().get("ok") else "goal_errors"] += 1

    bench.publish_frame(["node"], picture(size[0], size[1], bench.next_seed()))
    threads = [threading.Thread(target=frames, daemon=True),
               threading.Thread(target=goals, daemon=True)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        rss, children = _rss_mb(proc)
        results.series("node_rss", {"t_s": time.monotonic() - t0, "rss_mb": rss,
                                    "children_rss_mb": children, **counts})
        if time.monotonic() > deadline:
            stop.set()
        for t in threads:
            t.join(0.5 / len(threads))
    rss, children = _rss_mb(proc)
    results.series("node_rss", {"t_s": time.monotonic() - t0, "rss_mb": rss,
                                "children_rss_mb": children, **counts})
    series = results.data["series"]["node_rss"]
    growth = benchstats.growth([(p["t_s"], p["rss_mb"]) for p in series])
    results.extra("memory", {"frames": counts["frames"], "goals": counts["goals"],
                             "goal_errors": counts["goal_errors"],
                             "frames_wanted": n_frames, "goals_wanted": n_goals,
                             "frame_size": size_name(size), "rss_growth_mb": growth,
                             "rss_start_mb": series[0]["rss_mb"],
                             "rss_end_mb": series[-1]["rss_mb"],
                             "trimmed": stop.is_set()})
    results.mode("memory", status="ran")


def _rss_mb(proc: Any) -> tuple[float, float]:
    rss = proc.memory_info().rss / 2**20
    children = 0.0
    for p in proc.children(recursive=True):
        with contextlib.suppress(Exception):
            children += p.memory_info().rss / 2**20
    return rss, children
