"""The goal pipeline over named cameras, end to end on the scripted engine.

The real ``GoalPipeline``, ``EngineRunner`` and ``FrameHistory`` objects; only the engine is
scripted (``test/fake_engine.py``), so the request it receives and the result built from its
answer are exactly what the node and offline replay get.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import numpy as np
import pytest
from fake_engine import FakeEngine, Script

from cosmos_reason_ros.core import query
from cosmos_reason_ros.core.answer3d import Answer3D, LiftCode
from cosmos_reason_ros.core.cameras import DEFAULT_CAMERA
from cosmos_reason_ros.core.frames import FrameHistory
from cosmos_reason_ros.core.imaging import ImageMessage
from cosmos_reason_ros.core.models import COSMOS_REASON2
from cosmos_reason_ros.core.pipeline import GoalFields, GoalPipeline, Settings, Source
from cosmos_reason_ros.core.prefill import PrefillPolicy
from cosmos_reason_ros.core.types import (
    BadRequestError,
    Box,
    ErrorCode,
    ImageGeometry,
    NoImageError,
)
from cosmos_reason_ros.engines.runner import EngineRunner

NS = 1_000_000_000
MS = 1_000_000
NOW = 500 * NS
SIZES = {"front": (640, 480), "wrist": (320, 240)}
GROUND_ANSWER = json.dumps([
    {"bbox_2d": [250, 500, 750, 1000], "label": "cup", "camera": "front"},
    {"bbox_2d": [0, 0, 500, 500], "label": "cup", "camera": "wrist"},
])


@pytest.fixture(scope="module")
def engine() -> Iterator[tuple[FakeEngine, EngineRunner]]:
    fake = FakeEngine()
    runner = EngineRunner(fake)
    runner.start(timeout_s=30.0)
    yield fake, runner
    runner.close()


def image(camera: str, stamp_ns: int, width: int, height: int) -> ImageMessage:
    shade = 40 if camera == "front" else 200  # tells the two cameras' pixels apart
    pixels = np.full((height, width, 3), shade, np.uint8).tobytes()
    return ImageMessage(stamp_ns=stamp_ns, frame_id=f"{camera}_optical", width=width,
                        height=height, encoding="rgb8", step=width * 3, data=pixels)


def camera_history(camera: str, *stamps_ns: int) -> FrameHistory[ImageMessage]:
    history: FrameHistory[ImageMessage] = FrameHistory(clock=lambda: NOW)
    for stamp in stamps_ns:
        msg = image(camera, stamp, *SIZES[camera])
        history.append(msg, stamp, nbytes=len(msg.data), received_ns=stamp)
    return history


def pipeline(runner, front_stamps=(NOW - 20 * MS,), wrist_stamps=(NOW - 10 * MS,),
             limits: query.QueryLimits | None = None, **kwargs) -> GoalPipeline[ImageMessage]:
    settings = Settings(profile=COSMOS_REASON2, limits=limits or query.QueryLimits(),
                        max_age_s=1.0, wait_s=0.05)
    cameras = {"front": camera_history("front", *front_stamps),
               "wrist": camera_history("wrist", *wrist_stamps)}
    return GoalPipeline.for_cameras(settings, runner, cameras, read_frame=lambda m: m,
                                    clock_ns=lambda: NOW, max_skew_s=0.05, **kwargs)


def run(p: GoalPipeline[ImageMessage], **fields):
    goal = p.validate(GoalFields(**fields))
    return p.run(goal, t_start=time.monotonic(), accepted_ns=NOW)


def test_a_two_camera_goal_sends_both_images_named_in_order_and_maps_boxes_per_camera(engine):
    fake, runner = engine
    fake.script = lambda _r: Script(deltas=[GROUND_ANSWER])
    p = pipeline(runner)
    before = len(fake.requests)
    result = run(p, task="ground", targets=("cup",), cameras=("wrist", "front"))
    assert result.error is None, result.error
    request = fake.requests[before]
    # Both images, in the goal's camera order, each at its own size and with its own pixels.
    assert [img.shape for img in request.images] == [(256, 320, 3), (480, 640, 3)]
    assert [int(img[0, 0, 0]) for img in request.images] == [200, 40]
    user = request.messages[-1]
    assert [p.kind for p in user.content] == ["image", "image", "text"]
    assert user.content[-1].text.startswith(
        'Image 1 is from the camera "wrist". Image 2 is from the camera "front".\n'
        "Locate the bounding box of cup.")
    assert request.json_schema["items"]["properties"]["camera"]["enum"] == ["wrist", "front"]
    # Each box in its own camera's original pixels, named.
    assert result.outcome.boxes == (
        Box(160.0, 240.0, 480.0, 480.0, label="cup", camera="front"),
        Box(0.0, 0.0, 160.0, 120.0, label="cup", camera="wrist"))
    # Per camera: the frame used, its header and geometry; the single-image fields are the
    # first camera's.
    media = result.media
    assert [(c.camera, c.frame_id, c.header_stamp_ns, c.geometry) for c in media.cameras] == [
        ("wrist", "wrist_optical", NOW - 10 * MS, ImageGeometry(320, 240, 320, 256)),
        ("front", "front_optical", NOW - 20 * MS, ImageGeometry(640, 480, 640, 480))]
    assert media.stamps_ns == [NOW - 10 * MS, NOW - 20 * MS]
    assert (media.frame_id, media.header_stamp_ns) == ("wrist_optical", NOW - 10 * MS)


def test_a_goal_without_cameras_is_the_default_camera_and_the_request_is_unchanged(engine):
    fake, runner = engine
    fake.script = lambda _r: Script(deltas=[json.dumps([{"bbox_2d": [0, 0, 500, 500],
                                                         "label": "cup"}])])
    p = pipeline(runner)
    before = len(fake.requests)
    result = run(p, task="ground", targets=("cup",))
    request = fake.requests[before]
    assert len(request.images) == 1 and request.images[0].shape == (480, 640, 3)
    assert "camera" not in request.messages[-1].content[-1].text
    assert "camera" not in request.json_schema["items"]["properties"]
    assert result.outcome.boxes == (Box(0.0, 0.0, 320.0, 240.0, label="cup", camera="front"),)
    assert [c.camera for c in result.media.cameras] == ["front"]


def test_one_named_camera_uses_that_cameras_frames(engine):
    fake, runner = engine
    fake.script = lambda _r: Script(deltas=[json.dumps([{"point_2d": [500, 500],
                                                         "label": "cup"}])])
    p = pipeline(runner)
    before = len(fake.requests)
    result = run(p, task="point", targets=("cup",), cameras=("wrist",))
    assert fake.requests[before].images[0].shape == (256, 320, 3)
    (point,) = result.outcome.points
    assert (point.x, point.y, point.camera) == (160.0, 120.0, "wrist")


def test_the_single_history_constructor_still_serves_goals_as_the_default_camera(engine):
    fake, runner = engine
    fake.script = lambda _r: Script(deltas=["a cup"])
    settings = Settings(profile=COSMOS_REASON2, limits=query.QueryLimits(), max_age_s=1.0)
    p = GoalPipeline(settings, runner, camera_history("front", NOW), lambda m: m,
                     lambda: NOW)
    result = run(p, prompt="What is there?")
    assert result.error is None and result.outcome.parsed.answer == "a cup"
    assert [c.camera for c in result.media.cameras] == [DEFAULT_CAMERA]
    with pytest.raises(BadRequestError, match="configured cameras: default"):
        p.validate(GoalFields(prompt="?", cameras=("front",)))


def test_frames_too_far_apart_end_the_goal_with_no_image_naming_both_cameras(engine):
    _fake, runner = engine
    p = pipeline(runner, front_stamps=(NOW - 300 * MS,), wrist_stamps=(NOW - 10 * MS,))
    result = run(p, prompt="What is there?", cameras=("front", "wrist"))
    assert isinstance(result.error, NoImageError)
    assert "front newest 0.300 s old, wrist newest 0.010 s old" in result.error.message
    assert "the closest set is 0.290 s apart (limit 0.05 s)" in result.error.message


@pytest.mark.parametrize(("fields", "words"), [
    ({"cameras": ("front", "rear")}, "cameras[1]='rear' is not a configured camera; "
                                     "configured cameras: front, wrist"),
    ({"cameras": ("front", "wrist"), "source": Source.CLIP},
     "source=SOURCE_CLIP takes one camera; cameras names 2 (front, wrist)"),
    ({"cameras": ("front",), "source": Source.GOAL_IMAGE, "images_in_goal": 1,
      "image": image("front", NOW, 64, 48)}, "leave cameras empty"),
])
def test_bad_camera_fields_are_refused_at_validation(engine, fields, words):
    _fake, runner = engine
    with pytest.raises(BadRequestError) as err:
        pipeline(runner).validate(GoalFields(prompt="What is there?", **fields))
    assert words in err.value.message


def test_more_cameras_than_the_engine_takes_is_refused_at_validation(engine):
    _fake, runner = engine
    p = pipeline(runner, limits=query.QueryLimits(max_images=1))
    with pytest.raises(BadRequestError) as err:
        p.validate(GoalFields(prompt="?", cameras=("front", "wrist")))
    assert err.value.code is ErrorCode.BAD_REQUEST
    assert "names 2 cameras, but one request takes at most 1 images" in err.value.message


class RecordingLifter:
    """Stands in for the default camera's ``DepthLifter``: records what it was asked."""

    def __init__(self) -> None:
        self.lifted = 0

    def pick(self, _stamp_ns):
        return None

    def lift(self, *_args):
        self.lifted += 1
        return Answer3D(LiftCode.OK)


def test_depth_of_the_default_camera_is_not_applied_to_other_cameras(engine):
    fake, runner = engine
    fake.script = lambda _r: Script(deltas=[GROUND_ANSWER])
    lifter = RecordingLifter()
    p = pipeline(runner, lifter=lifter)
    result = run(p, task="ground", targets=("cup",), cameras=("front", "wrist"))
    assert result.answer3d.code is LiftCode.OFF and lifter.lifted == 0
    assert "default camera 'front' alone" in result.answer3d.message
    run(p, task="ground", targets=("cup",), cameras=("front",))
    assert lifter.lifted == 1


def prefill_in_flight(stamp_ns: int) -> tuple[PrefillPolicy, list[int]]:
    policy = PrefillPolicy(skip_while_busy=False)
    assert policy.try_start(stamp_ns, busy=False)
    cancelled: list[int] = []
    assert policy.attach(lambda: cancelled.append(stamp_ns))
    return policy, cancelled


def test_a_prefill_of_the_first_cameras_frame_is_kept_for_a_multi_camera_goal(engine):
    fake, runner = engine
    fake.script = lambda _r: Script(deltas=["ok"])
    front_stamp = NOW - 20 * MS
    policy, cancelled = prefill_in_flight(front_stamp)
    p = pipeline(runner, prefill=policy)
    run(p, prompt="What is there?", cameras=("front", "wrist"))
    assert cancelled == []  # the goal's prompt starts with that very image
    policy, cancelled = prefill_in_flight(front_stamp)
    p = pipeline(runner, prefill=policy)
    run(p, prompt="What is there?", cameras=("wrist", "front"))
    assert cancelled == [front_stamp]  # another image comes first: no shared prefix
