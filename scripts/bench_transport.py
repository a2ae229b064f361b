"""Action transport delay with a big camera stream: client on its own participant vs shared.

    source env-kilted.sh && python scripts/bench_transport.py [--seconds 20] [--rounds 2]

Starts the node (cpu_demo, tiny model) and, in this process, a 1920x1080 rgb8 publisher at
30 Hz plus two action clients: one on the publisher's rclpy context (one DDS participant for
frames and goals) and one on a context of its own (``ReasonClient``'s default). Short goals
run back to back, round-robin over {camera on, off} x {shared, own}; each goal's delay is the
client's end-to-end time minus the node's own ``total_s``. Prints medians, p95, max and the
count of delays over 0.3 s per setting.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import rclpy
from rclpy.context import Context
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "test"))

from node_process import NodeProcess, rgb_image_msg, scene  # noqa: E402

from cosmos_reason_ros.client import ReasonClient  # noqa: E402
from cosmos_reason_ros.tools.tiny_model import ensure_tiny_model  # noqa: E402

SLOW_S = 0.3


def main() -> int:
    """Run the rounds and print one line per setting."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=20.0, help="per setting and round")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    node = NodeProcess("cpu_demo", {"engine.model": str(ensure_tiny_model("qwen3_vl")),
                                    "image.max_age_s": 30.0})
    node.wait_ready()
    camera_context = Context()
    rclpy.init(context=camera_context)
    camera_node = rclpy.create_node("transport_camera", context=camera_context)
    publisher = camera_node.create_publisher(Image, "/image", qos_profile_sensor_data)
    frame = rgb_image_msg(scene(1920, 1080, 0), 1)
    camera_on, stop = threading.Event(), threading.Event()

    def camera() -> None:
        while not stop.is_set():
            if camera_on.is_set():
                frame.header.stamp = camera_node.get_clock().now().to_msg()
                publisher.publish(frame)
            time.sleep(1 / 30)

    threading.Thread(target=camera, daemon=True).start()
    clients = {"shared": ReasonClient(context=camera_context, node_name="transport_shared"),
               "own": ReasonClient(node_name="transport_own")}
    delays: dict[tuple[str, str], list[float]] = {}
    try:
        assert all(c.wait_for_server(30) for c in clients.values())
        camera_on.set()
        time.sleep(2.0)  # the node has a frame before the first goal
        for _ in range(args.rounds):
            for cam in ("on", "off"):
                (camera_on.set if cam == "on" else camera_on.clear)()
                for name, client in clients.items():
                    end = time.monotonic() + args.seconds
                    while time.monotonic() < end:
                        t0 = time.monotonic()
                        r = client.run(ReasonClient.goal("q", max_tokens=2,
                                                         max_image_age_s=30.0), 60)
                        if r.ok:
                            delays.setdefault((cam, name), []).append(
                                time.monotonic() - t0 - r.message.total_s)
    finally:
        stop.set()
        for c in clients.values():
            c.close()
        camera_node.destroy_node()
        rclpy.try_shutdown(context=camera_context)
        node.stop()
    print(f"{'camera':7}{'client':8}{'goals':>7}{'p50 ms':>9}{'p95 ms':>9}{'max ms':>9}"
          f"{'> 0.3 s':>9}")
    for (cam, name), values in sorted(delays.items()):
        values.sort()
        print(f"{cam:7}{name:8}{len(values):7d}{statistics.median(values) * 1e3:9.1f}"
              f"{values[int(0.95 * (len(values) - 1))] * 1e3:9.1f}{values[-1] * 1e3:9.1f}"
              f"{sum(v > SLOW_S for v in values):9d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
