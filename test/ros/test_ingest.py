"""Camera ingest runs on a node of its own: renamed and remapped like the main node.

The node takes frames on ``<name>_ingest`` with its own executor (so camera traffic cannot
hold back goal requests). That node ignores the process-wide arguments, so a launch-file
rename (``__node:=``) must not rename it into a clash, and the camera remap must still reach
its subscription. The engine is an unreachable server: nothing here needs one.
"""

from __future__ import annotations

import threading

import pytest

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402
from node_process import NodeProcess, rgb_image_msg, scene  # noqa: E402
from rclpy.qos import QoSProfile, ReliabilityPolicy  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402
from spun_node import SpunNode  # noqa: E402
from waiting import DISCOVERY_S, NEVER_S, wait_until  # noqa: E402

from cosmos_reason_ros.client import ReasonClient, status_name  # noqa: E402
from cosmos_reason_ros.core.types import ErrorCode  # noqa: E402

# A node process of its own: the real tier.
pytestmark = [pytest.mark.ros, pytest.mark.slow]

NAME, TOPIC = "front_reasoner", "/front/image_raw"


@pytest.fixture(scope="module")
def renamed_node():
    proc = NodeProcess("cpu_demo", {"engine.kind": "openai", "model.family": "qwen3_vl",
                                    "engine.url": "http://127.0.0.1:9/v1",
                                    "engine.start_timeout_s": 1.0,
                                    "image.qos_reliability": "reliable",
                                    "diagnostics.period_s": 0.2},
                       remaps=[f"__node:={NAME}", f"image:={TOPIC}"])
    proc.wait_ready(NEVER_S)
    yield proc
    proc.stop_cleanly()


def test_renamed_node_takes_remapped_frames_on_its_ingest_node(renamed_node):
    side = SpunNode("ingest_test")
    node = side.node
    diagnostics: dict[str, str] = {}
    received = threading.Event()

    def on_diagnostics(msg: DiagnosticArray) -> None:
        for status in msg.status:
            if status.name == status_name(f"/{NAME}"):
                diagnostics.update({kv.key: kv.value for kv in status.values})
                if int(diagnostics.get("frames_received", 0)) >= 1:
                    received.set()

    node.create_subscription(DiagnosticArray, "/diagnostics", on_diagnostics, 10)
    camera = node.create_publisher(Image, TOPIC,
                                   QoSProfile(depth=5, reliability=ReliabilityPolicy.RELIABLE))
    try:
        assert side.wait_matched(camera), "the ingest node's subscription was not found"
        expected = sorted([NAME, f"{NAME}_ingest"])
        # Node names arrive after the endpoints.
        wait_until(lambda: sorted(n for n in node.get_node_names()
                                  if n.startswith(NAME)) == expected, DISCOVERY_S,
                   f"node names {expected}", poll_s=0.05)
        camera.publish(rgb_image_msg(scene(64, 48), side.now_ns()))
        assert received.wait(NEVER_S), f"frames not counted; last diagnostics: {diagnostics}"
        with ReasonClient(f"/{NAME}/reason") as client:
            assert client.wait_for_server(DISCOVERY_S)
            result = client.ask("what is in front?", timeout_s=NEVER_S)
        # The goal reached the renamed node's action server; only the (deliberately
        # unreachable) engine failed.
        assert result.error_code is ErrorCode.ENGINE_UNAVAILABLE, result
    finally:
        side.close()
