"""The generated interfaces load in rclpy and a Reason goal round-trips over real DDS."""

from __future__ import annotations

import threading

import pytest

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
from rclpy.action import ActionClient, ActionServer  # noqa: E402
from rclpy.executors import MultiThreadedExecutor  # noqa: E402
from waiting import DISCOVERY_S, NEVER_S  # noqa: E402

from cosmos_reason_interfaces.action import Reason  # noqa: E402
from cosmos_reason_interfaces.msg import Box2D, ReasoningResult  # noqa: E402
from cosmos_reason_ros.core.types import ErrorCode  # noqa: E402

pytestmark = pytest.mark.ros


def test_error_code_constants_match_core_error_codes():
    for code in ErrorCode:
        assert getattr(ReasoningResult, code.name) == code.value, code.name


def test_goal_fields_keep_non_ascii_text_and_defaults_mean_presets():
    goal = Reason.Goal(prompt="桌子上有几个杯子？", targets=["红色杯子"])
    assert goal.prompt == "桌子上有几个杯子？"
    assert list(goal.targets) == ["红色杯子"]
    assert goal.source == Reason.Goal.SOURCE_LATEST
    assert goal.max_tokens == 0 and goal.temperature == 0.0


def test_reason_goal_round_trips_through_action_server_and_client(ros_context):
    node = rclpy.create_node("interfaces_test_server", context=ros_context)
    client_node = rclpy.create_node("interfaces_test_client", context=ros_context)
    received: dict = {}

    def execute(goal_handle):
        goal = goal_handle.request
        received["prompt"], received["targets"] = goal.prompt, list(goal.targets)
        feedback = Reason.Feedback(stage=Reason.Feedback.STAGE_GENERATING, text_delta="杯")
        goal_handle.publish_feedback(feedback)
        goal_handle.succeed()
        result = Reason.Result()
        result.result.answer = f"echo: {goal.prompt}"
        result.result.boxes = [Box2D(label=goal.targets[0], x_min=1.0, y_min=2.0,
                                     x_max=30.0, y_max=40.0)]
        result.result.error_code = ReasoningResult.OK
        return result

    server = ActionServer(node, Reason, "reason", execute)
    client = ActionClient(client_node, Reason, "reason")
    executor = MultiThreadedExecutor(context=ros_context)
    executor.add_node(node)
    executor.add_node(client_node)
    spin = threading.Thread(target=executor.spin, daemon=True)
    spin.start()
    try:
        assert client.wait_for_server(timeout_sec=DISCOVERY_S)
        feedback: list = []
        done = threading.Event()
        outcome: dict = {}

        def on_result(future):
            outcome["result"] = future.result()
            done.set()

        def on_goal(future):
            handle = future.result()
            assert handle.accepted
            handle.get_result_async().add_done_callback(on_result)

        send = client.send_goal_async(
            Reason.Goal(prompt="哪个杯子?", targets=["cup"]),
            feedback_callback=lambda msg: feedback.append(msg.feedback))
        send.add_done_callback(on_goal)
        assert done.wait(timeout=NEVER_S), "no result"
        result = outcome["result"].result.result
        assert received == {"prompt": "哪个杯子?", "targets": ["cup"]}
        assert result.answer == "echo: 哪个杯子?"
        assert result.boxes[0].label == "cup" and result.boxes[0].x_max == 30.0
        assert [f.text_delta for f in feedback] in ([], ["杯"])  # feedback is best effort
    finally:
        executor.shutdown()
        server.destroy()
        client.destroy()
        node.destroy_node()
        client_node.destroy_node()
