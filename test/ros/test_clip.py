"""Clips from a camera thinner than clip_fps: the result says the rate it got.

A best-effort 640x480 camera at 10 Hz reached the node at 2.5-3.5 fps (Fast DDS defaults,
RELIABILITY.md), so a 4 fps clip silently held fewer frames than asked. A clip result now
carries its effective rate (``clip_fps``: frames per second of the duration asked), and
``image.clip_min_fps`` (``Settings.clip_min_fps``) turns a rate below a floor into NO_IMAGE
naming the numbers.
"""

from __future__ import annotations

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
from action_msgs.msg import GoalStatus  # noqa: E402
from inprocess_node import InProcessNode  # noqa: E402

from cosmos_reason_interfaces.action import Reason  # noqa: E402
from cosmos_reason_ros.core import query  # noqa: E402
from cosmos_reason_ros.core.frames import FrameHistory  # noqa: E402
from cosmos_reason_ros.core.imaging import ImageMessage  # noqa: E402
from cosmos_reason_ros.core.models import PROFILES  # noqa: E402
from cosmos_reason_ros.core.pipeline import GoalFields, GoalPipeline, Settings, Source  # noqa: E402
from cosmos_reason_ros.core.types import NoImageError  # noqa: E402

pytestmark = [pytest.mark.ros]
NS = 1_000_000_000
CLIP = {"image.clip_fps": 4.0, "image.clip_duration_s": 2.0, "image.max_age_s": 0.0}


@pytest.fixture
def node():
    n = InProcessNode(CLIP)
    yield n
    n.close()


def publish_stream(n: InProcessNode, fps: float, seconds: float) -> list[int]:
    """Publish ``seconds`` of a ``fps`` camera ending now; return the stamps."""
    now = n.side.now_ns()
    count = int(round(seconds * fps)) + 1
    stamps = [n.publish(now - int((count - 1 - k) * NS / fps)) for k in range(count)]
    n.wait_frames(count)
    return stamps


def test_a_clip_over_a_stream_thinner_than_clip_fps_reports_the_rate_it_got(node):
    # 2 fps for 2 s under a 4 fps clip: of the 8 sample times (every 0.25 s back from the
    # newest frame) only those on a frame match within half a period -> 4 frames, 2 fps.
    stamps = publish_stream(node, fps=2.0, seconds=2.0)
    status, result = node.ask(prompt="What happened?", source=Reason.Goal.SOURCE_CLIP)
    assert status == GoalStatus.STATUS_SUCCEEDED
    got = [s.sec * NS + s.nanosec for s in result.frame_stamps]
    assert got == stamps[1:]  # the frame 2 s back is the 9th sample, outside the clip
    assert result.clip_fps == pytest.approx(len(got) / 2.0) == pytest.approx(2.0)
    assert len(node.engine.requests[0].video.frames) == 4


def test_a_clip_over_a_stream_at_clip_fps_reports_clip_fps(node):
    publish_stream(node, fps=4.0, seconds=2.0)
    status, result = node.ask(prompt="What happened?", source=Reason.Goal.SOURCE_CLIP)
    assert status == GoalStatus.STATUS_SUCCEEDED
    assert len(result.frame_stamps) == 8 and result.clip_fps == pytest.approx(4.0)


def test_a_single_image_result_has_no_clip_rate(node):
    node.publish()
    node.wait_frames(1)
    status, result = node.ask(prompt="What is there?")
    assert status == GoalStatus.STATUS_SUCCEEDED and result.clip_fps == 0.0


# --- the floor (Settings.clip_min_fps), on the pipeline the node runs --------------------

def pipeline_over(stamps: list[int], clip_min_fps: float) -> GoalPipeline[ImageMessage]:
    history: FrameHistory[ImageMessage] = FrameHistory(clock=lambda: stamps[-1])
    pixels = np.full((48, 64, 3), 90, np.uint8).tobytes()
    for stamp in stamps:
        history.append(ImageMessage(stamp_ns=stamp, frame_id="camera", width=64, height=48,
                                    encoding="rgb8", step=64 * 3, data=pixels),
                       stamp, nbytes=len(pixels))
    settings = Settings(profile=PROFILES["cosmos_reason2"], limits=query.QueryLimits(),
                        clip_fps=4.0, clip_duration_s=2.0, max_age_s=0.0,
                        clip_min_fps=clip_min_fps)
    return GoalPipeline(settings, runner=None, history=history, read_frame=lambda m: m,
                        clock_ns=lambda: stamps[-1])


def clip_goal(pipeline: GoalPipeline[ImageMessage]):
    return pipeline.validate(GoalFields(prompt="What happened?", source=Source.CLIP),
                             check_engine=False)


THIN = [100 * NS + k * NS // 2 for k in range(5)]  # 2 fps for 2 s


def test_a_clip_below_clip_min_fps_fails_no_image_naming_the_rates():
    pipeline = pipeline_over(THIN, clip_min_fps=3.0)
    with pytest.raises(NoImageError) as err:
        pipeline.choose_frames(clip_goal(pipeline), accepted_ns=THIN[-1], deadline=1e18)
    assert "4 frames in 2 s (2.00 fps) < image.clip_min_fps=3" in err.value.message


def test_a_clip_at_or_above_clip_min_fps_is_served_with_its_effective_rate():
    pipeline = pipeline_over(THIN, clip_min_fps=2.0)
    goal = clip_goal(pipeline)
    frames = pipeline.choose_frames(goal, accepted_ns=THIN[-1], deadline=1e18)
    media = pipeline.prepare_clip(frames, goal.clip_fps, goal.clip_duration_s)
    assert media.clip_fps == pytest.approx(2.0) and media.stamps_ns == THIN[1:]
    assert media.prepared.video is not None and media.prepared.video.fps == 4.0
