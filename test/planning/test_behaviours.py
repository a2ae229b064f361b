"""The py_trees behaviours against the real node in-process, on the scripted engine.

Ticked by a real py_trees tree through the package's ``ReasonClient``: RUNNING while the goal
runs (a ``Gate`` holds the engine's stream, so "running" is arranged, not raced), then SUCCESS
or FAILURE from the result; Verify's three outcomes; what lands on the blackboard; preemption
and the behaviour's own timeout cancel the goal and the engine request is aborted. Timeouts
run on a fake clock that the test advances.
"""

from __future__ import annotations

import math

import pytest

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
py_trees = pytest.importorskip("py_trees", reason="needs py-trees (make setup)")
from fake_engine import Gate, Script, answers_the_task  # noqa: E402
from geometry_msgs.msg import PoseStamped  # noqa: E402
from inprocess_node import InProcessNode  # noqa: E402
from py_trees.common import Status  # noqa: E402
from waiting import NEVER_S, wait_until  # noqa: E402

from cosmos_reason_interfaces.msg import Box2D, ReasoningResult  # noqa: E402
from cosmos_reason_ros.client import ReasonClient, ReasonResult, ResultBox  # noqa: E402
from cosmos_reason_ros.core.types import EngineError, ErrorCode  # noqa: E402
from cosmos_reason_ros.planning.behaviours import (  # noqa: E402
    Ask,
    Count,
    Ground,
    Point,
    Verify,
    WaitUntilSeen,
    pose_of,
    positions_of,
)

pytestmark = [pytest.mark.ros]
WIDTH, HEIGHT = 64, 48  # the in-process node's test frames


class FakeClock:
    """Monotonic seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def node():
    n = InProcessNode(script=answers_the_task)
    n.publish()
    n.wait_frames(1)
    yield n
    n.close()


@pytest.fixture(scope="module")
def client(node):
    with ReasonClient(context=node.context) as c:
        yield c


@pytest.fixture(autouse=True)
def fresh_blackboard(node):
    node.engine.script = answers_the_task
    py_trees.blackboard.Blackboard.clear()
    yield
    py_trees.blackboard.Blackboard.clear()


@pytest.fixture
def gate():
    """A gate for the engine's streams, released at the end whatever the test's outcome."""
    held = Gate()
    yield held
    held.release()


def answering(text: str):
    return lambda _request: Script(deltas=[text])


def tick_until_done(tree_or_behaviour, what: str) -> Status:
    """Tick until the root is no longer RUNNING; return its status."""
    def done():
        if isinstance(tree_or_behaviour, py_trees.trees.BehaviourTree):
            tree_or_behaviour.tick()
            status = tree_or_behaviour.root.status
        else:
            tree_or_behaviour.tick_once()
            status = tree_or_behaviour.status
        return status if status != Status.RUNNING else None
    return wait_until(done, NEVER_S, what)


def board(key: str):
    return py_trees.blackboard.Blackboard.get(key)


def test_a_behaviour_runs_while_its_goal_generates_then_succeeds(node, client, gate):
    node.engine.script = lambda r: Script(deltas=["The aisle ", "is clear."], gate=gate)
    ask = Ask("describe", "Describe the aisle.", client=client, answer_key="aisle/answer")
    ask.tick_once()
    assert ask.status == Status.RUNNING
    [request_id] = node.engine.wait_generating(1)
    ask.tick_once()  # the goal is held at the gate: still running, the tick did not wait
    assert ask.status == Status.RUNNING and not py_trees.blackboard.Blackboard.exists(
        "/aisle/answer")
    gate.release()
    assert tick_until_done(ask, "Ask ends") == Status.SUCCESS
    assert board("/aisle/answer") == "The aisle is clear."
    assert ask.result.ok and request_id not in node.engine.aborted


@pytest.mark.parametrize(("answer", "status", "verdict"), [
    ('{"answer": "yes", "reason": "Nothing on the floor."}', Status.SUCCESS, "yes"),
    ('{"answer": "no", "reason": "A pallet blocks the aisle."}', Status.FAILURE, "no"),
    ("I cannot tell from this view.", Status.FAILURE, "unsure"),
])
def test_verify_yes_succeeds_no_and_unsure_fail_with_the_reason(node, client, answer, status,
                                                                verdict):
    node.engine.script = answering(answer)
    check = Verify("aisle clear?", "The aisle ahead is clear.", client=client,
                   verdict_key="aisle/verdict", reason_key="aisle/reason")
    assert tick_until_done(check, "Verify ends") == status
    assert board("/aisle/verdict") == verdict
    reason = {"yes": "Nothing on the floor.", "no": "A pallet blocks the aisle.",
              "unsure": "I cannot tell from this view."}[verdict]
    assert board("/aisle/reason") == reason
    assert check.feedback_message == f"{verdict}: {reason}"


def test_verify_fails_with_the_nodes_error_when_the_goal_fails(node, client):
    node.engine.script = lambda r: Script(deltas=["x"], error=EngineError("backend exploded"))
    check = Verify("aisle clear?", "The aisle ahead is clear.", client=client,
                   verdict_key="aisle/verdict", result_key="aisle/result")
    assert tick_until_done(check, "Verify ends") == Status.FAILURE
    result = board("/aisle/result")
    assert isinstance(result, ReasonResult) and result.error_code == ErrorCode.ENGINE_ERROR
    assert check.feedback_message == f"goal aborted: ENGINE_ERROR: {result.error_message}"
    assert not py_trees.blackboard.Blackboard.exists("/aisle/verdict")  # no verdict was read


def test_ground_writes_boxes_in_pixels_and_no_pose_without_depth(node, client):
    find = Ground("find cup", ["red cup"], client=client, boxes_key="/cup/boxes",
                  positions_key="/cup/positions", pose_key="/cup/pose")
    assert tick_until_done(find, "Ground ends") == Status.SUCCESS
    [box] = board("/cup/boxes")
    assert isinstance(box, ResultBox) and box.label == "red cup"
    # The scripted answer is [100, 150, 400, 700] on Cosmos-Reason2's 0-1000 grid.
    assert (box.x_min, box.y_min, box.x_max, box.y_max) == pytest.approx(
        (0.1 * WIDTH, 0.15 * HEIGHT, 0.4 * WIDTH, 0.7 * HEIGHT), abs=1e-3)
    assert board("/cup/positions") == (None,)
    assert board("/cup/pose") is None


def test_ground_with_nothing_found_fails_and_says_so(node, client):
    node.engine.script = answering("[]")
    find = Ground("find cup", ["red cup"], client=client, boxes_key="cup/boxes")
    assert tick_until_done(find, "Ground ends") == Status.FAILURE
    assert board("/cup/boxes") == ()
    assert find.feedback_message.startswith("0 boxes of ['red cup']")


def test_point_and_count_write_their_results(node, client):
    point = Point("point at cup", ["red cup"], client=client, points_key="cup/points")
    count = Count("count cups", ["red cup"], client=client, count_key="cup/count",
                  min_count=1)
    root = py_trees.composites.Sequence("both", memory=True, children=[point, count])
    assert tick_until_done(py_trees.trees.BehaviourTree(root), "the sequence ends") \
        == Status.SUCCESS
    [p] = board("/cup/points")
    assert (p.x, p.y) == pytest.approx((0.25 * WIDTH, 0.4 * HEIGHT), abs=1e-3)
    assert board("/cup/count") == 1


def test_count_outside_its_bounds_fails(node, client):
    count = Count("no cups", ["red cup"], client=client, count_key="cup/count", max_count=0)
    assert tick_until_done(count, "Count ends") == Status.FAILURE
    assert board("/cup/count") == 1


def test_preemption_cancels_the_goal_and_aborts_the_engine_request(node, client, gate):
    node.engine.script = lambda r: Script(deltas=["word ", "more."], gate=gate)
    emergency = {"stop": False}

    class Emergency(py_trees.behaviour.Behaviour):
        def update(self) -> Status:
            return Status.SUCCESS if emergency["stop"] else Status.FAILURE

    check = Verify("aisle clear?", "The aisle ahead is clear.", client=client)
    root = py_trees.composites.Selector("patrol", memory=False,
                                        children=[Emergency("emergency"), check])
    tree = py_trees.trees.BehaviourTree(root)
    tree.tick()
    assert check.status == Status.RUNNING
    [request_id] = node.engine.wait_generating(1)
    emergency["stop"] = True  # the higher-priority branch takes over at the next tick
    tree.tick()
    assert root.status == Status.SUCCESS and check.status == Status.INVALID
    node.engine.wait_for(lambda e: request_id in e.aborted, NEVER_S,
                         "the preempted goal's engine request aborted")
    wait_until(lambda: not node.engine.running, NEVER_S, "the engine idle")


def test_timeout_fails_with_the_reason_and_aborts_the_engine_request(node, client, gate):
    node.engine.script = lambda r: Script(deltas=["word ", "more."], gate=gate)
    clock = FakeClock()
    check = Verify("aisle clear?", "The aisle ahead is clear.", client=client,
                   timeout_s=20.0, clock=clock, result_key="aisle/result")
    check.tick_once()
    [request_id] = node.engine.wait_generating(1)
    check.tick_once()
    assert check.status == Status.RUNNING
    clock.now += 20.0
    check.tick_once()
    assert check.status == Status.FAILURE
    assert check.feedback_message == "timed out after 20 s (timeout_s); the goal was cancelled"
    node.engine.wait_for(lambda e: request_id in e.aborted, NEVER_S,
                         "the timed-out goal's engine request aborted")
    assert not py_trees.blackboard.Blackboard.exists("/aisle/result")


def test_the_goal_carries_camera_source_schema_and_the_timeout(node, client):
    schema = {"type": "object", "properties": {"free": {"type": "boolean"}},
              "required": ["free"]}
    ask = Ask("free?", "Is the aisle free?", client=client, source="next", timeout_s=12.5,
              response_schema=schema, reasoning=True, wait_for_image_s=5.0)
    goal = ask.make_goal()
    assert (goal.task, goal.prompt, goal.source, goal.timeout_s, goal.reasoning) == \
        ("vqa", "Is the aisle free?", goal.SOURCE_NEXT, 12.5, True)
    assert goal.response_schema and '"free"' in goal.response_schema
    find = Ground("find", ["cup"], client=client, cameras=["front", "wrist"])
    assert list(find.make_goal().cameras) == ["front", "wrist"]
    # A camera the node does not have: the node's BAD_REQUEST, as the behaviour's reason.
    assert tick_until_done(find, "Ground ends") == Status.FAILURE
    assert find.feedback_message.startswith("goal aborted: BAD_REQUEST: ")


def test_bad_arguments_fail_when_the_tree_is_built(client):
    with pytest.raises(TypeError, match="cameras='front,wrist'"):
        Ask("a", "?", client=client, cameras="front,wrist")
    with pytest.raises(ValueError, match="source='ready'"):
        Ask("a", "?", client=client, source="ready")
    with pytest.raises(ValueError, match="timeout_s=0"):
        Verify("v", "x", client=client, timeout_s=0)
    with pytest.raises(ValueError, match="targets=\\[\\]"):
        Ground("g", [], client=client)
    with pytest.raises(AttributeError, match="no_such_field"):
        Ask("a", "?", client=client, no_such_field=1)
    lonely = Ask("a", "?")
    with pytest.raises(ValueError, match="no ReasonClient"):
        lonely.setup()


def test_wait_until_seen_retries_until_the_target_shows(node, client):
    answers = iter(["[]", '[{"bbox_2d": [100, 150, 400, 700], "label": "person"}]'])
    node.engine.script = lambda r: Script(deltas=[next(answers)])
    clock = FakeClock()
    seen = WaitUntilSeen("wait for a person",
                         Ground("find person", ["person"], boxes_key="person/boxes",
                                clock=clock),
                         timeout_s=60.0, period_s=2.0, clock=clock)
    tree = py_trees.trees.BehaviourTree(seen)
    tree.setup(reason_client=client)  # the py_trees way to hand the behaviours their client
    # The first attempt finds nothing: the wait goes on, and no second goal starts before
    # period_s has passed on the clock, however often the tree ticks.
    wait_until(lambda: (tree.tick(), seen.decorated.status == Status.FAILURE)[1], NEVER_S,
               "the first attempt fails")
    for _ in range(5):
        tree.tick()
        assert seen.status == Status.RUNNING and seen.decorated.status == Status.FAILURE
    assert seen.attempts == 1 and len(node.engine.requests) >= 1
    clock.now += 2.0
    assert tick_until_done(tree, "the second attempt ends") == Status.SUCCESS
    assert seen.attempts == 2
    assert [b.label for b in board("/person/boxes")] == ["person"]


def test_wait_until_seen_gives_up_at_its_timeout_cancelling_the_attempt(node, client, gate):
    node.engine.script = lambda r: Script(deltas=["word ", "more."], gate=gate)
    clock = FakeClock()
    seen = WaitUntilSeen("wait for a person", Ground("find person", ["person"], client=client,
                                                     clock=clock),
                         timeout_s=30.0, clock=clock)
    seen.tick_once()
    [request_id] = node.engine.wait_generating(1)
    clock.now += 30.0
    seen.tick_once()
    assert seen.status == Status.FAILURE and seen.decorated.status == Status.INVALID
    assert seen.feedback_message.startswith("not seen within 30 s (timeout_s, 1 attempt(s))")
    node.engine.wait_for(lambda e: request_id in e.aborted, NEVER_S,
                         "the running attempt's engine request aborted")


def _lifted_box(x: float, y: float, z: float) -> Box2D:
    box = Box2D(label="pallet", x_min=1.0, y_min=2.0, x_max=3.0, y_max=4.0, score=math.nan)
    box.position_3d.valid = True
    box.position_3d.position.x, box.position_3d.position.y, box.position_3d.position.z = x, y, z
    return box


def test_positions_and_pose_of_lifted_boxes():
    lifted = _lifted_box(0.5, -0.25, 2.0)
    # The box's axes, where the interface carries them (Position3D.orientation).
    axes = (0.0, 0.0, math.sqrt(0.5), math.sqrt(0.5))
    if hasattr(lifted.position_3d, "orientation"):
        q = lifted.position_3d.orientation
        q.x, q.y, q.z, q.w = axes
    else:
        axes = (0.0, 0.0, 0.0, 1.0)
    msg = ReasoningResult(frame_3d="camera_color_optical_frame",
                          boxes=[Box2D(label="shadow", score=math.nan), lifted])
    msg.header.stamp.sec, msg.header.stamp.nanosec = 42, 7
    result = ReasonResult.from_message("succeeded", msg)
    assert positions_of(result.boxes) == (None, (0.5, -0.25, 2.0))
    pose = pose_of(result, result.boxes)
    assert isinstance(pose, PoseStamped)
    assert pose.header.frame_id == "camera_color_optical_frame"
    assert (pose.header.stamp.sec, pose.header.stamp.nanosec) == (42, 7)
    p, q = pose.pose.position, pose.pose.orientation
    assert (p.x, p.y, p.z) == (0.5, -0.25, 2.0)
    assert (q.x, q.y, q.z, q.w) == axes
    assert pose_of(result, result.boxes[:1]) is None
