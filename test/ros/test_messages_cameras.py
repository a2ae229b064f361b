"""Camera fields between goals/results and the pipeline (``ros/messages.py``), no DDS."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
from cosmos_reason_interfaces.action import Reason  # noqa: E402
from cosmos_reason_interfaces.msg import ReasoningResult  # noqa: E402
from cosmos_reason_ros.core import query  # noqa: E402
from cosmos_reason_ros.core.pipeline import CameraImage, GoalRun, Media  # noqa: E402
from cosmos_reason_ros.core.types import (  # noqa: E402
    Box,
    ImageGeometry,
    ParsedAnswer,
    Point,
    ReasonOutcome,
    Trajectory,
)
from cosmos_reason_ros.ros.messages import fill_run, goal_fields  # noqa: E402

pytestmark = pytest.mark.ros
NS = 1_000_000_000
FRONT = ImageGeometry(640, 480, 640, 480)
WRIST = ImageGeometry(320, 240, 320, 256)


def test_goal_cameras_reach_the_pipeline_in_order_and_empty_means_default():
    assert goal_fields(Reason.Goal(cameras=["wrist", "front"])).cameras == ("wrist", "front")
    assert goal_fields(Reason.Goal()).cameras == ()


def two_camera_run() -> GoalRun:
    rgb = np.zeros((1, 1, 3), np.uint8)
    cameras = (CameraImage("wrist", "wrist_optical", 7 * NS + 5, 7 * NS + 5, WRIST,
                           lambda: rgb),
               CameraImage("front", "front_optical", 7 * NS, 7 * NS, FRONT, lambda: rgb))
    prepared = query.PreparedMedia(WRIST, images=(rgb, rgb), views=(
        query.CameraView("wrist", WRIST), query.CameraView("front", FRONT)))
    media = Media(prepared, [7 * NS + 5, 7 * NS], "wrist_optical", 7 * NS + 5, lambda: rgb,
                  cameras=cameras)
    outcome = ReasonOutcome(
        ParsedAnswer(raw_text="[]", reasoning="", answer="[]"),
        boxes=(Box(1, 2, 3, 4, label="cup", camera="front"),),
        points=(Point(5, 6, "cup", "wrist"),),
        trajectories=(Trajectory((Point(1, 1, "", "wrist"), Point(2, 2, "", "wrist")),
                                 "path", "wrist"),))
    return GoalRun(media=media, outcome=outcome)


def test_results_list_each_cameras_frame_and_every_item_names_its_camera():
    msg = ReasoningResult()
    fill_run(msg, two_camera_run())
    frames = [(f.camera, f.header.frame_id, f.header.stamp.sec, f.header.stamp.nanosec,
               f.image_width, f.image_height, f.input_width, f.input_height)
              for f in msg.camera_frames]
    assert frames == [("wrist", "wrist_optical", 7, 5, 320, 240, 320, 256),
                      ("front", "front_optical", 7, 0, 640, 480, 640, 480)]
    # The single-image fields stay those of the first camera.
    assert msg.header.frame_id == "wrist_optical" and (msg.image_width, msg.input_height) == (
        320, 256)
    assert [(s.sec, s.nanosec) for s in msg.frame_stamps] == [(7, 5), (7, 0)]
    assert [b.camera for b in msg.boxes] == ["front"]
    assert [p.camera for p in msg.points] == ["wrist"]
    assert msg.trajectories[0].camera == "wrist"
    assert [p.camera for p in msg.trajectories[0].points] == ["wrist", "wrist"]
