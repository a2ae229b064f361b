"""``ReasonClient`` against the real node: goals never go out before the server is discovered.

rclpy sends a goal request whether or not the action server is matched, and DDS drops a
request sent before discovery, so a client used right after it was created lost its goal and
waited out its whole timeout. What these tests prove: fresh clients used at once
(each a new DDS participant: real discovery) get every goal answered by the real node; a client
of a missing node fails within its timeout naming the server; the README's Python example runs
as printed, in a fresh interpreter, against a node named ``/cosmos_reason`` fed by a camera.

Fast tier: what is tested here is the client, DDS discovery and the node's action server, not
the model, so the node is the real ``ReasonNode`` on the scripted engine
(``test/inprocess_node.py``), serving the real names: in a child process for the fresh
clients (discovery between processes, as a planner meets the node; inside one process Fast DDS
skips the transport), in this process for the README example (which runs in a child
interpreter itself). The missing-node tests need no node. One node at a time: both serve
``/cosmos_reason/reason``.
"""

from __future__ import annotations

import concurrent.futures
import re
import subprocess
import sys
import threading
import uuid
from typing import Any

import pytest

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
from fake_engine import Gate, Script, answers_the_task  # noqa: E402
from inprocess_node import InProcessNode, ServedNode  # noqa: E402
from node_process import (  # noqa: E402
    REPO_ROOT,
    readme_python_example,
    rgb_image_msg,
    scene,
)
from waiting import NEVER_S, wait_until  # noqa: E402

from cosmos_reason_interfaces.action import Reason  # noqa: E402
from cosmos_reason_ros.client import (  # noqa: E402
    ReasonClient,
    ReasonResult,
    ServerUnavailableError,
)
from cosmos_reason_ros.core.types import EngineUnavailableError, ErrorCode  # noqa: E402

pytestmark = pytest.mark.ros

Goal = Reason.Goal
FRESH_CLIENT_ROUNDS = 50  # discovery races are timing-dependent: many fresh clients, one node
LOOPS = 5


def missing_action() -> str:
    return f"/no_such_node_{uuid.uuid4().hex[:8]}/reason"


# --- no node: the clear failure ------------------------------------------------------------


def test_client_of_a_missing_node_fails_within_its_timeout_naming_the_server():
    action = missing_action()
    with ReasonClient(action) as client, concurrent.futures.ThreadPoolExecutor(1) as pool:
        call = pool.submit(client.ground, ["red cup"], timeout_s=1.0)
        # The call ends by itself: no silent wait past its timeout.
        with pytest.raises(ServerUnavailableError) as caught:
            call.result(timeout=NEVER_S)
    # It gave up on the server for the call's own timeout, and says so.
    assert str(caught.value).startswith(f"action server {action} not available after 1 s")
    assert caught.value.action_name == action and caught.value.timeout_s == 1.0
    # One of the package's errors (code ENGINE_UNAVAILABLE) and a timeout, so callers that
    # already catch the client's TimeoutError keep working.
    assert isinstance(caught.value, EngineUnavailableError)
    assert caught.value.code is ErrorCode.ENGINE_UNAVAILABLE
    assert isinstance(caught.value, concurrent.futures.TimeoutError)


def test_future_of_a_missing_node_fails_after_the_server_timeout():
    with ReasonClient(missing_action()) as client:
        handle = client.submit(client.goal("q"), server_timeout_s=0.5)
        future = client.run_async(client.goal("q"), server_timeout_s=0.5)
        for failed in (handle.future, future):
            with pytest.raises(ServerUnavailableError, match="not available after 0.5 s"):
                failed.result(timeout=NEVER_S)
        assert not handle.sent


def test_goal_cancelled_or_closed_while_waiting_for_the_server_is_never_sent():
    client = ReasonClient(missing_action())
    cancelled = client.submit(client.goal("q"), server_timeout_s=None)
    cancelled.cancel()
    result = cancelled.result(NEVER_S)
    assert result.status == "canceled" and result.error_code is ErrorCode.CANCELLED
    assert "never sent" in result.error_message and not cancelled.sent
    pending = client.submit(client.goal("q"), server_timeout_s=None)
    client.close()  # must not leave the future hanging forever
    with pytest.raises(RuntimeError, match="closed while the goal waited"):
        pending.result(NEVER_S)
    assert not pending.sent


# --- the real node (scripted engine) -----------------------------------------------------------


@pytest.fixture
def node():
    """The node in this process, answering each task in its own shape."""
    n = InProcessNode(script=answers_the_task)
    yield n
    n.close()


@pytest.fixture
def served():
    """The same node in a child process."""
    n = ServedNode()
    yield n
    assert n.stop() == 0, "\n".join(n.lines[-40:])


@pytest.mark.slow  # starts processes or waits on real time: the real tier
def test_fresh_clients_used_at_once_get_every_goal_answered(served):
    image = rgb_image_msg(scene(320, 240, seed=5), 42_000_000_000, "goal_cam")
    fields = {"source": Goal.SOURCE_GOAL_IMAGE, "image": image, "max_tokens": 8}
    # Every way a goal leaves the client, each the first thing done with a new client. The
    # calls wait longer than the client's delivery_timeout_s (30 s), so a goal lost on the way
    # fails the test as 'not_delivered' naming the lost hop, not as a bare TimeoutError.
    calls = [
        lambda c: c.ask("What is this?", timeout_s=NEVER_S, **fields),
        lambda c: c.ground(["red cup"], timeout_s=NEVER_S, **fields),
        lambda c: c.point(["red cup"], timeout_s=NEVER_S, **fields),
        lambda c: c.verify("A cup is there.", timeout_s=NEVER_S, **fields),
        lambda c: c.trajectory("Pick up the cup.", timeout_s=NEVER_S, **fields),
        lambda c: c.run(c.goal("Describe it.", **fields), timeout_s=NEVER_S),
        lambda c: c.run_async(c.goal("Describe it.", **fields)).result(NEVER_S),
        lambda c: c.submit(c.goal("Describe it.", **fields)).result(NEVER_S),
    ]

    def loop(worker: int) -> list[tuple[int, ReasonResult]]:
        done = []
        for i in range(worker, FRESH_CLIENT_ROUNDS, LOOPS):
            with ReasonClient() as client:  # a new participant: the node is not discovered yet
                done.append((i, calls[i % len(calls)](client)))
        return done

    # LOOPS loops side by side: a round is mostly waiting for DDS discovery (0.1-3 s on a
    # loaded 2-core machine), so this keeps the 50 rounds to a fraction of the time.
    with concurrent.futures.ThreadPoolExecutor(LOOPS) as pool:
        rounds = [r for done in pool.map(loop, range(LOOPS)) for r in done]
    assert len(rounds) == FRESH_CLIENT_ROUNDS
    for i, result in rounds:
        assert result.ok, f"round {i}: {result.status} {result.error_message} " \
            f"({result.delivery and result.delivery.summary()})"
        assert result.message.header.frame_id == "goal_cam"
    # Each answer was a goal of its own at the node (before the fix, none arrived at all).
    assert len({result.message.goal_id for _, result in rounds}) == FRESH_CLIENT_ROUNDS


BURST = 20


@pytest.fixture
def endless():
    """The node in this process, generating until cancelled (10 tokens a second a goal)."""
    n = InProcessNode({"limits.max_concurrent_goals": BURST, "limits.max_queued_goals": 0},
                      script=lambda r: Script(deltas=["x"], delay_s=0.1, endless=True))
    n.publish()
    n.wait_frames(1)
    yield n
    n.close()


def generating_burst(client: ReasonClient) -> list:
    started = [threading.Event() for _ in range(BURST)]
    handles = [client.submit(client.goal("Write.", max_tokens=4000),
                             lambda fb, e=e: fb.text_delta and e.set()) for e in started]
    assert all(e.wait(NEVER_S) for e in started), "not every goal started generating"
    return handles


def test_a_burst_of_cancels_goes_out_from_the_spin_thread(endless, monkeypatch):
    # From the caller's thread each cancel request waited for the GIL against the spin thread
    # decoding feedback: 50 took up to 2 s under load (docs/RELIABILITY.md, "Mass cancel").
    from rclpy.action.client import ClientGoalHandle

    sent_from: list[threading.Thread] = []
    send = ClientGoalHandle.cancel_goal_async
    monkeypatch.setattr(ClientGoalHandle, "cancel_goal_async", lambda self: (
        sent_from.append(threading.current_thread()), send(self))[1])
    with ReasonClient() as client:
        handles = generating_burst(client)
        for h in handles:
            h.cancel()
        results = [h.result(NEVER_S) for h in handles]
        assert [(r.status, r.error_code) for r in results] == \
            [("canceled", ErrorCode.CANCELLED)] * BURST
        # Each goal got a cancel, all from the spin thread (a cancel the node has not taken
        # after a second is sent again, so a loaded run may show a few more).
        assert set(sent_from) == {client._thread} and len(sent_from) >= BURST


def test_cancels_asked_for_right_before_close_still_reach_the_node(endless):
    client = ReasonClient()
    handles = generating_burst(client)
    for h in handles:
        h.cancel()
    client.close()
    ended = endless.wait_result(lambda m: sum(r.error_code == ErrorCode.CANCELLED
                                              for r in endless.results) >= BURST, 30.0)
    assert ended is not None


def test_a_goal_without_a_feedback_callback_asks_the_node_for_none(node, monkeypatch):
    from rclpy.action import ActionClient

    levels: list[int] = []
    send = ActionClient.send_goal_async
    monkeypatch.setattr(ActionClient, "send_goal_async", lambda self, goal, **kw: (
        levels.append(goal.feedback), send(self, goal, **kw))[1])
    node.publish()
    node.wait_frames(1)
    goal = ReasonClient.goal("What is here?")
    seen: list = []
    with ReasonClient() as client:
        assert client.run(goal, NEVER_S).ok
        assert client.run(goal, NEVER_S, on_feedback=seen.append).ok
    assert levels == [Goal.FEEDBACK_NONE, Goal.FEEDBACK_ALL]
    assert goal.feedback == Goal.FEEDBACK_ALL  # the caller's goal is left as it was
    assert "queued" in [fb.stage for fb in seen]


@pytest.mark.slow  # starts processes or waits on real time: the real tier
def test_readme_python_example_runs_as_printed(node):
    code = readme_python_example()
    assert "ReasonClient()" in code and "client.ground(" in code  # the block we mean
    stop = threading.Event()

    def feed_camera() -> None:  # a live camera at 10 Hz, fresh stamps
        while not stop.is_set():
            node.publish(width=640, height=480)
            stop.wait(0.1)

    camera = threading.Thread(target=feed_camera, daemon=True)
    camera.start()
    try:
        node.wait_frames(1, 30.0)  # the node has a camera frame
        before = {msg.goal_id for msg in list(node.results)}
        # A fresh interpreter, as a user would run it; the README's own default timeouts
        # (120 s) would only hide a lost goal, so the run gets a shorter limit.
        run = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True,
                             text=True, timeout=NEVER_S)
    finally:
        stop.set()
        camera.join()
    assert run.returncode == 0, f"stdout:\n{run.stdout}\nstderr:\n{run.stderr[-3000:]}"
    assert run.stdout.strip(), "the example printed nothing"
    node.wait_result(lambda m: m.task == "verify" and m.goal_id not in before, 10.0)
    node.wait_result(lambda m: m.task == "ground" and m.goal_id not in before, 10.0)
    results = [msg for msg in list(node.results) if msg.goal_id not in before]
    by_task = {msg.task: msg for msg in results}
    assert sorted(msg.task for msg in results) == ["ground", "verify"], \
        [m.task for m in results]
    for msg in results:
        assert msg.error_code == ErrorCode.OK, f"{msg.task}: {msg.error_message}"
        assert msg.header.frame_id == "camera"  # answered about the camera's frame
    assert by_task["ground"].boxes  # the engine's answer, parsed into pixels
    assert run.stdout.splitlines()[-1] == by_task["verify"].answer_json  # what it printed


# --- lost replies: the status path, repeated requests, "not delivered" -------------------------
# The goal, cancel and result replies of an action are service responses, and rmw_fastrtps
# drops a response whose writer has not matched the client's reader yet (discovery lag under
# load): the node accepted and ran the goal, the client never heard. The loss cannot be
# arranged through DDS on demand, so each test drops one hop inside the client (the callback
# that would have handled the reply, or the request itself) and shows that the client still
# ends the goal, through the action status and repeated requests, or says which hop was lost.


def drop_calls(client: ReasonClient, monkeypatch: pytest.MonkeyPatch, method: str,
               first: int | None = None) -> list[Any]:
    """Make the client ignore replies handled by ``method`` (the ``first`` ones; None: all)."""
    real = getattr(client, method)
    dropped: list[Any] = []

    def maybe_drop(flight: Any, ros_future: Any, *more: Any) -> None:
        if first is None or len(dropped) < first:
            dropped.append(ros_future)
            return
        real(flight, ros_future, *more)

    monkeypatch.setattr(client, method, maybe_drop)
    return dropped


def test_a_goal_whose_goal_response_is_lost_is_accepted_from_the_status(node, monkeypatch):
    node.publish()
    node.wait_frames(1)
    with ReasonClient() as client:
        drop_calls(client, monkeypatch, "_on_goal_response")  # every goal response "lost"
        result = client.ask("What is here?", timeout_s=NEVER_S)
    assert result.ok, f"{result.status} {result.error_message}"
    delivery = result.delivery
    assert delivery is not None
    assert (delivery.accepted_via, delivery.goal_response) == ("status", None)
    assert delivery.accepted is not None and delivery.result is not None
    assert delivery.goal_id == result.message.goal_id  # the node ran the client's goal id
    assert "via=status" in delivery.summary() and "goal_response=-" in delivery.summary()


def test_a_lost_result_response_is_asked_for_again(node, monkeypatch):
    node.publish()
    node.wait_frames(1)
    with ReasonClient() as client:
        dropped = drop_calls(client, monkeypatch, "_on_result_response", first=1)
        result = client.ask("What is here?", timeout_s=NEVER_S)
    assert result.ok, f"{result.status} {result.error_message}"
    assert len(dropped) == 1
    assert result.delivery is not None and result.delivery.result_requests >= 2
    assert result.delivery.ended is not None  # the repeat came from the status's "ended"


def test_a_result_that_never_arrives_ends_not_delivered_naming_the_hop(node, monkeypatch):
    node.publish()
    node.wait_frames(1)
    with ReasonClient(delivery_timeout_s=3.0) as client:
        drop_calls(client, monkeypatch, "_on_result_response")  # every result response "lost"
        result = client.ask("What is here?", timeout_s=NEVER_S)
    assert (result.status, result.error_code) == ("not_delivered", ErrorCode.NOT_DELIVERED)
    assert not result.ok
    assert result.error_message.startswith("result response not delivered: the goal ended "
                                           "(succeeded in /cosmos_reason/reason/_action/status)")
    requests = int(re.search(r"after (\d+) result requests", result.error_message).group(1))
    assert requests >= 2  # asked again before giving up
    delivery = result.delivery
    assert delivery is not None and delivery.result is None and delivery.ended is not None
    assert delivery.result_requests == requests
    assert result.message.goal_id == delivery.goal_id


def test_an_accepted_goal_whose_end_never_shows_ends_not_delivered_after_its_limit(
        node, monkeypatch):
    # The connection lost after the acceptance: neither the status nor a result response
    # reaches the client again. The goal's own time limit bounds the wait.
    node.publish()
    node.wait_frames(1)
    with ReasonClient(delivery_timeout_s=1.0) as client:
        monkeypatch.setattr(client._client, "status_observer", lambda msg: None)
        drop_calls(client, monkeypatch, "_on_result_response")
        goal = ReasonClient.goal("What is here?", timeout_s=1.0)
        result = client.run(goal, timeout_s=NEVER_S)  # it ends after ~2 s
    assert (result.status, result.error_code) == ("not_delivered", ErrorCode.NOT_DELIVERED)
    assert result.error_message.startswith("result not delivered: the goal was accepted ")
    assert "its time limit (timeout_s=1) has passed" in result.error_message
    delivery = result.delivery
    assert delivery is not None and delivery.accepted is not None
    assert (delivery.ended, delivery.result) == (None, None)


@pytest.fixture
def deaf_server():
    """An action server that is discovered but never takes a request: its node never spins.

    To the client this is a goal request lost on the way (or a node too stuck to take it):
    no goal response, and the goal never in the status.
    """
    from rclpy.action import ActionServer
    from rclpy.context import Context

    context = Context()
    rclpy.init(context=context)
    server_node = rclpy.create_node("deaf_server", context=context)
    action = missing_action()
    server = ActionServer(server_node, Reason, action,
                          execute_callback=lambda goal_handle: Reason.Result())
    yield action
    server.destroy()
    server_node.destroy_node()
    rclpy.try_shutdown(context=context)


def test_a_goal_never_seen_by_the_server_ends_not_delivered_naming_the_hop(deaf_server):
    with ReasonClient(deaf_server, delivery_timeout_s=1.0) as client:
        handle = client.submit(client.goal("q"), server_timeout_s=30.0)
        result = handle.result(NEVER_S)  # it ends after delivery_timeout_s
        assert handle.sent  # the server was discovered and the request went out
    assert (result.status, result.error_code) == ("not_delivered", ErrorCode.NOT_DELIVERED)
    assert result.error_message.startswith(
        "goal request not delivered: no goal response and the goal id never appeared in "
        f"{deaf_server}/_action/status within 1.0 s (")
    delivery = result.delivery
    assert delivery is not None
    assert (delivery.accepted, delivery.accepted_via, delivery.result_requests) == (None, "", 0)
    assert delivery.goal_requests >= 2  # sent again before giving up
    assert f"({delivery.goal_requests} goal requests)" in result.error_message


def test_a_client_held_past_its_delivery_timeout_asks_again_before_giving_up(deaf_server,
                                                                             monkeypatch):
    # The client's own process held (frozen, starved): a deadline that ran out while it could
    # take no reply is not held against the transport. Held here right after its first goal
    # request, on its spin thread, for three delivery timeouts.
    with ReasonClient(deaf_server, delivery_timeout_s=1.0) as client:
        real = client._send_goal_request

        def send_then_hold(flight):
            real(flight)
            if flight.goal_requests == 1:
                threading.Event().wait(3.0)  # bound: the hold itself, 3 delivery timeouts

        monkeypatch.setattr(client, "_send_goal_request", send_then_hold)
        handle = client.submit(client.goal("q"), server_timeout_s=30.0)
        result = handle.result(NEVER_S)  # it ends a delivery timeout after the hold
    assert (result.status, result.error_code) == ("not_delivered", ErrorCode.NOT_DELIVERED)
    assert result.delivery is not None
    # Without the hold credited: not delivered at the first look after it, one request sent.
    assert result.delivery.goal_requests >= 2, result.delivery.summary()


def test_a_feedback_callback_that_raises_loses_no_goal(node):
    node.publish()
    node.wait_frames(1)
    calls: list[Any] = []

    def broken(feedback: Any) -> None:
        calls.append(feedback)
        raise ValueError("the caller's bug")

    # Held generating until the callback has run: a goal that ended first may have its result
    # reach the client before any feedback (a CI run saw no callback at all).
    gate = Gate()
    node.engine.script = lambda request: Script(gate=gate)
    with ReasonClient() as client:
        first = client.submit(client.goal("What is here?", feedback=Goal.FEEDBACK_STAGES), broken)
        wait_until(lambda: calls, NEVER_S, "the feedback callback")  # it ran, and raised
        gate.release()
        assert first.result(NEVER_S).ok  # its own result still comes
        assert client.ask("And now?", timeout_s=NEVER_S).ok  # the client still serves goals


def test_a_lost_goal_request_is_sent_again_with_the_same_id(node, monkeypatch):
    from rclpy.action import ActionClient
    from rclpy.task import Future

    sent: list[Any] = []
    send = ActionClient.send_goal_async

    def lose_the_first(self: Any, goal: Any, **kwargs: Any) -> Any:  # never reaches the node
        sent.append(bytes(kwargs["goal_uuid"].uuid))
        return Future() if len(sent) == 1 else send(self, goal, **kwargs)

    monkeypatch.setattr(ActionClient, "send_goal_async", lose_the_first)
    node.publish()
    node.wait_frames(1)
    with ReasonClient() as client:
        result = client.ask("What is here?", timeout_s=NEVER_S)
    assert result.ok, f"{result.status} {result.error_message}"
    assert len(sent) >= 2 and len(set(sent)) == 1  # one goal, asked for again
    assert result.delivery is not None and result.delivery.goal_requests == len(sent)
    assert result.message.goal_id == sent[0].hex()  # the node ran the client's goal id


def test_a_lost_cancel_request_is_sent_again_until_the_status_shows_it(endless, monkeypatch):
    from rclpy.action.client import ClientGoalHandle
    from rclpy.task import Future

    calls: list[Any] = []
    send = ClientGoalHandle.cancel_goal_async

    def lose_the_first(self: Any) -> Any:  # the first cancel request never reaches the node
        calls.append(self)
        return Future() if len(calls) == 1 else send(self)

    monkeypatch.setattr(ClientGoalHandle, "cancel_goal_async", lose_the_first)
    generating = threading.Event()
    with ReasonClient() as client:
        handle = client.submit(client.goal("Write.", max_tokens=4000),
                               lambda fb: fb.text_delta and generating.set())
        assert generating.wait(NEVER_S), "the goal did not start generating"
        handle.cancel()
        result = handle.result(NEVER_S)  # without the repeat the goal would generate on
    assert (result.status, result.error_code) == ("canceled", ErrorCode.CANCELLED)
    assert result.delivery is not None and result.delivery.cancel_requests >= 2
    assert len(calls) >= 2


def test_delivery_timeout_must_be_positive():
    with pytest.raises(ValueError, match="delivery_timeout_s=0"):
        ReasonClient(missing_action(), delivery_timeout_s=0)
