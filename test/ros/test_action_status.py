"""Finished goals leave the action status after ``limits.result_keep_s``.

Every goal the action server keeps is repeated in each status message, which every action
client decodes in Python (1 000 kept goals: ~16 ms per message on this machine). ROS 2 Humble
and Jazzy keep finished goals for 900 s by default, so a robot sending goals at a few Hz slowed
every client down more and more (measured on Jazzy: a goal's round trip 20 -> 71 ms over 1 500
goals). The engine is an unreachable server: goals end at once with ENGINE_UNAVAILABLE.
"""

from __future__ import annotations

import threading
import time

import pytest

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
from action_msgs.msg import GoalStatusArray  # noqa: E402
from node_process import NodeProcess  # noqa: E402
from rclpy.qos import qos_profile_action_status_default  # noqa: E402
from spun_node import SpunNode  # noqa: E402

from cosmos_reason_ros.client import ReasonClient  # noqa: E402
from cosmos_reason_ros.core.types import ErrorCode  # noqa: E402

pytestmark = [pytest.mark.ros]

KEEP_S = 2
STATUS_TOPIC = "/cosmos_reason/reason/_action/status"
GOALS = 20


@pytest.fixture(scope="module")
def node():
    proc = NodeProcess("cpu_demo", {"engine.kind": "openai", "model.family": "qwen3_vl",
                                    "engine.url": "http://127.0.0.1:9/v1",
                                    "engine.start_timeout_s": 1.0,
                                    "limits.result_keep_s": KEEP_S})
    proc.wait_ready(120)
    yield proc
    proc.stop_cleanly()


def test_finished_goals_leave_the_status_after_result_keep_s(node):
    side = SpunNode("action_status_probe")
    cond = threading.Condition()
    statuses: list[tuple[float, int]] = []  # (arrival, goals listed)

    def on_status(msg: GoalStatusArray) -> None:
        with cond:
            statuses.append((time.monotonic(), len(msg.status_list)))
            cond.notify_all()

    # The server's status QoS (transient local): a late-matched probe still gets the latest.
    side.node.create_subscription(GoalStatusArray, STATUS_TOPIC, on_status,
                                  qos_profile_action_status_default)
    client = ReasonClient()
    try:
        assert client.wait_for_server(30)
        deadline = time.monotonic() + 30
        while side.node.count_publishers(STATUS_TOPIC) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)  # the probe discovers the status publisher
        for _ in range(GOALS):
            result = client.ask("Anything there?", max_tokens=4)
            assert result.error_code is ErrorCode.ENGINE_UNAVAILABLE, result.error_message
        # Finished goals are listed (while younger than KEEP_S: on a slow machine the first
        # of the 20 can expire before the last ends).
        with cond:
            assert cond.wait_for(lambda: max((n for _, n in statuses), default=0) >= 2, 10), \
                statuses
        # rcl expires finished goals on a timer of result_keep_s, so a goal can stay up to
        # twice that (measured: all 20 gone 3 s after the last ended, with KEEP_S = 2).
        time.sleep(2 * KEEP_S + 1.0)
        t_late = time.monotonic()
        assert client.ask("And now?", max_tokens=4).error_code is ErrorCode.ENGINE_UNAVAILABLE
        with cond:
            assert cond.wait_for(lambda: any(t > t_late for t, _ in statuses), 10)
            late = [n for t, n in statuses if t > t_late]
        # Only the new goal (and none of the 20 finished more than KEEP_S ago) is listed.
        assert max(late) == 1, late
    finally:
        client.close()
        side.close()
