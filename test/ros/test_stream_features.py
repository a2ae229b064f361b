"""Compressed input, periodic monitoring and diagnostics on the real node (tiny model, CPU)."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402
from node_process import (  # noqa: E402
    ENDLESS_LIMITS,
    ENDLESS_SCHEMA,
    ENDLESS_TOKENS,
    NodeProcess,
    scene,
)
from rclpy.qos import qos_profile_sensor_data  # noqa: E402
from sensor_msgs.msg import CompressedImage  # noqa: E402
from spun_node import SpunNode  # noqa: E402

from cosmos_reason_interfaces.msg import ReasoningResult  # noqa: E402
from cosmos_reason_ros.client import ReasonClient  # noqa: E402
from cosmos_reason_ros.core.imaging import encode_jpeg  # noqa: E402
from cosmos_reason_ros.core.types import ErrorCode  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.engine, pytest.mark.slow]
PERIOD_S = 1.0


@pytest.fixture(scope="module")
def node(tiny_qwen3_vl):
    proc = NodeProcess("cpu_demo", {
        "engine.model": str(tiny_qwen3_vl), "image.input": "both",
        "periodic.enabled": True, "periodic.period_s": PERIOD_S,
        "periodic.prompt": "Is anything blocking the way?", "periodic.max_tokens": 4,
        **ENDLESS_LIMITS,
        "diagnostics.period_s": 0.5, "image.max_age_s": 30.0})
    proc.wait_ready()
    yield proc
    proc.stop_cleanly()


@pytest.fixture(scope="module")
def io(node):
    side = SpunNode("stream_test_io")
    test_node = side.node

    class IO:
        lock = threading.Condition()
        results: list = []
        diagnostics: list = []

    io = IO()
    io.node = test_node
    io.compressed = test_node.create_publisher(CompressedImage, "/image/compressed",
                                               qos_profile_sensor_data)

    def on_result(msg):
        with io.lock:
            io.results.append((time.monotonic(), msg))
            io.lock.notify_all()

    def on_diag(msg):
        with io.lock:
            io.diagnostics.append(msg)
            io.lock.notify_all()

    test_node.create_subscription(ReasoningResult, "/cosmos_reason/results", on_result, 50)
    test_node.create_subscription(DiagnosticArray, "/diagnostics", on_diag, 10)
    io.client = ReasonClient()  # own participant, as a planner's would be
    assert io.client.wait_for_server(30)
    assert side.wait_matched(io.compressed), "the node's camera subscription was not found"

    def publish_jpeg(data: bytes, frame_id="jpeg_cam", n=10):
        for _ in range(n):
            msg = CompressedImage(format="jpeg", data=data)
            msg.header.stamp = test_node.get_clock().now().to_msg()
            msg.header.frame_id = frame_id
            io.compressed.publish(msg)
            time.sleep(0.03)

    def latest_diag_values():
        with io.lock:
            status = io.diagnostics[-1].status[0]
        return {kv.key: kv.value for kv in status.values}, status

    def wait_diag_update():
        with io.lock:
            n = len(io.diagnostics)
            assert io.lock.wait_for(lambda: len(io.diagnostics) > n + 1, 10)

    io.publish_jpeg = publish_jpeg
    io.latest_diag_values = latest_diag_values
    io.wait_diag_update = wait_diag_update
    yield io
    io.client.close()
    side.close()


def test_compressed_jpeg_input_is_answered_with_its_header(io):
    io.publish_jpeg(encode_jpeg(scene(800, 600, seed=1), 90))
    result = io.client.ask("What is this?", max_tokens=8)
    assert result.ok, result.error_message
    assert result.message.header.frame_id == "jpeg_cam"
    assert (result.message.image_width, result.message.image_height) == (800, 600)


def test_corrupt_jpeg_gives_bad_image_and_node_keeps_serving(io):
    good = encode_jpeg(scene(320, 240), 90)
    io.publish_jpeg(good[: len(good) // 3] + bytes(200), frame_id="broken")
    result = io.client.ask("q", max_tokens=4)
    assert result.error_code is ErrorCode.BAD_IMAGE, result.error_message
    io.publish_jpeg(good)
    assert io.client.ask("q", max_tokens=4).ok


def test_periodic_runs_publish_at_the_period_and_skip_while_busy(io):
    io.publish_jpeg(encode_jpeg(scene(320, 240), 90), n=5)
    with io.lock:
        start = len(io.results)
        assert io.lock.wait_for(lambda: sum(
            m.origin == "periodic" for _, m in io.results[start:]) >= 3, 20)
        periodic = [(t, m) for t, m in io.results[start:] if m.origin == "periodic"]
    gaps = np.diff([t for t, _ in periodic])
    # Timers on a loaded 2-core machine jitter; the period shows in the median.
    assert np.all(gaps > PERIOD_S * 0.2) and PERIOD_S * 0.5 < np.median(gaps) < PERIOD_S * 2.5, \
        gaps
    assert all(m.error_code == 0 and m.model for _, m in periodic)
    assert all(m.prompt == "Is anything blocking the way?" for _, m in periodic)

    before, _ = io.latest_diag_values()
    # Goals that run until cancelled (see ENDLESS_SCHEMA).
    handles = [io.client.submit(io.client.goal("Long", response_schema=ENDLESS_SCHEMA,
                                               max_tokens=ENDLESS_TOKENS)) for _ in range(4)]
    time.sleep(PERIOD_S * 2.5)  # timers fire while the goals run: they must skip
    for handle in handles:
        handle.cancel()
    assert all(h.result(120).status == "canceled" for h in handles)
    io.wait_diag_update()
    after, _ = io.latest_diag_values()
    assert int(after["periodic_skipped"]) > int(before["periodic_skipped"])


def test_diagnostics_count_a_known_sequence_of_goals(io):
    io.publish_jpeg(encode_jpeg(scene(320, 240), 90), n=5)
    io.wait_diag_update()
    before, _ = io.latest_diag_values()
    assert io.client.ask("one", max_tokens=4).ok
    assert io.client.ask("two", max_tokens=4).ok
    bad = io.client.run(io.client.goal("", task="ground"))
    assert bad.error_code is ErrorCode.BAD_REQUEST
    stale = io.client.ask("old?", max_image_age_s=1e-6, max_tokens=4)
    assert stale.error_code is ErrorCode.IMAGE_TOO_OLD
    io.wait_diag_update()
    after, status = io.latest_diag_values()

    def delta(key):
        return int(after[key]) - int(before[key])

    assert delta("goals_succeeded") == 2
    assert delta("goals_rejected") == 1  # BAD_REQUEST
    assert delta("goals_aborted") == 1  # IMAGE_TOO_OLD
    assert after["engine_state"] == "ready" and after["engine_running_requests"] in ("0", "1")
    assert int(after["frames_received"]) > 0
    assert float(after["ttft_p50_s"]) > 0 and float(after["total_p95_s"]) >= float(
        after["total_p50_s"])
    assert "engine" not in status.message, status.message  # camera may be quiet by now


def test_diagnostics_warn_then_error_when_the_camera_goes_silent(io, node):
    # diagnostics.camera_warn_s=2 and camera_error_s=10 (defaults): wait out the warning.
    deadline = time.monotonic() + 15
    levels = set()
    while time.monotonic() < deadline and 2 not in levels:
        io.wait_diag_update()
        _, status = io.latest_diag_values()
        levels.add(status.level[0] if isinstance(status.level, bytes) else int(status.level))
    assert {1, 2} <= levels, levels
    assert "camera silent" in status.message


def test_annotated_image_has_the_source_header_and_drawn_boxes(io):
    from node_process import rgb_image_msg
    from sensor_msgs.msg import Image

    received = []
    got = threading.Event()

    def on_image(msg):
        if msg.header.frame_id == "annotate_cam":  # periodic runs annotate their frames too
            received.append(msg)
            got.set()

    sub = io.node.create_subscription(Image, "/cosmos_reason/annotated_image", on_image, 5)
    try:
        deadline = time.monotonic() + 10
        while io.node.count_publishers("/cosmos_reason/annotated_image") == 0 \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # let the node's publisher see the subscription
        schema = json.dumps({"type": "array", "minItems": 1, "maxItems": 1, "items": {
            "type": "object", "required": ["bbox_2d", "label"], "additionalProperties": False,
            "properties": {"bbox_2d": {"type": "array", "minItems": 4, "maxItems": 4, "items": {
                "type": "integer", "minimum": 100, "maximum": 900}},
                "label": {"enum": ["cup"]}}}})
        source = np.zeros((480, 640, 3), np.uint8)
        image = rgb_image_msg(source, 42 * 10**9, "annotate_cam")
        result = io.client.run(io.client.goal("", "ground", ["cup"], source=3, image=image,
                                              response_schema=schema, max_tokens=64))
        assert result.ok and result.boxes, (result.error_message, result.message.raw_text)
        assert got.wait(10), "no annotated image"
        msg = received[-1]
        assert msg.header.frame_id == "annotate_cam" and msg.header.stamp.sec == 42
        assert (msg.width, msg.height, msg.encoding) == (640, 480, "rgb8")
        drawn = np.frombuffer(bytes(msg.data), np.uint8).reshape(480, 640, 3)
        box = max(result.boxes, key=lambda b: (b.x_max - b.x_min) * (b.y_max - b.y_min))
        if box.x_max - box.x_min >= 2 and box.y_max - box.y_min >= 2:
            # The outline passes through the box's left edge at mid-height.
            y = int((box.y_min + box.y_max) / 2)
            x = int(min(max(box.x_min, 0), 639))
            assert drawn[y, max(0, x - 1):x + 2].any(), "no outline where the box is"
        assert drawn.any() and not source.any()
    finally:
        io.node.destroy_subscription(sub)
