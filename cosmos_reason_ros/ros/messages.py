"""Core types <-> ROS messages. No logic beyond field copying and stamp arithmetic."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from builtin_interfaces.msg import Time
from sensor_msgs.msg import Image
from std_msgs.msg import Header

from cosmos_reason_interfaces.msg import (
    Box2D,
    Point2D,
    ReasoningResult,
    TemporalSpan,
    Trajectory2D,
)
from cosmos_reason_ros.core.imaging import rgb_to_image_fields
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
    return Point2D(label=p.label, x=float(p.x), y=float(p.y))


def fill_outcome(msg: ReasoningResult, outcome: ReasonOutcome, geometry: ImageGeometry,
                 clip_start_ns: int | None = None) -> None:
    """Copy a finished outcome (already in original-image pixels) into ``msg``."""
    parsed = outcome.parsed
    msg.raw_text = parsed.raw_text
    msg.reasoning = parsed.reasoning
    msg.answer = parsed.answer
    msg.answer_json = parsed.answer_json or ""
    msg.boxes = [
        Box2D(label=b.label, score=float(b.score) if b.score is not None else math.nan,
              x_min=float(b.x_min), y_min=float(b.y_min), x_max=float(b.x_max),
              y_max=float(b.y_max), degenerate=bool(b.degenerate))
        for b in outcome.boxes
    ]
    msg.points = [_point(p) for p in outcome.points]
    msg.trajectories = [Trajectory2D(label=t.label, points=[_point(p) for p in t.points])
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
