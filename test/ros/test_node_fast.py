"""Node behaviour in the fast tier: the real node in-process on a scripted engine.

Each test starts its own node (milliseconds); the engine's answers, delays and errors are
scripted, so admission, cancel, timeouts, frame choice, feedback, results and diagnostics are
tested deterministically. The real-engine tier (test_node.py and others) proves the same
paths end to end with vLLM.
"""

from __future__ import annotations

import math
import queue

import pytest

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
from action_msgs.msg import GoalStatus  # noqa: E402
from diagnostic_msgs.msg import DiagnosticStatus  # noqa: E402
from fake_engine import Script  # noqa: E402
from inprocess_node import InProcessNode  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402
from waiting import NEVER_S, wait_until  # noqa: E402

from cosmos_reason_interfaces.action import Reason  # noqa: E402
from cosmos_reason_ros.core.types import EngineError, ErrorCode, FinishReason  # noqa: E402

pytestmark = [pytest.mark.ros]
Goal = Reason.Goal
NS = 1_000_000_000
WAIT_S = NEVER_S  # a wait that runs out means the event never happened


@pytest.fixture
def make_node():
    nodes: list[InProcessNode] = []

    def make(params=None, script=None, engine=None) -> InProcessNode:
        node = InProcessNode(params, script, engine)
        nodes.append(node)
        return node

    yield make
    for node in nodes:
        node.close()


def distinct_stages(feedback) -> list[str]:
    """The stages of ``feedback``, each once, in the order of their first appearance."""
    seen: list[str] = []
    for fb in list(feedback):
        if fb.stage not in seen:
            seen.append(fb.stage)
    return seen


def stages(feedback, expected: list[str]) -> list[str]:
    """Wait until as many distinct stages as ``expected`` are in; return them in order.

    Call it before asking for the result: feedback is a topic and the result a service, so
    the last feedback can arrive after the result, and rclpy's ActionClient drops a goal's
    feedback callback once the result has arrived.
    """
    return wait_until(lambda: len(seen := distinct_stages(feedback)) >= len(expected) and seen,
                      WAIT_S, f"feedback stages {expected}")


def text_of(feedback) -> str:
    return "".join(fb.text_delta for fb in list(feedback))


def test_latest_frame_goal_succeeds_with_the_frame_header_and_answer(make_node):
    n = make_node(script=lambda r: Script(deltas=["The ", "aisle ", "is clear."]))
    stamp = n.publish()
    n.wait_frames(1)
    status, result = n.ask(prompt="Is the aisle clear?")
    assert status == GoalStatus.STATUS_SUCCEEDED
    assert result.answer == "The aisle is clear."
    assert result.header.frame_id == "camera"
    assert result.header.stamp.sec * NS + result.header.stamp.nanosec == stamp
    assert (result.image_width, result.image_height) == (64, 48)
    assert result.task == "vqa" and result.output_tokens == 3
    assert len(n.engine.requests[0].images) == 1
    on_topic = n.wait_result(lambda r: r.goal_id == result.goal_id)
    assert on_topic.answer == result.answer


@pytest.mark.parametrize("source, expected", [
    (Goal.SOURCE_LATEST, ["queued", "waiting_for_image", "preprocessing", "generating"]),
    (Goal.SOURCE_NEXT, ["queued", "waiting_for_image", "preprocessing", "generating"]),
    (Goal.SOURCE_CLIP, ["queued", "preprocessing", "generating"]),
])
def test_feedback_stages_follow_the_documented_order_per_source(make_node, source, expected):
    n = make_node({"image.clip_fps": 4.0, "image.clip_duration_s": 1.0, "image.max_age_s": 0.0})
    now = n.side.now_ns()
    for k in range(5):  # a 4 fps second of frames, newest now
        n.publish(now - (4 - k) * NS // 4)
    n.wait_frames(5)
    feedback: list = []
    handle = n.send(feedback, prompt="What happens?", source=source, wait_for_image_s=2.0)
    if source == Goal.SOURCE_NEXT:  # the frame it waits for, once it waits
        stages(feedback, ["queued", "waiting_for_image"])
        n.publish()
    assert stages(feedback, expected) == expected
    status, _ = n.result(handle)
    assert status == GoalStatus.STATUS_SUCCEEDED


def test_goal_image_source_uses_the_goal_image(make_node):
    from inprocess_node import image_msg

    n = make_node()
    feedback: list = []
    handle = n.send(feedback, prompt="What is this?", source=Goal.SOURCE_GOAL_IMAGE,
                    image=image_msg(5 * NS, width=32, height=24, frame_id="goal"))
    expected = ["queued", "preprocessing", "generating"]
    assert stages(feedback, expected) == expected
    status, result = n.result(handle)
    assert status == GoalStatus.STATUS_SUCCEEDED
    assert result.header.frame_id == "goal" and result.image_width == 32


def test_cancel_aborts_the_engine_request_and_keeps_the_partial_text(make_node):
    n = make_node(script=lambda r: Script(deltas=["word "], delay_s=0.01, endless=True))
    n.publish()
    n.wait_frames(1)
    feedback: list = []
    handle = n.send(feedback, prompt="Describe at length.")
    wait_until(lambda: len(text_of(feedback)) >= 20, WAIT_S, "20 characters of feedback")
    handle.cancel_goal_async()
    status, result = n.result(handle)
    assert status == GoalStatus.STATUS_CANCELED
    assert result.error_code == ErrorCode.CANCELLED
    assert result.finish_reason == FinishReason.CANCELLED.value
    assert result.output_tokens > 0 and result.raw_text.startswith("word word")
    assert n.engine.aborted == [n.engine.requests[0].request_id]
    assert not n.engine.running


def test_the_engine_warm_up_is_routed_as_the_default_camera(make_node):
    n = make_node({"engine.session_key": "robot7"})
    assert n.engine.warm_up_session_key == "robot7/default" == n.node.pipeline.session_key()


def test_a_cancelled_goal_still_shows_its_frame_on_the_annotated_image(make_node):
    """A viewer (the console, rqt) sees what every goal looked at, answered or not."""
    from inprocess_node import image_msg

    n = make_node(script=lambda r: Script(deltas=["word "], delay_s=0.01, endless=True))
    drawn: queue.Queue = queue.Queue()
    n.side.node.create_subscription(Image, "/cosmos_reason/annotated_image", drawn.put, 5)
    wait_until(lambda: n.node.outputs.annotated.get_subscription_count(), WAIT_S,
               "the node sees the annotated image's subscription")
    feedback: list = []
    handle = n.send(feedback, prompt="Describe at length.", source=Goal.SOURCE_GOAL_IMAGE,
                    image=image_msg(7 * NS, width=64, height=48, frame_id="goal"))
    wait_until(lambda: len(text_of(feedback)) >= 20, WAIT_S, "20 characters of feedback")
    handle.cancel_goal_async()
    status, _ = n.result(handle)
    assert status == GoalStatus.STATUS_CANCELED
    image = drawn.get(timeout=WAIT_S)  # published before the result
    assert (image.header.frame_id, image.header.stamp.sec) == ("goal", 7)
    assert (image.width, image.height) == (64, 48)


def test_goal_timeout_during_generation_returns_what_was_generated(make_node):
    n = make_node(script=lambda r: Script(deltas=["tok "], delay_s=0.01, endless=True))
    n.publish()
    n.wait_frames(1)
    status, result = n.ask(prompt="Talk.", timeout_s=0.5)
    assert status == GoalStatus.STATUS_ABORTED
    assert result.error_code == ErrorCode.TIMEOUT
    assert "timed out during generation after" in result.error_message
    assert result.output_tokens > 0 and "tok tok" in result.raw_text
    assert n.engine.aborted


def test_engine_error_mid_stream_is_engine_error_with_partial_text(make_node):
    n = make_node(script=lambda r: Script(deltas=["half ", "an "],
                                          error=EngineError("worker died")))
    n.publish()
    n.wait_frames(1)
    status, result = n.ask(prompt="Go on.")
    assert status == GoalStatus.STATUS_ABORTED
    assert result.error_code == ErrorCode.ENGINE_ERROR and "worker died" in result.error_message
    assert result.raw_text == "half an "


def test_latest_frame_older_than_max_age_is_image_too_old(make_node):
    n = make_node({"image.max_age_s": 1.0})
    n.publish(n.side.now_ns() - 3 * NS)
    n.wait_frames(1)
    status, result = n.ask(prompt="Now?")
    assert status == GoalStatus.STATUS_ABORTED
    assert result.error_code == ErrorCode.IMAGE_TOO_OLD
    assert "max_image_age_s=1" in result.error_message
    assert not n.engine.requests


def test_clip_after_the_camera_stopped_is_image_too_old(make_node):
    n = make_node({"image.max_age_s": 1.0, "image.clip_fps": 4.0})
    old = n.side.now_ns() - 20 * NS
    for k in range(8):
        n.publish(old + k * NS // 4)
    n.wait_frames(8)
    status, result = n.ask(prompt="What happened?", source=Goal.SOURCE_CLIP,
                           clip_duration_s=2.0)
    assert status == GoalStatus.STATUS_ABORTED
    assert result.error_code == ErrorCode.IMAGE_TOO_OLD
    assert "clip's newest frame" in result.error_message


def test_clip_sends_a_video_of_the_recent_frames(make_node):
    n = make_node({"image.clip_fps": 4.0})
    now = n.side.now_ns()
    stamps = [n.publish(now - (7 - k) * NS // 4) for k in range(8)]
    n.wait_frames(8)
    status, result = n.ask(prompt="What happened?", source=Goal.SOURCE_CLIP,
                           clip_duration_s=2.0)
    assert status == GoalStatus.STATUS_SUCCEEDED
    video = n.engine.requests[0].video
    assert video is not None and len(video.frames) == 8
    got = [s.sec * NS + s.nanosec for s in result.frame_stamps]
    assert got == stamps


def test_next_waits_for_a_frame_after_acceptance(make_node):
    n = make_node()
    n.publish()
    n.wait_frames(1)
    feedback: list = []
    handle = n.send(feedback, prompt="Next?", source=Goal.SOURCE_NEXT, wait_for_image_s=3.0)
    stages(feedback, ["queued", "waiting_for_image"])  # it waits: the frame comes after
    later = n.publish()
    status, result = n.result(handle)
    assert status == GoalStatus.STATUS_SUCCEEDED
    assert result.header.stamp.sec * NS + result.header.stamp.nanosec == later


def test_next_without_a_new_frame_is_no_image(make_node):
    n = make_node()
    n.publish()
    n.wait_frames(1)
    status, result = n.ask(prompt="Next?", source=Goal.SOURCE_NEXT, wait_for_image_s=0.2)
    assert result.error_code == ErrorCode.NO_IMAGE and "no new frame" in result.error_message


@pytest.mark.parametrize("fields, fragment", [
    ({"max_tokens": -5}, "max_tokens=-5"),
    ({"source": 7}, "source=7 is unknown"),
    ({"clip_fps": 60.0, "source": Goal.SOURCE_CLIP}, "clip_fps=60"),
    ({"timeout_s": -1.0}, "timeout_s=-1"),
])
def test_bad_fields_are_bad_request_naming_the_field_with_the_task_filled(
        make_node, fields, fragment):
    n = make_node()
    status, result = n.ask(prompt="Q?", **fields)
    assert status == GoalStatus.STATUS_ABORTED
    assert result.error_code == ErrorCode.BAD_REQUEST and fragment in result.error_message
    assert result.task == "vqa"
    assert not n.engine.requests


def test_goals_over_the_bounds_are_rejected_and_reported_on_results(make_node):
    n = make_node({"limits.max_concurrent_goals": 1, "limits.max_queued_goals": 1},
                  script=lambda r: Script(deltas=["x"], delay_s=0.05, endless=True))
    n.publish()
    n.wait_frames(1)
    first = n.send(prompt="busy")
    second = n.send(prompt="queued")
    third = n.send(prompt="over")
    assert first.accepted and second.accepted and not third.accepted
    refusal = n.wait_result(lambda r: r.error_code == ErrorCode.OVERLOADED)
    assert refusal.prompt == "over"
    first.cancel_goal_async()
    second.cancel_goal_async()
    assert n.result(first)[0] == GoalStatus.STATUS_CANCELED
    assert n.result(second)[0] == GoalStatus.STATUS_CANCELED


def test_feedback_is_throttled_to_the_rate_and_loses_no_text(make_node):
    n = make_node({"limits.feedback_rate_hz": 5.0},
                  script=lambda r: Script(deltas=[f"{i} " for i in range(60)], delay_s=0.01))
    n.publish()
    n.wait_frames(1)
    feedback: list = []
    handle = n.send(feedback, prompt="Count.")
    text = "".join(f"{i} " for i in range(60))
    # Before the result (see stages()); never complete if text was lost.
    wait_until(lambda: text_of(feedback) == text, WAIT_S, "feedback text equal to the deltas")
    status, result = n.result(handle)
    assert status == GoalStatus.STATUS_SUCCEEDED and result.raw_text == text
    with_text = [fb for fb in feedback if fb.text_delta]
    assert 2 <= len(with_text) <= 8  # ~0.6 s of deltas at 5 Hz, not 60 messages


def test_feedback_of_many_goals_shares_the_total_rate_and_loses_no_text(make_node):
    # Every action client decodes every goal's feedback: 5 goals at 10 Hz each would send
    # ~60 text messages in 1.2 s; the total cap (5 Hz) allows ~6 plus each goal's first.
    n = make_node({"limits.feedback_rate_hz": 10.0, "limits.feedback_total_rate_hz": 5.0,
                   "limits.max_concurrent_goals": 5},
                  script=lambda r: Script(deltas=[f"{i} " for i in range(60)], delay_s=0.02))
    n.publish()
    n.wait_frames(1)
    # Feedback may trail the result, and the client's callbacks drop what does: the feedback
    # topic's own subscriber sees all of it (feedback_of waits until none is on the way).
    n.watch_feedback()
    handles = [n.send(prompt="Count.") for _ in range(5)]
    longest_s = 0.0
    for handle in handles:
        status, result = n.result(handle)
        assert status == GoalStatus.STATUS_SUCCEEDED
        longest_s = max(longest_s, result.total_s)
    text = "".join(f"{i} " for i in range(60))
    feedbacks = [n.feedback_of(handle) for handle in handles]
    assert all(text_of(f) == text for f in feedbacks), [text_of(f) for f in feedbacks]
    # At most the total rate over the goals' own span (however long the machine made it),
    # plus each goal's first and last; each goal at its own 10 Hz would give ~4x that.
    with_text = sum(1 for f in feedbacks for fb in f if fb.text_delta)
    allowed = math.ceil(5.0 * longest_s) + 2 * len(handles)
    assert 5 <= with_text <= allowed, (with_text, allowed, longest_s)


@pytest.mark.parametrize("level, expected", [
    (Goal.FEEDBACK_ALL, "stages and text"), (Goal.FEEDBACK_STAGES, "stages"),
    (Goal.FEEDBACK_NONE, "nothing")])
def test_a_goal_gets_the_feedback_it_asked_for(make_node, level, expected):
    n = make_node(script=lambda r: Script(deltas=["a ", "b ", "c"], delay_s=0.01))
    n.publish()
    n.wait_frames(1)
    n.watch_feedback()  # sees feedback that trails the result, which the client drops
    handle = n.send(prompt="Say it.", feedback=level)
    status, result = n.result(handle)
    assert status == GoalStatus.STATUS_SUCCEEDED and result.answer == "a b c"
    feedback = n.feedback_of(handle)  # all of it: none is left on the way
    stages_seen = [fb.stage for fb in feedback if not fb.text_delta]
    text = text_of(feedback)
    got = {("queued", "a b c"): "stages and text", ("queued", ""): "stages",
           (None, ""): "nothing"}.get((stages_seen[0] if stages_seen else None, text))
    assert got == expected, (stages_seen, text)
    if level != Goal.FEEDBACK_NONE:
        assert stages_seen == ["queued", "waiting_for_image", "preprocessing", "generating"]


def test_diagnostics_count_outcomes(make_node):
    n = make_node(script=lambda r: Script(deltas=["ok"]))
    n.publish()
    n.wait_frames(1)
    n.ask(prompt="one")
    n.ask(prompt="")  # refused: empty prompt
    from cosmos_reason_ros.ros.diagnostics import node_status

    values = {kv.key: kv.value for kv in node_status(n.node.report()).values}
    assert values["goals_succeeded"] == "1" and values["goals_rejected"] == "1"
    assert values["engine_state"] == "ready" and values["frames_received"] == "1"
    assert values["ttft_p50_s"] != ""


def test_diagnostics_name_the_node_by_its_path_and_an_engine_problem_is_an_error(make_node):
    from cosmos_reason_ros.ros.diagnostics import node_status

    n = make_node()
    n.publish()
    n.wait_frames(1)
    status = node_status(n.node.report())
    assert status.name == "/cosmos_reason: visual reasoning"
    assert status.level == DiagnosticStatus.OK, status.message
    rejected = "http://server:8000/v1 returned HTTP 401: API key rejected; check CR_KEY"
    n.engine.problems = (rejected,)
    status = node_status(n.node.report())
    assert status.level == DiagnosticStatus.ERROR and rejected in status.message
    values = {kv.key: kv.value for kv in status.values}
    assert values["engine_state"] == "ready"


def test_runtime_parameter_keeps_its_type_and_reaches_the_goal_path(make_node):
    n = make_node()
    result = n.node.set_parameters([Parameter("prefill.ready_frame_within_s", value=0.25)])
    assert result[0].successful
    assert n.node.pipeline.settings.ready_frame_within_s == 0.25


def test_goal_timeout_while_queued_names_the_slot_wait(make_node):
    n = make_node({"limits.max_concurrent_goals": 1},
                  script=lambda r: Script(deltas=["x"], delay_s=0.02, endless=True))
    n.publish()
    n.wait_frames(1)
    filler = n.send(prompt="long")
    n.engine.wait_generating(1)  # it holds the one slot
    status, result = n.ask(prompt="short", timeout_s=0.3)
    assert status == GoalStatus.STATUS_ABORTED and result.error_code == ErrorCode.TIMEOUT
    assert "goal timed out while waiting for a free slot" in result.error_message
    filler.cancel_goal_async()
    assert n.result(filler)[0] == GoalStatus.STATUS_CANCELED


def test_50_goals_cancelled_at_once_all_end_canceled_and_every_request_is_aborted(make_node):
    n = make_node({"limits.max_concurrent_goals": 50, "limits.max_queued_goals": 0},
                  # 10 tokens/s a goal: faster streams (5,000 tokens/s in all) starved the
                  # admission of the last goals on a loaded 2-core CI machine.
                  script=lambda r: Script(deltas=["x"], delay_s=0.1, endless=True))
    n.publish()
    n.wait_frames(1)
    handles = [n.send(prompt=f"long {i}") for i in range(50)]
    assert all(h.accepted for h in handles)
    # Every goal has a token or more. Generous: a loaded machine admits 50 goals slowly.
    n.engine.wait_generating(50, timeout_s=60.0)
    for h in handles:
        h.cancel_goal_async()
    results = [n.result(h) for h in handles]
    assert [s for s, _ in results] == [GoalStatus.STATUS_CANCELED] * 50
    assert all(r.error_code == ErrorCode.CANCELLED and r.output_tokens > 0 for _, r in results)
    assert sorted(n.engine.aborted) == sorted(r.request_id for r in n.engine.requests)
    assert not n.engine.running


def test_degenerate_boxes_stay_in_the_result_and_are_counted_in_diagnostics(make_node):
    from cosmos_reason_ros.ros.diagnostics import node_status

    answer = '[{"bbox_2d": [100, 100, 300, 400], "label": "cup"}, ' \
             '{"bbox_2d": [500, 500, 500, 600], "label": "line"}]'
    n = make_node(script=lambda r: Script(deltas=[answer]))
    n.publish()
    n.wait_frames(1)
    status, result = n.ask(task="ground", targets=["cup", "line"])
    assert status == GoalStatus.STATUS_SUCCEEDED
    assert [b.degenerate for b in result.boxes] == [False, True]
    values = {kv.key: kv.value for kv in node_status(n.node.report()).values}
    assert values["detections_left_out"] == "1"
