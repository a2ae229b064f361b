"""Faults in the fast tier: what the fault drills prove with real processes, arranged in order.

A gated scripted engine (``fake_engine.Gate``) holds each goal's stream after its first delta,
so "the goal is generating when the cancel / the stop / the engine's death comes" is arranged,
not raced. The drills (test/drills/test_fault_drills.py) prove the same outcomes with vLLM
and measure how long they take; these prove the order of events on the real node in-process.
"""

from __future__ import annotations

import pytest

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
from action_msgs.msg import GoalStatus  # noqa: E402
from diagnostic_msgs.msg import DiagnosticStatus  # noqa: E402
from fake_engine import FakeEngine, Gate, Script  # noqa: E402
from inprocess_node import InProcessNode  # noqa: E402
from waiting import NEVER_S, wait_until  # noqa: E402

from cosmos_reason_ros.core.types import EngineError, ErrorCode, FinishReason  # noqa: E402

pytestmark = [pytest.mark.ros]
WAIT_S = NEVER_S  # a wait that runs out means the event never happened


@pytest.fixture
def gated():
    """Start a node whose engine answers "word ", holds at the request's gate, then "more.".

    ``gated(params, gates=k)`` returns the node and ``k`` gates: request i holds at gate i.
    """
    made: list[tuple[InProcessNode, list[Gate]]] = []

    def make(params: dict | None = None, gates: int = 1) -> tuple[InProcessNode, list[Gate]]:
        held = [Gate() for _ in range(gates)]
        engine = FakeEngine(lambda r: Script(deltas=["word ", "more."],
                                             gate=held[len(engine.requests) - 1]))
        node = InProcessNode(params, engine=engine)
        made.append((node, held))
        node.publish()
        node.wait_frames(1)
        return node, held

    yield make
    for node, held in made:
        for gate in held:
            gate.release()  # nothing left held while the node closes
        node.close()


def goal_text(feedback: list) -> str:
    return "".join(fb.text_delta for fb in feedback)


def test_cancel_of_a_generating_goal_aborts_its_engine_request(gated):
    n, [gate] = gated()
    feedback: list = []
    handle = n.send(feedback, prompt="Describe at length.")
    [request_id] = n.engine.wait_generating(1)
    # The node has the first delta (its feedback carries it) before the cancel goes out.
    wait_until(lambda: goal_text(feedback) == "word ", WAIT_S, "the first delta's feedback")
    handle.cancel_goal_async()
    status, result = n.result(handle, WAIT_S)
    assert status == GoalStatus.STATUS_CANCELED
    assert result.error_code == ErrorCode.CANCELLED
    assert result.finish_reason == FinishReason.CANCELLED.value
    assert result.raw_text == "word " and result.output_tokens == 1
    assert n.engine.aborted == [request_id]  # the cancel reached the engine, once
    assert not n.engine.running
    assert gate.held == [request_id]  # it was held there: nothing past the gate was generated


def test_goals_in_flight_when_the_node_stops_get_their_results(gated):
    n, _ = gated({"limits.max_concurrent_goals": 1})
    generating = n.send(prompt="Long.")
    [request_id] = n.engine.wait_generating(1)
    queued = n.send(prompt="Behind it.")
    assert generating.accepted and queued.accepted
    wait_until(lambda: n.node.slots.queued == 1, WAIT_S, "the second goal queued")
    join = n.stop_node()
    ended = {name: n.result(handle, WAIT_S)
             for name, handle in (("generating", generating), ("queued", queued))}
    join(WAIT_S)
    for name, (status, result) in ended.items():
        assert status == GoalStatus.STATUS_ABORTED, name
        assert result.error_code == ErrorCode.ENGINE_UNAVAILABLE, name
        assert result.error_message.startswith("node shutting down"), result.error_message
    assert "during generation" in ended["generating"][1].error_message
    assert ended["generating"][1].raw_text == "word "
    # The stop aborted the one request in the engine; the queued goal never reached it.
    assert n.engine.aborted == [request_id]
    assert [r.request_id for r in n.engine.requests] == [request_id]
    # Both results went out on ~/results too, before the node went.
    for _, result in ended.values():
        n.wait_result(lambda r, goal_id=result.goal_id: r.goal_id == goal_id, WAIT_S)


def test_engine_core_dying_mid_generation_fails_that_goal_and_refuses_the_next(gated):
    n, [gate] = gated()
    handle = n.send(prompt="Long.")
    [request_id] = n.engine.wait_generating(1)
    gate.fail(n.engine.core_died(request_id))
    status, result = n.result(handle, WAIT_S)
    assert status == GoalStatus.STATUS_ABORTED
    assert result.error_code == ErrorCode.ENGINE_UNAVAILABLE
    assert "engine core died" in result.error_message and result.raw_text == "word "
    # The node stays up and keeps answering: each later goal ends at once, refused by name,
    # without reaching the dead engine.
    for _ in range(2):
        status, after = n.ask(prompt="Still there?")
        assert status == GoalStatus.STATUS_ABORTED
        assert after.error_code == ErrorCode.ENGINE_UNAVAILABLE
        assert "engine unavailable: vllm engine core is dead" in after.error_message
    assert [r.request_id for r in n.engine.requests] == [request_id]
    wait_until(lambda: n.next_diagnostics(WAIT_S).level == DiagnosticStatus.ERROR, WAIT_S,
               "diagnostics reporting the dead engine")


def test_a_request_the_engine_cancels_unasked_fails_its_goal_with_what_was_generated():
    # A server shutting down or a router dropping the request ends its stream "cancelled"
    # although nobody cancelled the goal: its answer is cut short, never a success.
    engine = FakeEngine(lambda r: Script(deltas=["word "], finish=FinishReason.CANCELLED))
    n = InProcessNode(engine=engine)
    try:
        n.publish()
        n.wait_frames(1)
        status, result = n.ask(prompt="Long.")
        assert status == GoalStatus.STATUS_ABORTED
        assert result.error_code == ErrorCode.ENGINE_ERROR
        assert "engine cancelled the request unasked after 1 tokens" in result.error_message
        assert result.raw_text == "word " and result.finish_reason == "error"
        assert not n.engine.aborted  # nothing was asked of the engine
    finally:
        n.close()


def test_engine_error_mid_generation_fails_that_goal_and_the_next_goal_succeeds(gated):
    n, gates = gated(gates=2)
    handle = n.send(prompt="Long.")
    [request_id] = n.engine.wait_generating(1)
    gates[0].fail(EngineError(f"vllm failed serving {request_id!r}: RuntimeError: "
                              f"CUDA error: an illegal memory access was encountered"))
    status, result = n.result(handle, WAIT_S)
    assert status == GoalStatus.STATUS_ABORTED
    assert result.error_code == ErrorCode.ENGINE_ERROR
    assert "illegal memory access" in result.error_message and result.raw_text == "word "
    # A failed request leaves the engine serving: the next goal runs to its answer.
    gates[1].release()
    status, after = n.ask(prompt="Again.")
    assert status == GoalStatus.STATUS_SUCCEEDED and after.answer == "word more."
    assert len(n.engine.requests) == 2 and not n.engine.aborted
