"""Lift a goal's whole answer to 3D: the matching depth frame, checks, then every item.

For each goal the depth frame nearest to the colour frame's stamp within ``max_skew_s`` is
used; its registration to the colour image is checked (size, frame_id, CameraInfo); then
boxes, points and trajectory waypoints are lifted (``core/lifting.py``). Any problem ends in a
:class:`Answer3D` with a specific :class:`LiftCode` and message: the 2D answer always stands.
The surface normal at a target (``core/normals.py``, for ``~/target_pose``) is read later from
the same depth frame (:meth:`DepthLifter.normal_at`).
"""

from __future__ import annotations

import collections
import enum
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from cosmos_reason_ros.core.frames import FrameHistory, StoredFrame
from cosmos_reason_ros.core.imaging import ImageMessage
from cosmos_reason_ros.core.lifting import (
    DEFAULT_SETTINGS,
    Lifted,
    LiftSettings,
    lift_boxes,
    lift_points,
    lift_trajectory,
)
from cosmos_reason_ros.core.normals import SurfaceNormal, surface_normal
from cosmos_reason_ros.core.rgbd import CameraModel, check_registration, depth_image
from cosmos_reason_ros.core.types import CosmosReasonError, ReasonOutcome

P = TypeVar("P")
_NS = 1_000_000_000


class LiftCode(enum.IntEnum):
    """How lifting went for a whole result (``ReasoningResult.LIFT_*``)."""

    OFF = 0  # depth input off, or nothing to lift
    OK = 1  # lifted; each item says whether it has a position
    NO_DEPTH = 2  # no depth frame near the colour frame, or no CameraInfo yet
    BAD_DEPTH = 3  # depth not registered to the colour image, or unreadable
    TF_FAILED = 4  # positions stay in the camera frame: the target_frame lookup failed


@dataclass(frozen=True)
class DepthSettings:
    """The node's ``depth.*`` parameters."""

    scale: float | None = None  # metres per depth unit; None: the encoding's own unit
    max_skew_s: float = 0.05
    registered_frame_id: str = ""
    lift: LiftSettings = DEFAULT_SETTINGS


@dataclass(frozen=True)
class Answer3D:
    """An answer's items in 3D (camera optical frame), aligned with the outcome's items."""

    code: LiftCode
    message: str = ""
    frame_id: str = ""
    depth_stamp_ns: int = 0
    boxes: tuple[Lifted, ...] = ()
    points: tuple[Lifted, ...] = ()
    trajectories: tuple[tuple[Lifted, ...], ...] = ()


_DEGENERATE = Lifted(False, reason="degenerate box (zero width or height): not lifted")


class DepthLifter(Generic[P]):
    """Lifts outcomes with frames from a depth history and the latest camera model."""

    def __init__(self, settings: DepthSettings, history: FrameHistory[P],
                 read_frame: Callable[[P], ImageMessage],
                 camera_model: Callable[[], CameraModel | None]) -> None:
        """``camera_model`` returns the colour camera's latest CameraInfo as a model."""
        self.settings = settings
        self.history = history
        self.read_frame = read_frame
        self.camera_model = camera_model
        # The depth frames of the latest lifts, for normal_at after the lift: a long
        # generation can outlast the history (the frame is picked before it), and the target
        # pose is estimated once the answer is published.
        self._lifted: collections.deque[StoredFrame[P]] = collections.deque(maxlen=4)
        self._lifted_lock = threading.Lock()

    def pick(self, colour_stamp_ns: int) -> StoredFrame[P] | None:
        """Return the depth frame nearest the colour stamp within ``max_skew_s`` (or None).

        Taken when the colour frame is chosen, before generation: a long generation would
        otherwise outlast the depth history and lose the frame to eviction.
        """
        skew_ns = int(self.settings.max_skew_s * _NS)
        candidates = self.history.frames_since(colour_stamp_ns - skew_ns,
                                               colour_stamp_ns + skew_ns)
        return min(candidates, key=lambda f: abs(f.stamp_ns - colour_stamp_ns), default=None)

    def _await(self, colour_stamp_ns: int) -> StoredFrame[P] | None:
        """Wait at most ``max_skew_s`` for the colour frame's depth frame to arrive.

        A driver publishes the pair together, but the depth frame (larger, on another topic)
        can arrive after its colour frame; a fast answer would otherwise find no depth. No
        wait once a depth frame newer than the window has arrived: this one will not come.
        """
        skew_ns = int(self.settings.max_skew_s * _NS)
        deadline = time.monotonic() + self.settings.max_skew_s
        while (left := deadline - time.monotonic()) > 0:
            latest = self.history.latest()
            if latest is not None and latest.stamp_ns > colour_stamp_ns + skew_ns:
                return None
            if self.history.wait_for_next(timeout_s=left) is None:
                return None
            frame = self.pick(colour_stamp_ns)
            if frame is not None:
                return frame
        return None

    def lift(self, outcome: ReasonOutcome, colour_stamp_ns: int,
             colour_size: tuple[int, int], colour_frame_id: str,
             frame: StoredFrame[P] | None = None) -> Answer3D:
        """Lift every box, point and trajectory of ``outcome``; never raises.

        ``frame`` is the depth frame :meth:`pick` chose with the colour frame; without one,
        it is picked now, waiting up to ``max_skew_s`` for it (depth may arrive a little after
        its colour frame).
        """
        if not (outcome.boxes or outcome.points or outcome.trajectories):
            return Answer3D(LiftCode.OFF, "nothing to lift", colour_frame_id)
        s = self.settings
        camera = self.camera_model()
        if camera is None:
            return Answer3D(LiftCode.NO_DEPTH, "no CameraInfo received yet", colour_frame_id)
        frame = frame or self.pick(colour_stamp_ns) or self._await(colour_stamp_ns)
        if frame is None:
            latest = self.history.latest()
            nearest = "none received" if latest is None else \
                f"newest is {(latest.stamp_ns - colour_stamp_ns) / _NS:+.3f} s from it"
            return Answer3D(LiftCode.NO_DEPTH, f"no depth frame within depth.max_skew_s="
                            f"{s.max_skew_s:g} s of the colour frame ({nearest})",
                            colour_frame_id)
        try:
            depth = self.read_frame(frame.payload)
            scale = check_registration(colour_size, (depth.width, depth.height),
                                       colour_frame_id, depth.frame_id,
                                       s.registered_frame_id, camera)
            stored = depth_image(depth.encoding, depth.width, depth.height, depth.step,
                                 depth.data, depth.is_bigendian, s.scale)
        except CosmosReasonError as e:
            return Answer3D(LiftCode.BAD_DEPTH, e.message, colour_frame_id, frame.stamp_ns)
        with self._lifted_lock:
            self._lifted.append(frame)
        settings = s.lift
        liftable = [b for b in outcome.boxes if not b.degenerate]
        lifted = iter(lift_boxes(stored, camera, liftable, scale, settings))
        boxes = tuple(_DEGENERATE if b.degenerate else next(lifted) for b in outcome.boxes)
        points = lift_points(stored, camera, outcome.points, scale, settings)
        trajectories = tuple(lift_trajectory(stored, camera, t, scale, settings)
                             for t in outcome.trajectories)
        return Answer3D(LiftCode.OK, "", colour_frame_id, frame.stamp_ns, boxes, points,
                        trajectories)

    def normal_at(self, depth_stamp_ns: int, colour_width: int, u: float,
                  v: float) -> SurfaceNormal:
        """Return the surface normal at colour pixel ``(u, v)`` in the depth frame a lift used.

        The frame is the one stamped ``depth_stamp_ns`` (``Answer3D.depth_stamp_ns``), one of
        the latest lifts' (else from the history), read again: the lift has checked its
        registration already. Never raises.
        """
        camera = self.camera_model()
        with self._lifted_lock:
            lifted = [f for f in self._lifted if f.stamp_ns == depth_stamp_ns]
        frame = next(iter(lifted or self.history.frames_since(depth_stamp_ns, depth_stamp_ns)),
                     None)
        if frame is None or camera is None:
            return SurfaceNormal(False, reason="the depth frame the answer was lifted with is "
                                 "no longer in the depth history (depth.history_frames)")
        try:
            depth = self.read_frame(frame.payload)
            stored = depth_image(depth.encoding, depth.width, depth.height, depth.step,
                                 depth.data, depth.is_bigendian, self.settings.scale)
        except CosmosReasonError as e:
            return SurfaceNormal(False, reason=e.message)
        # Registered at an integer down-scale (check_registration at the lift).
        scale = max(1, round(colour_width / depth.width)) if depth.width else 1
        return surface_normal(stored, camera, u, v, scale, self.settings.lift)
