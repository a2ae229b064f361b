"""Action transport delay with a camera stream: client on its own participant vs shared.

    source env-kilted.sh && python scripts/bench_transport.py [--seconds 20] [--rounds 2]
    # on the H200 (scripts/gpu/env.sh): the real engine, one frame per goal as the bench does
    python scripts/bench_transport.py --preset x86_gpu --model /root/m2b --camera per-goal \
        --size 640x480 --clients own --camera-states on --param engine.freeze_heap=false

Starts the node (default: cpu_demo, tiny model) and, in this process, a camera publisher plus
action clients: ``shared`` on the publisher's rclpy context (one DDS participant for frames and
goals) and ``own`` on a context of its own (``ReasonClient``'s default). ``--camera stream``
publishes at ``--hz``; ``per-goal`` publishes one reliable frame before each goal and waits
until it is acknowledged (the bench's layout). Short goals run back to back, round-robin over
camera states x clients; each goal's delay is the client's end-to-end time minus the node's own
``total_s``. Prints medians, p95, max and the count of delays over 0.3 s per setting, and the
garbage-collector pauses of the node (from /diagnostics) and of this process.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import signal
import sys
import threading
import time
from pathlib import Path

import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.context import Context
from rclpy.duration import Duration
from rclpy.executors import SingleThreadedExecutor
from rclpy.qos import QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "test"))

from node_process import NodeProcess, rgb_image_msg, scene  # noqa: E402

from cosmos_reason_interfaces.action import Reason  # noqa: E402
from cosmos_reason_ros.client import ReasonClient  # noqa: E402
from cosmos_reason_ros.core.stats import median, percentile  # noqa: E402
from cosmos_reason_ros.eval.tiny_model import ensure_tiny_model  # noqa: E402
from cosmos_reason_ros.ros.gcwatch import GcPauses  # noqa: E402

SLOW_S = 0.3


def _param(text: str) -> tuple[str, object]:
    name, _, value = text.partition("=")
    try:
        return name, json.loads(value)
    except ValueError:
        return name, value


def main() -> int:
    """Run the rounds and print one line per setting."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=20.0, help="per setting and round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--preset", default="cpu_demo")
    p.add_argument("--model", default="", help="checkpoint (default: the tiny model)")
    p.add_argument("--param", action="append", default=[], metavar="K=V",
                   help="node parameter (JSON value or string), repeatable")
    p.add_argument("--camera", choices=("stream", "per-goal"), default="stream")
    p.add_argument("--size", default="1920x1080")
    p.add_argument("--hz", type=float, default=30.0, help="stream rate")
    p.add_argument("--clients", default="shared,own")
    p.add_argument("--camera-states", default="on,off")
    p.add_argument("--feedback", default="all",
                   help="goal feedback levels to interleave: all,stages,none (Reason.Goal)")
    p.add_argument("--json", default="", help="append one JSON line of results here")
    args = p.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    params = {"engine.model": args.model or str(ensure_tiny_model("qwen3_vl")),
              "image.max_age_s": 30.0, "diagnostics.period_s": 0.5,
              **dict(_param(t) for t in args.param)}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the node on the way out
    client_gc = GcPauses().install()
    node = NodeProcess(args.preset, params)
    node.wait_ready(300)
    camera_context = Context()
    rclpy.init(context=camera_context)
    camera_node = rclpy.create_node("transport_camera", context=camera_context)
    publisher = camera_node.create_publisher(
        Image, "/image", QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE))
    node_gc: dict[str, str] = {}
    camera_node.create_subscription(
        DiagnosticArray, "/diagnostics",
        lambda m: node_gc.update({kv.key: kv.value for st in m.status for kv in st.values
                                  if kv.key.startswith("gc_")}), 10)
    spinner = SingleThreadedExecutor(context=camera_context)
    spinner.add_node(camera_node)
    threading.Thread(target=spinner.spin, daemon=True).start()
    frame = rgb_image_msg(scene(width, height, 0), 1)
    camera_on, stop = threading.Event(), threading.Event()

    def publish() -> None:
        frame.header.stamp = camera_node.get_clock().now().to_msg()
        publisher.publish(frame)

    def camera() -> None:
        while not stop.is_set():
            if camera_on.is_set():
                publish()
            time.sleep(1 / args.hz)

    if args.camera == "stream":
        threading.Thread(target=camera, daemon=True).start()
    all_clients = {"shared": lambda: ReasonClient(context=camera_context,
                                                  node_name="transport_shared"),
                   "own": lambda: ReasonClient(node_name="transport_own")}
    clients = {name: all_clients[name]() for name in args.clients.split(",")}
    levels = {"all": Reason.Goal.FEEDBACK_ALL, "stages": Reason.Goal.FEEDBACK_STAGES,
              "none": Reason.Goal.FEEDBACK_NONE}
    delays: dict[tuple[str, str, str], list[float]] = {}
    failed = 0
    try:
        assert all(c.wait_for_server(30) for c in clients.values())
        publish()
        time.sleep(2.0)  # the node has a frame before the first goal
        gc_before = dict(node_gc)
        for _ in range(args.rounds):
            for cam in args.camera_states.split(","):
                (camera_on.set if cam == "on" else camera_on.clear)()
                for (name, client), level in itertools.product(
                        clients.items(), args.feedback.split(",")):
                    goal = ReasonClient.goal("q", max_tokens=2, max_image_age_s=30.0,
                                             feedback=levels[level])
                    end = time.monotonic() + args.seconds
                    while time.monotonic() < end:
                        if cam == "on" and args.camera == "per-goal":
                            publish()
                            publisher.wait_for_all_acked(Duration(seconds=10))
                        t0 = time.monotonic()
                        r = client.run(goal, 60, on_feedback=None if level == "none"
                                       else lambda _fb: None)
                        if r.status == "rejected":
                            continue
                        if not r.ok:  # still timed: a dead engine's fast failures count too
                            if not failed:
                                print(f"first failure: {r.error_code.name} {r.error_message}")
                            failed += 1
                        delays.setdefault((cam, name, level), []).append(
                            time.monotonic() - t0 - r.message.total_s)
        time.sleep(1.5)  # one more diagnostics message
    finally:
        stop.set()
        for c in clients.values():
            c.close()
        spinner.shutdown()
        camera_node.destroy_node()
        rclpy.try_shutdown(context=camera_context)
        node.stop()
    print(f"{'camera':7}{'client':8}{'feedback':9}{'goals':>7}{'p50 ms':>9}{'p95 ms':>9}"
          f"{'max ms':>9}{'> 0.3 s':>9}")
    rows = []
    for (cam, name, level), values in sorted(delays.items()):
        row = {"camera": cam, "client": name, "feedback": level, "goals": len(values),
               "p50_ms": median(values) * 1e3, "p95_ms": percentile(values, 95) * 1e3,
               "max_ms": max(values, default=math.nan) * 1e3,
               "over_0_3_s": sum(v > SLOW_S for v in values),
               "over_0_1_s": sum(v > 0.1 for v in values)}
        rows.append(row)
        print(f"{cam:7}{name:8}{level:9}{row['goals']:7d}{row['p50_ms']:9.1f}{row['p95_ms']:9.1f}"
              f"{row['max_ms']:9.1f}{row['over_0_3_s']:9d}")
    print(f"failed goals (timed as well): {failed}")
    print(f"node gc before: {gc_before}\nnode gc after:  {node_gc}\nclient gc: {client_gc.stats()}")
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps({"argv": sys.argv[1:], "rows": rows, "failed": failed,
                                "node_gc_before": gc_before,
                                "node_gc_after": node_gc,
                                "client_gc": vars(client_gc.stats())}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
