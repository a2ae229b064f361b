"""``ReasonClient`` against the real node: goals never go out before the server is discovered.

rclpy sends a goal request whether or not the action server is matched, and DDS drops a
request sent before discovery, so a client used right after it was created lost its goal and
waited out its whole timeout (issue 18). What these tests prove: fresh clients used at once
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
import time
import uuid

import pytest

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
from fake_engine import Script, answers_the_task  # noqa: E402
from inprocess_node import InProcessNode, ServedNode  # noqa: E402
from node_process import REPO_ROOT, rgb_image_msg, scene  # noqa: E402

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
    with ReasonClient(action) as client:
        t0 = time.monotonic()
        with pytest.raises(ServerUnavailableError) as caught:
            client.ground(["red cup"], timeout_s=1.0)
        elapsed = time.monotonic() - t0
    assert str(caught.value).startswith(f"action server {action} not available after 1 s")
    # It waited for the server for the call's timeout, and no "silent long wait" after it.
    assert 1.0 <= elapsed < 5.0
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
                failed.result(timeout=10.0)
        assert not handle.sent


def test_goal_cancelled_or_closed_while_waiting_for_the_server_is_never_sent():
    client = ReasonClient(missing_action())
    cancelled = client.submit(client.goal("q"), server_timeout_s=None)
    cancelled.cancel()
    result = cancelled.result(10.0)
    assert result.status == "canceled" and result.error_code is ErrorCode.CANCELLED
    assert "never sent" in result.error_message and not cancelled.sent
    pending = client.submit(client.goal("q"), server_timeout_s=None)
    client.close()  # must not leave the future hanging forever
    with pytest.raises(RuntimeError, match="closed while the goal waited"):
        pending.result(10.0)
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


def test_fresh_clients_used_at_once_get_every_goal_answered(served):
    image = rgb_image_msg(scene(320, 240, seed=5), 42_000_000_000, "goal_cam")
    fields = {"source": Goal.SOURCE_GOAL_IMAGE, "image": image, "max_tokens": 8}
    # Every way a goal leaves the client, each the first thing done with a new client.
    calls = [
        lambda c: c.ask("What is this?", timeout_s=30.0, **fields),
        lambda c: c.ground(["red cup"], timeout_s=30.0, **fields),
        lambda c: c.point(["red cup"], timeout_s=30.0, **fields),
        lambda c: c.verify("A cup is there.", timeout_s=30.0, **fields),
        lambda c: c.trajectory("Pick up the cup.", timeout_s=30.0, **fields),
        lambda c: c.run(c.goal("Describe it.", **fields), timeout_s=30.0),
        lambda c: c.run_async(c.goal("Describe it.", **fields)).result(30.0),
        lambda c: c.submit(c.goal("Describe it.", **fields)).result(30.0),
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
        assert result.ok, f"round {i}: {result.status} {result.error_message}"
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
    assert all(e.wait(60) for e in started), "not every goal started generating"
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
        results = [h.result(30) for h in handles]
        assert [(r.status, r.error_code) for r in results] == \
            [("canceled", ErrorCode.CANCELLED)] * BURST
        assert sent_from == [client._thread] * BURST


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
        assert client.run(goal, 30).ok
        assert client.run(goal, 30, on_feedback=seen.append).ok
    assert levels == [Goal.FEEDBACK_NONE, Goal.FEEDBACK_ALL]
    assert goal.feedback == Goal.FEEDBACK_ALL  # the caller's goal is left as it was
    assert "queued" in [fb.stage for fb in seen]


def readme_python_example() -> str:
    """The README's Python example, exactly as printed."""
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.index("From Python (planners, behaviour trees)")
    match = re.compile(r"```python\n(.*?)```", re.S).search(readme, section)
    assert match, "README.md: no python block after 'From Python (planners, behaviour trees)'"
    return match.group(1)


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
                             text=True, timeout=90)
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
