"""A ground goal whose answer the engine streams only as reasoning still returns its boxes.

A server started with ``--reasoning-parser qwen3`` and asked without a think prompt can put
the whole output in its reasoning channel. The goal must not succeed with "nothing found":
the boxes come back, ``parse_problems`` says where they were found, and ``/diagnostics``
warns with the count.
"""

from __future__ import annotations

import pytest

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
from action_msgs.msg import GoalStatus  # noqa: E402
from diagnostic_msgs.msg import DiagnosticStatus  # noqa: E402
from fake_engine import Script, task_answer  # noqa: E402
from inprocess_node import InProcessNode  # noqa: E402

from cosmos_reason_ros.ros.diagnostics import node_status  # noqa: E402

pytestmark = [pytest.mark.ros]


def test_boxes_only_in_the_reasoning_channel_reach_the_result_and_diagnostics():
    node = InProcessNode(script=lambda r: Script(deltas=[task_answer(r)], reasoning=True))
    try:
        node.publish()
        node.wait_frames(1)
        status, result = node.ask(task="ground", targets=["red cup"])
        assert status == GoalStatus.STATUS_SUCCEEDED
        assert [b.label for b in result.boxes] == ["red cup"]
        assert any("reasoning channel" in p for p in result.parse_problems)
        diag = node_status(node.node.report())
        values = {kv.key: kv.value for kv in diag.values}
        assert values["goals_answered_from_reasoning"] == "1"
        assert diag.level == DiagnosticStatus.WARN and "reasoning channel" in diag.message
    finally:
        node.close()
