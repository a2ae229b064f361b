"""The cosmos_reason node: ROS wiring around the one goal pipeline (``core/pipeline.py``).

The node declares parameters, takes camera frames (stored serialized, on an ingest node of
its own), serves ``~/reason`` goals through ``GoalPipeline``, and publishes results,
diagnostics and optional outputs. Threads and what each may touch: docs/DEVELOPING.md.

It is an ``rclpy.lifecycle`` node (as llama_ros and yolo_ros are). ``lifecycle.autostart``
(default true) configures and activates it at start; false leaves it unconfigured for a
lifecycle manager (Nav2's, or ``ros2 lifecycle set``). The transitions:

- configure: parameters validated (their current values), the engine object built (not
  started), publishers and the action server created; goals are refused while inactive;
- activate: the engine started and warmed (bounded by ``engine.start_timeout_s``; a stop
  signal ends the start at once, ``ros/serve.py``), camera subscriptions, timers and goals on;
- deactivate: new goals refused, accepted goals finished or stopped
  (``lifecycle.deactivate_goals``, bounded by ``lifecycle.deactivate_timeout_s``), timers and
  subscriptions off; the engine stays loaded, so activating again is fast;
- cleanup: ``release``: the engine shut down and its processes ended and reaped (their memory
  released), everything configure built destroyed: the node can be configured again, with
  changed parameters;
- shutdown (from any state; also what the process runs at exit): ``release`` after every
  accepted goal ended with its result ("node shutting down ...").

A failed transition returns FAILURE with the reason in the log (configure: a bad parameter;
activate: the engine did not start), and the node stays where it was. ``/diagnostics`` reports
the lifecycle state in every state. With ``lifecycle.autostart`` false parameters are settable
while unconfigured and read-only (but the runtime ones) after; with it true they are read-only
from the start. States and timings: docs/INTERFACES.md, "Lifecycle".
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from rcl_interfaces.msg import SetParametersResult
from rclpy.action import CancelResponse, GoalResponse
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.executors import SingleThreadedExecutor
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from rclpy.logging import LoggingSeverity
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy

from cosmos_reason_interfaces.action import Reason
from cosmos_reason_interfaces.msg import ReasoningResult
from cosmos_reason_ros.client import RESEND_FIRST_S
from cosmos_reason_ros.config import (
    PARAMS_BY_NAME,
    RUNTIME_PARAMS,
    ConfigError,
    create_configured_engine,
    validate,
)
from cosmos_reason_ros.core import cdr, parsing
from cosmos_reason_ros.core.admission import GoalSlots
from cosmos_reason_ros.core.models import ModelProfile, detect_profile
from cosmos_reason_ros.core.params import NodeParams
from cosmos_reason_ros.core.pipeline import GoalPipeline, Settings, Stage, Stop, interrupted
from cosmos_reason_ros.core.prefill import PrefillPolicy
from cosmos_reason_ros.core.prompts import DEFAULT_TASK
from cosmos_reason_ros.core.types import (
    CosmosReasonError,
    EngineError,
    EngineUnavailableError,
    ErrorCode,
    OverloadedError,
    RequestCancelledError,
)
from cosmos_reason_ros.engines.base import Engine
from cosmos_reason_ros.engines.runner import EngineRunner
from cosmos_reason_ros.ros import diagnostics, messages, process_life, pylog
from cosmos_reason_ros.ros.action_results import ResultRequestsActionServer
from cosmos_reason_ros.ros.camera import Camera, CameraSet
from cosmos_reason_ros.ros.config import declare_and_load, declared_values
from cosmos_reason_ros.ros.gcwatch import GcPauses, freeze_heap
from cosmos_reason_ros.ros.outputs import Outputs
from cosmos_reason_ros.ros.target_frame import TargetFrame
from cosmos_reason_ros.ros.workers import PeriodicRuns, PrefillWorker

NODE_NAME = "cosmos_reason"
ACTION_QUEUE_DEPTH = 256  # requests and feedback messages buffered per action service/topic
TRANSITION_SPARE = 5  # spare executor threads (threads_for_goals), one for a transition
Feedback = Reason.Feedback
SUCCESS, FAILURE = TransitionCallbackReturn.SUCCESS, TransitionCallbackReturn.FAILURE
INACTIVE = "lifecycle state 'inactive': activate the node to serve goals"
Transition = Callable[["ReasonNode", LifecycleState], TransitionCallbackReturn]


def _transition(name: str, refusal: str | None = None) -> Callable[[Transition], Transition]:
    """Log the transition and its time; an unexpected exception is logged, then ERROR.

    (rclpy turns an exception in a transition callback into ERROR without a word.) A
    ``refusal`` is in force before the first line is logged, so a client that reads the line
    and sends a goal is refused, however the threads are scheduled. What made a transition
    fail is kept in ``failure`` (``start`` raises it).
    """
    def wrap(method: Transition) -> Transition:
        @functools.wraps(method)
        def run(self: ReasonNode, state: LifecycleState) -> TransitionCallbackReturn:
            t0 = time.monotonic()
            if refusal is not None:
                self.refusal = refusal
            self.get_logger().info(f"lifecycle: {name} from {state.label!r}")
            try:
                result = method(self, state)
            except (ConfigError, CosmosReasonError) as e:
                self.failure = e
                self.get_logger().error(f"lifecycle: {name} failed: {e}")
                return FAILURE
            except Exception as e:  # noqa: BLE001 - the boundary of a transition
                self.failure = e
                self.get_logger().error(f"lifecycle: {name} failed: internal error: {e!r}")
                return TransitionCallbackReturn.ERROR
            self.get_logger().info(f"lifecycle: {name} done took_s={time.monotonic() - t0:.2f}")
            return result
        return run
    return wrap


class ReasonNode(LifecycleNode):
    """Serves ``~/reason`` goals about the camera stream and publishes ``~/results``."""

    def __init__(self, engine: Engine | None = None, **kwargs: Any) -> None:
        """Declare the parameters; build nothing until configure (``start`` with autostart).

        ``engine`` replaces the one ``engine.kind`` would build (tests inject a scripted one).
        Raises ``ConfigError`` for a bad parameter unless ``lifecycle.autostart`` is false.
        """
        super().__init__(NODE_NAME, **kwargs)
        # The engines' and core's Python log lines go out as this node's (name, time, /rosout).
        self._python_log = pylog.forward_to(self.get_logger())
        declare_and_load(self)
        self.autostart: bool = self.get_parameter("lifecycle.autostart").value
        self._engine = engine
        self._stopping = threading.Event()
        self._counters_lock = threading.Lock()
        self.counters = {"succeeded": 0, "aborted": 0, "canceled": 0, "rejected": 0,
                         "answered_from_reasoning": 0}
        self._action_server: ResultRequestsActionServer | None = None
        self._ended_by_stop: set[bytes] = set()  # goal ids, for serve_results
        self.serving_timers: list[Any] = []
        self._owned: list[Any] = []  # publishers configure created (cleanup destroys them)
        self.configured = self._engine_started = self.activating = False
        self._autostarting = False  # start() runs the transitions (serve logs "ready:")
        self.lifecycle_state = "unconfigured"
        self.refusal: str | None = "lifecycle state 'unconfigured'"  # new goals refused
        self.stop_goals: Stop | None = None  # while set, accepted goals stop for this reason
        self.failure: BaseException | None = None  # what made the last transition fail
        # Processes below the node before its engine started (None: not started): release
        # ends only those started since, never a test's or a tool's other children.
        self._engine_pids: set[int] | None = None
        self.startup_s = 0.0
        self.latencies: collections.deque[tuple[float, float]] = collections.deque(maxlen=500)
        self.gc_pauses = GcPauses().install()
        # Every running and queued goal blocks an executor thread, and the executor is made
        # once: its size comes from the limits given at start (configure refuses more).
        limits = declared_values(self)
        self._threads = threads_for_goals(limits["limits.max_concurrent_goals"],
                                          limits["limits.max_queued_goals"], TRANSITION_SPARE)
        # /diagnostics reports the lifecycle state in every state, so it is the node's own.
        self.diagnostics_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self._diagnostics_group = MutuallyExclusiveCallbackGroup()
        self._diagnostics_timer = self.create_timer(
            max(0.1, limits["diagnostics.period_s"]), self._publish_diagnostics,
            callback_group=self._diagnostics_group)
        self.add_on_set_parameters_callback(self._on_set_parameters)

    def start(self) -> None:
        """With ``lifecycle.autostart``: configure and activate; raise what stopped either.

        Without it, nothing: a lifecycle manager drives the node.
        """
        if not self.autostart:
            self.get_logger().info("lifecycle: unconfigured, waiting for configure and "
                                   "activate (~/change_state)")
            return
        self._autostarting = True  # serve logs "ready:" once a signal no longer interrupts
        self.failure = None
        try:
            for trigger in (self.trigger_configure, self.trigger_activate):
                if trigger() != SUCCESS:
                    raise self.failure or EngineError("lifecycle transition failed")
        finally:
            self._autostarting = False

    def configure(self, p: NodeParams) -> None:
        """Build the engine object (not started), cameras, goal pipeline and publishers."""
        self.params = p
        try:
            self.profile: ModelProfile = detect_profile(
                p.engine.model or "unknown", None if p.model.family == "auto"
                else p.model.family)
        except CosmosReasonError as e:
            raise ConfigError(f"model.family/engine.model: {e.message}") from e
        self.slots = GoalSlots(p.limits.max_concurrent_goals, p.limits.max_queued_goals)
        self.runner = EngineRunner(self._engine or create_configured_engine(p.engine))
        self.prefill = PrefillPolicy(skip_while_busy=p.prefill.skip_while_busy)
        before = set(self.publishers)
        # Frames are taken on a node and executor of their own (same process and DDS
        # participant, names resolved with this node's remaps). On the goal executor, camera
        # traffic held back ~5% of goal requests by 0.1-3 s (docs/PERFORMANCE.md, "Action
        # transport delays"); apart, a frame never waits behind goal work or the reverse.
        self._ingest_node = rclpy.create_node(
            f"{self.get_name()}_ingest", namespace=self.get_namespace(), context=self.context,
            use_global_arguments=False, start_parameter_services=False)
        self._ingest_executor = SingleThreadedExecutor(context=self.context)
        self._ingest_executor.add_node(self._ingest_node)
        self._ingest_thread: threading.Thread | None = None
        self.cameras = CameraSet(self, self._ingest_node, p, self.now_ns, self._on_frame,
                                 subscribe=False)
        self.camera = self.cameras.default  # prefill, periodic runs and 3D use this one
        self.history = self.camera.history
        target_frame = TargetFrame(self, p.depth.target_frame, p.depth.tf_timeout_s)
        self.pipeline = GoalPipeline.from_params(
            p, self.profile, self.runner, self.cameras.histories, cdr.read_stored_frame,
            self.now_ns, node_name=self.get_fully_qualified_name(),
            depth_history=self.camera.depth_history, camera_model=self.camera.camera_model,
            prefill=self.prefill, source_name=self.cameras.source_name,
            to_target_frame=target_frame.apply)
        lifter = self.pipeline.lifter
        self.cameras.log_limits(self.get_logger(), p,
                                self.pipeline.settings.limits.images_per_request)
        self.periodic = PeriodicRuns(self)
        self.prefill_worker = PrefillWorker(self, busy=lambda: bool(
            self.slots.running or self.slots.queued or self.periodic.busy.is_set()))
        self.outputs = Outputs(self, depth=p.depth.enabled, default_camera=self.camera.name,
                               cameras=tuple(p.cameras.names), lifter=lifter)
        self._owned = [pub for pub in self.publishers if pub not in before]
        self._threads_started = False
        self.open_action_server()
        self.destroy_timer(self._diagnostics_timer)  # its period may have changed
        self._diagnostics_timer = self.create_timer(
            p.diagnostics.period_s, self._publish_diagnostics,
            callback_group=self._diagnostics_group)

    @property
    def last_frame_monotonic(self) -> float | None:
        """When the newest colour frame arrived (monotonic), or None."""
        return self.camera.last_frame_monotonic

    def _publish_diagnostics(self) -> None:
        if not self.context.ok():  # shut down meanwhile
            return
        array = DiagnosticArray(status=[diagnostics.node_status(self.report())])
        array.header.stamp = self.get_clock().now().to_msg()
        self.diagnostics_pub.publish(array)

    def report(self) -> diagnostics.NodeReport:
        """Read what ``/diagnostics`` reports, now (only the state unless configured)."""
        name, state = self.get_fully_qualified_name(), self.lifecycle_state
        if not self.configured:
            return diagnostics.NodeReport(name=name, lifecycle_state=state)
        now_ns, now = self.now_ns(), time.monotonic()

        def camera_report(camera: Camera) -> diagnostics.CameraReport:
            stats, newest = camera.history.stats(), camera.history.latest()
            arrived = camera.last_frame_monotonic
            return diagnostics.CameraReport(
                name=camera.name, image_topic=camera.image_topic, received=stats.received,
                stored=stats.frames, newest_stamp_ns=None if newest is None else newest.stamp_ns,
                silent_s=None if arrived is None else now - arrived)

        return diagnostics.NodeReport(
            name=name, lifecycle_state=state, configured=True, params=self.params,
            health=self.runner.health(), model_name=self.runner.model_name, now_ns=now_ns,
            camera=camera_report(self.camera),
            named_cameras=tuple(camera_report(c) for c in self.cameras)
            if self.cameras.named else (),
            goals_active=self.slots.running, goals_queued=self.slots.queued,
            counters=self.counters_snapshot(), latencies=tuple(self.latencies),
            periodic=self.periodic.snapshot(),
            gc=dataclasses.asdict(self.gc_pauses.stats()),
            detections_left_out=self.outputs.detections_left_out,
            prefill=dataclasses.asdict(self.prefill.counts()))

    # --- lifecycle -----------------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        """True once the node has begun shutting down (or cleaning up)."""
        return self._stopping.is_set()

    @property
    def stopping_event(self) -> threading.Event:
        """Set when the node begins shutting down (background threads wait on it)."""
        return self._stopping

    @_transition("configure")
    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Validate the parameters; build the engine object, publishers, action server."""
        params = validate(declared_values(self))
        need = threads_for_goals(params.limits.max_concurrent_goals,
                                 params.limits.max_queued_goals, TRANSITION_SPARE)
        if need > self._threads:
            raise ConfigError(
                f"limits.max_concurrent_goals + limits.max_queued_goals need {need} executor "
                f"threads, the process has {self._threads} (from the values at start): "
                f"restart the node to raise them")
        self._stopping = threading.Event()  # this configuration's stop (workers wait on it)
        self._engine_started = False
        self.configure(params)
        self.refusal, self.configured, self.lifecycle_state = INACTIVE, True, "inactive"
        return SUCCESS

    @_transition("activate")
    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Start and warm the engine (kept from a previous activation), then serve."""
        t0 = time.monotonic()
        # Cameras first: DDS matches them with their publishers while the engine starts, so
        # the frames sent right after "ready" arrive (matched only after the start, a replay
        # or a camera lost its first seconds of frames on a loaded machine).
        self.cameras.subscribe()
        if not self._engine_started:
            self.get_logger().info(
                f"lifecycle: starting the engine model={self.params.engine.model!r} "
                f"(at most engine.start_timeout_s={self.params.engine.start_timeout_s:g} s)")
            self._engine_pids = set(process_life.descendants())
            self.activating = True
            try:
                self.start_engine()
            except BaseException:
                self.cameras.subscribe(False)  # activate failed: the node stays inactive
                raise
            finally:
                self.activating = False
            self._engine_started = True
        self.resume()
        self.stop_goals, self.refusal, self.lifecycle_state = None, None, "active"
        self.startup_s = time.monotonic() - t0
        if not self._autostarting:
            self.log_ready()
        return SUCCESS

    @_transition("deactivate", refusal="lifecycle state 'deactivating': the node serves goals "
                 "only when active")
    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Refuse new goals; finish or stop the accepted ones; timers and cameras off."""
        rule = self.params.lifecycle
        in_flight = self.slots.running + self.slots.queued
        if rule.deactivate_goals == "cancel":
            self.stop_goals = Stop.DEACTIVATE
        if not self.wait_goals(rule.deactivate_timeout_s, linger=bool(in_flight)):
            self.get_logger().warning(
                f"lifecycle: {self.slots.running + self.slots.queued} goal(s) still running "
                f"after lifecycle.deactivate_timeout_s={rule.deactivate_timeout_s:g}: stopping "
                f"them")
            self.stop_goals = Stop.DEACTIVATE
            self.wait_goals(SHUTDOWN_GOALS_S, linger=True)
        self.periodic.join(SHUTDOWN_GOALS_S)
        self._stop_timers()
        self.cameras.subscribe(False)
        self.refusal, self.lifecycle_state = INACTIVE, "inactive"
        self.get_logger().info(f"lifecycle: deactivated goals_in_flight={in_flight} "
                               f"rule={rule.deactivate_goals}; engine kept loaded")
        return SUCCESS

    @_transition("cleanup")
    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Shut the engine down (its processes ended) and destroy what configure built."""
        self.release()
        self.lifecycle_state = "unconfigured"
        return SUCCESS

    @_transition("shutdown")
    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        """End goals (with their results) and the engine, from any state."""
        self.release()
        self.refusal, self.lifecycle_state = "lifecycle state 'finalized'", "finalized"
        return SUCCESS

    @_transition("error processing")
    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Release what exists and go back to unconfigured (configurable again)."""
        self.release()
        self.lifecycle_state = "unconfigured"
        return SUCCESS

    def start_engine(self) -> None:
        """Load and warm up the engine; raise if that failed and is fatal (in-process).

        A remote server that is down is not: goals get ENGINE_UNAVAILABLE until it comes up.
        """
        p = self.params
        fatal = self.runner.engine.start_failure_is_fatal
        try:
            # A remote engine gives up on its own after start_timeout_s and keeps checking in
            # the background; the margin lets it, so goals reach it once the server is up.
            self.runner.start(timeout_s=p.engine.start_timeout_s + (0.0 if fatal else 5.0),
                              usable_if_unavailable=not fatal)
        except CosmosReasonError as e:
            if fatal:
                raise
            self.get_logger().warning(f"engine not ready at start ({e.message}); serving "
                                      f"goals with ENGINE_UNAVAILABLE until it is")

    def open_action_server(self) -> None:
        """Create the ``~/reason`` action server."""
        p = self.params
        # The default service QoS keeps only 10 requests: a burst of goals beyond that is
        # dropped by DDS before the node ever sees it (never answered, never rejected). All
        # goals share one feedback topic: with depth 10, a client 10 messages behind loses a
        # goal's one-off stages (queued, waiting_for_image) under other goals' token feedback.
        requests_qos = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=ACTION_QUEUE_DEPTH,
                                  reliability=ReliabilityPolicy.RELIABLE)
        self._ended_by_stop.clear()
        self._action_server = ResultRequestsActionServer(
            self, Reason, "~/reason", execute_callback=self._execute,
            goal_callback=self._on_goal, cancel_callback=self._on_cancel,
            callback_group=ReentrantCallbackGroup(), goal_service_qos_profile=requests_qos,
            result_service_qos_profile=requests_qos, cancel_service_qos_profile=requests_qos,
            feedback_pub_qos_profile=requests_qos, result_timeout=p.limits.result_keep_s)

    def resume(self) -> None:
        """Timers on; the first time after ``configure`` also the prefill and ingest threads."""
        p = self.params
        if p.periodic.enabled:
            self.serving_timers.append(self.create_timer(
                p.periodic.period_s, self.periodic.on_timer,
                callback_group=self._diagnostics_group))
        if not self._threads_started:
            self._threads_started = True
            self.prefill_worker.start()
            self._ingest_thread = threading.Thread(target=self._ingest_executor.spin,
                                                   name="ingest", daemon=True)
            self._ingest_thread.start()
            if p.engine.freeze_heap:
                frozen, took_s = freeze_heap()
                self.get_logger().info(f"heap frozen: {frozen} objects out of the garbage "
                                       f"collector's view ({took_s:.2f} s)")
        self.gc_pauses.reset()  # diagnostics count the pauses while serving, not startup's

    def _stop_timers(self) -> None:
        for timer in self.serving_timers:
            self.destroy_timer(timer)
        self.serving_timers = []

    def log_ready(self) -> None:
        """Log the one "ready:" line once active (tools and tests wait for it)."""
        if self.lifecycle_state != "active":
            return
        p = self.params
        self.get_logger().info(
            f"ready: model={self.runner.model_name} family={self.profile.key} "
            f"engine={p.engine.kind} startup_s={self.startup_s:.1f} "
            f"max_concurrent_goals={self.slots.max_running} prefill={p.prefill.enabled}")

    def _on_set_parameters(self, params: list[Any]) -> SetParametersResult:
        # Parameters of the table: non-runtime ones change only while unconfigured (with
        # autostart they are declared read-only, and rclpy refuses them before this); runtime
        # ones are checked like startup values and applied only if all of them are valid: a
        # new frozen NodeParams replaces the old one whole. rclpy's own (use_sim_time) pass.
        ours = [p for p in params if p.name in PARAMS_BY_NAME]
        fixed = [p.name for p in ours if p.name not in RUNTIME_PARAMS]
        if self.configured and fixed:
            return SetParametersResult(successful=False, reason=(
                f"{', '.join(fixed)}: settable only while unconfigured (clean up first)"))
        if not self.configured or not ours:
            return SetParametersResult(successful=True)  # validated on configure
        try:
            updated = validate({**self.params.to_values(), **{p.name: p.value for p in ours}})
        except ConfigError as e:
            return SetParametersResult(successful=False, reason=str(e))
        self.params = updated
        self.pipeline.settings = Settings.from_params(updated, self.profile,
                                                      self.get_fully_qualified_name())
        for param in ours:
            self.get_logger().info(f"{param.name} set to {param.value}")
        return SetParametersResult(successful=True)

    def release(self, spin: Callable[[float], object] | None = None) -> None:
        """End every accepted goal with its result, then the engine and what configure built.

        The one teardown: cleanup, shutdown and the process's exit (``ros/serve.py``) run it.
        Every accepted goal (running, queued, or not begun) ends ABORTED with
        ENGINE_UNAVAILABLE ("node shutting down ...") while the action server still exists, so
        its result reaches the client and ``~/results``. ``spin(timeout_s)`` runs the node's
        executor meanwhile (``serve``); without it another thread must be spinning it.
        Bounded: goals get ``SHUTDOWN_GOALS_S``, then the engine is closed under those left.
        The engine's processes are ended (what its shutdown left is killed) and reaped, and
        the shared memory they held released. Idempotent; nothing to do unless configured.
        """
        if not self.configured:
            return
        self.configured = False
        self.refusal = "lifecycle state 'unconfigured'"
        self._stopping.set()
        keep, self._engine_pids = self._engine_pids, None
        segments = set() if keep is None else process_life.shared_memory_below(keep)
        self.prefill_worker.stop()
        self.cameras.close()  # goals waiting for a frame see the stop at once
        in_flight = bool(self.slots.running + self.slots.queued)
        ended = self.wait_goals(SHUTDOWN_GOALS_S, spin, linger=in_flight)
        if not ended:
            self.get_logger().warning(
                f"{self.slots.running + self.slots.queued} goal(s) still running "
                f"{SHUTDOWN_GOALS_S:g} s after the stop: closing the engine under them")
        # What still runs in the engine ends ENGINE_UNAVAILABLE. Bounded: vLLM kills its
        # processes after engine.shutdown_timeout_s; aborting requests takes up to 5 s more.
        self.runner.close(timeout_s=self.params.engine.shutdown_timeout_s + 10.0)
        if not ended:
            self.wait_goals(SHUTDOWN_GOALS_AFTER_ENGINE_S, spin, linger=in_flight)
        # vLLM may kill its core before it unlinks its segments, and leaves it unreaped.
        left = [] if keep is None else process_life.end_descendants(grace_s=1.0, keep=keep)
        released = process_life.release_shared_memory(segments)
        self._stop_timers()
        self.stop_ingest()
        self._ingest_node.destroy_node()
        if self._action_server is not None:
            self._action_server.destroy()
            self._action_server = None
        for publisher in self._owned:
            self.destroy_publisher(publisher)
        self._owned = []
        self.get_logger().info(f"engine shut down; processes_ended={len(left)} "
                               f"segments_released={len(released)}")

    def wait_goals(self, limit_s: float, spin: Callable[[float], object] | None = None,
                   linger: bool = False) -> bool:
        """Wait until no accepted goal runs or waits (False after ``limit_s``).

        Then, with ``linger`` or ``spin``, or once the stop has ended a goal, serve result
        requests and ~/results a while longer (``serve_results``). (``linger`` alone missed
        goals the stop ended before the caller looked: a loaded run's release took longer to
        reach that look than its three goals took to end, and their results went unserved.)
        """
        wait = spin if spin is not None else time.sleep
        deadline = time.monotonic() + limit_s
        while self.slots.running or self.slots.queued:
            if time.monotonic() >= deadline:
                return False
            wait(0.05)
        if linger or spin is not None or self._ended_by_stop:
            self.serve_results(wait)
        return True

    def serve_results(self, wait: Callable[[float], object]) -> None:
        """Serve result requests before the action server goes.

        Until the result of every goal the stop ended has been asked for (at most
        ``SHUTDOWN_RESULTS_WAIT_S``: a client that never asks, or went away), then
        ``SHUTDOWN_RESULTS_LINGER_S`` after the last such request, so that a client whose reply
        was lost asks again in time; ``SHUTDOWN_QUIET_LINGER_S`` when the stop ended no goal.
        """
        t0 = time.monotonic()
        while True:
            now = time.monotonic()
            ended = set(self._ended_by_stop)
            asked = {} if self._action_server is None \
                else self._action_server.result_requests(ended)
            waited_out = now >= t0 + SHUTDOWN_RESULTS_WAIT_S
            last = min(max([t0, *asked.values()]), t0 + SHUTDOWN_RESULTS_WAIT_S)
            linger = SHUTDOWN_RESULTS_LINGER_S if ended else SHUTDOWN_QUIET_LINGER_S
            if (len(asked) == len(ended) or waited_out) and now >= last + linger:
                return
            wait(0.05)

    def destroy_node(self) -> None:
        """Destroy the node (release it first: ``release`` ends goals and the engine).

        rclpy's context shutdown destroys its nodes, and must not wait for an engine
        (``serve`` releases the node first, or abandons an interrupted start). A bad
        parameter may have stopped ``__init__`` before anything below existed.
        """
        if hasattr(self, "_python_log"):
            pylog.stop_forwarding(self._python_log)
        if hasattr(self, "gc_pauses"):
            self.gc_pauses.uninstall()
        if getattr(self, "configured", False):
            self.stop_ingest()
            self._ingest_node.destroy_node()
        super().destroy_node()

    def stop_ingest(self) -> None:
        """Stop the camera executor and wait (bounded) for its thread.

        A thread still inside rcl's wait at interpreter exit aborts the process
        (ros2/rclpy#1484).
        """
        self._ingest_executor.shutdown(timeout_sec=1.0)
        if self._ingest_thread is not None:
            self._ingest_thread.join(timeout=2.0)

    def executor_threads(self) -> int:
        """Threads the executor needs (fixed at start; one more for transitions)."""
        return self._threads

    def now_ns(self) -> int:
        """Return the node clock (sim time under replay) in nanoseconds."""
        return self.get_clock().now().nanoseconds

    def _on_frame(self) -> None:
        if self.params.prefill.enabled:
            self.prefill_worker.wake.set()

    # --- goals ---------------------------------------------------------------------------

    def _on_goal(self, goal: Reason.Goal) -> GoalResponse:
        # Admission happens before acceptance so that a goal over the bounds never holds an
        # executor thread. A ROS reject cannot carry a reason, so the refusal is also
        # published on ~/results (code OVERLOADED) and logged; every other problem is
        # reported in the goal's result with a specific code.
        if self.stopping:
            return GoalResponse.REJECT
        if self.refusal is not None:  # not active
            return self._refuse(goal, EngineUnavailableError(self.refusal))
        try:
            self.slots.admit()
        except OverloadedError as e:
            return self._refuse(goal, e)
        return GoalResponse.ACCEPT

    def _on_cancel(self, goal_handle: Any) -> CancelResponse:
        # Logged (with its time) as it arrives: a cancel's delay before this line is the
        # transport's, after it the node's and the engine's (RELIABILITY.md, "Mass cancel").
        self.get_logger().info(f"goal {bytes(goal_handle.goal_id.uuid).hex()[:8]} "
                               "cancel requested")
        return CancelResponse.ACCEPT

    def _refuse(self, goal: Reason.Goal, error: CosmosReasonError) -> GoalResponse:
        self._count("rejected")
        self.get_logger().warning(f"goal rejected: code={error.code.name} "
                                  f"message={error.message}")
        msg = ReasoningResult(origin="goal", model=self.runner.model_name,
                              task=goal.task or DEFAULT_TASK.value, prompt=goal.prompt)
        messages.fill_error(msg, error)
        self.outputs.publish_result(msg)
        return GoalResponse.REJECT

    def _count(self, outcome: str) -> None:
        with self._counters_lock:
            self.counters[outcome] += 1

    def counters_snapshot(self) -> dict[str, int]:
        """Goal outcome counters, copied under the lock."""
        with self._counters_lock:
            return dict(self.counters)

    def _execute(self, goal_handle: Any) -> Reason.Result:
        t_accept, accepted_ns = time.monotonic(), self.now_ns()
        goal = goal_handle.request
        msg = ReasoningResult(goal_id=bytes(goal_handle.goal_id.uuid).hex(), origin="goal",
                              model=self.runner.model_name,
                              task=goal.task or DEFAULT_TASK.value, prompt=goal.prompt)

        def should_stop() -> Stop | None:
            if goal_handle.is_cancel_requested:
                return Stop.CANCEL
            return Stop.SHUTDOWN if self.stopping else self.stop_goals

        def feedback(stage: Stage, text: str = "", tokens: int = 0) -> None:
            goal_handle.publish_feedback(Feedback(
                stage=stage.value, text_delta=text, output_tokens=tokens,
                elapsed_s=time.monotonic() - t_accept))

        holding_slot = False
        media = None
        try:
            valid = self.pipeline.validate(messages.goal_fields(goal))
            msg.task = valid.spec.task.value
            if valid.feedback.stages:
                feedback(Stage.QUEUED)
            holding_slot = self.slots.acquire(
                t_accept + valid.timeout_s - time.monotonic(),
                should_stop=lambda: should_stop() is not None)
            if not holding_slot:
                raise interrupted(should_stop(), "while waiting for a free slot")
            msg.queue_s = time.monotonic() - t_accept
            run = self.pipeline.run(
                valid, t_start=t_accept, accepted_ns=accepted_ns, should_stop=should_stop,
                on_stage=feedback, on_progress=lambda text, n: feedback(Stage.GENERATING,
                                                                        text, n))
            messages.fill_run(msg, run)
            media = run.media
            if run.error is not None:
                raise run.error
            self.outputs.publish_extras(msg, run.media)
            goal_handle.succeed()
            self._count("succeeded")
            if parsing.answered_from_reasoning_channel(msg.parse_problems):
                self._count("answered_from_reasoning")
                self.get_logger().warning(
                    "answers arrive in the server's reasoning channel (its --reasoning-parser "
                    "took the whole output): recovered and noted in parse_problems; ask with "
                    "reasoning on, or run the server without --reasoning-parser", once=True)
            self.latencies.append((run.time_to_first_token_s, time.monotonic() - t_accept))
            pylog.log_line(
                self.get_logger(), LoggingSeverity.INFO,
                f"goal {msg.goal_id[:8]} succeeded: task={msg.task} "
                f"tokens={msg.prompt_tokens}+{msg.output_tokens} "
                f"cached={msg.cached_prompt_tokens} ttft_s={run.time_to_first_token_s:.3f} "
                f"total_s={time.monotonic() - t_accept:.3f} parsed={','.join(msg.parsed)}")
        except CosmosReasonError as e:
            self._end_with_error(goal_handle, msg, e)
            try:  # the viewers' copy of its frames: never at the cost of the goal's result
                self.outputs.publish_drawings(msg, media, answered=False)
            except Exception as drawing:  # noqa: BLE001
                self.get_logger().warning(
                    f"goal {msg.goal_id[:8]}: frames not published: {drawing!r}")
        except Exception as e:  # noqa: BLE001 - the boundary: a goal must always end
            self.get_logger().error(f"goal {msg.goal_id[:8]}: internal error: {e!r}")
            self._end_with_error(goal_handle, msg, EngineError(f"internal error: {e!r}"))
        finally:
            if self.stopping:  # before leave(): a stop waiting for the goals then sees it
                self._ended_by_stop.add(bytes(goal_handle.goal_id.uuid))
            if holding_slot:
                self.slots.release()
            self.slots.leave()
            self.prefill_worker.wake.set()  # a frame skipped while busy can be prefilled now
        msg.total_s = time.monotonic() - t_accept
        self.outputs.publish_result(msg)
        return Reason.Result(result=msg)

    def _end_with_error(self, goal_handle: Any, msg: ReasoningResult,
                        error: CosmosReasonError) -> None:
        messages.fill_error(msg, error)
        pylog.log_line(self.get_logger(), LoggingSeverity.WARN,
                       f"goal {msg.goal_id[:8]} ended: code={error.code.name} "
                       f"message={error.message}")
        if isinstance(error, RequestCancelledError) and goal_handle.is_cancel_requested:
            goal_handle.canceled()
            self._count("canceled")
        else:
            goal_handle.abort()
            self._count("rejected" if error.code in (ErrorCode.OVERLOADED,
                                                     ErrorCode.BAD_REQUEST) else "aborted")

    # --- diagnostics ---------------------------------------------------------------------


def threads_for_goals(max_running: int, max_queued: int, spare: int = 4) -> int:
    """Threads the goal executor needs: every running and queued goal blocks one."""
    return max_running + max_queued + spare


# Shutdown bounds (docs/RELIABILITY.md, "Shutdown and signals"): goals stopped by the node end
# within milliseconds while the engine runs; these bound a stuck one.
SHUTDOWN_GOALS_S = 3.0  # accepted goals end (with their results) before the engine closes
SHUTDOWN_GOALS_AFTER_ENGINE_S = 1.0  # goals ended by closing the engine under them
SHUTDOWN_RESULTS_WAIT_S = 3.0  # for the result requests of the goals the stop ended
# After the last of those requests: longer than a client's first re-ask (ReasonClient asks
# again RESEND_FIRST_S after the status shows the goal ended), so a reply lost between
# participants is asked for again while the node still answers.
SHUTDOWN_RESULTS_LINGER_S = RESEND_FIRST_S + 0.5
SHUTDOWN_QUIET_LINGER_S = 0.5  # the stop ended no goal: replies and ~/results in flight leave

# vLLM starts its engine processes with 'spawn': they import this module as __mp_main__ (main
# makes sure of it), and there this makes them die with the node, even a SIGKILLed one
# (process_life.py).
process_life.guard_spawned_child()


def main(args: list[str] | None = None) -> NoReturn:
    """Run the node as a process until SIGINT/SIGTERM (``ros/serve.py``)."""
    from cosmos_reason_ros.ros.serve import serve

    # Started from an installed executable (ros2 run, ros2 launch), __main__ is a wrapper that
    # spawned children would run instead of this module, leaving them unguarded.
    process_life.spawn_children_from(__spec__.name)
    serve(args)


if __name__ == "__main__":
    sys.exit(main())
