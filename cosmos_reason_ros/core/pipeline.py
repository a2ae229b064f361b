"""The goal pipeline: one copy of every step from goal fields to a finished outcome.

The node, offline replay and the benchmarks run goals through :class:`GoalPipeline`, so the
same goal about the same frame builds the same engine request everywhere:

1. :meth:`GoalPipeline.validate`: goal fields -> :class:`ValidGoal` (text, task, schema,
   sampling, source, numeric fields, clip bounds, timeout, engine state), or ``BadRequestError``
   naming the field.
2. :meth:`GoalPipeline.run`: choose frames from the camera's :class:`FrameHistory` (latest
   within the max age, the next one, the newest prefilled one, a clip ending within the max
   age; with several cameras one frame each, synchronised: ``core/cameras.py``), decode and
   resize them to the model budget, build the request, drive the engine with a deadline,
   cancel and throttled progress callbacks, parse and map coordinates to original pixels
   (each camera's own, with several).

ROS stays outside: callers pass plain callables for stages, progress and "should I stop", and
read frames through a ``read_frame`` function (``core/cdr.read_frame`` for CDR bytes).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

from cosmos_reason_ros.core import imaging, query, routing
from cosmos_reason_ros.core.answer3d import Answer3D, DepthLifter, DepthSettings, LiftCode
from cosmos_reason_ros.core.cameras import (
    DEFAULT_CAMERA,
    CameraFrame,
    resolve_cameras,
    synchronized_frames,
)
from cosmos_reason_ros.core.frames import FrameHistory, StoredFrame
from cosmos_reason_ros.core.imaging import ImageMessage
from cosmos_reason_ros.core.lifting import LiftSettings
from cosmos_reason_ros.core.models import ModelProfile
from cosmos_reason_ros.core.params import NodeParams
from cosmos_reason_ros.core.prefill import PrefillPolicy
from cosmos_reason_ros.core.types import (
    BadRequestError,
    ChatRequest,
    CosmosReasonError,
    DeadlineExceededError,
    EngineError,
    EngineUnavailableError,
    FinishReason,
    ImageGeometry,
    ImageTooOldError,
    NoImageError,
    ReasonOutcome,
    RequestCancelledError,
    Timings,
)

P = TypeVar("P")  # a stored frame's payload (e.g. serialized bytes)
_LOG = logging.getLogger(__name__)

CANCEL_GRACE_S = 5.0  # how long a stopped request may take to end in the engine
POLL_S = 0.05  # cancel/timeout are re-checked at least this often
MAX_CLIP_FPS = 30.0
# Frames of several cameras in one goal must be taken within this of each other (0.1 s:
# free-running cameras at 10 Hz or faster always have a pair within half a period, 0.05 s;
# hardware-synchronised ones allow 0). The node's cameras.max_skew_s sets it.
DEFAULT_MAX_SKEW_S = 0.1
# make_way_for's stamp for a goal whose first image is not the default camera's: no prefill
# (always of the default camera) shares its prefix, so one in flight is aborted.
_NO_PREFILLED_PREFIX = -1
UNAVAILABLE_STATES = ("unavailable", "closed", "stopped")  # EngineState values


class Source(enum.IntEnum):
    """Where a goal's image comes from (the values of ``Reason.Goal.SOURCE_*``)."""

    LATEST = 0
    NEXT = 1
    CLIP = 2
    GOAL_IMAGE = 3


class Stage(str, enum.Enum):
    """Progress stages, in the order a goal passes them (``Reason.Feedback.STAGE_*``)."""

    QUEUED = "queued"
    WAITING_FOR_IMAGE = "waiting_for_image"
    PREPROCESSING = "preprocessing"
    GENERATING = "generating"


def _no_stage(_stage: Stage) -> None:
    """Take no stage feedback (the default ``on_stage``, and a goal that asked for none)."""


class FeedbackLevel(enum.IntEnum):
    """Which feedback a goal publishes (the values of ``Reason.Goal.FEEDBACK_*``)."""

    ALL = 0  # every stage and the streamed text
    STAGES = 1  # stage changes only
    NONE = 2  # the result alone

    @property
    def stages(self) -> bool:
        """Whether stage changes go out."""
        return self is not FeedbackLevel.NONE

    @property
    def text(self) -> bool:
        """Whether the streamed text goes out."""
        return self is FeedbackLevel.ALL


class Stop(str, enum.Enum):
    """Why a caller wants a goal to stop early."""

    CANCEL = "cancel"
    SHUTDOWN = "shutdown"
    DEACTIVATE = "deactivate"  # the node leaving the active state (ros/node.py)


@dataclass(frozen=True)
class GoalFields:
    """The fields of a ``Reason`` goal in plain form (0 / empty = the node's default)."""

    task: str = ""
    prompt: str = ""
    targets: tuple[str, ...] = ()
    reasoning: bool = False
    source: int = Source.LATEST
    max_image_age_s: float = 0.0
    wait_for_image_s: float = 0.0
    clip_duration_s: float = 0.0
    clip_fps: float = 0.0
    response_schema: str = ""
    max_tokens: int = 0
    temperature: float = 0.0
    greedy: bool = False
    timeout_s: float = 0.0
    image: ImageMessage | None = None  # the image carried by a SOURCE_GOAL_IMAGE goal
    images_in_goal: int = 0  # how many of image / compressed_image the goal filled
    cameras: tuple[str, ...] = ()  # camera names, in prompt order; empty = the default camera
    feedback: int = FeedbackLevel.ALL


@dataclass(frozen=True)
class Settings:
    """The node parameters the goal path reads, taken once from the parameter table."""

    profile: ModelProfile
    limits: query.QueryLimits
    constrain_structured_tasks: bool = True
    fixed_output_length: bool = False
    engine_constrains_after_reasoning: bool = False
    goal_timeout_s: float = 120.0
    max_age_s: float = 2.0
    wait_s: float = 1.0
    clip_duration_s: float = 3.0
    clip_fps: float = 4.0
    max_clip_duration_s: float = 30.0
    max_clip_frames: int = 64
    # A clip whose history gives fewer frames per second than this fails (NO_IMAGE); 0: never,
    # the result's clip_fps reports the rate instead (image.clip_min_fps).
    clip_min_fps: float = 0.0
    decode_max_pixels: int = imaging.DEFAULT_MAX_PIXELS
    feedback_rate_hz: float = 10.0
    feedback_total_rate_hz: float = 50.0
    ready_frame_within_s: float = 0.0
    depth: DepthSettings | None = None  # None: depth input off
    # Requests about a camera carry the routing key '<prefix>/<camera>' (core/routing.py).
    session_key_prefix: str = ""

    @classmethod
    def from_params(cls, p: NodeParams, profile: ModelProfile,
                    node_name: str = "") -> Settings:
        """Build from the validated node parameters (``config.validate``).

        ``node_name`` (the node's fully qualified name) prefixes the routing keys unless
        ``engine.session_key`` names another prefix.
        """
        return cls(
            profile=profile,
            session_key_prefix=p.engine.session_key or node_name,
            limits=query.QueryLimits(
                max_tokens=p.limits.max_tokens, max_prompt_chars=p.limits.max_prompt_chars,
                max_schema_bytes=p.limits.max_schema_bytes,
                max_image_pixels=p.model.max_pixels, max_images=_images_per_prompt(p),
                # Only the in-process engine's context is known here; a server has its own.
                max_model_len=p.engine.max_model_len if p.engine.kind == "vllm" else 0),
            constrain_structured_tasks=p.model.constrain_structured_tasks,
            fixed_output_length=p.limits.fixed_output_length,
            engine_constrains_after_reasoning=p.engine.constrains_after_reasoning,
            goal_timeout_s=p.limits.goal_timeout_s, max_age_s=p.image.max_age_s,
            wait_s=p.image.wait_s, clip_duration_s=p.image.clip_duration_s,
            clip_fps=p.image.clip_fps, max_clip_duration_s=p.limits.max_clip_duration_s,
            max_clip_frames=p.limits.max_clip_frames,
            clip_min_fps=p.image.clip_min_fps,
            decode_max_pixels=p.image.max_pixels,
            feedback_rate_hz=p.limits.feedback_rate_hz,
            feedback_total_rate_hz=p.limits.feedback_total_rate_hz,
            ready_frame_within_s=p.prefill.ready_frame_within_s,
            depth=DepthSettings(
                scale=p.depth.scale or None, max_skew_s=p.depth.max_skew_s,
                registered_frame_id=p.depth.registered_frame_id,
                lift=LiftSettings(min_m=p.depth.min_m, max_m=p.depth.max_m))
            if p.depth.enabled else None)


@dataclass(frozen=True)
class ValidGoal:
    """A goal whose fields passed every check; what :meth:`GoalPipeline.run` needs."""

    fields: GoalFields
    spec: query.QuerySpec
    source: Source
    timeout_s: float
    max_age_s: float
    wait_s: float
    clip_duration_s: float
    clip_fps: float
    # The cameras the goal is about, in prompt order (the default camera when it named
    # none); empty for SOURCE_GOAL_IMAGE.
    cameras: tuple[str, ...] = ()
    feedback: FeedbackLevel = FeedbackLevel.ALL


@dataclass(frozen=True)
class CameraImage:
    """One camera's frame in a goal's media: the result's per-camera header and geometry."""

    camera: str
    frame_id: str
    header_stamp_ns: int  # the image's own header stamp (a clip: its newest frame's)
    stamp_ns: int  # the frame's time as stored
    geometry: ImageGeometry
    # Full-resolution RGB of the frame, converted only if someone draws on it.
    original_rgb: Callable[[], np.ndarray]


@dataclass
class Media:
    """Model-ready media of a goal and where it came from.

    With several cameras, ``stamps_ns`` holds one stamp per camera in prompt order and the
    single-image fields (``frame_id``, ``header_stamp_ns``, ``original_rgb``) are the first
    camera's; ``cameras`` has each camera's own.
    """

    prepared: query.PreparedMedia
    stamps_ns: list[int]  # each frame's time as stored (header stamp, else receipt time)
    frame_id: str
    header_stamp_ns: int  # the (newest) image's own header stamp, for the result header
    # Full-resolution RGB of the (newest) frame, converted only if someone draws on it.
    original_rgb: Callable[[], np.ndarray]
    # A clip's effective rate: its frames per second of the duration asked (below the goal's
    # clip_fps when the history held fewer frames); 0 for a single image.
    clip_fps: float = 0.0
    # Each camera's frame, in prompt order; empty for the goal's own image.
    cameras: tuple[CameraImage, ...] = ()

    @property
    def clip_start_ns(self) -> int | None:
        """The first frame's stamp of a clip (span times count from it), else None."""
        return self.stamps_ns[0] if self.prepared.video is not None else None


@dataclass
class GoalRun:
    """What one run produced: the outcome (partial after a stop or error), timings, error."""

    media: Media | None = None
    request: ChatRequest | None = None
    outcome: ReasonOutcome | None = None
    answer3d: Answer3D | None = None  # with depth on: the outcome's items in 3D
    error: CosmosReasonError | None = None
    preprocess_s: float = 0.0
    time_to_first_token_s: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)


class GoalPipeline(Generic[P]):
    """Runs validated goals over camera frame histories and an engine runner."""

    def __init__(self, settings: Settings, runner: Any, history: FrameHistory[P],
                 read_frame: Callable[[P], ImageMessage], clock_ns: Callable[[], int],
                 prefill: PrefillPolicy | None = None, source_name: str = "the camera",
                 lifter: DepthLifter[Any] | None = None,
                 to_target_frame: Callable[[Answer3D, int], Answer3D] | None = None, *,
                 cameras: Mapping[str, FrameHistory[P]] | None = None,
                 max_skew_s: float = DEFAULT_MAX_SKEW_S) -> None:
        """``runner``: an ``engines.runner.EngineRunner`` (``submit``/``health_now``).

        ``history`` is the default camera's frames. ``clock_ns`` is the clock frame ages are
        measured on (the node clock: sim time under replay); ``source_name`` names the default
        camera in error messages; ``lifter`` lifts answers to 3D when depth input is on (the
        default camera's depth), and ``to_target_frame(answer, stamp_ns)`` moves them to
        another frame (the node's tf2 lookup at the image stamp).

        ``cameras`` (name -> history, the default camera first, its history ``history``)
        names every camera goals may ask for; without it the one camera is
        ``cameras.DEFAULT_CAMERA``. ``max_skew_s`` bounds how far apart the frames of one
        multi-camera goal may be taken. :meth:`for_cameras` builds from the mapping alone.
        """
        named = dict(cameras) if cameras else {DEFAULT_CAMERA: history}
        if next(iter(named.values())) is not history:
            raise ValueError("GoalPipeline: history must be the first (default) camera's")
        if not (math.isfinite(max_skew_s) and max_skew_s >= 0):
            raise ValueError(f"max_skew_s={max_skew_s!r}; expected a finite number >= 0")
        self.settings = settings
        self.runner = runner
        self.history = history
        self.cameras: dict[str, FrameHistory[P]] = named
        self.max_skew_s = float(max_skew_s)
        self.read_frame = read_frame
        self.clock_ns = clock_ns
        self.prefill = prefill
        self.source_name = source_name
        self.lifter = lifter
        self.to_target_frame = to_target_frame
        self._generating = 0  # goals streaming from the engine now (feedback shares)
        self._generating_lock = threading.Lock()

    @classmethod
    def for_cameras(cls, settings: Settings, runner: Any,
                    cameras: Mapping[str, FrameHistory[P]],
                    read_frame: Callable[[P], ImageMessage], clock_ns: Callable[[], int], *,
                    max_skew_s: float = DEFAULT_MAX_SKEW_S,
                    prefill: PrefillPolicy | None = None, source_name: str = "",
                    lifter: DepthLifter[Any] | None = None,
                    to_target_frame: Callable[[Answer3D, int], Answer3D] | None = None,
                    ) -> GoalPipeline[P]:
        """Build over named cameras (name -> history; the first is the default camera).

        ``source_name`` names the default camera in error messages (default: its name);
        ``prefill`` and ``lifter`` are the default camera's, as in the constructor.
        """
        if not cameras:
            raise ValueError("GoalPipeline.for_cameras needs at least one camera")
        default = next(iter(cameras))
        return cls(settings, runner, cameras[default], read_frame, clock_ns, prefill,
                   source_name or default, lifter, to_target_frame, cameras=cameras,
                   max_skew_s=max_skew_s)

    @classmethod
    def from_params(cls, p: NodeParams, profile: ModelProfile, runner: Any,
                    cameras: Mapping[str, FrameHistory[P]],
                    read_frame: Callable[[P], ImageMessage], clock_ns: Callable[[], int], *,
                    node_name: str = "", depth_history: FrameHistory[P] | None = None,
                    camera_model: Callable[[], Any] | None = None,
                    prefill: PrefillPolicy | None = None, source_name: str = "",
                    to_target_frame: Callable[[Answer3D, int], Answer3D] | None = None,
                    ) -> GoalPipeline[P]:
        """Compose the pipeline from the node's parameters: the node's and replay's one way.

        Settings from ``p`` (``node_name`` prefixes the routing keys); with ``depth.enabled``
        and a ``depth_history``, a lifter over it with the colour camera's intrinsics from
        ``camera_model()``. The rest as :meth:`for_cameras`.
        """
        settings = Settings.from_params(p, profile, node_name)
        lifter = None if settings.depth is None or depth_history is None \
            else DepthLifter(settings.depth, depth_history, read_frame,
                             camera_model or (lambda: None))
        pipeline = cls.for_cameras(settings, runner, cameras, read_frame, clock_ns,
                                   max_skew_s=p.cameras.max_skew_s, prefill=prefill,
                                   source_name=source_name, lifter=lifter,
                                   to_target_frame=to_target_frame)
        runner.engine.route_warm_up_as(pipeline.session_key())
        return pipeline

    @property
    def default_camera(self) -> str:
        """The camera a goal without ``cameras`` is about (the first configured)."""
        return next(iter(self.cameras))

    def _camera_label(self, camera: str) -> str:
        """How error messages name a camera (the default one by ``source_name``)."""
        return self.source_name if camera == self.default_camera else camera

    # --- 1. validation -----------------------------------------------------------------

    def validate(self, goal: GoalFields, check_engine: bool = True) -> ValidGoal:
        """Check every goal field (and the engine's state); raise naming the bad field."""
        s = self.settings
        spec = query.make_spec(
            s.profile, task=goal.task, prompt=goal.prompt, targets=list(goal.targets),
            reasoning=goal.reasoning, response_schema=goal.response_schema,
            max_tokens=goal.max_tokens, temperature=goal.temperature, greedy=goal.greedy,
            limits=s.limits, constrain=s.constrain_structured_tasks)
        if s.fixed_output_length:
            spec = dataclasses.replace(
                spec, sampling=dataclasses.replace(spec.sampling, ignore_eos=True))
        timeout = _non_negative("timeout_s", goal.timeout_s, "number of seconds")
        source = _check_source(goal)
        cameras = self._check_cameras(goal, source)
        for name in ("max_image_age_s", "wait_for_image_s", "clip_duration_s", "clip_fps"):
            _non_negative(name, getattr(goal, name), "finite number")
        duration = float(goal.clip_duration_s) or s.clip_duration_s
        fps = float(goal.clip_fps) or s.clip_fps
        if source is Source.CLIP:
            if duration > s.max_clip_duration_s:
                raise BadRequestError(f"clip_duration_s={duration:g} exceeds "
                                      f"limits.max_clip_duration_s={s.max_clip_duration_s:g}")
            if fps > MAX_CLIP_FPS:
                raise BadRequestError(f"clip_fps={fps:g}: allowed 0 (default {s.clip_fps:g}) "
                                      f"up to {MAX_CLIP_FPS:g}")
        if check_engine:
            health = self.runner.health_now()
            if health.state.value in UNAVAILABLE_STATES:
                raise EngineUnavailableError(f"engine {health.state.value}: {health.detail}")
        return ValidGoal(goal, spec, source, timeout or s.goal_timeout_s,
                         float(goal.max_image_age_s) or s.max_age_s,
                         float(goal.wait_for_image_s) or s.wait_s, duration, fps, cameras,
                         _check_feedback(goal))

    def _check_cameras(self, goal: GoalFields, source: Source) -> tuple[str, ...]:
        """Resolve the goal's camera names (BAD_REQUEST naming the problem)."""
        if source is Source.GOAL_IMAGE:
            if goal.cameras:
                raise BadRequestError(
                    f"cameras={list(goal.cameras)} names cameras, but source="
                    f"SOURCE_GOAL_IMAGE answers about the goal's own image; leave cameras "
                    f"empty")
            return ()
        cameras = resolve_cameras(goal.cameras, list(self.cameras),
                                  self.settings.limits.images_per_request)
        if source is Source.CLIP and len(cameras) > 1:
            raise BadRequestError(
                f"source=SOURCE_CLIP takes one camera; cameras names {len(cameras)} "
                f"({', '.join(cameras)}): send one clip goal per camera")
        return cameras

    def _goal_camera(self, goal: ValidGoal) -> str:
        """Return the one camera of a single-camera goal."""
        return goal.cameras[0] if goal.cameras else self.default_camera

    # --- 2. frames and media -------------------------------------------------------------

    def choose_frames(self, goal: ValidGoal, accepted_ns: int, deadline: float,
                      should_stop: Callable[[], Stop | None] = lambda: None,
                      ) -> list[StoredFrame[P]]:
        """Return the frame(s) a single-camera goal is about: latest / next / ready / a clip.

        The camera is the goal's one camera (the default camera when it named none);
        :meth:`choose_camera_frames` serves goals of several cameras.
        """
        camera = self._goal_camera(goal)
        history, label = self.cameras[camera], self._camera_label(camera)
        if goal.source is Source.CLIP:
            return self._clip_frames(goal, history, label)
        wait_s = min(goal.wait_s, max(0.0, deadline - time.monotonic()))
        if goal.source is Source.NEXT:
            # "After acceptance": frames taken since the goal arrived, by the node clock (under
            # sim time a paused /clock means a paused recording, so no wall time is mixed in).
            frame = self._wait_frame(history, accepted_ns, wait_s, should_stop)
            if frame is None:
                raise NoImageError(f"no new frame on '{label}' within {wait_s:.2f} s")
            return [frame]
        frame = history.latest()
        if frame is None:
            frame = self._wait_frame(history, None, wait_s, should_stop)
            if frame is None:
                raise NoImageError(f"no image received on '{label}' yet "
                                   f"(waited {wait_s:.2f} s)")
        if camera == self.default_camera:  # prefills are of the default camera's frames
            frame = self._ready_frame(frame)
        self._check_age(frame, goal.max_age_s, "latest image")
        return [frame]

    def choose_camera_frames(self, goal: ValidGoal, accepted_ns: int, deadline: float,
                             should_stop: Callable[[], Stop | None] = lambda: None,
                             ) -> tuple[CameraFrame[P], ...]:
        """Return one frame per camera of the goal, in its order, within ``max_skew_s``.

        Latest (within the max age) or next (after ``accepted_ns``) per camera, then
        synchronised, waiting at most the goal's ``wait_for_image_s`` and its deadline
        (``core/cameras.synchronized_frames``). A single-camera goal gets its frame from
        :meth:`choose_frames`; clips are single-camera (``validate`` refuses more).
        """
        if len(goal.cameras) <= 1 or goal.source is Source.CLIP:
            frames = self.choose_frames(goal, accepted_ns, deadline, should_stop)
            return (CameraFrame(self._goal_camera(goal), frames[-1]),)

        def stop_error() -> CosmosReasonError | None:
            stop = should_stop()
            return None if stop is None else interrupted(stop, "while waiting for an image")

        return synchronized_frames(
            [(name, self.cameras[name]) for name in goal.cameras],
            max_skew_s=self.max_skew_s, clock_ns=self.clock_ns,
            wait_s=min(goal.wait_s, max(0.0, deadline - time.monotonic())),
            max_age_s=goal.max_age_s,
            after_ns=accepted_ns if goal.source is Source.NEXT else None,
            should_stop=stop_error)

    def _check_age(self, frame: StoredFrame[P], max_age_s: float, what: str) -> None:
        age_s = (self.clock_ns() - frame.stamp_ns) / 1e9
        if max_age_s > 0 and age_s > max_age_s:
            raise ImageTooOldError(f"{what} is {age_s:.3f} s old; max_image_age_s="
                                   f"{max_age_s:g}")

    def _clip_frames(self, goal: ValidGoal, history: FrameHistory[P],
                     label: str) -> list[StoredFrame[P]]:
        s = self.settings
        frames = history.clip(goal.clip_duration_s, goal.clip_fps, max_frames=s.max_clip_frames)
        if len(frames) < 2:
            raise NoImageError(f"a {goal.clip_duration_s:g} s clip at {goal.clip_fps:g} fps "
                               f"needs at least 2 frames; the history holds "
                               f"{len(history)} (camera: {label})")
        # "The last N seconds" means before now: a camera that stopped gives no clip.
        self._check_age(frames[-1], goal.max_age_s, "the clip's newest frame")
        # The history keeps what the camera subscription received: a camera slower than
        # clip_fps, or frames dropped on the way (best-effort raw 640x480 frames, larger than
        # Fast DDS's default 512 KB shared-memory segment, lost 2 of 3 at 10 Hz in a soak),
        # gives a thinner clip than asked.
        wanted = max(1, round(goal.clip_duration_s * goal.clip_fps))
        allowed = min(wanted, s.max_clip_frames)
        fps = len(frames) / goal.clip_duration_s
        if s.clip_min_fps > 0 and fps < s.clip_min_fps:
            raise NoImageError(
                f"the clip holds {len(frames)} frames in {goal.clip_duration_s:g} s ({fps:.2f} "
                f"fps) < image.clip_min_fps={s.clip_min_fps:g} (clip_fps={goal.clip_fps:g}; "
                f"camera: {label} delivers too few frames, see RELIABILITY.md, "
                f"camera QoS)")
        if len(frames) < allowed:
            _LOG.warning("thin clip: frames=%d wanted=%d duration_s=%g clip_fps=%g "
                         "effective_fps=%.2f camera=%s", len(frames), allowed,
                         goal.clip_duration_s, goal.clip_fps, fps, label)
        return frames

    def _ready_frame(self, newest: StoredFrame[P]) -> StoredFrame[P]:
        """Return the newest frame, or a slightly older one whose prefix the engine holds."""
        within_ns = int(self.settings.ready_frame_within_s * 1e9)
        if within_ns <= 0 or self.prefill is None:
            return newest
        candidates = [newest] + [f for f in reversed(self.history.snapshot()) if f is not newest
                                 and 0 <= newest.stamp_ns - f.stamp_ns <= within_ns]
        stamp = self.prefill.ready_frame([f.stamp_ns for f in candidates])
        return next((f for f in candidates if f.stamp_ns == stamp), newest)

    def _wait_frame(self, history: FrameHistory[P], after_ns: int | None, wait_s: float,
                    should_stop: Callable[[], Stop | None]) -> StoredFrame[P] | None:
        end = time.monotonic() + wait_s
        while True:
            remaining = end - time.monotonic()
            frame = history.wait_for_next(after_ns, min(POLL_S * 4, max(0.0, remaining)))
            if frame is not None:
                return frame
            stop = should_stop()
            if stop is not None:
                raise interrupted(stop, "while waiting for an image")
            if remaining <= 0:
                return None

    def prepare_frame(self, frame: StoredFrame[P]) -> Media:
        """Decode and resize one stored frame: one path for goals and prefills alike."""
        return self.prepare_image(self.read_frame(frame.payload), frame.stamp_ns)

    def prepare_image(self, image: ImageMessage, stamp_ns: int | None = None) -> Media:
        """Decode ``image`` straight to the model's input size; keep the geometry."""
        s = self.settings
        max_px = s.decode_max_pixels
        stamp = image.stamp_ns if stamp_ns is None else stamp_ns
        if image.compressed or not (image.width and image.height):
            rgb = imaging.message_to_rgb(image, max_px)
            prepared = query.prepare_image(s.profile, rgb, s.limits)
            return Media(prepared, [stamp], image.frame_id, image.stamp_ns, lambda: rgb)
        # Converted and resized in one pass (colour conversion at the model's resolution).
        size = query.input_size(s.profile, image.width, image.height, s.limits)
        rgb = imaging.message_to_rgb(image, max_px, size)
        prepared = query.prepare_image(s.profile, rgb, s.limits,
                                       original_size=(image.width, image.height))
        return Media(prepared, [stamp], image.frame_id, image.stamp_ns,
                     lambda: imaging.message_to_rgb(image, max_px))

    def prepare_clip(self, frames: list[StoredFrame[P]], fps: float,
                     duration_s: float = 0.0) -> Media:
        """Decode a clip's frames and resize them within the video budget.

        ``fps`` is the rate asked (the model's time axis uses the frames' own stamps); the
        media's ``clip_fps`` is the rate obtained, ``len(frames) / duration_s`` (without a
        duration: over the frames' own span).
        """
        s = self.settings
        images = [self.read_frame(f.payload) for f in frames]
        rgbs = [imaging.message_to_rgb(m, s.decode_max_pixels) for m in images]
        stamps = [f.stamp_ns for f in frames]
        prepared = query.prepare_clip(s.profile, rgbs, stamps, fps, s.limits)
        span_s = (stamps[-1] - stamps[0]) / 1e9 if len(stamps) > 1 else 0.0
        effective = len(frames) / duration_s if duration_s > 0 else (
            (len(frames) - 1) / span_s if span_s > 0 else float(fps))
        return Media(prepared, stamps, images[-1].frame_id, images[-1].stamp_ns,
                     lambda: rgbs[-1], clip_fps=effective)

    def prepare_cameras(self, frames: tuple[CameraFrame[P], ...]) -> Media:
        """Decode and resize one frame per camera: one request's images, in camera order.

        Each image gets the whole per-image budget (``model.max_pixels``); the request's
        limits count them all (``query.check_media_limits``).
        """
        prepared = [self.prepare_frame(f.frame) for f in frames]
        if len(frames) == 1:
            return self._named(prepared[0], frames[0].camera)
        pairs = list(zip(frames, prepared, strict=True))
        first = prepared[0]
        return Media(query.combine_cameras([(f.camera, m.prepared) for f, m in pairs]),
                     [m.stamps_ns[-1] for m in prepared], first.frame_id,
                     first.header_stamp_ns, first.original_rgb,
                     cameras=tuple(_camera_image(f.camera, m) for f, m in pairs))

    def _named(self, media: Media, camera: str) -> Media:
        """Return the media of one camera's image or clip, named by its camera."""
        return dataclasses.replace(
            media, prepared=query.combine_cameras([(camera, media.prepared)]),
            cameras=(_camera_image(camera, media),))

    def media_for(self, goal: ValidGoal, accepted_ns: int, deadline: float,
                  should_stop: Callable[[], Stop | None] = lambda: None,
                  on_stage: Callable[[Stage], None] = _no_stage) -> Media:
        """Choose and prepare the goal's media, reporting the stages it passes."""
        if goal.source is Source.GOAL_IMAGE:
            on_stage(Stage.PREPROCESSING)
            assert goal.fields.image is not None  # validate() checked it
            return self.prepare_image(goal.fields.image)
        if goal.source is not Source.CLIP:
            on_stage(Stage.WAITING_FOR_IMAGE)
        if len(goal.cameras) > 1:
            chosen = self.choose_camera_frames(goal, accepted_ns, deadline, should_stop)
            on_stage(Stage.PREPROCESSING)
            return self.prepare_cameras(chosen)
        frames = self.choose_frames(goal, accepted_ns, deadline, should_stop)
        on_stage(Stage.PREPROCESSING)
        if goal.source is Source.CLIP:
            media = self.prepare_clip(frames, goal.clip_fps, goal.clip_duration_s)
        else:
            media = self.prepare_frame(frames[0])
        return self._named(media, self._goal_camera(goal))

    # --- 3. request ----------------------------------------------------------------------

    def session_key(self, camera: str | None = None) -> str:
        """Return the routing key of requests about ``camera`` (default: the default camera).

        Goals, follow-up questions, periodic runs and prefills about one camera share it, so
        a router with session affinity sends them to the server that holds its image prefix.
        """
        return routing.session_key(self.settings.session_key_prefix,
                                   camera or self.default_camera)

    def build_request(self, goal: ValidGoal, media: Media, priority: int = 0,
                      request_id: str | None = None) -> ChatRequest:
        """Build the engine request for a goal about prepared media.

        It is routed by its first camera (whose image starts the prompt: the cached prefix);
        a goal's own image by the default camera's key.
        """
        return query.build_request(
            request_id or uuid.uuid4().hex, self.settings.profile, goal.spec, media.prepared,
            priority=priority,
            engine_constrains_after_reasoning=self.settings.engine_constrains_after_reasoning,
            limits=self.settings.limits,
            session_key=self.session_key(media.cameras[0].camera if media.cameras else None))

    def build_prefill_request(self, media: Media, reasoning: bool = False,
                              request_id: str | None = None) -> ChatRequest:
        """Build the one-token request over a default-camera frame's prefix.

        Routed like the goals about that camera (``query.build_prefill_request``).
        """
        return query.build_prefill_request(
            request_id or uuid.uuid4().hex, self.settings.profile, media.prepared,
            reasoning=reasoning, session_key=self.session_key())

    # --- the whole run -------------------------------------------------------------------

    def run(self, goal: ValidGoal, *, t_start: float, accepted_ns: int,
            should_stop: Callable[[], Stop | None] = lambda: None,
            on_stage: Callable[[Stage], None] = _no_stage,
            on_progress: Callable[[str, int], None] = lambda _t, _n: None,
            priority: int = 0, is_goal: bool = True) -> GoalRun:
        """Frames -> media -> request -> engine -> outcome; never raises a package error.

        ``t_start`` (monotonic) is when the goal was accepted: the deadline and the
        time to first token count from it. Errors end up in ``GoalRun.error``; after a stop,
        a timeout or an engine error the outcome holds what was generated until then.
        """
        run = GoalRun()
        deadline = t_start + goal.timeout_s
        if not goal.feedback.stages:
            on_stage = _no_stage
        t_media = time.monotonic()
        try:
            run.media = self.media_for(goal, accepted_ns, deadline, should_stop, on_stage)
            run.preprocess_s = time.monotonic() - t_media
            newest = run.media.stamps_ns[-1]
            depth_frame = None if self.lifter is None or not self._liftable(run.media) \
                else self.lifter.pick(newest)
            if self.prefill is not None:
                # A prefill (of the default camera's frame) shares the prefix of a goal whose
                # first image is that frame: several cameras' images follow it in the prompt.
                first = run.media.cameras[0].camera if run.media.cameras else None
                if first not in (None, self.default_camera):
                    prefix_stamp = _NO_PREFILLED_PREFIX
                else:
                    prefix_stamp = run.media.stamps_ns[0] if len(run.media.cameras) > 1 \
                        else newest
                cancel = self.prefill.make_way_for(prefix_stamp)
                if cancel is not None:
                    cancel()  # a prefill of another frame must not delay this goal
                if is_goal and prefix_stamp != _NO_PREFILLED_PREFIX:
                    self.prefill.goal_frame(prefix_stamp)
            run.request = self.build_request(goal, run.media, priority)
            self._generate(run, goal, deadline, t_start, should_stop, on_stage, on_progress)
            if self.prefill is not None and is_goal and run.outcome is not None:
                self.prefill.goal_served(run.outcome.tokens.cached_prompt)
            run.answer3d = self.lift(goal, run.media, run.outcome, depth_frame)
        except CosmosReasonError as e:
            run.error = e
        return run

    def lift(self, goal: ValidGoal, media: Media, outcome: ReasonOutcome | None,
             depth_frame: StoredFrame[Any] | None = None) -> Answer3D | None:
        """Lift the outcome's items to 3D when depth is on (None when off)."""
        if self.lifter is None or outcome is None:
            return None
        if goal.source is Source.GOAL_IMAGE:
            return Answer3D(LiftCode.OFF, "the goal's own image has no depth", media.frame_id)
        if not self._liftable(media):
            return Answer3D(LiftCode.OFF, f"depth is lifted for the default camera "
                            f"'{self.default_camera}' alone; this goal used cameras "
                            f"{', '.join(c.camera for c in media.cameras)}", media.frame_id)
        geometry = media.prepared.geometry
        answer = self.lifter.lift(outcome, media.stamps_ns[-1],
                                  (geometry.original_width, geometry.original_height),
                                  media.frame_id, depth_frame)
        if self.to_target_frame is not None:
            answer = self.to_target_frame(answer, media.stamps_ns[-1])
        return answer

    def _liftable(self, media: Media) -> bool:
        """Whether the lifter (the default camera's depth) fits the media: that camera only."""
        return all(c.camera == self.default_camera for c in media.cameras)

    def _feedback_interval(self) -> float:
        """Seconds between one goal's text feedback: its own cap, or its share of the total.

        Every action client decodes every goal's feedback (one topic per action). 50 goals at
        10 Hz each stalled the node for up to a minute under CPU load (docs/RELIABILITY.md,
        "Mass cancel"); a share of the total rate bounds that whatever the number of goals.
        """
        s = self.settings
        return max(1.0 / s.feedback_rate_hz, self._generating / s.feedback_total_rate_hz)

    def _generate(self, run: GoalRun, goal: ValidGoal, deadline: float, t_start: float,
                  should_stop: Callable[[], Stop | None], on_stage: Callable[[Stage], None],
                  on_progress: Callable[[str, int], None]) -> None:
        assert run.media is not None and run.request is not None
        output = query.OutputAccumulator()
        pending: list[str] = []
        last_progress = 0.0
        streams = goal.feedback.text  # counted in the feedback shares only if it streams
        t_submit = time.monotonic()
        handle = self.runner.submit(run.request)
        on_stage(Stage.GENERATING)
        stopped: CosmosReasonError | None = None
        stop_at = 0.0
        with self._generating_lock:
            self._generating += streams
        try:
            while True:
                if stopped is None:
                    stop = should_stop()
                    if stop is not None:
                        stopped = interrupted(stop, "during generation")
                    elif time.monotonic() > deadline:
                        stopped = DeadlineExceededError("goal timed out during generation")
                    if stopped is not None:
                        handle.cancel()
                        stop_at = time.monotonic()
                elif time.monotonic() - stop_at > CANCEL_GRACE_S:
                    break  # the engine did not confirm in time; the goal ends anyway
                chunk = handle.next_chunk(POLL_S)
                if chunk is None:
                    continue
                output.add(chunk)
                if streams:
                    pending.append(chunk.reasoning_delta + chunk.text_delta)
                    now = time.monotonic()
                    if chunk.finish_reason is None and \
                            now - last_progress >= self._feedback_interval():
                        on_progress("".join(pending), output.output_tokens)
                        pending.clear()
                        last_progress = now
                if chunk.finish_reason is FinishReason.CANCELLED and stopped is None:
                    # Nobody here asked: the engine or server ended the request itself (a
                    # server shutting down, a router dropping it). The answer is cut short,
                    # so the goal must not succeed with it.
                    stopped = EngineError(f"the engine cancelled the request unasked after "
                                          f"{output.output_tokens} tokens")
                if chunk.finish_reason is not None:
                    break
        except CosmosReasonError as e:
            # An engine failure mid-stream: keep what was generated. A goal already stopped
            # keeps that first reason (its engine may fail as the node closes it under it).
            stopped = stopped or e
        finally:
            with self._generating_lock:
                self._generating -= streams
        if pending and stopped is None:
            on_progress("".join(pending), output.output_tokens)
        run.time_to_first_token_s = (t_submit - t_start) + (output.first_token_s or 0.0)
        if stopped is not None:
            if isinstance(stopped, DeadlineExceededError):
                stopped = DeadlineExceededError(f"goal timed out during generation after "
                                                f"{output.output_tokens} tokens")
            if output.finish_reason is None or output.finish_reason is FinishReason.STOP:
                output.finish_reason = FinishReason.CANCELLED
        run.outcome = query.finish(self.settings.profile, goal.spec, run.media.prepared, output,
                                   Timings(time_to_first_token_s=run.time_to_first_token_s))
        if stopped is not None:
            raise stopped


def _images_per_prompt(p: NodeParams) -> int:
    """Return the engine's images per prompt (``limit_mm_per_prompt``'s "image"; 0: not set).

    ``config.validate`` has already raised it to the number of cameras where it was left
    at its default; the value is a checked JSON object.
    """
    limits = json.loads(p.engine.limit_mm_per_prompt or "{}")
    image = limits.get("image", 0)
    return image if isinstance(image, int) and image > 0 else 0


def _camera_image(camera: str, media: Media) -> CameraImage:
    return CameraImage(camera, media.frame_id, media.header_stamp_ns, media.stamps_ns[-1],
                       media.prepared.geometry, media.original_rgb)


def _non_negative(name: str, value: float, what: str) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise BadRequestError(f"{name}={value!r}: allowed 0 (node default) or a positive "
                              f"{what}")
    return value


def _check_feedback(goal: GoalFields) -> FeedbackLevel:
    try:
        return FeedbackLevel(goal.feedback)
    except ValueError:
        raise BadRequestError(f"feedback={goal.feedback} is unknown; allowed 0 (all: stages "
                              f"and text), 1 (stages only), 2 (none)") from None


def _check_source(goal: GoalFields) -> Source:
    try:
        source = Source(goal.source)
    except ValueError:
        raise BadRequestError(f"source={goal.source} is unknown; allowed 0 (latest), 1 (next), "
                              f"2 (clip), 3 (image in goal)") from None
    if source is Source.GOAL_IMAGE:
        if goal.images_in_goal != 1 or goal.image is None:
            raise BadRequestError("source=SOURCE_GOAL_IMAGE needs exactly one of image and "
                                  "compressed_image filled")
    elif goal.images_in_goal:
        raise BadRequestError(f"the goal carries an image but source={goal.source}; set "
                              f"source=SOURCE_GOAL_IMAGE ({int(Source.GOAL_IMAGE)}) to use it")
    return source


def interrupted(stop: Stop | None, where: str) -> CosmosReasonError:
    """Return the error of a goal stopped ``where`` for ``stop`` (None: its deadline passed)."""
    if stop is None:
        return DeadlineExceededError(f"goal timed out {where}")
    if stop is Stop.CANCEL:
        return RequestCancelledError(f"cancelled {where}")
    if stop is Stop.DEACTIVATE:
        return EngineUnavailableError(f"node deactivating {where}")
    return EngineUnavailableError(f"node shutting down {where}")
