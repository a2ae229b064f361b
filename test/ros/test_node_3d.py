"""3D lifting through the node, fast tier: depth + CameraInfo in, 3D fields and topics out.

The real node in-process on the scripted engine; the geometry is exact (a plane at a known
depth seen through a known K), so the expected 3D positions are computed, not recorded. The
lifting estimator itself is tested in test/core/test_lifting.py.
"""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
from action_msgs.msg import GoalStatus  # noqa: E402
from fake_engine import Gate, Script  # noqa: E402
from geometry_msgs.msg import PointStamped, TransformStamped  # noqa: E402
from inprocess_node import InProcessNode  # noqa: E402
from sensor_msgs.msg import CameraInfo, Image  # noqa: E402
from visualization_msgs.msg import MarkerArray  # noqa: E402
from waiting import wait_until  # noqa: E402

from cosmos_reason_interfaces.msg import ReasoningResult  # noqa: E402
from cosmos_reason_ros.core.rgbd import CameraModel  # noqa: E402
from cosmos_reason_ros.ros.target_frame import TargetFrame  # noqa: E402

pytestmark = [pytest.mark.ros]
WAIT_S = 10.0  # generous: a wait that runs out means the event never happened
W, H = 64, 48
K = (60.0, 0.0, 32.0, 0.0, 60.0, 24.0, 0.0, 0.0, 1.0)
MODEL = CameraModel(fx=60.0, fy=60.0, cx=32.0, cy=24.0, width=W, height=H)
# Reason2 boxes are 0-1000 per axis: this one is pixels 16..48 x 12..36 of the 64x48 image.
BOX_ANSWER = '[{"bbox_2d": [250, 250, 750, 750], "label": "crate"}]'
DEPTH_3D = {"depth.enabled": True, "depth.max_skew_s": 0.05}


def depth_msg(stamp_ns: int, metres: float, width: int = W, height: int = H,
              frame_id: str = "camera") -> Image:
    mm = np.full((height, width), int(round(metres * 1000)), np.uint16)
    msg = Image(height=height, width=width, encoding="16UC1", step=width * 2, data=mm.tobytes())
    msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(stamp_ns, 1_000_000_000)
    msg.header.frame_id = frame_id
    return msg


def info_msg(frame_id: str = "camera") -> CameraInfo:
    info = CameraInfo(width=W, height=H, k=list(K), d=[0.0] * 5, distortion_model="plumb_bob")
    info.header.frame_id = frame_id
    return info


class Rig:
    """Depth and CameraInfo publishers, plus subscriptions to the 3D topics."""

    def __init__(self, n: InProcessNode) -> None:
        node = n.side.node
        self.n = n
        self.depth = node.create_publisher(Image, "/depth/image", 10)
        self.info = node.create_publisher(CameraInfo, "/camera_info", 10)
        self.markers: list[MarkerArray] = []
        self.targets: list[PointStamped] = []
        self.cond = threading.Condition()
        node.create_subscription(MarkerArray, "/cosmos_reason/markers", self._on(self.markers),
                                 10)
        node.create_subscription(PointStamped, "/cosmos_reason/target_point",
                                 self._on(self.targets), 10)
        assert n.side.wait_matched(self.depth) and n.side.wait_matched(self.info)

    def _on(self, sink: list):
        def callback(msg) -> None:
            with self.cond:
                sink.append(msg)
                self.cond.notify_all()
        return callback

    def frame(self, metres: float = 1.0, depth_skew_ns: int = 0, **depth_kwargs) -> int:
        """Publish CameraInfo, a depth frame and a colour frame; wait until all arrived."""
        stamp = self.n.side.now_ns()
        self.info.publish(info_msg())
        self.depth.publish(depth_msg(stamp + depth_skew_ns, metres, **depth_kwargs))
        self.n.publish(stamp, width=W, height=H)
        node = self.n.node

        def arrived() -> bool:
            if node.camera.depth_history.stats().received >= 1 \
                    and node.camera.camera_model() is not None \
                    and node.history.stats().received >= 1:
                return True
            # CameraInfo is best effort (as drivers publish it, with every frame): a sample
            # sent right after discovery can be lost, so it is repeated like a driver does.
            self.info.publish(info_msg())
            return False

        try:
            wait_until(arrived, WAIT_S, "depth, camera info and colour frame", poll_s=0.05)
        except AssertionError as error:
            raise AssertionError(
                f"{error}; arrived: depth={node.camera.depth_history.stats().received} "
                f"camera_info={node.camera.camera_model() is not None} "
                f"colour={node.history.stats().received}") from None
        return stamp

    def wait(self, sink: list, count: int = 1):
        with self.cond:
            assert self.cond.wait_for(lambda: len(sink) >= count, 5.0)
            return sink[-1]


@pytest.fixture
def rig():
    made = []

    def make(params=None, answer=BOX_ANSWER):
        n = InProcessNode({**DEPTH_3D, "model.family": "cosmos_reason2", **(params or {})},
                          script=lambda r: Script(deltas=[answer]))
        made.append(n)
        return Rig(n)

    yield make
    for n in made:
        n.close()


def expected_centre(metres: float) -> tuple[float, float, float]:
    return MODEL.back_project(32.0, 24.0, metres)


def test_a_box_on_a_plane_is_lifted_and_published_in_3d(rig):
    r = rig()
    stamp = r.frame(1.0)
    status, result = r.n.ask(task="ground", targets=["crate"])
    assert status == GoalStatus.STATUS_SUCCEEDED
    assert result.lift_code == ReasoningResult.LIFT_OK, result.lift_message
    assert result.frame_3d == "camera"
    assert result.depth_stamp.sec * 1_000_000_000 + result.depth_stamp.nanosec == stamp
    p = result.boxes[0].position_3d
    assert p.valid and p.status == "" and p.depth_pixels > 0
    ex, ey, ez = expected_centre(1.0)
    assert math.isclose(p.position.z, ez, abs_tol=0.005)
    assert math.isclose(p.position.x, ex, abs_tol=0.01)
    assert math.isclose(p.position.y, ey, abs_tol=0.01)
    assert math.isclose(p.size.x, 32 / 60.0, rel_tol=0.1)  # 32 px at 1 m through fx=60
    markers = r.wait(r.markers)
    cubes = [m for m in markers.markers if m.ns == "boxes"]
    assert len(cubes) == 1 and cubes[0].header.frame_id == "camera"
    assert math.isclose(cubes[0].pose.position.z, p.position.z)
    target = r.wait(r.targets)
    assert target.header.stamp.sec * 1_000_000_000 + target.header.stamp.nanosec == stamp
    assert math.isclose(target.point.z, p.position.z)


def test_depth_of_another_size_is_refused_and_the_2d_answer_stands(rig):
    r = rig()
    r.frame(1.0, width=50, height=40)
    status, result = r.n.ask(task="ground", targets=["crate"])
    assert status == GoalStatus.STATUS_SUCCEEDED and len(result.boxes) == 1
    assert result.lift_code == ReasoningResult.LIFT_BAD_DEPTH
    assert "depth image 50x40 does not fit colour image 64x48" in result.lift_message
    assert not result.boxes[0].position_3d.valid


def test_half_resolution_depth_is_registered_by_its_integer_scale(rig):
    r = rig()
    r.frame(2.0, width=W // 2, height=H // 2)
    _, result = r.n.ask(task="ground", targets=["crate"])
    assert result.lift_code == ReasoningResult.LIFT_OK, result.lift_message
    assert math.isclose(result.boxes[0].position_3d.position.z, 2.0, abs_tol=0.01)


def test_depth_from_another_frame_is_refused(rig):
    r = rig()
    r.frame(1.0, frame_id="other_camera")
    _, result = r.n.ask(task="ground", targets=["crate"])
    assert result.lift_code == ReasoningResult.LIFT_BAD_DEPTH
    assert "depth frame_id='other_camera' is not the colour frame_id='camera'" \
        in result.lift_message


def test_depth_too_far_from_the_colour_stamp_is_no_depth(rig):
    r = rig()
    r.frame(1.0, depth_skew_ns=500_000_000)
    _, result = r.n.ask(task="ground", targets=["crate"])
    assert result.lift_code == ReasoningResult.LIFT_NO_DEPTH
    assert "no depth frame within depth.max_skew_s=0.05 s" in result.lift_message


def test_the_readme_client_line_gives_the_box_centre_in_metres(rig):
    from cosmos_reason_ros.client import ReasonClient

    r = rig()
    r.frame(1.0)
    with ReasonClient() as client:
        centre = client.ground(["red cup"]).boxes[0].position_3d.position  # as README.md
    ex, ey, ez = expected_centre(1.0)
    assert math.isclose(centre.z, ez, abs_tol=0.005)
    assert math.isclose(centre.x, ex, abs_tol=0.01) and math.isclose(centre.y, ey, abs_tol=0.01)


def test_points_and_trajectories_get_3d_positions(rig):
    answer = '[{"point_2d": [500, 500], "label": "handle"}]'
    r = rig(answer=answer)
    r.frame(1.5)
    _, result = r.n.ask(task="point", targets=["handle"])
    assert result.lift_code == ReasoningResult.LIFT_OK, result.lift_message
    p = result.points[0].position_3d
    ex, ey, ez = MODEL.back_project(32.0, 24.0, 1.5)
    assert p.valid and math.isclose(p.position.z, ez, abs_tol=0.005)
    assert math.isclose(p.position.x, ex, abs_tol=0.005)
    assert math.isclose(p.position.y, ey, abs_tol=0.005)


class StandInBuffer:
    """A faithful stand-in for tf2_ros.Buffer (no tf2_ros wheel exists here): it records the
    lookup and returns a fixed transform, as ``lookup_transform(target, source, time,
    timeout)`` does."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list = []
        self.fail = fail

    def lookup_transform(self, target, source, time, timeout):
        self.calls.append((target, source, time.nanoseconds, timeout.nanoseconds))
        if self.fail:
            raise LookupError("extrapolation into the future")
        tf = TransformStamped()
        tf.header.frame_id, tf.child_frame_id = target, source
        tf.transform.translation.x = 1.0  # camera 1 m ahead of base_link, same axes
        tf.transform.rotation.w = 1.0
        return tf


@pytest.mark.parametrize("fail", [False, True])
def test_target_frame_is_looked_up_at_the_image_stamp(rig, fail):
    r = rig()
    buffer = StandInBuffer(fail)
    r.n.node.pipeline.to_target_frame = TargetFrame(r.n.node, "base_link", 0.1,
                                                    buffer=buffer).apply
    stamp = r.frame(1.0)
    _, result = r.n.ask(task="ground", targets=["crate"])
    assert buffer.calls == [("base_link", "camera", stamp, 100_000_000)]
    z = result.boxes[0].position_3d.position.z
    x = result.boxes[0].position_3d.position.x
    if fail:
        assert result.lift_code == ReasoningResult.LIFT_TF_FAILED
        assert "no transform 'camera' -> 'base_link' at the image stamp" in result.lift_message
        assert result.frame_3d == "camera" and math.isclose(z, 1.0, abs_tol=0.005)
    else:
        assert result.lift_code == ReasoningResult.LIFT_OK and result.frame_3d == "base_link"
        assert math.isclose(x, expected_centre(1.0)[0] + 1.0, abs_tol=0.01)


def test_the_depth_frame_is_kept_through_a_long_generation(rig):
    # Depth matched when the colour frame is chosen: newer depth frames evicting it from a
    # short history while the model generates must not lose it (found through the demo).
    r = rig({"depth.history_frames": 2})
    gate = Gate()  # the answer is held until the matching depth frame has left the history
    r.n.engine.script = lambda req: Script(deltas=[BOX_ANSWER], gate=gate)
    stamp = r.frame(1.0)
    handle = r.n.send(task="ground", targets=["crate"])
    r.n.engine.wait_generating(1, WAIT_S)
    for k in range(1, 5):  # newer depth frames fill the 2-frame history
        r.depth.publish(depth_msg(stamp + k * 1_000_000_000, 3.0))
    history = r.n.node.camera.depth_history
    wait_until(lambda: history.stats().evicted >= 3, WAIT_S, "the matching depth frame evicted")
    assert r.n.engine.running and gate.held  # still generating: the answer has not ended
    gate.release()
    status, result = r.n.result(handle)
    assert status == GoalStatus.STATUS_SUCCEEDED
    assert result.lift_code == ReasoningResult.LIFT_OK, result.lift_message
    assert result.depth_stamp.sec * 1_000_000_000 + result.depth_stamp.nanosec == stamp
    assert math.isclose(result.boxes[0].position_3d.position.z, 1.0, abs_tol=0.005)
