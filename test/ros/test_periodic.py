"""Periodic runs in the fast tier: every run counted in /diagnostics is on ``~/results``.

A 20-minute soak once counted one periodic run more than it received. The node's
counters must never run ahead of the topic (a run is counted only after its result is
published), and no run may start while a goal holds the node (the soak's exact final count
rests on both). Runs are started by calling the timer's own callback, so the test decides
when they happen: after the node's ``~/results`` writer has matched the test's reader (a
result published before that never reaches a late subscriber, which is what the soak saw).
"""

from __future__ import annotations

import threading

import pytest

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
import waiting  # noqa: E402
from fake_engine import Script  # noqa: E402
from inprocess_node import InProcessNode  # noqa: E402

from cosmos_reason_interfaces.action import Reason  # noqa: E402
from cosmos_reason_ros.core.types import EngineError, ErrorCode  # noqa: E402
from cosmos_reason_ros.ros.diagnostics import node_status  # noqa: E402

pytestmark = [pytest.mark.ros]

# The timer exists (periodic.enabled) but never fires during a test unless its period is set.
MANUAL = {"periodic.enabled": True, "periodic.period_s": 3600.0,
          "periodic.prompt": "Is the aisle blocked?", "periodic.max_tokens": 4}


@pytest.fixture
def make_node():
    nodes: list[InProcessNode] = []

    def make(params=None, script=None) -> InProcessNode:
        node = InProcessNode({**MANUAL, **(params or {})}, script)
        nodes.append(node)
        return node

    yield make
    for node in nodes:
        node.close()


def wait_until(predicate, timeout_s: float = 10.0, what: str = "condition") -> None:
    waiting.wait_until(predicate, timeout_s, what)


def periodic_results(n: InProcessNode) -> list:
    with n._results_cond:
        return [r for r in n.results if r.origin == "periodic"]


def diag(n: InProcessNode) -> dict[str, str]:
    return {kv.key: kv.value for kv in node_status(n.node.report()).values}


def wait_writer_matched(n: InProcessNode) -> None:
    # The writer's own view: a result published from now on is delivered to the test's reader.
    wait_until(lambda: n.node.outputs.results.get_subscription_count() >= 1, waiting.NEVER_S,
               "~/results to match the test's subscription")


def run_once(n: InProcessNode) -> None:
    """Start one periodic run exactly as the timer does and wait until it is over."""
    before = n.node.periodic.snapshot()
    n.node.periodic.on_timer()
    wait_until(lambda: not n.node.periodic.busy.is_set(), what="the periodic run")
    assert n.node.periodic.snapshot()["skipped"] == before["skipped"], "the run was skipped"


def test_every_periodic_run_publishes_one_result_whatever_its_outcome(make_node):
    fail = threading.Event()
    n = make_node(script=lambda r: Script(deltas=["no"], error=EngineError("engine fell over")
                                          if fail.is_set() else None))
    wait_writer_matched(n)
    run_once(n)  # no frame yet: NO_IMAGE, counted failed, still published
    n.publish()
    n.wait_frames(1)
    run_once(n)  # answered
    fail.set()
    run_once(n)  # the engine fails mid-stream
    wait_until(lambda: len(periodic_results(n)) >= 3, what="three periodic results")
    codes = [r.error_code for r in periodic_results(n)]
    assert codes == [ErrorCode.NO_IMAGE, ErrorCode.OK, ErrorCode.ENGINE_ERROR]
    assert periodic_results(n)[1].answer == "no" and periodic_results(n)[1].task == "vqa"
    values = diag(n)
    assert (values["periodic_run"], values["periodic_failed"]) == ("1", "2")
    assert values["periodic_busy"] == "0" and values["periodic_unpublished"] == "0"


def test_diagnostics_count_a_periodic_run_only_once_its_result_is_published(make_node,
                                                                            monkeypatch):
    n = make_node()
    n.publish()
    n.wait_frames(1)
    wait_writer_matched(n)
    publishing, release = threading.Event(), threading.Event()
    real_publish = n.node.outputs.publish_result

    def held_publish(msg):
        publishing.set()
        assert release.wait(waiting.NEVER_S)
        real_publish(msg)

    monkeypatch.setattr(n.node.outputs, "publish_result", held_publish)
    n.node.periodic.on_timer()
    assert publishing.wait(waiting.NEVER_S)
    # The run is over but its result is not out yet: /diagnostics must not count it (the
    # soak compared a status counting it with a topic that did not have it yet).
    during = diag(n)
    assert (during["periodic_run"], during["periodic_busy"]) == ("0", "1")
    release.set()
    wait_until(lambda: not n.node.periodic.busy.is_set(), what="the periodic run")
    after = diag(n)
    assert (after["periodic_run"], after["periodic_busy"]) == ("1", "0")
    wait_until(lambda: len(periodic_results(n)) == 1, what="the periodic result")


def test_no_periodic_run_starts_while_a_goal_holds_the_node(make_node):
    # The soak's final drain: with a goal in the node and periodic_busy 0, the count is final.
    n = make_node({"periodic.period_s": 0.1})
    n.publish()
    n.wait_frames(1)
    wait_until(lambda: int(diag(n)["periodic_run"]) >= 2, what="periodic runs on the timer")
    handle = n.send(prompt="hold", source=Reason.Goal.SOURCE_NEXT, wait_for_image_s=30.0)
    assert handle.accepted
    # Accepted is not yet running: the goal holds the node once its execution took a slot.
    wait_until(lambda: (lambda d: (d["goals_active"], d["periodic_busy"]) == ("1", "0"))(
        diag(n)), what="the goal to hold the node and the last run to finish")
    held = diag(n)
    assert held["goals_active"] == "1"
    skipped = int(held["periodic_skipped"])
    wait_until(lambda: int(diag(n)["periodic_skipped"]) >= skipped + 5,
               what="the timer to fire five more times")
    now = diag(n)
    assert (now["periodic_run"], now["periodic_failed"], now["periodic_busy"]) == (
        held["periodic_run"], held["periodic_failed"], "0")
    handle.cancel_goal_async()
    n.result(handle)


def test_a_run_that_cannot_publish_is_counted_unpublished_not_run(make_node, monkeypatch):
    n = make_node()
    n.publish()
    n.wait_frames(1)
    # What the node sees when rclpy shut down while a run was generating.
    monkeypatch.setattr(n.node.context, "ok", lambda: False)
    run_once(n)
    counts = n.node.periodic.snapshot()
    assert (counts["run"], counts["failed"], counts["unpublished"]) == (0, 0, 1)
