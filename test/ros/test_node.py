"""The node as its own process, with real rclpy over DDS and the real vLLM engine (tiny model).

One node process serves the whole module (engine start-up is the slow part); tests run in file
order where the camera state matters (the first test runs before any frame is published).
"""

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
    rgb_image_msg,
    scene,
)
from sensor_msgs.msg import Image  # noqa: E402
from spun_node import SpunNode  # noqa: E402
from waiting import DISCOVERY_S, NEVER_S, wait_until  # noqa: E402

from cosmos_reason_interfaces.action import Reason  # noqa: E402
from cosmos_reason_interfaces.msg import ReasoningResult  # noqa: E402
from cosmos_reason_ros.client import ReasonClient  # noqa: E402
from cosmos_reason_ros.core.types import ErrorCode  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.engine, pytest.mark.slow, pytest.mark.every_distro]

Goal = Reason.Goal
Feedback = Reason.Feedback


@pytest.fixture(scope="module")
def node(tiny_qwen3_vl):
    proc = NodeProcess("cpu_demo", {"engine.model": str(tiny_qwen3_vl),
                                    "limits.max_concurrent_goals": 8,
                                    "limits.max_queued_goals": 4,
                                    **ENDLESS_LIMITS,
                                    "image.wait_s": 0.5,
                                    # Any age: a frame the test has seen reach the node stays
                                    # the goal's, however long a loaded machine holds the goal
                                    # (goals that test the age bound set their own).
                                    "image.max_age_s": 0.0,
                                    # Reliable with a deep queue: the clip test counts frames,
                                    # and a loaded CI machine must not drop any.
                                    "image.qos_reliability": "reliable",
                                    "image.qos_depth": 30,
                                    "diagnostics.period_s": 0.2})
    proc.wait_ready()
    yield proc
    proc.stop_cleanly()


@pytest.fixture(scope="module")
def io(node):
    """A test-side node: camera publisher, results subscriber, action client."""
    side = SpunNode("node_test_io")
    test_node = side.node

    class IO:
        pass

    io = IO()
    io.node = test_node
    io.camera = test_node.create_publisher(Image, "/image", 30)  # reliable, like the node
    io.results: list[ReasoningResult] = []
    io.results_cond = threading.Condition()

    def on_result(msg):
        with io.results_cond:
            io.results.append(msg)
            io.results_cond.notify_all()

    test_node.create_subscription(ReasoningResult, "/cosmos_reason/results", on_result, 50)
    io.engine_running: list[int] = []
    io.frames_received = 0
    io.published = 0

    def on_diagnostics(msg):
        values = {kv.key: kv.value for kv in msg.status[0].values}
        if "engine_running_requests" not in values:  # not configured yet: the state alone
            return
        with io.results_cond:
            io.engine_running.append(int(values["engine_running_requests"]))
            io.frames_received = int(values["frames_received"])
            io.results_cond.notify_all()

    test_node.create_subscription(DiagnosticArray, "/diagnostics", on_diagnostics, 10)
    io.client = ReasonClient()  # own participant, as a planner's would be
    assert io.client.wait_for_server(DISCOVERY_S)
    assert side.wait_matched(io.camera), "the node's camera subscription was not found"

    def publish(width=640, height=480, stamp_ns=None, seed=0):
        now = side.now_ns()
        io.camera.publish(rgb_image_msg(scene(width, height, seed), stamp_ns or now))
        io.published += 1

    def wait_received():
        """Wait until the node has every frame published so far (its diagnostics' count)."""
        with io.results_cond:
            assert io.results_cond.wait_for(lambda: io.frames_received >= io.published,
                                            NEVER_S), \
                f"the node received {io.frames_received} of {io.published} frames"

    def publish_until_received(width=640, height=480):
        """Publish a few frames and wait until the node has them: its latest is the last one.

        (Without the wait, a loaded run's goal took a frame of the previous test, 640x480,
        still on its way when the 1280x720 ones were published.)
        """
        for _ in range(10):
            publish(width, height)
            time.sleep(0.05)  # paces: a 20 Hz camera
        wait_received()

    io.publish = publish
    io.publish_until_received = publish_until_received
    io.wait_received = wait_received
    yield io
    io.client.close()
    side.close()


def test_no_image_yet_gives_no_image_after_the_wait(io):
    result = io.client.ask("What do you see?", max_tokens=8)
    assert result.status == "aborted"
    assert result.error_code is ErrorCode.NO_IMAGE, result.error_message
    assert "no image received" in result.error_message
    clip = io.client.run(io.client.goal("What happens?", source=Goal.SOURCE_CLIP))
    assert clip.error_code is ErrorCode.NO_IMAGE
    assert "needs at least 2 frames" in clip.error_message


def test_free_form_question_on_latest_frame_has_source_header(io):
    io.publish_until_received(640, 480)
    result = io.client.ask("What is on the table?", max_tokens=16)
    assert result.ok, result.error_message
    msg = result.message
    assert msg.raw_text and msg.output_tokens > 0 and msg.prompt_tokens > 0
    assert msg.header.frame_id == "camera"
    assert len(msg.frame_stamps) == 1 and msg.frame_stamps[0] == msg.header.stamp
    assert (msg.image_width, msg.image_height) == (640, 480)
    assert msg.finish_reason in ("stop", "length")
    assert msg.total_s >= msg.time_to_first_token_s > 0


def test_grounding_boxes_are_inside_the_original_image(io):
    io.publish_until_received(1280, 720)
    # The task's own schema allows "[]" (nothing found); this one demands at least one box.
    schema = json.dumps({"type": "array", "minItems": 1, "maxItems": 3, "items": {
        "type": "object", "required": ["bbox_2d", "label"], "additionalProperties": False,
        "properties": {
            "bbox_2d": {"type": "array", "minItems": 4, "maxItems": 4,
                        "items": {"type": "integer", "minimum": 0, "maximum": 1000}},
            "label": {"enum": ["red cup", "box"]}}}})
    result = io.client.ground(["red cup", "box"], max_tokens=200, response_schema=schema)
    assert result.ok, result.error_message
    msg = result.message
    assert (msg.image_width, msg.image_height) == (1280, 720)
    assert (msg.input_width, msg.input_height) != (1280, 720)  # the model saw a smaller image
    assert "json" in msg.parsed, msg.parse_problems
    assert result.boxes, f"schema-constrained grounding returned no boxes: {msg.raw_text!r}"
    for box in result.boxes:
        assert 0 <= box.x_min <= box.x_max <= 1280 and 0 <= box.y_min <= box.y_max <= 720
        assert box.label in ("red cup", "box")


def test_image_carried_in_the_goal(io):
    rgb = scene(320, 240, seed=3)
    image = rgb_image_msg(rgb, 123_000_000_000, "goal_cam")
    result = io.client.run(io.client.goal("Describe it.", source=Goal.SOURCE_GOAL_IMAGE,
                                          image=image, max_tokens=8))
    assert result.ok, result.error_message
    assert result.message.header.frame_id == "goal_cam"
    assert result.message.header.stamp.sec == 123
    assert (result.message.image_width, result.message.image_height) == (320, 240)


def test_next_frame_waits_for_a_frame_after_acceptance(io):
    io.publish_until_received()
    old_stamp = io.node.get_clock().now().nanoseconds - 5 * 10**9
    io.publish(stamp_ns=old_stamp)  # the latest frame before the goal
    io.wait_received()  # every frame so far is the node's before the goal is sent
    waiting = threading.Event()
    handle = io.client.submit(
        io.client.goal("What changed?", source=Goal.SOURCE_NEXT, wait_for_image_s=60.0,
                       max_tokens=8),
        lambda fb: fb.stage == Feedback.STAGE_WAITING_FOR_IMAGE and waiting.set())
    assert waiting.wait(NEVER_S), "the goal never waited for a frame"
    fresh_stamp = io.node.get_clock().now().nanoseconds
    while not handle.future.done() and io.published < 2000:
        io.publish(stamp_ns=fresh_stamp)
        time.sleep(0.05)  # paces: a 20 Hz camera, until the goal has its frame
    result = handle.result(NEVER_S)
    assert result.ok, result.error_message
    stamp = result.message.header.stamp
    assert stamp.sec * 10**9 + stamp.nanosec == fresh_stamp


def test_next_frame_times_out_with_no_image(io):
    io.wait_received()  # frames the previous test published (reliable, queued) arrive first
    result = io.client.run(io.client.goal("q", source=Goal.SOURCE_NEXT, wait_for_image_s=0.3,
                                          max_tokens=4))
    assert result.error_code is ErrorCode.NO_IMAGE and "no new frame" in result.error_message


def test_stale_latest_frame_gives_image_too_old(io):
    stale = io.node.get_clock().now().nanoseconds - 30 * 10**9
    for _ in range(5):
        io.publish(stamp_ns=stale)
    io.wait_received()  # the stale frame is the latest
    result = io.client.ask("q", max_image_age_s=1.0, max_tokens=4)
    assert result.error_code is ErrorCode.IMAGE_TOO_OLD, result.error_message
    assert "max_image_age_s=1" in result.error_message


def test_bad_request_fields_are_reported_and_node_keeps_serving(io):
    io.publish_until_received()
    bad = io.client.run(io.client.goal("", task="ground"))
    assert bad.error_code is ErrorCode.BAD_REQUEST and "targets" in bad.error_message
    bad = io.client.run(io.client.goal("q", task="dance"))
    assert bad.error_code is ErrorCode.BAD_REQUEST and "dance" in bad.error_message
    bad = io.client.run(io.client.goal("q", source=Goal.SOURCE_GOAL_IMAGE))
    assert bad.error_code is ErrorCode.BAD_REQUEST and "exactly one" in bad.error_message
    io.publish_until_received()
    assert io.client.ask("still there?", max_tokens=4).ok


def test_cancel_mid_stream_ends_canceled_and_engine_serves_next(io):
    io.publish_until_received()
    generating = threading.Event()

    def on_feedback(fb):
        if fb.stage == Reason.Feedback.STAGE_GENERATING and fb.output_tokens > 0:
            generating.set()

    handle = io.client.submit(io.client.goal("Write a lot.", response_schema=ENDLESS_SCHEMA,
                                             max_tokens=ENDLESS_TOKENS), on_feedback)
    assert generating.wait(NEVER_S), "no generation feedback"
    handle.cancel()
    result = handle.result(NEVER_S)
    assert result.status == "canceled", (result.status, result.error_message)
    assert result.error_code is ErrorCode.CANCELLED
    assert result.message.finish_reason == "cancelled"
    # The engine (vLLM's own request count, via diagnostics) is idle again.
    with io.results_cond:
        seen = len(io.engine_running)
        assert io.results_cond.wait_for(
            lambda: 0 in io.engine_running[seen:], NEVER_S), io.engine_running[seen:]
    io.publish_until_received()
    assert io.client.ask("next?", max_tokens=4).ok


def test_eight_concurrent_goals_all_succeed(io):
    io.publish_until_received()
    handles = [io.client.submit(io.client.goal(f"Question {i}?", max_tokens=16))
               for i in range(8)]
    results = [h.result(NEVER_S) for h in handles]
    assert all(r.ok for r in results), [r.error_message for r in results if not r.ok]
    assert len({r.message.goal_id for r in results}) == 8


def test_goals_beyond_the_bounds_are_overloaded(io, node):
    io.publish_until_received()
    # Goals that run until cancelled, so none frees its slot during the burst however fast
    # the machine (512-token goals ended before the last of 20 was admitted on a quiet one);
    # queued goals pick their frame when they start: allow old frames.
    handles = [io.client.submit(io.client.goal("Long", response_schema=ENDLESS_SCHEMA,
                                               max_tokens=ENDLESS_TOKENS,
                                               max_image_age_s=300.0))
               for _ in range(20)]
    wait_until(lambda: sum(h.future.done() for h in handles) >= 20 - 12,  # 8 run, 4 queue
               NEVER_S, "the refusals did not come back")
    for h in handles:
        h.cancel()
    results = [h.result(NEVER_S) for h in handles]
    codes = [r.error_code for r in results]
    assert codes.count(ErrorCode.OVERLOADED) == 20 - 12, codes
    assert codes.count(ErrorCode.CANCELLED) == 12, codes
    overloaded = next(r for r in results if r.error_code is ErrorCode.OVERLOADED)
    assert overloaded.status == "rejected" and "max_concurrent_goals" in overloaded.error_message
    # The refusal's reason is published on ~/results too, for a subscriber that sent nothing.
    with io.results_cond:
        assert io.results_cond.wait_for(lambda: any(
            r.error_code == ErrorCode.OVERLOADED and "max_concurrent_goals=8" in r.error_message
            for r in io.results), NEVER_S), [(r.error_code, r.error_message) for r in io.results]
    io.publish_until_received()  # the burst may outlast the frame's max age
    assert io.client.ask("after the burst?", max_tokens=4).ok


def test_results_topic_carries_every_action_result(io):
    io.publish_until_received()
    results = [io.client.ask(f"q{i}", max_tokens=4, max_image_age_s=60.0) for i in range(3)]
    results.append(io.client.run(io.client.goal("", task="ground")))  # a failure, too
    wanted = {r.message.goal_id: r.message for r in results}
    deadline = time.monotonic() + 10
    with io.results_cond:
        while time.monotonic() < deadline:
            published = {m.goal_id: m for m in io.results if m.goal_id in wanted}
            if len(published) == len(wanted):
                break
            io.results_cond.wait(0.2)
    assert published.keys() == wanted.keys()
    for goal_id, msg in wanted.items():
        assert published[goal_id] == msg


def test_bad_parameter_stops_the_node_with_a_message(tiny_qwen3_vl):
    proc = NodeProcess("cpu_demo", {"engine.model": str(tiny_qwen3_vl),
                                    "limits.max_concurrent_goals": 0})
    try:
        assert proc.proc.wait(NEVER_S) == 2
    finally:
        proc.stop()
    assert "limits.max_concurrent_goals=0" in proc.output
    assert "allowed: >= 1" in proc.output


def test_image_arrays_survive_exactly(io):
    # The ros-side copy of an rgb8 frame must reach the model unchanged (no channel swap).
    rgb = np.zeros((64, 64, 3), np.uint8)
    rgb[..., 0] = 255
    result = io.client.run(io.client.goal("colour?", source=Goal.SOURCE_GOAL_IMAGE,
                                          image=rgb_image_msg(rgb, 1), max_tokens=4))
    assert result.ok, result.error_message


def test_clip_of_3_s_at_4_fps_from_a_15_hz_stream_uses_12_frames(io):
    t0 = io.node.get_clock().now().nanoseconds
    period = 10**9 // 15
    stamps = [t0 + i * period for i in range(15 * 4)]  # 4 s of stream
    # Faster than real time (the stamps carry the 15 Hz timing), in bursts the node's queue
    # (depth 30) holds: each burst is taken by its camera callback (diagnostics count it)
    # before the next, so a starved node cannot lose a frame.
    with io.results_cond:  # a fresh count: two diagnostics messages from now
        seen = len(io.engine_running)
        assert io.results_cond.wait_for(lambda: len(io.engine_running) >= seen + 2, NEVER_S)
        base = io.frames_received
    for burst in range(0, len(stamps), 10):
        for i in range(burst, burst + 10):
            io.publish(320, 240, stamp_ns=stamps[i], seed=i % 5)
            time.sleep(1 / 60)  # paces: a 60 Hz camera
        with io.results_cond:
            assert io.results_cond.wait_for(
                lambda b=burst: io.frames_received >= base + b + 10, NEVER_S), io.frames_received
    result = io.client.run(io.client.goal("What happens?", source=Goal.SOURCE_CLIP,
                                          clip_duration_s=3.0, clip_fps=4.0, max_tokens=8,
                                          max_image_age_s=60.0))
    assert result.ok, result.error_message
    used = [s.sec * 10**9 + s.nanosec for s in result.message.frame_stamps]
    assert len(used) == 12, used
    assert used == sorted(set(used))
    assert used[-1] == stamps[-1]  # the clip ends at the newest frame
    assert all(u in stamps for u in used)
    gaps = np.diff(used) / 1e9
    assert np.allclose(gaps, 0.25, atol=1 / 15)  # 4 fps, nearest 15 Hz frames


def test_clip_longer_than_the_limit_is_a_bad_request(io):
    too_long = io.client.run(io.client.goal("q", source=Goal.SOURCE_CLIP,
                                            clip_duration_s=1000.0))
    assert too_long.error_code is ErrorCode.BAD_REQUEST
    assert "limits.max_clip_duration_s" in too_long.error_message


# 3995 characters (under limits.max_prompt_chars), more than 4096 byte-level tokens.
CJK_PROMPT = "\u6c34\u706b\u571f\u6728\u91d1" * 799


def test_prompt_over_the_context_limit_is_prompt_too_long(io):
    # From test_bad_inputs.py's catalogue (the rest of it runs on the scripted engine): only
    # the real model's tokenizer knows that this prompt exceeds engine.max_model_len (4096).
    goal = io.client.goal(CJK_PROMPT, source=Goal.SOURCE_GOAL_IMAGE, max_tokens=4)
    goal.image = rgb_image_msg(scene(64, 48), 1)
    result = io.client.run(goal, NEVER_S)
    assert (result.status, result.error_code) == ("aborted", ErrorCode.PROMPT_TOO_LONG), \
        (result.status, result.error_code, result.error_message)
    assert "max_model_len is 4096" in result.error_message, result.error_message
    assert result.message.finish_reason == "error"
    with io.results_cond:  # published on ~/results like every other result
        assert io.results_cond.wait_for(lambda: any(
            m.goal_id == result.message.goal_id and m.error_code == ErrorCode.PROMPT_TOO_LONG
            for m in io.results), NEVER_S)
    after = io.client.run(io.client.goal("Describe it.", source=Goal.SOURCE_GOAL_IMAGE,
                                         image=rgb_image_msg(scene(64, 48, seed=9), 2),
                                         max_tokens=2), NEVER_S)
    assert after.ok, after.error_message  # the node keeps serving


# Keep this test last: it stops the module's node (a module's tests run in file order), which
# has served every goal above -- the state a node is in when a robot's launch is stopped.
def test_sigterm_after_serving_exits_cleanly(node):
    # A node that hung on SIGTERM is killed at the end of the bound and exits non-zero.
    code = node.stop()
    assert code == 0, node.output[-2000:]
