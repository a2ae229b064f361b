"""3D lifting through the node, fast tier: depth + CameraInfo in, 3D fields and topics out.

The real node in-process on the scripted engine; the geometry is exact (a plane at a known
depth seen through a known K), so the expected 3D positions are computed, not recorded. The
lifting estimator itself is tested in test/core/test_lifting.py.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
from action_msgs.msg import GoalStatus  # noqa: E402
from fake_engine import Gate, Script  # noqa: E402
from geometry_msgs.msg import PointStamped, PoseStamped, TransformStamped  # noqa: E402
from inprocess_node import InProcessNode, image_msg  # noqa: E402
from rclpy.qos import ReliabilityPolicy, qos_profile_sensor_data  # noqa: E402
from sensor_msgs.msg import CameraInfo, Image  # noqa: E402
from visualization_msgs.msg import Marker, MarkerArray  # noqa: E402
from waiting import NEVER_S, wait_until  # noqa: E402

from cosmos_reason_interfaces.msg import ReasoningResult  # noqa: E402
from cosmos_reason_ros.core.rgbd import CameraModel  # noqa: E402
from cosmos_reason_ros.ros.target_frame import TargetFrame, rotation_matrix  # noqa: E402

pytestmark = [pytest.mark.ros]
WAIT_S = NEVER_S  # a wait that runs out means the event never happened
W, H = 64, 48
K = (60.0, 0.0, 32.0, 0.0, 60.0, 24.0, 0.0, 0.0, 1.0)
MODEL = CameraModel(fx=60.0, fy=60.0, cx=32.0, cy=24.0, width=W, height=H)
# Reason2 boxes are 0-1000 per axis: this one is pixels 16..48 x 12..36 of the 64x48 image.
BOX_ANSWER = '[{"bbox_2d": [250, 250, 750, 750], "label": "crate"}]'
DEPTH_3D = {"depth.enabled": True, "depth.max_skew_s": 0.05}


def depth_msg(stamp_ns: int, metres: float, width: int = W, height: int = H,
              frame_id: str = "camera", tilt_deg: float = 0.0, every: int = 1) -> Image:
    """16UC1 depth of a plane ``metres`` away at the image centre, turned ``tilt_deg`` about
    the camera's y; with ``every`` > 1 only every ``every``-th row and column has depth."""
    mm = np.full((height, width), int(round(metres * 1000)), np.uint16)
    if tilt_deg:
        through = np.array(MODEL.back_project(32.0, 24.0, metres))
        rows, cols = np.mgrid[0:height, 0:width]
        rays = np.stack(((cols - MODEL.cx) / MODEL.fx, (rows - MODEL.cy) / MODEL.fy,
                         np.ones((height, width))))
        normal = plane_normal(tilt_deg)
        mm = np.round(1000 * (normal @ through) / np.tensordot(normal, rays, axes=1))
        mm = mm.astype(np.uint16)
    if every > 1:
        holes = np.ones((height, width), bool)
        holes[::every, ::every] = False
        mm[holes] = 0  # no return
    msg = Image(height=height, width=width, encoding="16UC1", step=width * 2, data=mm.tobytes())
    msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(stamp_ns, 1_000_000_000)
    msg.header.frame_id = frame_id
    return msg


def plane_normal(tilt_deg: float) -> np.ndarray:
    """Outward normal (toward the camera) of a facing plane turned ``tilt_deg`` about y."""
    a = math.radians(tilt_deg)
    return np.array([-math.sin(a), 0.0, -math.cos(a)])


def info_msg(frame_id: str = "camera") -> CameraInfo:
    info = CameraInfo(width=W, height=H, k=list(K), d=[0.0] * 5, distortion_model="plumb_bob")
    info.header.frame_id = frame_id
    return info


class Rig:
    """Depth and CameraInfo publishers, plus subscriptions to the 3D topics."""

    def __init__(self, n: InProcessNode, qos: Any = 10) -> None:
        node = n.side.node
        self.n = n
        self.depth = node.create_publisher(Image, "/depth/image", qos)
        self.info = node.create_publisher(CameraInfo, "/camera_info", qos)
        self.markers: list[MarkerArray] = []
        self.targets: list[PointStamped] = []
        self.poses: list[PoseStamped] = []
        self.cond = threading.Condition()
        node.create_subscription(MarkerArray, "/cosmos_reason/markers", self._on(self.markers),
                                 10)
        node.create_subscription(PointStamped, "/cosmos_reason/target_point",
                                 self._on(self.targets), 10)
        node.create_subscription(PoseStamped, "/cosmos_reason/target_pose",
                                 self._on(self.poses), 10)
        assert n.side.wait_matched(self.depth) and n.side.wait_matched(self.info)

    def _on(self, sink: list):
        def callback(msg) -> None:
            with self.cond:
                sink.append(msg)
                self.cond.notify_all()
        return callback

    def frame(self, metres: float = 1.0, depth_skew_ns: int = 0, **depth_kwargs) -> int:
        """Publish CameraInfo, a depth frame and a colour frame; wait until all arrived."""
        node = self.n.node
        # This frame's own arrival, not an earlier frame's: a goal asked before its depth
        # frame arrived would be answered on the previous one.
        depth_before = node.camera.depth_history.stats().received
        colour_before = node.history.stats().received
        stamp = self.n.side.now_ns()
        self.info.publish(info_msg())
        self.depth.publish(depth_msg(stamp + depth_skew_ns, metres, **depth_kwargs))
        self.n.publish(stamp, width=W, height=H)

        def arrived() -> bool:
            if node.camera.depth_history.stats().received > depth_before \
                    and node.camera.camera_model() is not None \
                    and node.history.stats().received > colour_before:
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
            assert self.cond.wait_for(lambda: len(sink) >= count, WAIT_S)
            return sink[-1]


@pytest.fixture
def rig():
    made = []

    def make(params=None, answer=BOX_ANSWER, qos=10):
        n = InProcessNode({**DEPTH_3D, "model.family": "cosmos_reason2", **(params or {})},
                          script=lambda r: Script(deltas=[answer]))
        made.append(n)
        return Rig(n, qos)

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
    assert (p.orientation.x, p.orientation.y, p.orientation.z, p.orientation.w) == \
        (0.0, 0.0, 0.0, 1.0)  # the box's axes are the camera's
    markers = r.wait(r.markers)
    cubes = [m for m in markers.markers if m.ns == "boxes"]
    assert len(cubes) == 1 and cubes[0].header.frame_id == "camera"
    assert math.isclose(cubes[0].pose.position.z, p.position.z)
    # The label is above the box: -y in the optical frame (y points down), clear of its top.
    (label,) = [m for m in markers.markers if m.ns == "labels"]
    assert label.pose.position.y == pytest.approx(p.position.y - p.size.y / 2 - 0.03,
                                                  abs=1e-9)
    assert (label.pose.position.x, label.pose.position.z) == (p.position.x, p.position.z)
    target = r.wait(r.targets)
    assert target.header.stamp.sec * 1_000_000_000 + target.header.stamp.nanosec == stamp
    assert math.isclose(target.point.z, p.position.z)


def reliabilities(r: Rig) -> dict[str, Any]:
    """The node's depth and CameraInfo subscriptions' reliability, by topic."""
    return {topic: reliability for topic, reliability in r.n.node.camera.reliabilities().items()
            if topic in ("/depth/image", "/camera_info")}


def test_depth_and_camera_info_are_subscribed_reliable_like_rgbd_drivers_publish(rig):
    # RealSense, ZED, OAK-D and Orbbec drivers publish both reliable: a reliable reader gets
    # lost fragments of a large depth frame resent, where best effort loses the frame.
    r = rig()
    assert reliabilities(r) == {"/depth/image": ReliabilityPolicy.RELIABLE,
                                "/camera_info": ReliabilityPolicy.RELIABLE}
    r.frame(1.0)
    _, result = r.n.ask(task="ground", targets=["crate"])
    assert result.lift_code == ReasoningResult.LIFT_OK, result.lift_message


def test_best_effort_depth_and_camera_info_publishers_are_followed(rig):
    # Publishers appearing after the node subscribed, best effort (sensor data QoS): a
    # reliable reader would never match them; the node resubscribes best effort.
    r = rig(qos=qos_profile_sensor_data)
    wait_until(lambda: set(reliabilities(r).values()) == {ReliabilityPolicy.BEST_EFFORT},
               WAIT_S, "depth and CameraInfo resubscribed best effort")
    stamp = r.n.side.now_ns()
    node = r.n.node

    def arrived() -> bool:
        # Best effort: a sample sent right after matching can be lost, so resend like a
        # driver streaming does.
        r.info.publish(info_msg())
        r.depth.publish(depth_msg(stamp, 1.0))
        return node.camera.depth_history.stats().received >= 1 \
            and node.camera.camera_model() is not None

    wait_until(arrived, WAIT_S, "best-effort depth and CameraInfo", poll_s=0.05)
    r.n.publish(stamp, width=W, height=H)
    wait_until(lambda: node.history.stats().received >= 1, WAIT_S, "the colour frame")
    _, result = r.n.ask(task="ground", targets=["crate"])
    assert result.lift_code == ReasoningResult.LIFT_OK, result.lift_message
    assert math.isclose(result.boxes[0].position_3d.position.z, 1.0, abs_tol=0.005)


def test_the_colour_stream_follows_its_publishers_reliability_by_default():
    # image.qos_reliability auto: reliable while no publisher is known (a best-effort reader
    # of a reliable camera between processes loses most large frames for good), best effort
    # once a best-effort camera appears (a reliable reader would never match it).
    n = InProcessNode({"image.qos_reliability": "auto"})
    try:
        def colour() -> Any:
            return n.node.camera.reliabilities()["/image"]

        assert colour() == ReliabilityPolicy.RELIABLE
        camera = n.side.node.create_publisher(Image, "/image", qos_profile_sensor_data)
        wait_until(lambda: colour() == ReliabilityPolicy.BEST_EFFORT, WAIT_S,
                   "the colour stream resubscribed best effort")
        stamp = n.side.now_ns()

        def arrived() -> bool:  # best effort: resent, as a streaming driver does
            camera.publish(image_msg(stamp))
            return n.node.history.stats().received >= 1

        wait_until(arrived, WAIT_S, "a frame from the best-effort camera", poll_s=0.05)
        status, result = n.ask(prompt="What is there?")
        assert status == GoalStatus.STATUS_SUCCEEDED, result.error_message
        assert result.header.stamp.sec * 1_000_000_000 + result.header.stamp.nanosec == stamp
    finally:
        n.close()


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
    # Nothing lifted: the answer's markers are a DELETEALL alone, clearing older answers'.
    markers = r.wait(r.markers)
    assert [m.action for m in markers.markers] == [Marker.DELETEALL]
    assert stamp_of(markers.markers[0].header.stamp) == stamp_of(result.header.stamp)


def stamp_of(stamp: Any) -> int:
    return stamp.sec * 1_000_000_000 + stamp.nanosec


def test_an_answer_that_lifts_nothing_clears_the_previous_answers_markers(rig):
    r = rig()
    r.frame(1.0)
    _, grounded = r.n.ask(task="ground", targets=["crate"])
    assert grounded.lift_code == ReasoningResult.LIFT_OK, grounded.lift_message
    first = r.wait(r.markers, 1)
    assert [m.ns for m in first.markers if m.action == Marker.ADD] == ["boxes", "labels"]
    r.n.engine.script = lambda req: Script(deltas=["A wooden crate."])
    _, answered = r.n.ask(task="vqa", prompt="What is on the floor?")
    assert answered.answer and answered.lift_code == ReasoningResult.LIFT_OFF
    second = r.wait(r.markers, 2)
    assert [m.action for m in second.markers] == [Marker.DELETEALL]
    assert second.markers[0].header.frame_id == "camera"


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


def axis_angle(axis: tuple[float, float, float], degrees: float) -> tuple[np.ndarray,
                                                                          np.ndarray]:
    """The rotation matrix (Rodrigues) and unit quaternion (x, y, z, w) of one rotation."""
    k = np.array(axis, float) / np.linalg.norm(axis)
    a = math.radians(degrees)
    cross = np.array([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]])
    matrix = np.eye(3) + math.sin(a) * cross + (1 - math.cos(a)) * cross @ cross
    return matrix, np.append(k * math.sin(a / 2), math.cos(a / 2))


def compose(q1: np.ndarray, q2: np.ndarray) -> np.ndarray:
    """Hamilton product q1 * q2 of (x, y, z, w) quaternions: q2's rotation first."""
    v1, w1, v2, w2 = q1[:3], q1[3], q2[:3], q2[3]
    return np.append(w1 * v2 + w2 * v1 + np.cross(v1, v2), w1 * w2 - v1 @ v2)


def pitched_camera(degrees: float) -> tuple[np.ndarray, np.ndarray]:
    """base_link <- camera optical frame (rotation matrix, quaternion), pitched down.

    The optical axes (x right, y down, z forward) turned into base_link's (x forward, y left,
    z up), then pitched down by ``degrees`` about base_link's y.
    """
    rotation, quaternion = np.eye(3), np.array([0.0, 0.0, 0.0, 1.0])
    for axis, angle in [((1, 0, 0), -90), ((0, 0, 1), -90), ((0, 1, 0), degrees)]:
        m, q = axis_angle(axis, angle)
        rotation, quaternion = m @ rotation, compose(q, quaternion)
    return rotation, quaternion


def test_a_trajectory_targets_its_first_lifted_waypoint(rig):
    answer = '[{"point_2d": [500, 500]}, {"point_2d": [750, 250]}]'
    r = rig(answer=answer)
    stamp = r.frame(1.5)
    _, result = r.n.ask(task="trajectory", prompt="pick up the crate")
    assert result.lift_code == ReasoningResult.LIFT_OK, result.lift_message
    first = result.trajectories[0].points[0].position_3d
    assert first.valid
    target = r.wait(r.targets)
    assert stamp_of(target.header.stamp) == stamp and target.header.frame_id == "camera"
    assert (target.point.x, target.point.y, target.point.z) == \
        (first.position.x, first.position.y, first.position.z)
    assert target.point.z == pytest.approx(1.5, abs=0.005)


def angle_deg(a: np.ndarray, b: np.ndarray) -> float:
    return math.degrees(math.acos(float(np.clip(a @ b, -1.0, 1.0))))


def test_a_ground_goal_publishes_a_target_pose_approaching_along_the_surface_normal(rig):
    r = rig()
    stamp = r.frame(1.0, tilt_deg=30.0)
    _, result = r.n.ask(task="ground", targets=["crate"])
    assert result.lift_code == ReasoningResult.LIFT_OK, result.lift_message
    p = result.boxes[0].position_3d
    pose = r.wait(r.poses)
    assert stamp_of(pose.header.stamp) == stamp and pose.header.frame_id == "camera"
    assert (pose.pose.position.x, pose.pose.position.y, pose.pose.position.z) == \
        (p.position.x, p.position.y, p.position.z)
    q = pose.pose.orientation
    axes = rotation_matrix((q.x, q.y, q.z, q.w))
    normal = plane_normal(30.0)
    # z approaches into the surface; x lies in it, along the image's right.
    error = angle_deg(axes[:, 2], -normal)
    print(f"target_pose approach error on a 30 degree plane (16UC1, f=60): {error:.3f} deg")
    assert error <= 3.0
    assert abs(axes[:, 0] @ normal) <= math.sin(math.radians(3.0)) and axes[0, 0] > 0.0


def test_a_point_on_too_sparse_depth_gets_no_target_pose(rig):
    answer = '[{"point_2d": [500, 500], "label": "handle"}]'
    r = rig(answer=answer)
    r.frame(1.0, every=2)  # a quarter of the pixels: enough for a position, not a plane
    _, sparse = r.n.ask(task="point", targets=["handle"])
    assert sparse.points[0].position_3d.valid, sparse.points[0].position_3d.status
    r.wait(r.targets, 1)
    stamp = r.frame(1.0)
    _, dense = r.n.ask(task="point", targets=["handle"])
    assert dense.points[0].position_3d.valid
    r.wait(r.targets, 2)
    pose = r.wait(r.poses)
    # Published in order on one reliable topic: the only pose is the dense answer's.
    assert [stamp_of(m.header.stamp) for m in r.poses] == [stamp]
    assert pose.pose.position.z == dense.points[0].position_3d.position.z
    assert math.isfinite(pose.pose.orientation.w)


class StandInBuffer:
    """A faithful stand-in for tf2_ros.Buffer (no tf2_ros wheel exists here): it records the
    lookup and returns a fixed transform, as ``lookup_transform(target, source, time,
    timeout)`` does (by default the camera 1 m ahead of base_link, same axes)."""

    def __init__(self, fail: bool = False, rotation=(0.0, 0.0, 0.0, 1.0),
                 translation=(1.0, 0.0, 0.0)) -> None:
        self.calls: list = []
        self.fail = fail
        self.rotation, self.translation = rotation, translation

    def lookup_transform(self, target, source, time, timeout):
        self.calls.append((target, source, time.nanoseconds, timeout.nanoseconds))
        if self.fail:
            raise LookupError("extrapolation into the future")
        tf = TransformStamped()
        tf.header.frame_id, tf.child_frame_id = target, source
        t, q = tf.transform.translation, tf.transform.rotation
        t.x, t.y, t.z = (float(v) for v in self.translation)
        q.x, q.y, q.z, q.w = (float(v) for v in self.rotation)
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


def same_rotation(q: Any, expected: np.ndarray) -> bool:
    """Whether quaternion message ``q`` is ``expected`` (q and -q are the same rotation)."""
    got = np.array([q.x, q.y, q.z, q.w])
    return bool(np.allclose(got, expected, atol=1e-9) or np.allclose(got, -expected, atol=1e-9))


def test_a_box_in_the_target_frame_keeps_its_orientation_and_its_label_goes_up(rig):
    # A camera pitched 15 degrees down, 1.2 m up on base_link, sees a fronto-parallel face:
    # in base_link the box is the same box turned with the camera (a near-vertical face, not
    # a flat square with camera-axis extents), and its label goes up base_link's z.
    r = rig()
    rotation, quaternion = pitched_camera(15.0)
    translation = np.array([0.1, -0.05, 1.2])
    r.n.node.pipeline.to_target_frame = TargetFrame(
        r.n.node, "base_link", 0.1, buffer=StandInBuffer(rotation=quaternion,
                                                         translation=translation)).apply
    r.frame(1.0)
    _, result = r.n.ask(task="ground", targets=["crate"])
    assert result.lift_code == ReasoningResult.LIFT_OK and result.frame_3d == "base_link"
    p = result.boxes[0].position_3d
    camera_centre = np.array(expected_centre(1.0))
    centre = rotation @ camera_centre + translation
    assert [p.position.x, p.position.y, p.position.z] == pytest.approx(centre.tolist(),
                                                                      abs=0.005)
    assert same_rotation(p.orientation, quaternion)
    # The size stays along the box's own axes: 32 x 24 px at 1 m through f = 60, flat in z.
    size = np.array([p.size.x, p.size.y, p.size.z])
    assert size == pytest.approx([32 / 60, 24 / 60, 0.0], abs=0.02)
    # Its height axis (the image's y) is base_link's -z tilted by the pitch: a standing face.
    height_axis = rotation @ [0.0, 1.0, 0.0]
    assert height_axis @ [0.0, 0.0, -1.0] == pytest.approx(math.cos(math.radians(15)))
    markers = r.wait(r.markers)
    (cube,) = [m for m in markers.markers if m.ns == "boxes"]
    assert cube.header.frame_id == "base_link"
    assert (cube.pose.position.x, cube.pose.position.y, cube.pose.position.z) == \
        (p.position.x, p.position.y, p.position.z)
    assert same_rotation(cube.pose.orientation, quaternion)
    assert (cube.scale.x, cube.scale.y) == (p.size.x, p.size.y)
    assert cube.scale.z == pytest.approx(max(0.01, p.size.z))  # a flat face still shows
    (label,) = [m for m in markers.markers if m.ns == "labels"]
    half_height = 0.5 * np.abs(rotation[2]) @ size  # the box's extent along base_link z
    assert (label.pose.position.x, label.pose.position.y) == (p.position.x, p.position.y)
    assert label.pose.position.z == pytest.approx(p.position.z + half_height + 0.03, abs=1e-9)
    # The target pose moves as a pose too: a face square to the camera is approached along
    # the camera's own axes, turned into base_link.
    pose = r.wait(r.poses)
    assert pose.header.frame_id == "base_link"
    assert (pose.pose.position.x, pose.pose.position.y, pose.pose.position.z) == \
        (p.position.x, p.position.y, p.position.z)
    assert same_rotation(pose.pose.orientation, quaternion)


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
