"""Managed (lifecycle) mode: the node as an ``rclpy.lifecycle`` node (``lifecycle.enabled``).

The transitions run the same phases as the plain node's start-up (``ReasonNode.configure``,
``start_engine``, ``open_action_server``, ``resume``), at a lifecycle manager's request:

- configure: parameters validated (their current values), the engine object built (not
  started), publishers and the action server created; goals are refused while inactive;
- activate: the engine started and warmed (bounded by ``engine.start_timeout_s``), camera
  subscriptions, timers and goals on;
- deactivate: new goals refused, accepted goals finished or stopped
  (``lifecycle.deactivate_goals``, bounded by ``lifecycle.deactivate_timeout_s``), timers and
  subscriptions off; the engine stays loaded, so activating again is fast;
- cleanup: the engine shut down and its processes ended (their memory released), everything
  configure built destroyed: the node can be configured again, with changed parameters;
- shutdown: as cleanup, from any state. A failed transition returns FAILURE with the reason in
  the log (configure: a bad parameter; activate: the engine did not start), and the node stays
  where it was (unconfigured, or inactive: clean up, fix the parameter, configure again).

Parameters are all settable while unconfigured and read-only (but the runtime ones) after.
States and timings: docs/INTERFACES.md, "Managed (lifecycle) mode".
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

import rclpy
from rcl_interfaces.msg import SetParametersResult
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn

from cosmos_reason_ros.core.pipeline import Stop
from cosmos_reason_ros.core.types import CosmosReasonError
from cosmos_reason_ros.engines.base import Engine
from cosmos_reason_ros.ros import process_life
from cosmos_reason_ros.ros.config import RUNTIME_PARAMS, ConfigError, declared_values, validate
from cosmos_reason_ros.ros.node import (
    NODE_NAME,
    SHUTDOWN_GOALS_S,
    ReasonNode,
    threads_for_goals,
)

ENABLE_PARAM = "lifecycle.enabled"
TRANSITION_SPARE = 5  # the plain node's spare threads, plus one for a transition
Transition = Callable[["ManagedReasonNode", LifecycleState], TransitionCallbackReturn]


def requested() -> bool:
    """Whether ``lifecycle.enabled`` is true for this process's node (after ``rclpy.init``).

    Read before the node exists (its class depends on it) from a short-lived probe node of
    the same name, which gets the same parameter overrides (files, ``-p``, remaps).
    """
    probe = rclpy.create_node(NODE_NAME, start_parameter_services=False, enable_rosout=False)
    try:
        # The overrides the node was created with; see config.declare_and_load.
        override = probe._parameter_overrides.get(ENABLE_PARAM)
    finally:
        probe.destroy_node()
    return override is not None and override.value is True


def create_node() -> ReasonNode:
    """Build the node this process runs: a ``ManagedReasonNode`` if requested, else plain."""
    return ManagedReasonNode() if requested() else ReasonNode()


def _transition(name: str, refusal: str | None = None) -> Callable[[Transition], Transition]:
    """Log the transition and its time; an unexpected exception is logged, then ERROR.

    (rclpy turns an exception in a transition callback into ERROR without a word.) A
    ``refusal`` is in force before the first line is logged, so a client that reads the line
    and sends a goal is refused, however the threads are scheduled.
    """
    def wrap(method: Transition) -> Transition:
        @functools.wraps(method)
        def run(self: ManagedReasonNode, state: LifecycleState) -> TransitionCallbackReturn:
            t0 = time.monotonic()
            if refusal is not None:
                self.refusal = refusal
            self.get_logger().info(f"lifecycle: {name} from {state.label!r}")
            try:
                result = method(self, state)
            except Exception as e:  # noqa: BLE001 - the boundary of a transition
                self.get_logger().error(f"lifecycle: {name} failed: internal error: {e!r}")
                return TransitionCallbackReturn.ERROR
            outcome = "done" if result == TransitionCallbackReturn.SUCCESS else "FAILED"
            self.get_logger().info(f"lifecycle: {name} {outcome} "
                                   f"took_s={time.monotonic() - t0:.2f}")
            return result
        return run
    return wrap


class ManagedReasonNode(ReasonNode, LifecycleNode):
    """The cosmos_reason node under a lifecycle manager (``~/change_state`` and friends)."""

    def __init__(self, engine: Engine | None = None, **kwargs: Any) -> None:
        """Declare the parameters; build nothing until configure."""
        super().__init__(engine, managed=True, **kwargs)
        self.configured = self._engine_started = False
        self.refusal = "lifecycle state 'unconfigured'"
        # Every running and queued goal blocks an executor thread, and the executor is made
        # once: its size comes from the limits given at start (configure refuses more).
        limits = declared_values(self)
        self._threads = threads_for_goals(limits["limits.max_concurrent_goals"],
                                          limits["limits.max_queued_goals"], TRANSITION_SPARE)
        self._owned_publishers: list[Any] = []
        self.add_on_set_parameters_callback(self._on_set_managed)

    def executor_threads(self) -> int:
        """Threads the executor needs (fixed at start; one more for transitions)."""
        return self._threads

    def start(self) -> None:
        """Nothing starts before configure and activate."""

    def log_ready(self) -> None:
        """Log the "ready:" line once active; before, that the node waits for a manager."""
        if self.refusal is None:
            super().log_ready()
        else:
            self.get_logger().info("lifecycle: unconfigured, waiting for configure and "
                                   "activate (~/change_state)")

    def close(self, spin: Callable[[float], object] | None = None) -> None:
        """End goals and the engine as the plain node does (if configured)."""
        if self.configured:
            super().close(spin)
        else:
            self.gc_pauses.uninstall()

    def _on_set_managed(self, params: list[Any]) -> SetParametersResult:
        fixed = [p.name for p in params if p.name not in RUNTIME_PARAMS]
        if ENABLE_PARAM in fixed:
            return SetParametersResult(successful=False, reason=f"{ENABLE_PARAM} is read "
                                       f"once at process start")
        if self.configured and fixed:
            return SetParametersResult(successful=False, reason=(
                f"{', '.join(fixed)}: settable only while unconfigured (clean up first)"))
        if self.configured:
            return self._on_set_parameters(params)
        return SetParametersResult(successful=True)  # validated on configure

    # --- transitions ---------------------------------------------------------------------

    @_transition("configure")
    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Validate the parameters; build the engine object, publishers, action server."""
        try:
            params = validate(declared_values(self))
        except ConfigError as e:
            self.get_logger().error(f"lifecycle: configure refused: {e}")
            return TransitionCallbackReturn.FAILURE
        need = threads_for_goals(params.limits.max_concurrent_goals,
                                params.limits.max_queued_goals, TRANSITION_SPARE)
        if need > self._threads:
            self.get_logger().error(
                f"lifecycle: configure refused: limits.max_concurrent_goals + "
                f"limits.max_queued_goals need {need} executor threads, the process has "
                f"{self._threads} (from the values at start): restart the node to raise them")
            return TransitionCallbackReturn.FAILURE
        self._stopping = threading.Event()  # this configuration's stop (workers wait on it)
        self._threads_started = self._engine_started = False
        before = set(self.publishers)
        try:
            self.configure(params, subscribe=False)
        except (ConfigError, CosmosReasonError) as e:
            self.get_logger().error(f"lifecycle: configure refused: {e}")
            return TransitionCallbackReturn.FAILURE
        self._owned_publishers = [p for p in self.publishers if p not in before]
        self.refusal = "lifecycle state 'inactive': activate the node to serve goals"
        self.open_action_server()
        self.configured = True
        return TransitionCallbackReturn.SUCCESS

    @_transition("activate")
    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Start and warm the engine (kept from a previous activation), then serve."""
        t0 = time.monotonic()
        if not self._engine_started:
            self.get_logger().info(
                f"lifecycle: starting the engine model={self.params.engine.model!r} "
                f"(at most engine.start_timeout_s={self.params.engine.start_timeout_s:g} s)")
            try:
                self.start_engine()
            except CosmosReasonError as e:
                self.get_logger().error(f"lifecycle: activate failed: engine did not start: "
                                        f"{e.message} (clean up, fix the parameter, configure "
                                        f"again)")
                return TransitionCallbackReturn.FAILURE
            self._engine_started = True
        self.cameras.subscribe()
        self.resume()
        self.stop_goals, self.refusal = None, None
        self.startup_s = time.monotonic() - t0
        self.log_ready()
        return TransitionCallbackReturn.SUCCESS

    @_transition("deactivate", refusal="lifecycle state 'deactivating': the node serves goals "
                 "only when active")
    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Refuse new goals; finish or stop the accepted ones; timers and cameras off."""
        rule = self.params.lifecycle
        in_flight = self.slots.running + self.slots.queued
        if rule.deactivate_goals == "cancel":
            self.stop_goals = Stop.DEACTIVATE
        ended = self.wait_goals(rule.deactivate_timeout_s, linger=bool(in_flight))
        if not ended:
            self.get_logger().warning(
                f"lifecycle: {self.slots.running + self.slots.queued} goal(s) still running "
                f"after lifecycle.deactivate_timeout_s={rule.deactivate_timeout_s:g}: stopping "
                f"them")
            self.stop_goals = Stop.DEACTIVATE
            self.wait_goals(SHUTDOWN_GOALS_S, linger=True)
        self.periodic.join(SHUTDOWN_GOALS_S)
        for timer in self.serving_timers:
            self.destroy_timer(timer)
        self.serving_timers = []
        self.cameras.subscribe(False)
        self.refusal = "lifecycle state 'inactive': activate the node to serve goals"
        self.get_logger().info(f"lifecycle: deactivated goals_in_flight={in_flight} "
                               f"rule={rule.deactivate_goals}; engine kept loaded")
        return TransitionCallbackReturn.SUCCESS

    @_transition("cleanup")
    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Shut the engine down (its processes ended) and destroy what configure built."""
        self._release()
        return TransitionCallbackReturn.SUCCESS

    @_transition("shutdown")
    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        """End goals and the engine, from any state."""
        if self.configured:
            self._release()  # running goals end ABORTED, "node deactivating ..."
        return TransitionCallbackReturn.SUCCESS

    @_transition("error processing")
    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Release what exists and go back to unconfigured (configurable again)."""
        if self.configured:
            self._release()
        return TransitionCallbackReturn.SUCCESS

    def _release(self) -> None:
        self.refusal = "lifecycle state 'unconfigured'"
        self.stop_goals = Stop.DEACTIVATE
        segments = process_life.shared_memory_below()
        self._stopping.set()
        self.prefill_worker.stop()
        self.cameras.close()
        self.wait_goals(SHUTDOWN_GOALS_S, linger=bool(self.slots.running + self.slots.queued))
        self.runner.close(timeout_s=self.params.engine.shutdown_timeout_s + 10.0)
        # What the engine's shutdown left (vLLM may kill its core before it unlinks its
        # segments): as at process exit (ros/serve.py).
        left = process_life.end_descendants(grace_s=1.0)
        released = process_life.release_shared_memory(segments)
        for timer in self.serving_timers:
            self.destroy_timer(timer)
        self.serving_timers = []
        self.stop_ingest()
        self._ingest_node.destroy_node()
        del self._ingest_node
        if self._action_server is not None:
            self._action_server.destroy()
            self._action_server = None
        for publisher in self._owned_publishers:
            self.destroy_publisher(publisher)
        self._owned_publishers = []
        self.configured = False
        self.get_logger().info(f"lifecycle: engine shut down; processes_ended={len(left)} "
                               f"segments_released={len(released)}")
