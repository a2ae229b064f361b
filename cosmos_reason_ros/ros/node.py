"""The cosmos_reason node: camera cache, the ``~/reason`` action server, results publishing.

Thin glue: parameters come from ``config``, every decision about prompts, images, parsing and
geometry from ``core``, inference from an ``engines`` backend driven through ``EngineRunner``.
Image callbacks only store the serialized message and its stamp; conversion happens once per
goal, on the goal's own executor thread.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import signal
import struct
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np
import rclpy
from builtin_interfaces.msg import Time
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rcl_interfaces.msg import SetParametersResult
from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.executors import (
    ExternalShutdownException,
    MultiThreadedExecutor,
    SingleThreadedExecutor,
)
from rclpy.node import Node
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.serialization import deserialize_message
from rclpy.signals import SignalHandlerOptions
from sensor_msgs.msg import CompressedImage, Image
from std_msgs.msg import Header

from cosmos_reason_interfaces.action import Reason
from cosmos_reason_interfaces.msg import ReasoningResult
from cosmos_reason_ros.core import cdr, imaging, query
from cosmos_reason_ros.core.admission import GoalSlots
from cosmos_reason_ros.core.annotate import draw_annotations
from cosmos_reason_ros.core.benchstats import percentile
from cosmos_reason_ros.core.frames import FrameHistory, StoredFrame
from cosmos_reason_ros.core.gcwatch import GcPauses, freeze_heap
from cosmos_reason_ros.core.models import ModelProfile, detect_profile
from cosmos_reason_ros.core.prefill import PrefillPolicy
from cosmos_reason_ros.core.types import (
    BadImageError,
    BadRequestError,
    CosmosReasonError,
    DeadlineExceededError,
    EngineError,
    EngineUnavailableError,
    ErrorCode,
    FinishReason,
    ImageTooOldError,
    NoImageError,
    OverloadedError,
    RequestCancelledError,
    Timings,
)
from cosmos_reason_ros.engines.base import EngineState
from cosmos_reason_ros.engines.factory import create_engine
from cosmos_reason_ros.engines.runner import EngineRunner
from cosmos_reason_ros.ros import messages
from cosmos_reason_ros.ros.config import (
    ConfigError,
    declare_and_load,
    engine_options,
    validate,
)
from cosmos_reason_ros.ros.detections import load_vision_msgs, to_detection_array

NODE_NAME = "cosmos_reason"
_CANCEL_GRACE_S = 5.0  # how long a cancelled request may take to end in the engine
_POLL_S = 0.05  # goal threads re-check cancel/timeout at least this often
ACTION_QUEUE_DEPTH = 256  # goal/result/cancel requests buffered per action service
# ~/results is reliable keep-last: a burst (e.g. 100 goals at once, most refused OVERLOADED)
# must fit in the writer's history until a slow subscriber acknowledges it, or results drop.
RESULTS_QUEUE_DEPTH = 256
Goal = Reason.Goal
Feedback = Reason.Feedback


@dataclass(frozen=True)
class RawFrame:
    """A camera message kept serialized until a goal needs it."""

    compressed: bool
    data: bytes


def cdr_header_stamp_ns(data: bytes) -> int:
    """Read ``header.stamp`` from a serialized Image/CompressedImage without deserializing.

    CDR: a 4-byte encapsulation header (byte 1: 0 big endian, 1 little endian), then the
    Header's stamp (int32 sec, uint32 nanosec) at offset 4.
    """
    if len(data) < 12:
        return 0
    order = "<" if data[1] == 1 else ">"
    sec, nanosec = struct.unpack_from(order + "iI", data, 4)
    return sec * messages.NS_PER_S + nanosec


@dataclass(frozen=True)
class _ImageView:
    """A stored raw Image read in place: its fields and a ``Header`` for the results."""

    fields: cdr.ImageFields
    header: Header

    def __getattr__(self, name: str) -> Any:  # width, height, encoding, step, data, ...
        return getattr(self.fields, name)


@dataclass
class _Media:
    prepared: query.PreparedMedia
    header: Any
    stamps_ns: list[int]
    # Full-resolution RGB of the (newest) frame, converted only if someone wants to draw on it.
    original_rgb: Callable[[], np.ndarray] | None = None


class ReasonNode(Node):
    """Serves ``~/reason`` goals about the camera stream and publishes ``~/results``."""

    def __init__(self, **kwargs: Any) -> None:
        """Declare and validate parameters, create the engine and subscriptions."""
        super().__init__(NODE_NAME, **kwargs)
        self.params = declare_and_load(self)
        p = self.params
        try:
            self.profile: ModelProfile = detect_profile(
                p["engine.model"] or "unknown", None if p["model.family"] == "auto"
                else p["model.family"])
        except CosmosReasonError as e:
            raise ConfigError(f"model.family/engine.model: {e.message}") from e
        self.limits = query.QueryLimits(
            max_tokens=p["limits.max_tokens"], max_prompt_chars=p["limits.max_prompt_chars"],
            max_schema_bytes=p["limits.max_schema_bytes"], max_image_pixels=p["model.max_pixels"])
        self.history: FrameHistory[RawFrame] = FrameHistory(
            max_frames=p["image.history_frames"],
            max_bytes=int(p["image.history_mb"] * 1024 * 1024), clock=self._now_ns)
        self.slots = GoalSlots(p["limits.max_concurrent_goals"], p["limits.max_queued_goals"])
        try:
            engine = create_engine(p["engine.kind"], engine_options(p))
        except ValueError as e:  # the engine's own config checks (e.g. api_key_env)
            raise ConfigError(f"invalid engine.* parameters: {e}") from e
        self.runner = EngineRunner(engine)
        self._stopping = threading.Event()
        self._counters_lock = threading.Lock()
        self.counters = {"succeeded": 0, "aborted": 0, "canceled": 0, "rejected": 0}
        self._action_server: ActionServer | None = None

        self._latencies: collections.deque[tuple[float, float]] = collections.deque(maxlen=500)
        self._periodic_busy = threading.Event()
        self.periodic_counts = {"run": 0, "skipped": 0, "failed": 0}
        self._last_frame_monotonic: float | None = None

        # Speculative prefill of the newest frame (see core/prefill.py).
        self.prefill = PrefillPolicy(skip_while_busy=p["prefill.skip_while_busy"])
        self.gc_pauses = GcPauses().install()
        self._prefill_wake = threading.Event()

        self.results_pub = self.create_publisher(ReasoningResult, "~/results",
                                                RESULTS_QUEUE_DEPTH)
        self.diagnostics_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.annotated_pub = self.create_publisher(Image, "~/annotated_image", 2)
        self._vision_msgs = load_vision_msgs()
        self.detections_pub = None
        if self._vision_msgs is None:
            self.get_logger().info("vision_msgs is not installed: ~/detections is off")
        else:
            self.detections_pub = self.create_publisher(
                self._vision_msgs.Detection2DArray, "~/detections", 10)
        camera_qos = QoSProfile(
            history=HistoryPolicy.KEEP_LAST, depth=p["image.qos_depth"],
            reliability=ReliabilityPolicy.BEST_EFFORT
            if p["image.qos_reliability"] == "best_effort" else ReliabilityPolicy.RELIABLE)
        # Frames are taken on a node and executor of their own (same process and DDS
        # participant, names resolved with this node's remaps). On the goal executor, camera
        # traffic held back ~5% of goal requests by 0.1-3 s (docs/PERFORMANCE.md, "Action
        # transport delays"); apart, a frame never waits behind goal work or the reverse.
        self._ingest_node = rclpy.create_node(
            f"{self.get_name()}_ingest", namespace=self.get_namespace(), context=self.context,
            use_global_arguments=False, start_parameter_services=False)
        self._ingest_executor = SingleThreadedExecutor(context=self.context)
        self._ingest_executor.add_node(self._ingest_node)
        # raw=True: the callback receives the serialized bytes, so ingest costs a stamp read
        # instead of a full deserialization of every 6 MB frame at 30 Hz.
        self._camera_subscriptions = []
        if p["image.input"] in ("raw", "both"):
            self._camera_subscriptions.append(self._ingest_node.create_subscription(
                Image, self.resolve_topic_name("image"), self._on_raw_image, camera_qos,
                raw=True))
        if p["image.input"] in ("compressed", "both"):
            self._camera_subscriptions.append(self._ingest_node.create_subscription(
                CompressedImage, self.resolve_topic_name("image/compressed"),
                self._on_compressed_image, camera_qos, raw=True))

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Load and warm up the engine, then open the action server.

        An in-process engine that fails to start is fatal. A remote server that is down is
        not: goals fail fast with ENGINE_UNAVAILABLE until it comes up.
        """
        p = self.params
        t0 = time.monotonic()
        remote = p["engine.kind"] == "openai"
        try:
            # A remote engine gives up on its own after start_timeout_s and keeps checking in
            # the background; the margin lets it, so goals reach it once the server is up.
            self.runner.start(timeout_s=p["engine.start_timeout_s"] + (5.0 if remote else 0.0),
                              usable_if_unavailable=remote)
        except CosmosReasonError as e:
            if p["engine.kind"] != "openai":
                raise
            self.get_logger().warning(f"engine not ready at start ({e.message}); serving "
                                      f"goals with ENGINE_UNAVAILABLE until it is")
        # The default service QoS keeps only 10 requests: a burst of goals beyond that is
        # dropped by DDS before the node ever sees it (never answered, never rejected).
        requests_qos = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=ACTION_QUEUE_DEPTH,
                                  reliability=ReliabilityPolicy.RELIABLE)
        self._action_server = ActionServer(
            self, Reason, "~/reason", execute_callback=self._execute,
            goal_callback=self._on_goal, cancel_callback=lambda _: CancelResponse.ACCEPT,
            callback_group=ReentrantCallbackGroup(), goal_service_qos_profile=requests_qos,
            result_service_qos_profile=requests_qos, cancel_service_qos_profile=requests_qos,
            result_timeout=p["limits.result_keep_s"])
        timer_group = MutuallyExclusiveCallbackGroup()
        self.create_timer(p["diagnostics.period_s"], self._publish_diagnostics,
                          callback_group=timer_group)
        if p["periodic.enabled"]:
            self.create_timer(p["periodic.period_s"], self._on_periodic_timer,
                              callback_group=timer_group)
        # Always started: prefill.enabled can be switched on at runtime.
        threading.Thread(target=self._prefill_worker, name="prefill", daemon=True).start()
        self.add_on_set_parameters_callback(self._on_set_parameters)
        threading.Thread(target=self._ingest_executor.spin, name="ingest", daemon=True).start()
        if p["engine.freeze_heap"]:
            frozen, took_s = freeze_heap()
            self.get_logger().info(f"heap frozen: {frozen} objects out of the garbage "
                                   f"collector's view ({took_s:.2f} s)")
        self.gc_pauses.reset()  # diagnostics count the pauses while serving, not startup's
        self.get_logger().info(
            f"ready: model={self.runner.model_name} family={self.profile.key} "
            f"engine={p['engine.kind']} startup_s={time.monotonic() - t0:.1f} "
            f"max_concurrent_goals={self.slots.max_running} prefill={p['prefill.enabled']}")

    def _on_set_parameters(self, params: list[Any]) -> SetParametersResult:
        # Only config.RUNTIME_PARAMS reach here (the rest are declared read-only); checked
        # like startup values, and applied only if all of them are valid.
        try:
            updated = validate({**self.params, **{p.name: p.value for p in params}})
        except ConfigError as e:
            return SetParametersResult(successful=False, reason=str(e))
        self.params = updated
        for param in params:
            self.get_logger().info(f"{param.name} set to {param.value}")
        return SetParametersResult(successful=True)

    def close(self) -> None:
        """Stop taking goals, end running ones, and shut the engine down."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._prefill_wake.set()
        self.gc_pauses.uninstall()
        self._ingest_executor.shutdown(timeout_sec=1.0)
        self.history.close()
        self.runner.close()
        if self._action_server is not None:
            self._action_server.destroy()

    def destroy_node(self) -> None:
        """Destroy the camera ingest node too (absent when a bad parameter stopped __init__)."""
        if hasattr(self, "_ingest_node"):
            self._ingest_executor.shutdown(timeout_sec=1.0)
            self._ingest_node.destroy_node()
        super().destroy_node()

    def executor_threads(self) -> int:
        """Threads the executor needs: every running and queued goal blocks one."""
        return self.slots.max_running + self.slots.max_queued + 4

    # --- camera --------------------------------------------------------------------------

    def _now_ns(self) -> int:
        return self.get_clock().now().nanoseconds

    def _store(self, data: bytes, compressed: bool) -> None:
        stamp = cdr_header_stamp_ns(data) or self._now_ns()
        self.history.append(RawFrame(compressed, data), stamp, nbytes=len(data))
        self._last_frame_monotonic = time.monotonic()
        if self.params["prefill.enabled"]:
            self._prefill_wake.set()

    def _on_raw_image(self, data: bytes) -> None:
        self._store(data, compressed=False)

    def _on_compressed_image(self, data: bytes) -> None:
        self._store(data, compressed=True)

    # --- goals ---------------------------------------------------------------------------

    def _on_goal(self, goal: Goal) -> GoalResponse:
        # Admission happens before acceptance so that a goal over the bounds never holds an
        # executor thread. A ROS reject cannot carry a reason, so the refusal is also
        # published on ~/results (code OVERLOADED) and logged; every other problem is
        # reported in the goal's result with a specific code.
        if self._stopping.is_set():
            return GoalResponse.REJECT
        try:
            self.slots.admit()
        except OverloadedError as e:
            self._count("rejected")
            self.get_logger().warning(f"goal rejected: code=OVERLOADED message={e.message}")
            msg = ReasoningResult(origin="goal", model=self.runner.model_name, task=goal.task,
                                  prompt=goal.prompt)
            messages.fill_error(msg, e)
            self._publish_result(msg)
            return GoalResponse.REJECT
        return GoalResponse.ACCEPT

    def _count(self, outcome: str) -> None:
        with self._counters_lock:
            self.counters[outcome] += 1

    def _execute(self, goal_handle: Any) -> Reason.Result:
        t_accept, accepted_ns = time.monotonic(), self._now_ns()
        goal: Goal = goal_handle.request
        msg = ReasoningResult(goal_id=bytes(goal_handle.goal_id.uuid).hex(), origin="goal",
                              model=self.runner.model_name, task=goal.task, prompt=goal.prompt)
        holding_slot = False
        timings: dict[str, float] = {}
        try:
            deadline = t_accept + self._goal_timeout(goal)
            spec = query.make_spec(
                self.profile, task=goal.task, prompt=goal.prompt, targets=list(goal.targets),
                reasoning=goal.reasoning, response_schema=goal.response_schema,
                max_tokens=goal.max_tokens, temperature=goal.temperature, greedy=goal.greedy,
                limits=self.limits, constrain=self.params["model.constrain_structured_tasks"])
            if self.params["limits.fixed_output_length"]:
                spec = dataclasses.replace(
                    spec, sampling=dataclasses.replace(spec.sampling, ignore_eos=True))
            msg.task = spec.task.value
            self._check_source(goal)
            self._check_engine()
            self._feedback(goal_handle, Feedback.STAGE_QUEUED, t_accept)
            holding_slot = self.slots.acquire(
                deadline - time.monotonic(),
                should_stop=lambda: goal_handle.is_cancel_requested or self._stopping.is_set())
            if not holding_slot:
                self._raise_interrupted(goal_handle, "while waiting for a free slot")
            timings["queue_s"] = time.monotonic() - t_accept
            media = self._acquire_media(goal, goal_handle, deadline, t_accept, accepted_ns)
            msg.header = messages.source_header(media.header)
            msg.frame_stamps = messages.stamps(media.stamps_ns)
            timings["preprocess_s"] = time.monotonic() - t_accept - timings["queue_s"]
            self._make_way_for(media.stamps_ns[-1])
            self.prefill.goal_frame(media.stamps_ns[-1])
            outcome, ttft = self._generate(goal_handle, spec, media, deadline, t_accept)
            timings["time_to_first_token_s"] = ttft
            messages.fill_outcome(msg, outcome, media.prepared.geometry,
                                  media.stamps_ns[0] if media.prepared.video else None)
            self._publish_outputs(msg, media)
            goal_handle.succeed()
            self._count("succeeded")
            self._latencies.append((ttft, time.monotonic() - t_accept))
            self.get_logger().info(
                f"goal {msg.goal_id[:8]} succeeded: task={msg.task} "
                f"tokens={outcome.tokens.prompt}+{outcome.tokens.output} "
                f"cached={outcome.tokens.cached_prompt} ttft_s={ttft:.3f} "
                f"total_s={time.monotonic() - t_accept:.3f} parsed={','.join(msg.parsed)}")
        except CosmosReasonError as e:
            self._end_with_error(goal_handle, msg, e)
        except Exception as e:  # noqa: BLE001 - the boundary: a goal must always end
            self.get_logger().error(f"goal {msg.goal_id[:8]}: internal error: {e!r}")
            self._end_with_error(goal_handle, msg, EngineError(f"internal error: {e!r}"))
        finally:
            if holding_slot:
                self.slots.release()
            self.slots.leave()
            self._prefill_wake.set()  # a frame skipped while busy can be prefilled now
        msg.queue_s = timings.get("queue_s", 0.0)
        msg.preprocess_s = timings.get("preprocess_s", 0.0)
        msg.time_to_first_token_s = timings.get("time_to_first_token_s", 0.0)
        msg.total_s = time.monotonic() - t_accept
        self._publish_result(msg)
        return Reason.Result(result=msg)

    def _goal_timeout(self, goal: Goal) -> float:
        timeout = float(goal.timeout_s)
        if not math.isfinite(timeout) or timeout < 0:
            raise BadRequestError(f"timeout_s={goal.timeout_s!r}: allowed 0 (node default) "
                                  f"or a positive number of seconds")
        return timeout or self.params["limits.goal_timeout_s"]

    def _check_source(self, goal: Goal) -> None:
        has_image = bool(goal.image.data) or goal.image.width > 0 or goal.image.height > 0
        has_compressed = len(goal.compressed_image.data) > 0
        if goal.source == Goal.SOURCE_GOAL_IMAGE:
            if has_image == has_compressed:
                raise BadRequestError("source=SOURCE_GOAL_IMAGE needs exactly one of image and "
                                      "compressed_image filled")
        elif goal.source in (Goal.SOURCE_LATEST, Goal.SOURCE_NEXT, Goal.SOURCE_CLIP):
            if has_image or has_compressed:
                raise BadRequestError(f"the goal carries an image but source={goal.source}; "
                                      f"set source=SOURCE_GOAL_IMAGE ({Goal.SOURCE_GOAL_IMAGE}) "
                                      f"to use it")
        else:
            raise BadRequestError(f"source={goal.source} is unknown; allowed 0 (latest), "
                                  f"1 (next), 2 (clip), 3 (image in goal)")
        for name in ("max_image_age_s", "wait_for_image_s", "clip_duration_s", "clip_fps"):
            value = float(getattr(goal, name))
            if not math.isfinite(value) or value < 0:
                raise BadRequestError(f"{name}={value!r}: allowed 0 (node default) or a "
                                      f"positive finite number")

    def _check_engine(self) -> None:
        health = self.runner.health()
        if health.state in (EngineState.UNAVAILABLE, EngineState.CLOSED, EngineState.STOPPED):
            raise EngineUnavailableError(f"engine {health.state.value}: {health.detail}")

    def _raise_interrupted(self, goal_handle: Any, where: str) -> None:
        if goal_handle.is_cancel_requested:
            raise RequestCancelledError(f"cancelled {where}")
        if self._stopping.is_set():
            raise EngineUnavailableError(f"node shutting down {where}")
        raise DeadlineExceededError(f"goal timed out {where}")

    # --- images --------------------------------------------------------------------------

    def _wait_s(self, goal: Goal) -> float:
        return float(goal.wait_for_image_s) or self.params["image.wait_s"]

    def _acquire_media(self, goal: Goal, goal_handle: Any, deadline: float,
                       t_accept: float, accepted_ns: int) -> _Media:
        if goal.source == Goal.SOURCE_GOAL_IMAGE:
            if len(goal.compressed_image.data) > 0:
                rgb = self._compressed_to_rgb(goal.compressed_image)
                header = goal.compressed_image.header
            else:
                rgb = self._image_to_rgb(goal.image)
                header = goal.image.header
            prepared = query.prepare_image(self.profile, rgb, self.limits)
            return _Media(prepared, header, [messages.stamp_to_ns(header.stamp)], lambda: rgb)
        if goal.source == Goal.SOURCE_CLIP:
            return self._acquire_clip(goal)
        self._feedback(goal_handle, Feedback.STAGE_WAITING_FOR_IMAGE, t_accept)
        return self._frame_media(self._pick_frame(goal, goal_handle, deadline, accepted_ns))

    def _frame_media(self, frame: StoredFrame[RawFrame]) -> _Media:
        """Decode and prepare a stored frame: one path for goals and prefills alike."""
        message = self._deserialize(frame)
        if frame.payload.compressed:
            rgb = self._compressed_to_rgb(message)
            prepared = query.prepare_image(self.profile, rgb, self.limits)
            return _Media(prepared, message.header, [frame.stamp_ns], lambda: rgb)
        size = query.input_size(self.profile, message.width, message.height, self.limits) \
            if message.width and message.height else None
        rgb = self._image_to_rgb(message, size)
        prepared = query.prepare_image(self.profile, rgb, self.limits,
                                       original_size=(message.width, message.height))
        return _Media(prepared, message.header, [frame.stamp_ns],
                      lambda: self._image_to_rgb(message))

    def _acquire_clip(self, goal: Goal) -> _Media:
        p = self.params
        duration = float(goal.clip_duration_s) or p["image.clip_duration_s"]
        fps = float(goal.clip_fps) or p["image.clip_fps"]
        if duration > p["limits.max_clip_duration_s"]:
            raise BadRequestError(f"clip_duration_s={duration:g} exceeds "
                                  f"limits.max_clip_duration_s={p['limits.max_clip_duration_s']:g}")
        if fps > 30.0:
            raise BadRequestError(f"clip_fps={fps:g}: allowed 0 (default {p['image.clip_fps']:g})"
                                  f" up to 30")
        frames = self.history.clip(duration, fps, max_frames=p["limits.max_clip_frames"])
        if len(frames) < 2:
            raise NoImageError(f"a {duration:g} s clip at {fps:g} fps needs at least 2 frames; "
                               f"the history holds {len(self.history)} (camera: "
                               f"{self._image_topics()})")
        decoded = [self._deserialize(f) for f in frames]
        rgbs = [self._compressed_to_rgb(m) if f.payload.compressed else self._image_to_rgb(m)
                for f, m in zip(frames, decoded, strict=True)]
        stamps = [f.stamp_ns for f in frames]
        prepared = query.prepare_clip(self.profile, rgbs, stamps, fps, self.limits)
        return _Media(prepared, decoded[-1].header, stamps, lambda: rgbs[-1])

    def _pick_frame(self, goal: Goal, goal_handle: Any, deadline: float,
                    accepted_ns: int) -> StoredFrame[RawFrame]:
        wait_s = min(self._wait_s(goal), max(0.0, deadline - time.monotonic()))
        if goal.source == Goal.SOURCE_NEXT:
            # "After acceptance": frames taken since the goal arrived, by the node clock (under
            # sim time a paused /clock means a paused recording, so no wall time is mixed in).
            frame = self._wait_frame(goal_handle, accepted_ns, wait_s)
            if frame is None:
                raise NoImageError(f"no new frame on '{self._image_topics()}' within "
                                   f"{wait_s:.2f} s")
            return frame
        frame = self.history.latest()
        if frame is None:
            frame = self._wait_frame(goal_handle, None, wait_s)
            if frame is None:
                raise NoImageError(f"no image received on '{self._image_topics()}' yet "
                                   f"(waited {wait_s:.2f} s)")
        frame = self._ready_frame(frame)
        max_age = float(goal.max_image_age_s) or self.params["image.max_age_s"]
        age_s = (self._now_ns() - frame.stamp_ns) / 1e9
        if max_age > 0 and age_s > max_age:
            raise ImageTooOldError(f"latest image is {age_s:.3f} s old; max_image_age_s="
                                   f"{max_age:g}")
        return frame

    def _ready_frame(self, newest: StoredFrame[RawFrame]) -> StoredFrame[RawFrame]:
        """Return the newest frame, or a slightly older one whose prefix the engine holds."""
        within_ns = int(self.params["prefill.ready_frame_within_s"] * 1e9)
        if within_ns <= 0:
            return newest
        candidates = [newest] + [f for f in reversed(self.history.snapshot()) if f is not newest
                                 and 0 <= newest.stamp_ns - f.stamp_ns <= within_ns]
        stamp = self.prefill.ready_frame([f.stamp_ns for f in candidates])
        return next((f for f in candidates if f.stamp_ns == stamp), newest)

    def _wait_frame(self, goal_handle: Any, after_ns: int | None,
                    wait_s: float) -> StoredFrame[RawFrame] | None:
        end = time.monotonic() + wait_s
        while True:
            remaining = end - time.monotonic()
            frame = self.history.wait_for_next(after_ns, min(_POLL_S * 4, max(0.0, remaining)))
            if frame is not None:
                return frame
            if goal_handle.is_cancel_requested or self._stopping.is_set():
                self._raise_interrupted(goal_handle, "while waiting for an image")
            if remaining <= 0:
                return None

    def _image_topics(self) -> str:
        names = [s.topic_name for s in self._camera_subscriptions]  # not /clock
        return ", ".join(names) or "(no camera subscription)"

    def _deserialize(self, frame: StoredFrame[RawFrame]) -> Any:
        """Return the stored message: a ``CompressedImage``, or an Image's fields.

        A raw Image is read straight from its CDR bytes, the pixels as a view: deserializing
        would first copy the whole buffer. Both carry ``header`` (stamp and frame_id).
        """
        if not frame.payload.compressed:
            fields = cdr.parse_image(frame.payload.data)
            return _ImageView(fields, Header(stamp=Time(sec=fields.sec, nanosec=fields.nanosec),
                                             frame_id=fields.frame_id))
        try:
            return deserialize_message(frame.payload.data, CompressedImage)
        except Exception as e:  # noqa: BLE001 - malformed bytes from the wire
            raise BadImageError(f"could not deserialize the CompressedImage message: {e}") \
                from e

    def _compressed_to_rgb(self, msg: CompressedImage) -> Any:
        return imaging.compressed_to_rgb(msg.format, bytes(msg.data),
                                         self.params["image.max_pixels"])

    def _image_to_rgb(self, msg: Image, size: tuple[int, int] | None = None) -> Any:
        return imaging.image_to_rgb(msg.width, msg.height, msg.encoding, bool(msg.is_bigendian),
                                    msg.step, msg.data,
                                    max_pixels=self.params["image.max_pixels"], size=size)

    # --- generation ----------------------------------------------------------------------

    def _generate(self, goal_handle: Any, spec: query.QuerySpec, media: _Media,
                  deadline: float, t_accept: float, priority: int = 0) -> tuple[Any, float]:
        request = query.build_request(
            uuid.uuid4().hex, self.profile, spec, media.prepared, priority=priority,
            engine_constrains_after_reasoning=self.params["engine.constrains_after_reasoning"])
        output = query.OutputAccumulator()
        min_interval = 1.0 / self.params["limits.feedback_rate_hz"]
        pending: list[str] = []
        last_feedback = 0.0
        t_submit = time.monotonic()
        handle = self.runner.submit(request)
        self._feedback(goal_handle, Feedback.STAGE_GENERATING, t_accept)
        stop_reason: str | None = None
        stop_at = 0.0
        while True:
            if stop_reason is None:
                if goal_handle.is_cancel_requested:
                    stop_reason = "cancel"
                elif time.monotonic() > deadline:
                    stop_reason = "timeout"
                elif self._stopping.is_set():
                    stop_reason = "shutdown"
                if stop_reason is not None:
                    handle.cancel()
                    stop_at = time.monotonic()
            elif time.monotonic() - stop_at > _CANCEL_GRACE_S:
                break  # the engine did not confirm in time; the goal ends anyway
            chunk = handle.next_chunk(_POLL_S)
            if chunk is not None:
                output.add(chunk)
                pending.append(chunk.reasoning_delta + chunk.text_delta)
                now = time.monotonic()
                if chunk.finish_reason is None and now - last_feedback >= min_interval:
                    self._feedback(goal_handle, Feedback.STAGE_GENERATING, t_accept,
                                   "".join(pending), output.output_tokens)
                    pending.clear()
                    last_feedback = now
                if chunk.finish_reason is not None:
                    break
        if pending and stop_reason is None:
            self._feedback(goal_handle, Feedback.STAGE_GENERATING, t_accept, "".join(pending),
                           output.output_tokens)
        if stop_reason == "cancel":
            raise RequestCancelledError("cancelled by the client during generation")
        if stop_reason == "timeout":
            raise DeadlineExceededError(f"goal timed out during generation after "
                                        f"{output.output_tokens} tokens")
        if stop_reason == "shutdown":
            raise EngineUnavailableError("node shutting down during generation")
        ttft = (t_submit - t_accept) + (output.first_token_s or 0.0)
        timings = Timings(time_to_first_token_s=ttft)
        return query.finish(self.profile, spec, media.prepared, output, timings), ttft

    # --- outputs -------------------------------------------------------------------------

    def _feedback(self, goal_handle: Any, stage: str, t_accept: float, text: str = "",
                  tokens: int = 0) -> None:
        goal_handle.publish_feedback(Feedback(stage=stage, text_delta=text, output_tokens=tokens,
                                              elapsed_s=time.monotonic() - t_accept))

    def _end_with_error(self, goal_handle: Any, msg: ReasoningResult,
                        error: CosmosReasonError) -> None:
        messages.fill_error(msg, error)
        self.get_logger().warning(f"goal {msg.goal_id[:8]} ended: code={error.code.name} "
                                  f"message={error.message}")
        if isinstance(error, RequestCancelledError) and goal_handle.is_cancel_requested:
            goal_handle.canceled()
            self._count("canceled")
        else:
            goal_handle.abort()
            self._count("rejected" if error.code in (ErrorCode.OVERLOADED,
                                                     ErrorCode.BAD_REQUEST) else "aborted")

    def _publish_outputs(self, msg: ReasoningResult, media: _Media) -> None:
        """Annotated image (only when subscribed: drawing costs) and vision_msgs detections."""
        if self.detections_pub is not None and msg.boxes:
            self.detections_pub.publish(to_detection_array(msg, self._vision_msgs))
        if media.original_rgb is None or self.annotated_pub.get_subscription_count() == 0:
            return
        try:
            drawn = draw_annotations(media.original_rgb(), msg.boxes, msg.points,
                                     msg.trajectories, title=msg.answer)
        except CosmosReasonError as e:  # a drawing problem must not fail the goal
            self.get_logger().warning(f"annotated image skipped: {e.message}")
            return
        self.annotated_pub.publish(messages.rgb_image(drawn,
                                                      messages.source_header(media.header)))

    def _publish_result(self, msg: ReasoningResult) -> None:
        if self.context.ok():
            self.results_pub.publish(msg)

    # --- periodic monitoring -------------------------------------------------------------

    def _on_periodic_timer(self) -> None:
        # Goals take priority: a periodic run starts only when no goal is running or queued,
        # and never overlaps the previous run (skipped runs are counted in diagnostics).
        if self._periodic_busy.is_set() or self.slots.running or self.slots.queued \
                or self._stopping.is_set():
            with self._counters_lock:
                self.periodic_counts["skipped"] += 1
            return
        self._periodic_busy.set()
        threading.Thread(target=self._periodic_run, name="periodic", daemon=True).start()

    def _periodic_run(self) -> None:
        p = self.params
        t0 = time.monotonic()
        targets = [t.strip() for t in p["periodic.targets"].split(",") if t.strip()]
        msg = ReasoningResult(origin="periodic", model=self.runner.model_name,
                              task=p["periodic.task"], prompt=p["periodic.prompt"])
        handle = _PeriodicHandle(self._stopping)
        try:
            spec = query.make_spec(self.profile, task=p["periodic.task"],
                                   prompt=p["periodic.prompt"], targets=targets,
                                   max_tokens=min(p["periodic.max_tokens"], self.limits.max_tokens),
                                   limits=self.limits,
                                   constrain=p["model.constrain_structured_tasks"])
            msg.task = spec.task.value
            deadline = t0 + p["limits.goal_timeout_s"]
            goal = Goal(source=Goal.SOURCE_LATEST, wait_for_image_s=0.001)
            media = self._acquire_media(goal, handle, deadline, t0, self._now_ns())
            msg.header = messages.source_header(media.header)
            msg.frame_stamps = messages.stamps(media.stamps_ns)
            msg.preprocess_s = time.monotonic() - t0
            self._make_way_for(media.stamps_ns[-1])
            outcome, ttft = self._generate(handle, spec, media, deadline, t0, priority=1)
            messages.fill_outcome(msg, outcome, media.prepared.geometry)
            msg.time_to_first_token_s = ttft
            self._publish_outputs(msg, media)
            with self._counters_lock:
                self.periodic_counts["run"] += 1
        except CosmosReasonError as e:
            messages.fill_error(msg, e)
            with self._counters_lock:
                self.periodic_counts["failed"] += 1
            self.get_logger().warning(f"periodic run failed: code={e.code.name} "
                                      f"message={e.message}", throttle_duration_sec=30.0)
        except Exception as e:  # noqa: BLE001 - keep the timer alive whatever happens
            messages.fill_error(msg, EngineError(f"internal error: {e!r}"))
            self.get_logger().error(f"periodic run: internal error: {e!r}")
        finally:
            msg.total_s = time.monotonic() - t0
            self._publish_result(msg)
            self._periodic_busy.clear()

    # --- speculative prefill ---------------------------------------------------------------

    def _prefill_worker(self) -> None:
        # Woken by each new frame, so a prefill starts as soon as the frame arrives (a goal
        # that comes while it runs waits for the rest of that engine step, then hits the
        # cache); at most one per prefill.period_s, one at a time, on this one thread. A
        # frame skipped while busy is retried every period until it is prefilled or replaced.
        period = self.params["prefill.period_s"]
        last_start = -math.inf
        retry = False
        while not self._stopping.is_set():
            if not self._prefill_wake.wait(period if retry else 1.0) and not retry:
                continue
            self._prefill_wake.clear()
            wait = last_start + period - time.monotonic()
            if wait > 0 and self._stopping.wait(wait):
                return
            latest = self.history.latest()
            stamp = None if latest is None else latest.stamp_ns
            if not self.params["prefill.enabled"]:
                retry = False
                continue
            busy = bool(self.slots.running or self.slots.queued or self._periodic_busy.is_set())
            if not self.prefill.try_start(stamp, busy):
                retry = self.prefill.wants(stamp)
                continue
            retry = False
            last_start = time.monotonic()
            self._prefill_run(latest)

    def _prefill_run(self, frame: StoredFrame[RawFrame]) -> None:
        outcome = "failed"
        try:
            media = self._frame_media(frame)
            request = query.build_prefill_request(uuid.uuid4().hex, self.profile,
                                                  media.prepared,
                                                  reasoning=self.params["prefill.reasoning"])
            if self.prefill.abort_requested:
                outcome = "aborted"
                return
            handle = self.runner.submit(request)
            if not self.prefill.attach(handle.cancel):
                handle.cancel()  # a goal asked for the engine while this was being submitted
            _, final = handle.collect(timeout_s=self.params["limits.goal_timeout_s"])
            outcome = "aborted" if final.finish_reason is FinishReason.CANCELLED else "run"
        except CosmosReasonError as e:
            self.get_logger().warning(f"prefill failed: code={e.code.name} message={e.message}",
                                      throttle_duration_sec=30.0)
        except Exception as e:  # noqa: BLE001 - a prefill must never take the node down
            self.get_logger().error(f"prefill: internal error: {e!r}",
                                    throttle_duration_sec=30.0)
        finally:
            self.prefill.finished(frame.stamp_ns, outcome)

    def _make_way_for(self, stamp_ns: int) -> None:
        """Abort a prefill of another frame before a goal or periodic run uses the engine."""
        cancel = self.prefill.make_way_for(stamp_ns)
        if cancel is not None:
            cancel()

    # --- diagnostics ---------------------------------------------------------------------

    def diagnostics_status(self) -> DiagnosticStatus:
        """One status: engine, camera, goals, latency percentiles and periodic counters."""
        p = self.params
        health = self.runner.health()
        stats = self.history.stats()
        silent_s = None if self._last_frame_monotonic is None \
            else time.monotonic() - self._last_frame_monotonic
        latest = self.history.latest()
        frame_age_s = None if latest is None else (self._now_ns() - latest.stamp_ns) / 1e9
        with self._counters_lock:
            counters = dict(self.counters)
            periodic = dict(self.periodic_counts)
        latencies = list(self._latencies)
        level, problems = DiagnosticStatus.OK, []
        if health.state is not EngineState.READY:
            bad = health.state in (EngineState.UNAVAILABLE, EngineState.CLOSED,
                                   EngineState.STOPPED)
            level = max(level, DiagnosticStatus.ERROR if bad else DiagnosticStatus.WARN)
            problems.append(f"engine {health.state.value}")
        if silent_s is None or silent_s > p["diagnostics.camera_warn_s"]:
            error = silent_s is None or silent_s > p["diagnostics.camera_error_s"]
            level = max(level, DiagnosticStatus.ERROR if error else DiagnosticStatus.WARN)
            problems.append("no camera frames yet" if silent_s is None
                            else f"camera silent for {silent_s:.1f} s")
        values = {
            "engine_state": health.state.value, "model": health.model or self.runner.model_name,
            "engine_running_requests": health.running_requests,
            "frames_received": stats.received, "frames_stored": stats.frames,
            "frame_age_s": "" if frame_age_s is None else f"{frame_age_s:.3f}",
            "goals_active": self.slots.running, "goals_queued": self.slots.queued,
            **{f"goals_{k}": v for k, v in counters.items()},
            **{f"periodic_{k}": v for k, v in periodic.items()},
            **{f"gc_{k}": round(v, 4) if isinstance(v, float) else v
               for k, v in dataclasses.asdict(self.gc_pauses.stats()).items()},
            "prefill_enabled": p["prefill.enabled"],
            **{(k if k.startswith("goals") else f"prefill_{k}"): v
               for k, v in dataclasses.asdict(self.prefill.counts()).items()},
        }
        for i, name in ((0, "ttft"), (1, "total")):
            series = [x[i] for x in latencies]
            for q in (50, 95):
                values[f"{name}_p{q}_s"] = f"{percentile(series, q):.4f}" if series else ""
        return DiagnosticStatus(
            level=level, name=f"{self.get_name()}: visual reasoning",
            hardware_id=self.runner.model_name,
            message="; ".join(problems) or "ok",
            values=[KeyValue(key=k, value=str(v)) for k, v in values.items()])

    def _publish_diagnostics(self) -> None:
        if not self.context.ok():
            return
        array = DiagnosticArray(status=[self.diagnostics_status()])
        array.header.stamp = self.get_clock().now().to_msg()
        self.diagnostics_pub.publish(array)


class _PeriodicHandle:
    """Stands in for a goal handle in periodic runs: feedback is dropped, cancel = stopping."""

    def __init__(self, stopping: threading.Event) -> None:
        self._stopping = stopping

    @property
    def is_cancel_requested(self) -> bool:
        return self._stopping.is_set()

    def publish_feedback(self, _feedback: Any) -> None:
        pass


def main(args: list[str] | None = None) -> NoReturn:
    """Run the node until SIGINT/SIGTERM; exit 2 on a configuration error, 1 on engine failure."""
    rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    node: ReasonNode | None = None
    executor: MultiThreadedExecutor | None = None
    code = 0
    try:
        node = ReasonNode()
        node.start()
        executor = MultiThreadedExecutor(num_threads=node.executor_threads())
        executor.add_node(node)
        while rclpy.ok() and not stop.is_set():
            executor.spin_once(timeout_sec=0.2)
    except ConfigError as e:
        rclpy.logging.get_logger(NODE_NAME).fatal(str(e))
        code = 2
    except CosmosReasonError as e:
        rclpy.logging.get_logger(NODE_NAME).fatal(f"engine failed to start: {e.message}")
        code = 1
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        if node is not None:
            node.close()
        if executor is not None:
            # Let goal threads deliver their (aborted) results before the context goes.
            deadline = time.monotonic() + 3.0
            while node is not None and node.slots.running and time.monotonic() < deadline:
                executor.spin_once(timeout_sec=0.05)
            executor.shutdown(timeout_sec=2.0)
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()
    if code == 0 and node is not None:
        rclpy.logging.get_logger(NODE_NAME).info("shut down cleanly")
    # Everything is closed by now. The interpreter's own teardown of torch and vLLM modules
    # took 6-15 s on a loaded machine, long enough for launch to escalate to SIGKILL, so the
    # process ends here once its output is flushed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
