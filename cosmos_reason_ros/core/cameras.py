"""Several named cameras in one goal: which cameras it means, and one frame of each, in sync.

A goal names cameras (``Reason.Goal.cameras``; empty means the default camera, the first one
configured). :func:`resolve_cameras` checks the names against the configured cameras and the
engine's image limit. :func:`synchronized_frames` then takes one frame per camera by the
goal's rule (the latest within the max age, or the first after the goal was accepted) such
that all their stamps lie within ``max_skew_s`` of each other: a front camera's frame of
12:00:00.00 and a wrist camera's frame of 12:00:00.40 show two different moments of a moving
arm, and an answer about both would mix them. When no such set exists yet it waits, bounded,
for the cameras to deliver one, and otherwise fails naming every camera, its newest frame's
age and the skew against the limit.

Clips stay single-camera (``pipeline.GoalPipeline.validate`` refuses a clip of several).
Stamps are header stamps on the history's clock (sim time under replay), as in
``core/frames.py``; waits are wall-clock seconds.
"""

from __future__ import annotations

import bisect
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from cosmos_reason_ros.core.frames import FrameHistory, StoredFrame, capture_ns
from cosmos_reason_ros.core.prompts import MAX_IMAGES
from cosmos_reason_ros.core.types import (
    BadRequestError,
    CosmosReasonError,
    ImageTooOldError,
    NoImageError,
)

P = TypeVar("P")

DEFAULT_CAMERA = "default"
"""The default camera's name when the node configures no named cameras."""

WAIT_SLICE_S = 0.05
"""While waiting for a synchronised set, stop requests and other cameras' frames are looked at
least this often (the wait itself wakes at once on a frame of the camera that lags)."""

_NS = 1_000_000_000

MAX_CAMERAS = MAX_IMAGES
"""Most cameras a node configures: one request takes at most this many images."""

# One ROS name token (a topic prefix and a private output topic: ``<name>/image``,
# ``~/<name>/annotated_image``): a letter first (rcl refuses a token starting with a digit;
# one starting with '_' is hidden by ``ros2 topic list``), then letters, digits, underscores.
_CAMERA_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,62}")


def camera_name_problem(name: object) -> str | None:
    """Return why ``name`` cannot name a camera, or None when it can.

    A camera's name becomes its topics' first token (``front/image``), its output topics'
    (``~/front/annotated_image``) and the word the prompt and results use, so it must be one
    ROS name token: a letter, then letters, digits or underscores (no double underscore, which
    rcl reserves), at most 63 characters; no spaces, slashes or quotes.
    """
    if not isinstance(name, str):
        return f"{name!r} is not a string"
    if not name:
        return "is empty"
    if _CAMERA_NAME.fullmatch(name) is None or "__" in name:
        return ("is not a ROS name token: use a letter, then letters, digits or single "
                "underscores (at most 63 characters, no spaces, slashes or quotes)")
    return None


@dataclass(frozen=True)
class CameraFrame(Generic[P]):
    """The frame chosen for one camera of a goal."""

    camera: str
    frame: StoredFrame[P]


def resolve_cameras(requested: Sequence[str], configured: Sequence[str],
                    max_images: int) -> tuple[str, ...]:
    """Return the cameras a goal means, in its order; raise ``BadRequestError`` naming why not.

    ``requested`` is the goal's ``cameras`` field: empty means the default camera
    (``configured[0]``). Names are stripped of surrounding spaces; an empty, unknown or
    repeated name is refused, and so are more cameras than ``max_images`` (the engine's
    images per prompt: each camera sends one image).
    """
    if not configured:
        raise ValueError("resolve_cameras needs at least one configured camera")
    known = ", ".join(configured)
    if isinstance(requested, str):
        raise BadRequestError("cameras must be a list of camera names, not one string")
    names: list[str] = []
    for i, name in enumerate(requested):
        if not isinstance(name, str):
            raise BadRequestError(f"cameras[{i}]={name!r} must be a camera name (a string)")
        clean = name.strip()
        if not clean:
            raise BadRequestError(f"cameras[{i}] is empty; configured cameras: {known}")
        if clean not in configured:
            raise BadRequestError(f"cameras[{i}]={name!r} is not a configured camera; "
                                  f"configured cameras: {known}")
        if clean in names:
            raise BadRequestError(f"cameras names {clean!r} twice; name each camera once")
        names.append(clean)
    if len(names) > max_images:
        raise BadRequestError(
            f"cameras names {len(names)} cameras, but one request takes at most {max_images} "
            f"images (one per camera; the engine's limit_mm_per_prompt)")
    return tuple(names) or (configured[0],)


def synchronized_frames(
    cameras: Sequence[tuple[str, FrameHistory[P]]],
    *,
    max_skew_s: float,
    clock_ns: Callable[[], int],
    wait_s: float,
    max_age_s: float = 0.0,
    after_ns: int | None = None,
    should_stop: Callable[[], CosmosReasonError | None] = lambda: None,
) -> tuple[CameraFrame[P], ...]:
    """Choose one frame per camera, all stamps within ``max_skew_s``; in ``cameras`` order.

    Rule ``after_ns=None`` (latest): the newest such set whose frames are no older than
    ``max_age_s`` on ``clock_ns`` (0: any age); a camera whose newest frame is older fails at
    once with ``ImageTooOldError`` (as a single camera does). Rule ``after_ns`` given (next):
    the earliest such set of frames taken after ``after_ns``.

    Waits up to ``wait_s`` seconds for a camera that has not published (latest) or has no
    frame after ``after_ns`` yet (next), and for a matching set when the frames are too
    skewed; then raises ``NoImageError`` naming the cameras concerned. ``should_stop`` is
    asked before every wait and its error raised (cancel, shutdown).
    """
    if not cameras:
        raise ValueError("synchronized_frames needs at least one camera")
    skew_ns = max(0, int(round(max_skew_s * _NS)))
    end = time.monotonic() + max(0.0, wait_s)
    while True:
        now_ns = clock_ns()
        eligible = [_eligible(history, now_ns, max_age_s, after_ns) for _n, history in cameras]
        if after_ns is None:
            _check_fresh(cameras, now_ns, max_age_s)
        chosen = _matching_set(eligible, skew_ns, newest=after_ns is None)
        if chosen is not None:
            return tuple(CameraFrame(name, frame)
                         for (name, _h), frame in zip(cameras, chosen, strict=True))
        stop = should_stop()
        if stop is not None:
            raise stop
        remaining = end - time.monotonic()
        lagging = _lagging(cameras, eligible)
        if remaining <= 0 or lagging.closed:
            raise _failure(cameras, eligible, now_ns, skew_ns, wait_s, after_ns)
        # New frames only come newer, so a matching set needs a frame of the camera that lags
        # most; frames of the others are seen at the next slice.
        lagging.wait_for_next(None, min(WAIT_SLICE_S, remaining))


def _eligible(history: FrameHistory[P], now_ns: int, max_age_s: float,
              after_ns: int | None) -> list[StoredFrame[P]]:
    """Return the frames the rule allows, sorted by stamp."""
    frames = history.snapshot()
    if after_ns is not None:
        frames = [f for f in frames if capture_ns(f) > after_ns]
    elif max_age_s > 0:
        oldest_ns = now_ns - int(max_age_s * _NS)
        frames = [f for f in frames if f.stamp_ns >= oldest_ns]
    return sorted(frames, key=lambda f: (f.stamp_ns, f.seq))


def _check_fresh(cameras: Sequence[tuple[str, FrameHistory[P]]], now_ns: int,
                 max_age_s: float) -> None:
    """Fail at once when a camera's newest frame is too old: waiting would not make it new."""
    if max_age_s <= 0:
        return
    stale = []
    for name, history in cameras:
        latest = history.latest()
        if latest is not None and (now_ns - latest.stamp_ns) / _NS > max_age_s:
            stale.append(f"{name} {(now_ns - latest.stamp_ns) / _NS:.3f} s")
    if stale:
        raise ImageTooOldError(f"latest image of camera {', '.join(stale)} old; "
                               f"max_image_age_s={max_age_s:g}")


def _matching_set(eligible: list[list[StoredFrame[P]]], skew_ns: int,
                  newest: bool) -> list[StoredFrame[P]] | None:
    """One frame per camera within ``skew_ns``: the newest set, or the earliest one.

    Each stamp in turn (newest first, or oldest first) is tried as the set's oldest stamp;
    every camera then takes its newest (or earliest) frame in ``[stamp, stamp + skew_ns]``.
    Histories hold tens of frames, so trying them all is cheap.
    """
    if any(not frames for frames in eligible):
        return None
    stamps = [[f.stamp_ns for f in frames] for frames in eligible]
    for low in sorted({s for per_camera in stamps for s in per_camera}, reverse=newest):
        chosen = []
        for frames, per_camera in zip(eligible, stamps, strict=True):
            first = bisect.bisect_left(per_camera, low)
            last = bisect.bisect_right(per_camera, low + skew_ns)
            if first == last:
                break
            chosen.append(frames[last - 1] if newest else frames[first])
        else:
            return chosen
    return None


def _closest_skew_ns(eligible: list[list[StoredFrame[P]]]) -> int | None:
    """Return the smallest spread of stamps over sets of one frame per camera, if any."""
    if any(not frames for frames in eligible):
        return None
    stamps = [[f.stamp_ns for f in frames] for frames in eligible]
    best = None
    for low in sorted({s for per_camera in stamps for s in per_camera}):
        highs = []
        for per_camera in stamps:
            i = bisect.bisect_left(per_camera, low)
            if i == len(per_camera):
                break
            highs.append(per_camera[i])
        else:
            spread = max(highs) - low
            best = spread if best is None else min(best, spread)
    return best


def _lagging(cameras: Sequence[tuple[str, FrameHistory[P]]],
             eligible: list[list[StoredFrame[P]]]) -> FrameHistory[P]:
    """Return the history whose newest eligible frame is oldest (none at all: first)."""
    def newest(i: int) -> int:
        return eligible[i][-1].stamp_ns if eligible[i] else -1

    return cameras[min(range(len(cameras)), key=newest)][1]


def _failure(cameras: Sequence[tuple[str, FrameHistory[P]]],
             eligible: list[list[StoredFrame[P]]], now_ns: int, skew_ns: int,
             wait_s: float, after_ns: int | None) -> NoImageError:
    missing = [name for (name, _h), frames in zip(cameras, eligible, strict=True) if not frames]
    if missing:
        which = ", ".join(f"'{name}'" for name in missing)
        if after_ns is None:
            return NoImageError(f"no image received on camera {which} yet "
                                f"(waited {wait_s:.2f} s)")
        return NoImageError(f"no new frame on camera {which} within {wait_s:.2f} s")
    ages = ", ".join(f"{name} newest {(now_ns - frames[-1].stamp_ns) / _NS:.3f} s old"
                     for (name, _h), frames in zip(cameras, eligible, strict=True))
    closest = _closest_skew_ns(eligible)
    skew = "" if closest is None else f"; the closest set is {closest / _NS:.3f} s apart"
    return NoImageError(
        f"no frames of cameras {', '.join(name for name, _h in cameras)} within "
        f"cameras.max_skew_s={skew_ns / _NS:g} s of each other after waiting {wait_s:.2f} s: "
        f"{ages}{skew} (limit {skew_ns / _NS:g} s)")
