"""The example patrol tree against the demo recording: it runs until it publishes a pose.

The demo recording (``eval/demo_recording.py``, what ``make demo`` replays: colour, registered
16UC1 depth and CameraInfo) is played in a loop, restamped to now, to the real node in this
process on the scripted engine with depth on; ``reason_patrol`` runs as a user runs it. The
scripted verdict is "no" and the obstacle's box sits on the recording's middle, so the tree
goes Verify -> Ground, the node lifts the box on the recording's depth, and the patrol
publishes the obstacle's pose in the camera's frame.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
pytest.importorskip("py_trees", reason="needs py-trees (make setup)")
pytest.importorskip("rosbags", reason="needs rosbags (make setup)")
from fake_engine import Script, request_text  # noqa: E402
from geometry_msgs.msg import PoseStamped  # noqa: E402
from inprocess_node import InProcessNode  # noqa: E402
from patrol_process import patrol_until_a_pose  # noqa: E402
from rclpy.serialization import deserialize_message  # noqa: E402
from sensor_msgs.msg import CameraInfo, Image  # noqa: E402

from cosmos_reason_ros.eval import bagio, demo_recording  # noqa: E402
from cosmos_reason_ros.ros.messages import ns_to_stamp  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]  # starts a process: the real tier
BLOCKED = '{"answer": "no", "reason": "A pallet blocks the aisle."}'
MIDDLE = '[{"bbox_2d": [400, 400, 600, 600], "label": "pallet"}]'  # Reason2: 0-1000 per axis


def blocked_aisle(request) -> Script:
    return Script(deltas=[BLOCKED if "Answer yes or no" in request_text(request) else MIDDLE])


def recorded_frames(path: Path) -> list[tuple[Image, Image, CameraInfo]]:
    """(colour, depth, camera info) per recorded colour frame, depth matched by stamp."""
    topics = {demo_recording.IMAGE_TOPIC: Image, demo_recording.DEPTH_TOPIC: Image,
              demo_recording.CAMERA_INFO_TOPIC: CameraInfo}
    by_stamp: dict[tuple[str, int], object] = {}
    order: list[int] = []
    for topic, _type, _t, data in bagio.messages(path, list(topics)):
        msg = deserialize_message(data, topics[topic])
        stamp = msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec
        by_stamp[(topic, stamp)] = msg
        if topic == demo_recording.IMAGE_TOPIC:
            order.append(stamp)
    frames = [(by_stamp[(demo_recording.IMAGE_TOPIC, s)],
               by_stamp.get((demo_recording.DEPTH_TOPIC, s)),
               by_stamp.get((demo_recording.CAMERA_INFO_TOPIC, s))) for s in order]
    frames = [f for f in frames if f[1] is not None and f[2] is not None]
    assert frames, "the recording has no colour frame with its depth and camera info"
    return frames


def test_patrol_publishes_the_obstacle_pose_on_the_demo_recording(tmp_path):
    recording = demo_recording.ensure_recording(
        tmp_path / "recording", demo_recording.RecordingParams(duration_s=1.0, wrist=False))
    frames = recorded_frames(recording)
    n = InProcessNode({"depth.enabled": True, "depth.max_skew_s": 0.05}, script=blocked_aisle)
    side = n.side.node
    depth = side.create_publisher(Image, "/depth/image", 10)
    info = side.create_publisher(CameraInfo, "/camera_info", 10)
    poses: list[PoseStamped] = []
    side.create_subscription(PoseStamped, "/reason_patrol/obstacle_pose", poses.append, 10)
    played = itertools.count()

    def play() -> None:  # the recording in a loop at its 15 Hz, each frame stamped now
        colour, depth_image, camera_info = frames[next(played) % len(frames)]
        stamp = ns_to_stamp(n.side.now_ns())
        for msg in (colour, depth_image, camera_info):
            msg.header.stamp = stamp
        info.publish(camera_info)
        depth.publish(depth_image)
        n.camera.publish(colour)

    try:
        out, _ = patrol_until_a_pose(poses, play, 1.0 / demo_recording.RecordingParams().fps)
    finally:
        n.close()
    colour_frame = frames[0][0].header.frame_id
    pose = poses[0]
    assert pose.header.frame_id == colour_frame
    assert 0.3 < pose.pose.position.z < 10.0  # in front of the camera, on the scene's depth
    lines = out.splitlines()
    assert lines and all(line.startswith("cycle ") for line in lines), out
    assert any(line.endswith(": pose published") for line in lines), out
