"""The ingest phase: the camera callback's cost and the node's CPU at 30 Hz 1080p."""

from __future__ import annotations

import contextlib
import math
import threading
import time
from typing import TYPE_CHECKING, Any

from cosmos_reason_ros.bench.results import Results
from cosmos_reason_ros.bench.workload import LENGTHS, NODE_TOPIC, PROMPT, picture
from cosmos_reason_ros.core.stats import median, percentile

if TYPE_CHECKING:
    from cosmos_reason_ros.bench.runner import Bench


def run(bench: Bench, results: Results) -> None:
    """Measure the callback cost in-process and node CPU at 30 Hz 1080p +- goals."""
    import psutil

    assert bench.ros is not None and bench.node_proc is not None
    results.extra("ingest_callback", callback_cost(bench.args.model,
                                                   bench.args.ingest_callback_runs))
    deadline = bench.budget.phase_deadline("ingest")
    duration = max(0.5, min(bench.args.ingest_s, (deadline - time.monotonic() - 10) / 4))
    proc = psutil.Process(bench.node_proc.proc.pid)
    size = (1920, 1080)
    msgs = [bench.ros.image_msg(picture(size[0], size[1], bench.next_seed()), 0)
            for _ in range(3)]
    phases = {}
    for name, camera, goals in (("idle", False, False), ("camera", True, False),
                                ("goals", False, True), ("camera+goals", True, True)):
        if not camera:  # the goals need a frame to ask about
            bench.publish_frame(["node"], picture(size[0], size[1], bench.next_seed()))
        phases[name] = _load_phase(bench, proc, msgs, duration, camera, goals)
        results.extra("ingest_phases", phases)
    idle, cam = phases["idle"], phases["camera"]
    both, gl = phases["camera+goals"], phases["goals"]
    # CPU the frames cost = the phase's CPU minus the same-length share of the phase
    # without the camera (idle loops, timers; goals when they run).
    cam_extra = cam["cpu_s"] - idle["cpu_percent"] / 100 * cam["wall_s"]
    both_extra = both["cpu_s"] - gl["cpu_percent"] / 100 * both["wall_s"]
    summary = {
        "duration_s": duration,
        "idle_cpu_percent": idle["cpu_percent"],
        "camera_only_cpu_percent": cam["cpu_percent"],
        "camera_only_cpu_ms_per_frame": _per_frame(cam_extra, cam["frames_received"]),
        "with_goals_extra_cpu_ms_per_frame": _per_frame(both_extra,
                                                        both["frames_received"]),
        "goals_only_cpu_percent": gl["cpu_percent"],
        "camera_and_goals_cpu_percent": both["cpu_percent"],
        "goals_per_s_without_camera": gl["goals"] / gl["wall_s"],
        "goals_per_s_with_camera": both["goals"] / both["wall_s"],
    }
    results.extra("ingest", summary)
    results.mode("ingest", status="ran")


def _load_phase(bench: Bench, proc: Any, msgs: list[Any], duration: float, camera: bool,
                goals: bool) -> dict[str, Any]:
    assert bench.ros is not None
    stop = threading.Event()
    counts = {"published": 0, "goals": 0, "goal_errors": 0}

    def goal_loop() -> None:
        while not stop.is_set():
            out = bench.ros.node_submit(PROMPT, LENGTHS["short"])()
            counts["goals" if out.get("ok") else "goal_errors"] += 1

    def camera_loop() -> None:
        from cosmos_reason_ros.ros.messages import ns_to_stamp

        period = 1 / 30
        t_next = time.monotonic()
        i = 0
        while not stop.is_set():
            msg = msgs[i % len(msgs)]
            msg.header.stamp = ns_to_stamp(bench.ros.now_ns())
            bench.ros.cameras[NODE_TOPIC].publish(msg)
            counts["published"] += 1
            i += 1
            t_next += period
            stop.wait(max(0.0, t_next - time.monotonic()))

    threads = ([threading.Thread(target=camera_loop, daemon=True)] if camera else []) + \
        ([threading.Thread(target=goal_loop, daemon=True)] if goals else [])
    received0 = _int(bench.ros.fresh_diag().get("frames_received"))
    cpu0, t0 = _cpu_s(proc), time.monotonic()
    for t in threads:
        t.start()
    stop.wait(duration)
    stop.set()
    cpu1, t1 = _cpu_s(proc), time.monotonic()
    for t in threads:
        t.join(30)
    received = _int(bench.ros.fresh_diag().get("frames_received")) - received0
    wall = t1 - t0
    return {"wall_s": wall, "cpu_s": cpu1 - cpu0, "cpu_percent": 100 * (cpu1 - cpu0) / wall,
            "frames_published": counts["published"], "frames_received": received,
            "goals": counts["goals"], "goal_errors": counts["goal_errors"]}


def callback_cost(model: str, runs: int = 2000) -> dict[str, Any]:
    """Time the node's own camera callback on a serialized 1080p frame, in this process."""
    import rclpy
    from rclpy.parameter import Parameter
    from rclpy.serialization import serialize_message
    from std_msgs.msg import Header

    from cosmos_reason_ros.ros.messages import ns_to_stamp, rgb_image
    from cosmos_reason_ros.ros.node import ReasonNode

    runs = max(1, runs)
    context = rclpy.context.Context()
    rclpy.init(context=context)
    node = None
    try:
        node = ReasonNode(context=context, cli_args=["--ros-args", "-r",
                                                      "image:=/bench/ingest_unused"],
                          parameter_overrides=[Parameter("engine.model", value=model)])
        node.trigger_configure()  # the cameras, without starting the engine
        node.cameras.subscribe()
        # The callback the raw camera subscription runs (on the node's ingest node), found by
        # its topic, so this measures whatever the node does with a frame.
        callback = next(s.callback for s in node._ingest_node.subscriptions
                        if s.topic_name == "/bench/ingest_unused")
        times = []
        msg = rgb_image(picture(1920, 1080, 7), Header(frame_id="bench"))
        for i in range(runs):
            msg.header.stamp = ns_to_stamp(1_000_000_000 + i * 33_000_000)
            data = serialize_message(msg)  # a new bytes object per frame, like the wire
            t0 = time.perf_counter()
            callback(data)
            times.append((time.perf_counter() - t0) * 1e3)
        return {"runs": runs, "median_ms": median(times),
                "p95_ms": percentile(times, 95), "frame_bytes": len(data)}
    finally:
        if node is not None:
            with contextlib.suppress(Exception):
                node.history.close()
            node.destroy_node()
        rclpy.try_shutdown(context=context)


def _cpu_s(proc: Any) -> float:
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        with contextlib.suppress(Exception):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def _per_frame(cpu_s: float, frames: int) -> float:
    return 1e3 * cpu_s / frames if frames > 0 else math.nan


def _int(text: Any) -> int:
    try:
        return int(text)
    except (TypeError, ValueError):
        return 0
