"""Real vision_msgs and real tf2_ros around the node: what only the upstream packages prove.

vision_msgs and tf2_ros have no PyPI wheels; ``make setup`` builds them from
``../shared/ros-src`` into ``build/<distro>/ros-src/install`` (docs/DEVELOPING.md, "Real
upstream ROS parts"). Where they are built, this module runs the real node in-process on the
scripted engine (as test_node_3d.py does) and checks, with a separate subscriber over DDS:

- ``~/detections`` arrives as the real ``vision_msgs/msg/Detection2DArray``: the source
  image's header, one detection per non-degenerate box, centre and size in original-image
  pixels, the label as ``class_id``, ids ``<goal_id>/<index>``;
- ``~/detections_3d`` arrives as the real ``Detection3DArray`` with the result's
  ``position_3d`` values;
- with ``depth.target_frame`` and a real ``tf2_ros.StaticTransformBroadcaster``, the node's
  own ``tf2_ros`` listener and buffer move the positions into the target frame: equal to the
  camera-frame positions moved by the published rotation and translation (the expectation is
  built from axis-angle rotations here, not from the node's quaternion formula); without a
  transform for the camera, ``LIFT_TF_FAILED`` with the positions left in the camera frame.

Without the ros-src build each test skips naming it. The stand-in tests stay, since they are
what covers machines without ros-src: test_detections.py's conversion tests against a
hand-written vision_msgs (its field-by-field checks are covered here on the real classes,
its id and score rules too for the cases used here) and test_node_3d.py's
``test_target_frame_is_looked_up_at_the_image_stamp`` with a stand-in ``tf2_ros.Buffer``
(covered here end to end, except that only the stand-in records the lookup's time and timeout
arguments).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
from action_msgs.msg import GoalStatus  # noqa: E402
from fake_engine import Script  # noqa: E402
from geometry_msgs.msg import TransformStamped  # noqa: E402
from inprocess_node import InProcessNode  # noqa: E402
from rclpy.time import Time  # noqa: E402
from test_node_3d import (  # noqa: E402
    DEPTH_3D,
    MODEL,
    Rig,
    axis_angle,
    compose,
    same_rotation,
)
from waiting import NEVER_S, wait_until  # noqa: E402

from cosmos_reason_interfaces.msg import ReasoningResult  # noqa: E402

pytestmark = [pytest.mark.ros]
WAIT_S = NEVER_S  # a wait that runs out means the event never happened
ROS_SRC = ("which has no wheel: make setup builds it from ../shared/ros-src into "
           "build/<distro>/ros-src/install, and this machine has no such build")
# On the 64x48 image (Reason2 boxes are 0-1000 per axis): a crate at pixels 16..48 x 12..36,
# a degenerate pole (zero width: in ~/results, left out of every vision_msgs output), and an
# unlabelled box with a score at pixels 0..16 x 0..12.
ANSWER = ('[{"bbox_2d": [250, 250, 750, 750], "label": "crate"},'
          ' {"bbox_2d": [100, 300, 100, 700], "label": "pole"},'
          ' {"bbox_2d": [0, 0, 250, 250], "label": "", "score": 0.25}]')
# (index in result.boxes, label, centre x, centre y, width, height) in original pixels.
EXPECTED_2D = [(0, "crate", 32.0, 24.0, 32.0, 24.0), (2, "", 8.0, 6.0, 16.0, 12.0)]


def vision_msgs() -> Any:
    return pytest.importorskip("vision_msgs.msg", reason=f"needs vision_msgs, {ROS_SRC}")


def tf2_ros() -> Any:
    return pytest.importorskip("tf2_ros", reason=f"needs tf2_ros, {ROS_SRC}")


def collect(n: InProcessNode, msg_type: Any, topic: str, publisher: Any) -> list:
    """Subscribe on the client side (another DDS participant); wait until ``publisher``, the
    node's, has matched it, so nothing it publishes afterwards is missed."""
    received: list = []
    n.side.node.create_subscription(msg_type, topic, received.append, 10)
    wait_until(lambda: publisher.get_subscription_count() > 0, WAIT_S, f"{topic} matched")
    return received


def stamp_ns(stamp: Any) -> int:
    return stamp.sec * 1_000_000_000 + stamp.nanosec


def xyz(point: Any) -> np.ndarray:
    return np.array([point.x, point.y, point.z])


@pytest.fixture
def rig():
    made = []

    def make(params=None, answer=ANSWER):
        n = InProcessNode({**DEPTH_3D, **(params or {})},
                          script=lambda r: Script(deltas=[answer]))
        made.append(n)
        return Rig(n)

    yield make
    for n in made:
        n.close()


# --- vision_msgs ---------------------------------------------------------------------------


def test_detections_arrive_as_a_real_detection2d_array_with_the_boxes_in_pixels():
    vm = vision_msgs()
    n = InProcessNode(script=lambda r: Script(deltas=[ANSWER]))
    try:
        received = collect(n, vm.Detection2DArray, "/cosmos_reason/detections",
                           n.node.outputs.detections)
        stamp = n.publish(width=64, height=48)
        n.wait_frames(1, WAIT_S)
        status, result = n.ask(task="ground", targets=["crate", "pole"])
        assert status == GoalStatus.STATUS_SUCCEEDED
        assert [b.degenerate for b in result.boxes] == [False, True, False]
        array = wait_until(lambda: received and received[-1], WAIT_S, "~/detections")
    finally:
        n.close()
    assert type(array) is vm.Detection2DArray
    assert stamp_ns(array.header.stamp) == stamp and array.header.frame_id == "camera"
    assert array.header == result.header
    assert len(array.detections) == len(EXPECTED_2D)  # the degenerate box is left out
    for detection, (index, label, cx, cy, w, h) in zip(array.detections, EXPECTED_2D,
                                                       strict=True):
        box = result.boxes[index]
        assert detection.header == result.header
        assert detection.id == f"{result.goal_id}/{index}"
        centre = detection.bbox.center
        assert (centre.position.x, centre.position.y, centre.theta) == (cx, cy, 0.0)
        assert (detection.bbox.size_x, detection.bbox.size_y) == (w, h)
        assert (centre.position.x, detection.bbox.size_x) == \
            ((box.x_min + box.x_max) / 2, box.x_max - box.x_min)
        assert (centre.position.y, detection.bbox.size_y) == \
            ((box.y_min + box.y_max) / 2, box.y_max - box.y_min)
        assert len(detection.results) == 1
        assert detection.results[0].hypothesis.class_id == label == box.label
    # Unscored: 1.0 (the model asserted it); scored: the model's score.
    assert [d.results[0].hypothesis.score for d in array.detections] == [1.0, 0.25]


def test_detections_3d_arrive_as_a_real_detection3d_array_with_the_lifted_positions(rig):
    vm = vision_msgs()
    r = rig()
    received = collect(r.n, vm.Detection3DArray, "/cosmos_reason/detections_3d",
                       r.n.node.outputs.detections_3d)
    stamp = r.frame(1.0)
    status, result = r.n.ask(task="ground", targets=["crate"])
    assert status == GoalStatus.STATUS_SUCCEEDED
    assert result.lift_code == ReasoningResult.LIFT_OK, result.lift_message
    assert [b.position_3d.valid for b in result.boxes] == [True, False, True]
    array = wait_until(lambda: received and received[-1], WAIT_S, "~/detections_3d")
    assert type(array) is vm.Detection3DArray
    assert stamp_ns(array.header.stamp) == stamp
    assert array.header.frame_id == result.frame_3d == "camera"
    assert [d.id for d in array.detections] == [f"{result.goal_id}/{i}" for i, *_ in
                                                EXPECTED_2D]
    for detection, (index, label, *_) in zip(array.detections, EXPECTED_2D, strict=True):
        lifted = result.boxes[index].position_3d
        assert detection.header == array.header
        assert detection.bbox.center.position == lifted.position
        assert detection.bbox.size == lifted.size
        assert detection.results[0].hypothesis.class_id == label
        assert detection.results[0].pose.pose.position == lifted.position
    # The crate is on the 1 m plane, centred on the principal point.
    crate = xyz(array.detections[0].bbox.center.position)
    assert np.allclose(crate, MODEL.back_project(32.0, 24.0, 1.0), atol=0.01)


# --- tf2_ros -------------------------------------------------------------------------------


def camera_mount() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """base_link <- camera: (rotation matrix, quaternion, translation).

    The optical frame's axes (x right, y down, z forward) turned into base_link's (x forward,
    y left, z up), then pitched down 10 degrees and yawed 30 degrees left, mounted 0.25 m
    ahead, 0.1 m right and 0.6 m up: every axis and every component of the translation
    matters, so a transposed rotation, a swapped quaternion component or a lost translation
    shows.
    """
    rotation, quaternion = np.eye(3), np.array([0.0, 0.0, 0.0, 1.0])
    # Applied right to left: optical -> body is x by -90, then z by -90; then pitch, yaw.
    for axis, degrees in [((1, 0, 0), -90), ((0, 0, 1), -90), ((0, 1, 0), 10),
                          ((0, 0, 1), 30)]:
        m, q = axis_angle(axis, degrees)
        rotation, quaternion = m @ rotation, compose(q, quaternion)
    return rotation, quaternion, np.array([0.25, -0.1, 0.6])


def static_transform(n: InProcessNode, parent: str, child: str) -> None:
    """Broadcast ``parent`` <- ``child`` = camera_mount() with a real static broadcaster (its
    latched publisher lives as long as the client-side node)."""
    _, quaternion, translation = camera_mount()
    tf = TransformStamped()
    tf.header.stamp = n.side.node.get_clock().now().to_msg()
    tf.header.frame_id, tf.child_frame_id = parent, child
    tf.transform.translation.x, tf.transform.translation.y, tf.transform.translation.z = \
        (float(v) for v in translation)
    (tf.transform.rotation.x, tf.transform.rotation.y, tf.transform.rotation.z,
     tf.transform.rotation.w) = (float(v) for v in quaternion)
    tf2_ros().StaticTransformBroadcaster(n.side.node).sendTransform(tf)


def node_tf_buffer(n: InProcessNode) -> Any:
    """The node's own tf2_ros buffer (filled by its TransformListener): waiting on it is
    waiting on the node's state, not on time."""
    buffer = n.node.pipeline.to_target_frame.__self__.buffer
    assert type(buffer) is tf2_ros().Buffer, "the node did not take up tf2_ros"
    return buffer


def wait_for_transform(n: InProcessNode, target: str, source: str) -> None:
    buffer = node_tf_buffer(n)
    wait_until(lambda: buffer.can_transform(target, source, Time()), WAIT_S,
               f"the node's tf2 buffer has {target} <- {source}")


def test_positions_come_back_in_the_target_frame_through_a_real_static_transform(rig):
    tf2_ros()
    vm = vision_msgs()
    r = rig({"depth.target_frame": "base_link"})
    received = collect(r.n, vm.Detection3DArray, "/cosmos_reason/detections_3d",
                       r.n.node.outputs.detections_3d)
    r.frame(1.0)
    # Before any transform: the same frame's positions, left in the camera frame. They are
    # the camera-frame positions the transform below must move.
    _, before = r.n.ask(task="ground", targets=["crate"])
    assert before.lift_code == ReasoningResult.LIFT_TF_FAILED, before.lift_message
    assert before.frame_3d == "camera"
    static_transform(r.n, "base_link", "camera")
    wait_for_transform(r.n, "base_link", "camera")
    status, after = r.n.ask(task="ground", targets=["crate"])
    assert status == GoalStatus.STATUS_SUCCEEDED
    assert after.lift_code == ReasoningResult.LIFT_OK, after.lift_message
    assert after.frame_3d == "base_link"
    assert after.header.stamp == before.header.stamp  # the same colour frame, so same depth
    rotation, quaternion, translation = camera_mount()
    # The expectation's own check: without the pitch and yaw, the optical axis (z) would be
    # base_link's forward axis (x).
    pitch_yaw = axis_angle((0, 0, 1), 30)[0] @ axis_angle((0, 1, 0), 10)[0]
    assert np.allclose(pitch_yaw.T @ rotation @ [0.0, 0.0, 1.0], [1.0, 0.0, 0.0])
    lifted = [i for i, b in enumerate(before.boxes) if b.position_3d.valid]
    assert lifted == [0, 2]
    for i in lifted:
        camera, base = before.boxes[i].position_3d, after.boxes[i].position_3d
        expected = rotation @ xyz(camera.position) + translation
        assert np.allclose(xyz(base.position), expected, rtol=1e-6, atol=1e-9), \
            (i, xyz(base.position), expected)
        assert base.valid and base.depth_pixels == camera.depth_pixels
        # Sizes stay extents along the box's own axes (the camera's optical axes), which the
        # orientation turns into base_link (docs/INTERFACES.md, "3D").
        assert xyz(base.size).tolist() == xyz(camera.size).tolist()
        assert same_rotation(camera.orientation, np.array([0.0, 0.0, 0.0, 1.0]))
        assert same_rotation(base.orientation, quaternion)
    assert not after.boxes[1].position_3d.valid  # the degenerate box is not lifted
    # Detection3D carries the same pose: centre and orientation in base_link, own-axes size.
    array = wait_until(lambda: received and received[-1].header.frame_id == "base_link"
                       and received[-1], WAIT_S, "~/detections_3d in base_link")
    for detection, i in zip(array.detections, lifted, strict=True):
        base = after.boxes[i].position_3d
        assert detection.bbox.center.position == base.position
        assert detection.bbox.center.orientation == base.orientation
        assert detection.bbox.size == base.size
        assert detection.results[0].pose.pose.orientation == base.orientation


def test_target_frame_without_a_transform_for_the_camera_is_tf_failed_in_the_camera_frame(
        rig):
    tf2_ros()
    r = rig({"depth.target_frame": "base_link"})
    # TF is alive (base_link has a lidar), only the camera has no transform: the failure is
    # the missing camera transform, not a listener that never heard anything.
    static_transform(r.n, "base_link", "lidar")
    wait_for_transform(r.n, "base_link", "lidar")
    try:
        import vision_msgs.msg as vm
    except ImportError:
        vm = None  # the tf2 outcome stands alone; only the 3D topic needs vision_msgs
    else:
        received = collect(r.n, vm.Detection3DArray, "/cosmos_reason/detections_3d",
                           r.n.node.outputs.detections_3d)
    stamp = r.frame(1.0)
    status, result = r.n.ask(task="ground", targets=["crate"])
    assert status == GoalStatus.STATUS_SUCCEEDED and len(result.boxes) == 3  # 2D stands
    assert result.lift_code == ReasoningResult.LIFT_TF_FAILED
    assert "no transform 'camera' -> 'base_link' at the image stamp" in result.lift_message
    assert "positions are in 'camera'" in result.lift_message
    assert "LookupException" in result.lift_message  # real tf2's: camera is not in its tree
    assert result.frame_3d == "camera"
    crate = result.boxes[0].position_3d
    assert crate.valid
    assert np.allclose(xyz(crate.position), MODEL.back_project(32.0, 24.0, 1.0), atol=0.01)
    if vm is not None:  # published anyway, in the frame the positions are in
        array = wait_until(lambda: received and received[-1], WAIT_S, "~/detections_3d")
        assert array.header.frame_id == "camera" and stamp_ns(array.header.stamp) == stamp
        assert array.detections[0].bbox.center.position == crate.position

