"""The patrol tree, run as a user runs it.

``reason_patrol`` (through ``python -m``, the module its console script runs) runs in a fresh
interpreter against the real node in this process (``InProcessNode``, scripted engine),
reached by the real names as a planner reaches it, with the README's arguments: without depth
it reports the obstacle's pixels; with registered depth and CameraInfo it publishes the
obstacle's pose. (The README's behaviour-tree Python block runs in
test/test_documented_python.py, with every other documented Python block.)
"""

from __future__ import annotations

import ast
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
pytest.importorskip("py_trees", reason="needs py-trees (make setup)")
from fake_engine import Script, answers_the_task, request_text  # noqa: E402
from geometry_msgs.msg import PoseStamped  # noqa: E402
from inprocess_node import InProcessNode  # noqa: E402
from patrol_process import patrol_until_a_pose  # noqa: E402
from sensor_msgs.msg import CameraInfo, Image  # noqa: E402
from waiting import NEVER_S, wait_until  # noqa: E402

from cosmos_reason_interfaces.msg import ReasoningResult  # noqa: E402
from cosmos_reason_ros.core.types import ErrorCode  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]  # starts processes: the real tier
REPO_ROOT = Path(__file__).resolve().parents[2]
W, H = 64, 48
K = (60.0, 0.0, 32.0, 0.0, 60.0, 24.0, 0.0, 0.0, 1.0)  # principal point at the image centre
# Reason2 boxes are 0-1000 per axis: pixels 16..48 x 12..36, centred on the principal point.
PALLET = '[{"bbox_2d": [250, 250, 750, 750], "label": "pallet"}]'
BLOCKED = '{"answer": "no", "reason": "A pallet blocks the aisle."}'


def readme_section() -> str:
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    start = readme.index("### Behaviour trees")
    return readme[start:readme.index("\n### ", start + 1)]


def readme_patrol_args() -> list[str]:
    for line in readme_section().splitlines():
        if line.startswith("ros2 run cosmos_reason_ros reason_patrol"):
            return shlex.split(line, comments=True)[4:]
    raise AssertionError("README.md: no 'ros2 run cosmos_reason_ros reason_patrol' line")


def blocked_aisle(request) -> Script:
    """The aisle is not clear, and the obstacle is a pallet in the middle of the image."""
    return Script(deltas=[BLOCKED if "Answer yes or no" in request_text(request) else PALLET])


@pytest.fixture
def nodes():
    made: list[InProcessNode] = []

    def make(params=None, script=answers_the_task) -> InProcessNode:
        n = InProcessNode(params, script=script)
        made.append(n)
        return n

    yield make
    for n in made:
        n.close()


def run_patrol(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cosmos_reason_ros.planning.patrol", *args],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=NEVER_S)


def test_patrol_reports_the_obstacle_in_pixels_without_depth(nodes):
    n = nodes(script=blocked_aisle)
    n.publish()
    n.wait_frames(1)
    run = run_patrol(*readme_patrol_args(), "--cycles", "1")
    assert run.returncode == 0, f"stdout:\n{run.stdout}\nstderr:\n{run.stderr[-3000:]}"
    assert run.stdout.splitlines() == [
        "cycle 1: not clear (no: A pallet blocks the aisle.); obstacle 'pallet' at pixels "
        "(16, 12, 48, 36), not lifted to 3D: no pose to publish"]
    n.wait_result(lambda m: m.task == "ground", NEVER_S)
    assert [m.task for m in n.results] == ["verify", "ground"]


def depth_msg(stamp_ns: int, metres: float) -> Image:
    mm = np.full((H, W), int(round(metres * 1000)), np.uint16)
    msg = Image(height=H, width=W, encoding="16UC1", step=W * 2, data=mm.tobytes())
    msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(stamp_ns, 1_000_000_000)
    msg.header.frame_id = "camera"
    return msg


def test_patrol_publishes_the_obstacle_pose_with_depth(nodes):
    n = nodes({"depth.enabled": True, "depth.max_skew_s": 0.05}, script=blocked_aisle)
    side = n.side.node
    depth = side.create_publisher(Image, "/depth/image", 10)
    info = side.create_publisher(CameraInfo, "/camera_info", 10)
    poses: list[PoseStamped] = []
    side.create_subscription(PoseStamped, "/reason_patrol/obstacle_pose", poses.append, 10)
    camera_info = CameraInfo(width=W, height=H, k=list(K), d=[0.0] * 5,
                             distortion_model="plumb_bob")
    camera_info.header.frame_id = "camera"

    def rgbd_frame() -> None:  # a registered RGB-D camera at 10 Hz: a plane 1 m away
        stamp = n.side.now_ns()
        info.publish(camera_info)
        depth.publish(depth_msg(stamp, 1.0))
        n.publish(stamp, width=W, height=H)

    def lifting() -> None:  # the node lifts once depth and CameraInfo have arrived
        wait_until(lambda: n.ask(task="ground", targets=["pallet"])[1].lift_code
                   == ReasoningResult.LIFT_OK, NEVER_S, "a lifted box", poll_s=0.2)

    out, _ = patrol_until_a_pose(poses, rgbd_frame, 0.1, ready=lifting)
    pose = poses[0]
    assert pose.header.frame_id == "camera"
    p, q = pose.pose.position, pose.pose.orientation
    assert (p.x, p.y, p.z) == pytest.approx((0.0, 0.0, 1.0), abs=0.02)
    assert (q.x, q.y, q.z, q.w) == (0.0, 0.0, 0.0, 1.0)
    first = out.splitlines()[0]
    assert first.startswith("cycle 1: not clear (no: A pallet blocks the aisle.); obstacle "
                            "'pallet' at pixels (16, 12, 48, 36), at (") \
        and first.endswith(" m in camera: pose published"), first
    assert all(m.error_code == ErrorCode.OK for m in n.results)


def test_reason_patrol_is_a_console_script_of_the_patrol_module():
    tree = ast.parse((REPO_ROOT / "setup.py").read_text(encoding="utf-8"))
    entries = next(ast.literal_eval(node.values[0]) for node in ast.walk(tree)
                   if isinstance(node, ast.Dict) and node.keys
                   and getattr(node.keys[0], "value", None) == "console_scripts")
    assert "reason_patrol = cosmos_reason_ros.planning.patrol:main" in entries
