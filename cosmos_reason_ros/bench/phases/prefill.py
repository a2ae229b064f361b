"""The prefill phase: goals on the latest frame of a 5 Hz camera, prefill on vs off.

With the baseline running, the same camera also feeds it and its requests about the latest
frame join the rotation as one more setting: the node (prefill on+ready)
against what users do today, interleaved in one run.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from typing import TYPE_CHECKING

from cosmos_reason_ros.bench.results import Results, record_batch
from cosmos_reason_ros.bench.workload import (
    BASELINE_TOPIC,
    LENGTHS,
    NODE_TOPIC,
    PREFILL_BATCH,
    PREFILL_SETTINGS,
    PROMPT,
    picture,
    rotated,
    size_name,
)

if TYPE_CHECKING:
    from cosmos_reason_ros.bench.runner import Bench


def run(bench: Bench, results: Results) -> None:
    """Goals on the latest frame of a 5 Hz camera, prefill on vs off (interleaved)."""
    assert bench.ros is not None
    if not bench.prefill_param:
        results.mode("prefill", status="skipped",
                     reason="the node has no 'prefill.enabled' parameter (a node older "
                            "than speculative prefill)")
        return
    deadline = bench.budget.phase_deadline("prefill")
    size = (1280, 720) if (1280, 720) in bench.sizes else bench.sizes[0]
    base = picture(size[0], size[1], bench.next_seed())
    stop = threading.Event()
    # (monotonic time, stamp) of the newest frame published: where in the camera's period a
    # goal came, and whether it was answered on that frame or an older, prefilled one.
    newest = [(math.nan, 0)]

    def camera() -> None:
        i = 0
        while not stop.is_set():
            # Every frame differs (a corner block coloured by its number), so no frame
            # is in the engine's caches unless a prefill or an earlier goal put it there.
            frame = base.copy()
            frame[:32, :32] = (i % 251, (i // 251) % 251, 255)
            stamp_ns = bench.ros.now_ns()
            msg = bench.ros.image_msg(frame, stamp_ns)
            for topic in topics:
                bench.ros.cameras[topic].publish(msg)
            newest[0] = (time.monotonic(), stamp_ns)
            i += 1
            stop.wait(0.2)

    with_baseline = bench.available.get("baseline") == ""  # started and ready
    topics = [NODE_TOPIC, BASELINE_TOPIC] if with_baseline else [NODE_TOPIC]
    thread = threading.Thread(target=camera, daemon=True)
    thread.start()
    wanted = bench.args.repeats or bench.device.repeats
    rounds = 0
    settings = dict(PREFILL_SETTINGS)
    if bench.ros.get_param("prefill.ready_frame_within_s") is None:
        del settings["on+ready"]  # a node from before the parameter
    names = list(settings) + (["baseline"] if with_baseline else [])
    diag_before = bench.ros.fresh_diag()
    try:
        for r in range(-1, wanted):
            if r >= 1 and time.monotonic() > deadline:
                break
            for setting in rotated(names, r):
                if setting == "baseline":
                    _baseline_goals(bench, results, stop, size, r)
                    continue
                enabled, ready_s = settings[setting]
                bench.ros.set_param("prefill.enabled", enabled)
                if "on+ready" in settings:
                    bench.ros.set_param("prefill.ready_frame_within_s", ready_s)
                for _ in range(3):
                    # At a random phase of the camera, as goals come in practice: the
                    # newest frame may be prefilled, in prefill, or not yet seen.
                    stop.wait(0.35)
                    published_at, newest_stamp = newest[0]
                    camera_phase_s = time.monotonic() - published_at
                    out = bench.ros.node_submit(PROMPT, LENGTHS["short"])()
                    results.sample(phase="prefill", mode="node", prefill=enabled,
                                   setting=setting, size=size_name(size), round=r,
                                   warmup=r < 0, camera_phase_s=camera_phase_s,
                                   on_newest_frame=out.get("stamp_ns") == newest_stamp, **out)
                stop.wait(0.35)
                _prefill_batch(bench, results, setting, size, r)
            rounds += r >= 0
    finally:
        stop.set()
        thread.join(2)
        with contextlib.suppress(Exception):
            bench.ros.set_param("prefill.enabled", False)
    keys = ("prefill_run", "prefill_skipped", "prefill_aborted", "goals_on_prefilled_frame",
            "goals_on_ready_frame")
    after = bench.ros.fresh_diag()
    results.extra("prefill_diagnostics", {k: {"before": diag_before.get(k),
                                              "after": after.get(k)} for k in keys})
    results.mode("prefill", status="ran", rounds=rounds, wanted=wanted)


def _baseline_goals(bench: Bench, results: Results, stop: threading.Event,
                    size: tuple[int, int], r: int) -> None:
    """Ask the baseline about its latest frame 3 times, at random phases of the camera."""
    assert bench.ros is not None
    for _ in range(3):
        stop.wait(0.35)
        out = bench.ros.baseline_request(PROMPT, LENGTHS["short"], bench.next_seed())
        results.sample(phase="prefill", mode="baseline", setting="baseline",
                       size=size_name(size), round=r, warmup=r < 0, **out)


def _prefill_batch(bench: Bench, results: Results, setting: str, size: tuple[int, int],
                   r: int) -> None:
    """Real goals' throughput with prefill on or off: 8 goals at once on the latest frame."""
    assert bench.ros is not None
    t0 = time.monotonic()
    outs = [w() for w in [bench.ros.node_submit(PROMPT, LENGTHS["128"])
                          for _ in range(PREFILL_BATCH)]]
    record_batch(results, outs, [o for o in outs if not o.get("ok")],
                 time.monotonic() - t0, r, phase="prefill", mode="node",
                 prefill=PREFILL_SETTINGS[setting][0], setting=setting,
                 concurrency=PREFILL_BATCH, size=size_name(size))
