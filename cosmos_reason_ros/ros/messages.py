"""Core types <-> ROS messages. No logic beyond field copying and stamp arithmetic."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from builtin_interfaces.msg import Time
from geometry_msgs.msg import Point as GeoPoint
from geometry_msgs.msg import Quaternion, Vector3
from sensor_msgs.msg import Image
from std_msgs.msg import Header

from cosmos_reason_interfaces.msg import (
    Box2D,
    CameraFrame,
    Point2D,
    Position3D,
    ReasoningResult,
    TemporalSpan,
    Trajectory2D,
)
from cosmos_reason_ros.core.answer3d import Answer3D, LiftCode
from cosmos_reason_ros.core.imaging import ImageMessage, rgb_to_image_fields
from cosmos_reason_ros.core.lifting import Lifted
from cosmos_reason_ros.core.pipeline import CameraImage, GoalFields, GoalRun
from cosmos_reason_ros.core.types import (
    CosmosReasonError,
    ErrorCode,
    FinishReason,
    ImageGeometry,
    Point,
    ReasonOutcome,
)

NS_PER_S = 1_000_000_000


def stamp_to_ns(stamp: Time) -> int:
    """``builtin_interfaces/Time`` -> integer nanoseconds."""
    return int(stamp.sec) * NS_PER_S + int(stamp.nanosec)


def ns_to_stamp(ns: int) -> Time:
    """Integer nanoseconds -> ``builtin_interfaces/Time`` (negative values clamp to 0)."""
    ns = max(0, int(ns))
    return Time(sec=ns // NS_PER_S, nanosec=ns % NS_PER_S)


def _point(p: Point) -> Point2D:
    return Point2D(label=p.label, camera=p.camera, x=float(p.x), y=float(p.y))


def fill_outcome(msg: ReasoningResult, outcome: ReasonOutcome, geometry: ImageGeometry,
                 clip_start_ns: int | None = None) -> None:
    """Copy a finished outcome (already in original-image pixels) into ``msg``."""
    parsed = outcome.parsed
    msg.raw_text = parsed.raw_text
    msg.reasoning = parsed.reasoning
    msg.answer = parsed.answer
    msg.answer_json = parsed.answer_json or ""
    msg.boxes = [
        Box2D(label=b.label, camera=b.camera,
              score=float(b.score) if b.score is not None else math.nan,
              x_min=float(b.x_min), y_min=float(b.y_min), x_max=float(b.x_max),
              y_max=float(b.y_max), degenerate=bool(b.degenerate))
        for b in outcome.boxes
    ]
    msg.points = [_point(p) for p in outcome.points]
    msg.trajectories = [Trajectory2D(label=t.label, camera=t.camera,
                                     points=[_point(p) for p in t.points])
                        for t in outcome.trajectories]
    start = clip_start_ns or 0
    msg.spans = [
        TemporalSpan(start_s=float(s.start_s), end_s=float(s.end_s), caption=s.caption,
                     start_stamp=ns_to_stamp(start + s.start_s * NS_PER_S),
                     end_stamp=ns_to_stamp(start + s.end_s * NS_PER_S))
        for s in parsed.spans
    ]
    msg.parsed = list(parsed.found)
    msg.parse_problems = list(parsed.problems)
    msg.image_width, msg.image_height = geometry.original_width, geometry.original_height
    msg.input_width, msg.input_height = geometry.input_width, geometry.input_height
    msg.prompt_tokens = outcome.tokens.prompt
    msg.output_tokens = outcome.tokens.output
    msg.cached_prompt_tokens = outcome.tokens.cached_prompt
    msg.finish_reason = outcome.finish_reason.value
    msg.error_code = ErrorCode.OK.value


def fill_error(msg: ReasoningResult, error: CosmosReasonError) -> None:
    """Record a failure: code, message and an ``error``/``cancelled`` finish reason."""
    msg.error_code = int(error.code)
    msg.error_message = error.message
    cancelled = error.code is ErrorCode.CANCELLED
    msg.finish_reason = (FinishReason.CANCELLED if cancelled else FinishReason.ERROR).value


def source_header(header: Header | None) -> Header:
    """Copy the source image header (an empty one when there is no image)."""
    if header is None:
        return Header()
    return Header(stamp=Time(sec=header.stamp.sec, nanosec=header.stamp.nanosec),
                  frame_id=header.frame_id)


def rgb_image(rgb: Any, header: Header) -> Image:
    """Wrap an RGB uint8 array as an rgb8 ``sensor_msgs/Image`` with ``header``."""
    fields = rgb_to_image_fields(rgb, "rgb8")
    return Image(header=header, height=fields.height, width=fields.width,
                 encoding=fields.encoding, step=fields.step, data=fields.data)


def stamps(stamps_ns: Sequence[int]) -> list[Time]:
    """Frame stamps for ``ReasoningResult.frame_stamps``."""
    return [ns_to_stamp(s) for s in stamps_ns]


def camera_frame(camera: CameraImage) -> CameraFrame:
    """One camera's entry of ``ReasoningResult.camera_frames``."""
    g = camera.geometry
    return CameraFrame(camera=camera.camera,
                       header=Header(stamp=ns_to_stamp(camera.header_stamp_ns),
                                     frame_id=camera.frame_id),
                       image_width=g.original_width, image_height=g.original_height,
                       input_width=g.input_width, input_height=g.input_height)


def fill_run(msg: ReasoningResult, run: GoalRun) -> None:
    """Copy what a pipeline run produced: source header, frames, outcome (partial too), times.

    Call ``fill_error`` after it for a run that ended in an error: the code and message go on
    top of whatever text and token counts were generated before the stop.
    """
    msg.preprocess_s = run.preprocess_s
    msg.time_to_first_token_s = run.time_to_first_token_s
    if run.media is None:
        return
    msg.header = Header(stamp=ns_to_stamp(run.media.header_stamp_ns),
                        frame_id=run.media.frame_id)
    msg.frame_stamps = stamps(run.media.stamps_ns)
    msg.camera_frames = [camera_frame(c) for c in run.media.cameras]
    msg.clip_fps = run.media.clip_fps
    if run.outcome is not None:
        fill_outcome(msg, run.outcome, run.media.prepared.geometry, run.media.clip_start_ns)
    if run.answer3d is not None:
        fill_3d(msg, run.answer3d)


def _position(item: Lifted) -> Position3D:
    x, y, z = item.position
    sx, sy, sz = item.size
    qx, qy, qz, qw = item.orientation
    return Position3D(valid=item.valid, position=GeoPoint(x=x, y=y, z=z),
                      size=Vector3(x=sx, y=sy, z=sz),
                      orientation=Quaternion(x=qx, y=qy, z=qz, w=qw),
                      depth_pixels=item.used_pixels, status=item.reason)


def fill_3d(msg: ReasoningResult, answer: Answer3D) -> None:
    """Copy an answer's 3D positions onto its boxes, points and trajectory waypoints."""
    msg.lift_code = int(answer.code)
    msg.lift_message = answer.message
    msg.frame_3d = answer.frame_id
    msg.depth_stamp = ns_to_stamp(answer.depth_stamp_ns)
    if answer.code not in (LiftCode.OK, LiftCode.TF_FAILED):
        return
    for box, lifted in zip(msg.boxes, answer.boxes, strict=True):
        box.position_3d = _position(lifted)
    for point, lifted in zip(msg.points, answer.points, strict=True):
        point.position_3d = _position(lifted)
    for trajectory, waypoints in zip(msg.trajectories, answer.trajectories, strict=True):
        for point, lifted in zip(trajectory.points, waypoints, strict=True):
            point.position_3d = _position(lifted)


def _image_message(image: Image) -> ImageMessage:
    return ImageMessage(stamp_ns=stamp_to_ns(image.header.stamp), frame_id=image.header.frame_id,
                        width=image.width, height=image.height, encoding=image.encoding,
                        is_bigendian=bool(image.is_bigendian), step=image.step, data=image.data)


def goal_fields(goal: Any) -> GoalFields:
    """Return a ``Reason.Goal`` in the pipeline's plain form (the goal's own image converted)."""
    has_image = bool(goal.image.data) or goal.image.width > 0 or goal.image.height > 0
    has_compressed = len(goal.compressed_image.data) > 0
    image = None
    if has_compressed:
        c = goal.compressed_image
        image = ImageMessage(stamp_ns=stamp_to_ns(c.header.stamp), frame_id=c.header.frame_id,
                             data=bytes(c.data), compressed_format=c.format)
    elif has_image:
        image = _image_message(goal.image)
    return GoalFields(
        task=goal.task, prompt=goal.prompt, targets=tuple(goal.targets),
        reasoning=goal.reasoning, source=goal.source, max_image_age_s=goal.max_image_age_s,
        wait_for_image_s=goal.wait_for_image_s, clip_duration_s=goal.clip_duration_s,
        clip_fps=goal.clip_fps, response_schema=goal.response_schema,
        max_tokens=goal.max_tokens, temperature=goal.temperature, greedy=goal.greedy,
        timeout_s=goal.timeout_s, image=image, images_in_goal=int(has_image) + int(has_compressed),
        cameras=tuple(goal.cameras), feedback=goal.feedback)
