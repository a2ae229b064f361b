"""A small Python client for planners: ask the cosmos_reason node and get typed results.

    from cosmos_reason_ros.client import ReasonClient

    with ReasonClient() as client:                      # own node + spin thread
        print(client.ask("Is the aisle ahead blocked?").answer)
        cups = client.ground(["red cup"]).boxes         # original-image pixels
        both = client.ask("Is the part in the gripper?", cameras=["front", "wrist"])
        handle = client.submit(client.goal("Describe the scene"), on_feedback=print)
        handle.cancel()

Blocking calls take ``timeout_s``; ``*_async`` variants return ``concurrent.futures.Future``s
(``asyncio.wrap_future`` makes them awaitable). The client owns a small node and the one
thread that spins it; goals are sent from that thread too, because rclpy's ActionClient is not
safe against a goal response being processed while another thread is still sending (Kilted's
``send_goal_async`` can then lose the response and the goal's future never completes).

A goal is sent only once the action server has been discovered: rclpy sends a goal request
whether or not the server is matched, and DDS drops a request sent before discovery, so the
goal would be lost and the caller would wait its whole timeout. A goal therefore waits (within
the call's timeout) for the server; if it is not found in time the call fails with
``ServerUnavailableError`` ("action server <name> not available after N s").
"""

from __future__ import annotations

import concurrent.futures
import copy
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import rclpy
from action_msgs.msg import GoalStatus
from rclpy.action import ActionClient
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy

from cosmos_reason_interfaces.action import Reason
from cosmos_reason_interfaces.msg import ReasoningResult
from cosmos_reason_ros.core.types import (
    Box,
    EngineUnavailableError,
    ErrorCode,
    Point,
    Trajectory,
)

DEFAULT_ACTION = "/cosmos_reason/reason"
DEFAULT_SERVER_TIMEOUT_S = 30.0  # submit()/run_async(): how long a goal waits for the server
_WAITING_POLL_S = 0.01  # spin period while a goal waits for discovery (rclpy's own poll: 0.25)
_WARN_WAITING_AFTER_S = 5.0
_STATUS = {GoalStatus.STATUS_SUCCEEDED: "succeeded", GoalStatus.STATUS_ABORTED: "aborted",
           GoalStatus.STATUS_CANCELED: "canceled"}


class ServerUnavailableError(EngineUnavailableError, concurrent.futures.TimeoutError):
    """The action server was not discovered within the call's timeout; the goal was not sent.

    An ``EngineUnavailableError`` (code ``ENGINE_UNAVAILABLE``) and a
    ``concurrent.futures.TimeoutError`` (the builtin ``TimeoutError`` from Python 3.11), so
    code that catches the client's timeouts catches this one too.
    """

    def __init__(self, action_name: str, timeout_s: float) -> None:
        """Name the action and the time waited."""
        super().__init__(f"action server {action_name} not available after {timeout_s:g} s "
                         "(is the node running, with the same ROS_DOMAIN_ID, and is the "
                         "action name right?); the goal was not sent")
        self.action_name = action_name
        self.timeout_s = timeout_s


@dataclass(frozen=True)
class ReasonResult:
    """A finished goal: status, error, answer and geometry (original-image pixels)."""

    status: str  # succeeded | aborted | canceled | rejected
    error_code: ErrorCode
    error_message: str
    answer: str
    reasoning: str
    answer_json: str
    boxes: tuple[Box, ...]
    points: tuple[Point, ...]
    trajectories: tuple[Trajectory, ...]
    message: ReasoningResult  # the full result message

    @property
    def ok(self) -> bool:
        """True when the goal succeeded."""
        return self.status == "succeeded" and self.error_code is ErrorCode.OK

    @classmethod
    def from_message(cls, status: str, msg: ReasoningResult) -> ReasonResult:
        """Convert a ``ReasoningResult`` message."""
        def point(p: Any) -> Point:
            return Point(p.x, p.y, p.label, p.camera)
        try:
            code = ErrorCode(msg.error_code)
        except ValueError:
            code = ErrorCode.ENGINE_ERROR
        return cls(
            status=status, error_code=code, error_message=msg.error_message,
            answer=msg.answer, reasoning=msg.reasoning, answer_json=msg.answer_json,
            boxes=tuple(Box(b.x_min, b.y_min, b.x_max, b.y_max, b.label,
                            None if b.score != b.score else b.score, b.degenerate, b.camera)
                        for b in msg.boxes),
            points=tuple(point(p) for p in msg.points),
            trajectories=tuple(Trajectory(tuple(point(p) for p in t.points), t.label,
                                          t.camera) for t in msg.trajectories),
            message=msg)

    @property
    def cameras(self) -> tuple[str, ...]:
        """The cameras whose frames the answer is about, in prompt order.

        Each box, point and trajectory names its camera (``Box.camera``); the frame of each
        camera (header, sizes) is in ``message.camera_frames``.
        """
        return tuple(f.camera for f in self.message.camera_frames)


class GoalHandle:
    """A submitted goal: wait for its result, or cancel it."""

    def __init__(self, future: concurrent.futures.Future[ReasonResult],
                 send_cancel: Callable[[Any], None]) -> None:
        """Wrap the result future (created by ``ReasonClient.submit``).

        ``send_cancel(ros_handle)`` sends the cancel request (the client's spin thread does).
        """
        self.future = future
        self._send_cancel = send_cancel
        self._ros_handle: Any = None
        self._cancel_requested = False
        self._sent = False
        self._lock = threading.Lock()

    @property
    def sent(self) -> bool:
        """True once the goal request went out (the action server had been discovered)."""
        with self._lock:
            return self._sent

    def _claim_send(self) -> bool:
        # The spin thread asks before sending: a goal cancelled or failed while it waited for
        # the server must never go out (one lock orders this against cancel() and _fail_unsent).
        with self._lock:
            if self._cancel_requested or self.future.done():
                return False
            self._sent = True
            return True

    def _fail_unsent(self, error: BaseException) -> bool:
        """Fail the future with ``error`` unless the goal was sent; True when it was failed."""
        with self._lock:
            if self._sent:
                return False
            self._cancel_requested = True
            if not self.future.done():
                self.future.set_exception(error)
            return True

    def _attach(self, ros_handle: Any) -> None:
        with self._lock:
            self._ros_handle = ros_handle
            cancel = self._cancel_requested
        if cancel:
            self._send_cancel(ros_handle)

    def cancel(self) -> None:
        """Ask the node to cancel (the result then has status 'canceled')."""
        with self._lock:
            self._cancel_requested = True
            handle = self._ros_handle
            if not self._sent and not self.future.done():
                # Still waiting for the server: the goal will never be sent.
                msg = ReasoningResult(error_code=ErrorCode.CANCELLED.value,
                                      error_message="cancelled before the action server was "
                                      "available; the goal was never sent")
                self.future.set_result(ReasonResult.from_message("canceled", msg))
        if handle is not None:
            self._send_cancel(handle)

    def result(self, timeout_s: float | None = None) -> ReasonResult:
        """Block until the goal ends; ``TimeoutError`` after ``timeout_s`` (goal continues)."""
        return self.future.result(timeout=timeout_s)


@dataclass(frozen=True)
class _WaitingGoal:
    """A submitted goal not sent yet: it waits for the action server to be discovered."""

    handle: GoalHandle
    send: Callable[[], None]
    submitted: float  # time.monotonic()
    deadline: float | None  # None: wait as long as it takes
    timeout_s: float | None


class ReasonClient:
    """Action client for ``~/reason`` with typed helpers for the common tasks."""

    def __init__(self, action_name: str = DEFAULT_ACTION, context: Any = None,
                 node_name: str = "cosmos_reason_client") -> None:
        """Create a private node in ``context`` and spin it.

        ``context=None`` (the default) gives the client a context of its own, and so its own
        DDS participant. Sharing one with a publisher of camera frames in the same process
        delayed about 1 % of goals by 0.3-3 s: a request lost behind the frames is repaired
        only at the next Fast DDS heartbeat (every 3 s). See docs/PERFORMANCE.md.
        """
        self.action_name = action_name
        self._own_context: Context | None = None
        if context is None:
            context = self._own_context = Context()
            rclpy.init(context=context)
        self.node: Node = rclpy.create_node(node_name, context=context)
        # Deep request and feedback queues, like the node's: the default (10) drops bursts of
        # goals, and a goal's one-off feedback stages behind other goals' token feedback.
        requests_qos = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=256,
                                  reliability=ReliabilityPolicy.RELIABLE)
        self._client = ActionClient(self.node, Reason, action_name,
                                    goal_service_qos_profile=requests_qos,
                                    result_service_qos_profile=requests_qos,
                                    cancel_service_qos_profile=requests_qos,
                                    feedback_sub_qos_profile=requests_qos)
        self._executor = SingleThreadedExecutor(context=self.node.context)
        self._executor.add_node(self.node)
        # Goals waiting for the server; filled by submit(), sent or expired by the spin thread.
        self._waiting: list[_WaitingGoal] = []
        self._waiting_lock = threading.Lock()
        self._warned_waiting = False
        # Goals to cancel, sent by the spin thread in one go (also under _waiting_lock).
        self._cancels: list[Any] = []
        self._running = True
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        while self._running and self.node.context.ok():
            with self._waiting_lock:
                waiting = bool(self._waiting)
            try:
                # Discovery wakes no executor: poll briefly while a goal waits for the server.
                self._executor.spin_once(timeout_sec=_WAITING_POLL_S if waiting else 0.1)
            except Exception:  # noqa: BLE001 - context shut down under us: stop spinning
                break
            if waiting:
                self._send_waiting()

    def _send_waiting(self) -> None:
        """On the spin thread: send the waiting goals once the server is discovered."""
        with self._waiting_lock:
            waiting, self._waiting = self._waiting, []
        if not waiting:
            return
        ready = self._client.server_is_ready()
        now = time.monotonic()
        keep = []
        for entry in waiting:
            if entry.handle.future.done():  # cancelled while waiting
                continue
            if ready:
                if entry.handle._claim_send():
                    entry.send()
            elif entry.deadline is not None and now >= entry.deadline:
                entry.handle._fail_unsent(
                    ServerUnavailableError(self.action_name, entry.timeout_s or 0.0))
            else:
                keep.append(entry)
        if keep and not self._warned_waiting \
                and any(now - e.submitted > _WARN_WAITING_AFTER_S for e in keep):
            self._warned_waiting = True  # a goal may wait long: say once why nothing happens
            self.node.get_logger().warning(
                f"waiting for action server {self.action_name}: not discovered yet; goals are "
                "sent once it is")
        with self._waiting_lock:
            self._waiting = keep + self._waiting

    def _queue_cancel(self, ros_handle: Any) -> None:
        """Have the spin thread send a cancel request for ``ros_handle``.

        Sent from the caller's thread, each request waited for the GIL against the spin
        thread decoding feedback and status: 50 cancels in a loop took up to 2 s under CPU
        load (docs/RELIABILITY.md, "Mass cancel"). Queued, a burst goes out in one wake-up.
        """
        with self._waiting_lock:
            self._cancels.append(ros_handle)
        self._executor.create_task(self._send_cancels)

    def _send_cancels(self) -> None:
        with self._waiting_lock:
            cancels, self._cancels = self._cancels, []
        for ros_handle in cancels:
            ros_handle.cancel_goal_async()

    def close(self) -> None:
        """Stop the spin thread and destroy the private node (waiting goals fail)."""
        self._running = False
        self._executor.create_task(lambda: None)  # wake spin_once now, not after its 0.1 s
        self._thread.join(timeout=2.0)
        self._send_cancels()  # cancels asked for just before closing still go out
        with self._waiting_lock:
            waiting, self._waiting = self._waiting, []
        for entry in waiting:
            entry.handle._fail_unsent(RuntimeError(
                f"ReasonClient closed while the goal waited for {self.action_name}"))
        self._client.destroy()
        self._executor.shutdown(timeout_sec=1.0)
        self.node.destroy_node()
        if self._own_context is not None:
            rclpy.try_shutdown(context=self._own_context)

    def __enter__(self) -> ReasonClient:
        """Context manager: ``close()`` on exit."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the client."""
        self.close()

    def wait_for_server(self, timeout_s: float = 10.0) -> bool:
        """Wait until the node's action server is up."""
        return self._client.wait_for_server(timeout_sec=timeout_s)

    @staticmethod
    def goal(prompt: str = "", task: str = "", targets: Sequence[str] = (),
             cameras: Sequence[str] = (), **fields: Any) -> Reason.Goal:
        """Build a goal; ``fields`` are any other ``Reason.Goal`` fields.

        ``cameras`` names the node's cameras (``cameras.names``) to ask about together, in
        the order the model sees them; empty = the default camera.
        """
        if isinstance(cameras, str):
            raise TypeError(f"cameras={cameras!r}: give a list of camera names, e.g. "
                            f"{cameras.split(',')!r}, not one string")
        goal = Reason.Goal(prompt=prompt, task=task, targets=list(targets),
                           cameras=list(cameras))
        for name, value in fields.items():
            setattr(goal, name, value)
        return goal

    def submit(self, goal: Reason.Goal,
               on_feedback: Callable[[Reason.Feedback], None] | None = None,
               server_timeout_s: float | None = DEFAULT_SERVER_TIMEOUT_S) -> GoalHandle:
        """Send a goal without waiting; the handle gives the result or cancels.

        The goal goes out once the action server is discovered; if it is not within
        ``server_timeout_s`` (None: no limit), the handle's future fails with
        ``ServerUnavailableError``. Without ``on_feedback`` the goal asks the node for no
        feedback (``FEEDBACK_NONE``, unless ``goal.feedback`` asks for some).
        """
        if on_feedback is None and goal.feedback == Reason.Goal.FEEDBACK_ALL:
            # Nobody reads it: the result alone (every client decodes every goal's feedback).
            goal = copy.copy(goal)
            goal.feedback = Reason.Goal.FEEDBACK_NONE
        future: concurrent.futures.Future[ReasonResult] = concurrent.futures.Future()
        handle = GoalHandle(future, self._queue_cancel)

        def on_result(ros_future: Any) -> None:
            response = ros_future.result()
            status = _STATUS.get(response.status, f"status_{response.status}")
            future.set_result(ReasonResult.from_message(status, response.result.result))

        def on_goal(ros_future: Any) -> None:
            try:
                ros_handle = ros_future.result()
            except Exception as e:  # noqa: BLE001 - surface transport errors to the caller
                future.set_exception(e)
                return
            if not ros_handle.accepted:
                # The node rejects only when its goal bounds are full, it is stopping, or (a
                # managed node) it is not active; the node's ~/results message says which.
                msg = ReasoningResult(error_code=ErrorCode.OVERLOADED.value,
                                      error_message="goal rejected by the node: too many goals "
                                      "running and queued (limits.max_concurrent_goals + "
                                      "limits.max_queued_goals), shutting down, or a managed "
                                      "node not active (see its ~/results)")
                future.set_result(ReasonResult.from_message("rejected", msg))
                return
            handle._attach(ros_handle)
            ros_handle.get_result_async().add_done_callback(on_result)

        feedback = (lambda m: on_feedback(m.feedback)) if on_feedback else None

        def send() -> None:  # runs on the spin thread (see the module docstring)
            self._client.send_goal_async(goal, feedback_callback=feedback).add_done_callback(
                on_goal)

        now = time.monotonic()
        deadline = None if server_timeout_s is None else now + server_timeout_s
        with self._waiting_lock:
            self._waiting.append(_WaitingGoal(handle, send, now, deadline, server_timeout_s))
        self._executor.create_task(self._send_waiting)  # wakes the spin thread to send it
        return handle

    def run(self, goal: Reason.Goal, timeout_s: float | None = 120.0,
            on_feedback: Callable[[Reason.Feedback], None] | None = None) -> ReasonResult:
        """Send a goal and wait for its result; cancel it if ``timeout_s`` passes.

        ``timeout_s`` covers the wait for the action server too: ``ServerUnavailableError``
        when the server was not discovered in time (the goal was not sent), a plain
        ``TimeoutError`` when the goal was sent but did not end in time.
        """
        handle = self.submit(goal, on_feedback, server_timeout_s=timeout_s)
        try:
            return handle.result(timeout_s)
        except ServerUnavailableError:
            raise
        except concurrent.futures.TimeoutError:
            # Both deadlines fall together: if the goal is still unsent, say why.
            error = ServerUnavailableError(self.action_name, timeout_s or 0.0)
            if handle._fail_unsent(error):
                raise error from None
            handle.cancel()
            raise

    def run_async(self, goal: Reason.Goal,
                  on_feedback: Callable[[Reason.Feedback], None] | None = None,
                  server_timeout_s: float | None = DEFAULT_SERVER_TIMEOUT_S
                  ) -> concurrent.futures.Future[ReasonResult]:
        """Send a goal; the future resolves to its ``ReasonResult``.

        It fails with ``ServerUnavailableError`` if the server is not discovered within
        ``server_timeout_s``.
        """
        return self.submit(goal, on_feedback, server_timeout_s).future

    # --- task helpers ---------------------------------------------------------------------

    def ask(self, prompt: str, reasoning: bool = False, timeout_s: float | None = 120.0,
            **fields: Any) -> ReasonResult:
        """Ask a free-form question about the latest frame."""
        return self.run(self.goal(prompt, "vqa", reasoning=reasoning, **fields), timeout_s)

    def ground(self, targets: Sequence[str], timeout_s: float | None = 120.0,
               **fields: Any) -> ReasonResult:
        """Ask for boxes of ``targets`` (original-image pixels)."""
        return self.run(self.goal("", "ground", targets, **fields), timeout_s)

    def point(self, targets: Sequence[str], timeout_s: float | None = 120.0,
              **fields: Any) -> ReasonResult:
        """Ask for points on ``targets`` (original-image pixels)."""
        return self.run(self.goal("", "point", targets, **fields), timeout_s)

    def trajectory(self, task: str, timeout_s: float | None = 120.0,
                   **fields: Any) -> ReasonResult:
        """Ask for the 2D end-effector trajectory for ``task``."""
        return self.run(self.goal(task, "trajectory", **fields), timeout_s)

    def verify(self, statement: str, timeout_s: float | None = 120.0,
               **fields: Any) -> ReasonResult:
        """Check ``statement`` yes/no (the answer JSON has the verdict and a reason)."""
        return self.run(self.goal(statement, "verify", **fields), timeout_s)

    def count(self, targets: Sequence[str], timeout_s: float | None = 120.0,
              **fields: Any) -> ReasonResult:
        """Ask how many of ``targets`` are visible, all together.

        The answer JSON is ``{"count": N}`` when a count was read (``parsed`` lists "count").
        """
        return self.run(self.goal("", "count", targets, **fields), timeout_s)
