"""Compressed input, periodic monitoring, diagnostics and the annotated image on the real node.

Fast tier: the real ``ReasonNode`` in this process on the scripted engine
(``test/inprocess_node.py``); camera frames, goals (through the package's ``ReasonClient`` on
its own context), ``~/results``, ``/diagnostics`` and ``~/annotated_image`` all travel over
DDS. What is tested is the node's ingest, timers, counters and drawing, not the model; each
test starts its own node with the parameters it needs. The real engine's end-to-end paths
(one goal of each source, structured output) are proven by test_node.py.
"""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
from fake_engine import Script, request_text  # noqa: E402
from inprocess_node import InProcessNode  # noqa: E402
from node_process import rgb_image_msg, scene  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402
from waiting import DISCOVERY_S, NEVER_S, wait_until  # noqa: E402

from cosmos_reason_interfaces.msg import ReasoningResult  # noqa: E402
from cosmos_reason_ros.client import ReasonClient  # noqa: E402
from cosmos_reason_ros.core.imaging import encode_jpeg  # noqa: E402
from cosmos_reason_ros.core.types import ErrorCode  # noqa: E402

pytestmark = [pytest.mark.ros]
PERIOD_S = 1.0
PERIODIC_PROMPT = "Is anything blocking the way?"
# Besides each test's own: JPEG input as well as raw, a node that serves from a frame up to
# 30 s old (the tests ask after publishing), diagnostics twice a second.
STREAM_PARAMS = {"image.input": "both", "image.max_age_s": 30.0, "diagnostics.period_s": 0.5}


def long_goals_run_until_cancelled(request):
    """Goals whose prompt is "Long" generate until cancelled; everything else answers."""
    if "Long" in request_text(request):
        return Script(deltas=["word "], delay_s=0.01, endless=True)
    return Script(deltas=["Nothing ", "blocks ", "it."], first_delay_s=0.005)


@pytest.fixture
def stream():
    """``stream(params, script)``: a started node plus a ``ReasonClient`` of its own."""
    made: list[tuple[InProcessNode, ReasonClient]] = []

    def make(params=None, script=long_goals_run_until_cancelled):
        node = InProcessNode({**STREAM_PARAMS, **(params or {})}, script)
        client = ReasonClient(context=node.context)  # one participant: see InProcessNode
        made.append((node, client))
        assert client.wait_for_server(DISCOVERY_S)
        return node, client

    yield make
    for node, client in made:
        client.close()
        node.close()


def publish_jpeg(node: InProcessNode, data: bytes, frame_id="jpeg_cam", n=10) -> None:
    """``n`` compressed frames, fresh stamps; returns once the node has them all."""
    before = node.node.history.stats().received
    for _ in range(n):
        node.publish_compressed(data, frame_id=frame_id)
        time.sleep(0.03)  # paces: a camera's frame rate, ~30 fps
    node.wait_frames(before + n)


def values_of(status) -> dict[str, str]:
    return {kv.key: kv.value for kv in status.values}


def test_compressed_jpeg_input_is_answered_with_its_header(stream):
    node, client = stream()
    publish_jpeg(node, encode_jpeg(scene(800, 600, seed=1), 90))
    result = client.ask("What is this?", max_tokens=8)
    assert result.ok, result.error_message
    assert result.message.header.frame_id == "jpeg_cam"
    assert (result.message.image_width, result.message.image_height) == (800, 600)
    assert node.engine.requests[-1].images[0].ndim == 3  # decoded pixels reached the engine


def test_corrupt_jpeg_gives_bad_image_and_node_keeps_serving(stream):
    node, client = stream()
    good = encode_jpeg(scene(320, 240), 90)
    publish_jpeg(node, good[: len(good) // 3] + bytes(200), frame_id="broken")
    result = client.ask("q", max_tokens=4)
    assert result.error_code is ErrorCode.BAD_IMAGE, result.error_message
    assert not node.engine.requests  # refused before the engine
    publish_jpeg(node, good)
    assert client.ask("q", max_tokens=4).ok


@pytest.mark.slow  # starts processes or waits on real time: the real tier
def test_periodic_runs_publish_at_the_period_and_skip_while_busy(stream):
    node, client = stream({"periodic.enabled": True, "periodic.period_s": PERIOD_S,
                           "periodic.prompt": PERIODIC_PROMPT, "periodic.max_tokens": 4})
    received: list[tuple[float, object]] = []  # (arrival, result), periodic only
    cond = threading.Condition()

    def on_result(msg):
        if msg.origin == "periodic":
            with cond:
                received.append((time.monotonic(), msg))
                cond.notify_all()

    node.side.node.create_subscription(ReasoningResult, "/cosmos_reason/results", on_result,
                                       50)
    publish_jpeg(node, encode_jpeg(scene(320, 240), 90), n=5)
    with cond:
        # The first run after the frames arrived may have started before them (NO_IMAGE):
        # it is left out, then three runs on the camera's frames.
        start = len(received) + 1
        assert cond.wait_for(lambda: len(received) >= start + 3, NEVER_S)
        periodic = received[start:]
    gaps = np.diff([t for t, _ in periodic])
    # Timers on a loaded 2-core machine jitter; the period shows in the median.
    assert np.all(gaps > PERIOD_S * 0.2) and PERIOD_S * 0.5 < np.median(gaps) < PERIOD_S * 2.5, \
        gaps
    assert all(m.error_code == 0 and m.model for _, m in periodic)
    assert all(m.prompt == PERIODIC_PROMPT for _, m in periodic)

    before = values_of(node.next_diagnostics())
    # Goals that run until cancelled (the scripted engine's "Long").
    handles = [client.submit(client.goal("Long")) for _ in range(4)]
    # Timers fire while the goals run: they must skip (diagnostics count it), not run.
    deadline = time.monotonic() + NEVER_S  # a bound for "never", not a speed claim
    while int(values_of(node.next_diagnostics())["periodic_skipped"]) \
            <= int(before["periodic_skipped"]):
        assert time.monotonic() < deadline, "no periodic run was skipped while goals ran"
    with cond:
        ran_while_busy = len(received)
    for handle in handles:
        handle.cancel()
    assert all(h.result(NEVER_S).status == "canceled" for h in handles)
    assert all(h.sent for h in handles)
    with cond:
        assert cond.wait_for(lambda: len(received) > ran_while_busy, PERIOD_S * 10), \
            "periodic runs did not resume after the goals"


def test_diagnostics_count_a_known_sequence_of_goals(stream):
    node, client = stream()
    publish_jpeg(node, encode_jpeg(scene(320, 240), 90), n=5)
    node.next_diagnostics()
    before = values_of(node.next_diagnostics())
    assert client.ask("one", max_tokens=4).ok
    assert client.ask("two", max_tokens=4).ok
    bad = client.run(client.goal("", task="ground"))
    assert bad.error_code is ErrorCode.BAD_REQUEST
    stale = client.ask("old?", max_image_age_s=1e-6, max_tokens=4)
    assert stale.error_code is ErrorCode.IMAGE_TOO_OLD
    node.next_diagnostics()
    status = node.next_diagnostics()
    after = values_of(status)

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


@pytest.mark.slow  # starts processes or waits on real time: the real tier
def test_diagnostics_warn_then_error_when_the_camera_goes_silent(stream):
    # Short thresholds (defaults 2 s and 10 s): one frame, then silence past both. The WARN
    # window is 3.5 s wide: with 1.5 s, a starved run's first status after the frame was
    # already ERROR.
    node, _ = stream({"diagnostics.camera_warn_s": 0.5, "diagnostics.camera_error_s": 4.0,
                      "diagnostics.period_s": 0.2})
    node.publish()
    node.wait_frames(1)
    deadline = time.monotonic() + 15
    levels = set()
    while time.monotonic() < deadline and 2 not in levels:
        status = node.next_diagnostics()
        levels.add(status.level[0] if isinstance(status.level, bytes) else int(status.level))
    assert {1, 2} <= levels, levels
    assert "camera silent" in status.message


def test_annotated_image_has_the_source_header_and_drawn_boxes(stream):
    box_answer = '[{"bbox_2d": [200, 300, 600, 700], "label": "cup"}]'  # model coordinates
    node, client = stream(script=lambda r: Script(deltas=[box_answer]))
    received = []
    got = threading.Event()

    def on_image(msg):
        if msg.header.frame_id == "annotate_cam":
            received.append(msg)
            got.set()

    sub = node.side.node.create_subscription(Image, "/cosmos_reason/annotated_image",
                                             on_image, 5)
    try:
        # The node draws only while someone subscribes: wait until it sees this subscription.
        wait_until(lambda: node.node.outputs.annotated.get_subscription_count(), NEVER_S,
                   "the node sees the subscription")
        schema = json.dumps({"type": "array", "minItems": 1, "maxItems": 1, "items": {
            "type": "object", "required": ["bbox_2d", "label"], "additionalProperties": False,
            "properties": {"bbox_2d": {"type": "array", "minItems": 4, "maxItems": 4, "items": {
                "type": "integer", "minimum": 100, "maximum": 900}},
                "label": {"enum": ["cup"]}}}})
        source = np.zeros((480, 640, 3), np.uint8)
        image = rgb_image_msg(source, 42 * 10**9, "annotate_cam")
        result = client.run(client.goal("", "ground", ["cup"], source=3, image=image,
                                        response_schema=schema, max_tokens=64))
        assert result.ok and result.boxes, (result.error_message, result.message.raw_text)
        assert got.wait(NEVER_S), "no annotated image"
        msg = received[-1]
        assert msg.header.frame_id == "annotate_cam" and msg.header.stamp.sec == 42
        assert (msg.width, msg.height, msg.encoding) == (640, 480, "rgb8")
        drawn = np.frombuffer(bytes(msg.data), np.uint8).reshape(480, 640, 3)
        box = max(result.boxes, key=lambda b: (b.x_max - b.x_min) * (b.y_max - b.y_min))
        assert box.x_max - box.x_min >= 2 and box.y_max - box.y_min >= 2, box
        # The outline passes through the box's left edge at mid-height.
        y = int((box.y_min + box.y_max) / 2)
        x = int(min(max(box.x_min, 0), 639))
        assert drawn[y, max(0, x - 1):x + 2].any(), "no outline where the box is"
        assert drawn.any() and not source.any()
    finally:
        node.side.node.destroy_subscription(sub)
