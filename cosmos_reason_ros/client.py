"""A small Python client for planners: ask the cosmos_reason node and get typed results.

    from cosmos_reason_ros.client import ReasonClient

    with ReasonClient() as client:                      # own node + spin thread
        print(client.ask("Is the aisle ahead blocked?").answer)
        cups = client.ground(["red cup"]).boxes         # original-image pixels
        handle = client.submit(client.goal("Describe the scene"), on_feedback=print)
        handle.cancel()

Blocking calls take ``timeout_s``; ``*_async`` variants return ``concurrent.futures.Future``s
(``asyncio.wrap_future`` makes them awaitable). The client owns a small node and the one
thread that spins it; goals are sent from that thread too, because rclpy's ActionClient is not
safe against a goal response being processed while another thread is still sending (Kilted's
``send_goal_async`` can then lose the response and the goal's future never completes).
"""

from __future__ import annotations

import concurrent.futures
import threading
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
from cosmos_reason_ros.core.types import Box, ErrorCode, Point, Trajectory

DEFAULT_ACTION = "/cosmos_reason/reason"
_STATUS = {GoalStatus.STATUS_SUCCEEDED: "succeeded", GoalStatus.STATUS_ABORTED: "aborted",
           GoalStatus.STATUS_CANCELED: "canceled"}


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
            return Point(p.x, p.y, p.label)
        try:
            code = ErrorCode(msg.error_code)
        except ValueError:
            code = ErrorCode.ENGINE_ERROR
        return cls(
            status=status, error_code=code, error_message=msg.error_message,
            answer=msg.answer, reasoning=msg.reasoning, answer_json=msg.answer_json,
            boxes=tuple(Box(b.x_min, b.y_min, b.x_max, b.y_max, b.label,
                            None if b.score != b.score else b.score, b.degenerate)
                        for b in msg.boxes),
            points=tuple(point(p) for p in msg.points),
            trajectories=tuple(Trajectory(tuple(point(p) for p in t.points), t.label)
                               for t in msg.trajectories),
            message=msg)


class GoalHandle:
    """A submitted goal: wait for its result, or cancel it."""

    def __init__(self, future: concurrent.futures.Future[ReasonResult]) -> None:
        """Wrap the result future (created by ``ReasonClient.submit``)."""
        self.future = future
        self._ros_handle: Any = None
        self._cancel_requested = False
        self._lock = threading.Lock()

    def _attach(self, ros_handle: Any) -> None:
        with self._lock:
            self._ros_handle = ros_handle
            cancel = self._cancel_requested
        if cancel:
            ros_handle.cancel_goal_async()

    def cancel(self) -> None:
        """Ask the node to cancel (the result then has status 'canceled')."""
        with self._lock:
            self._cancel_requested = True
            handle = self._ros_handle
        if handle is not None:
            handle.cancel_goal_async()

    def result(self, timeout_s: float | None = None) -> ReasonResult:
        """Block until the goal ends; ``TimeoutError`` after ``timeout_s`` (goal continues)."""
        return self.future.result(timeout=timeout_s)


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
        self._own_context: Context | None = None
        if context is None:
            context = self._own_context = Context()
            rclpy.init(context=context)
        self.node: Node = rclpy.create_node(node_name, context=context)
        # Deep request queues, like the node's: the default (10) drops bursts of goals.
        requests_qos = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=256,
                                  reliability=ReliabilityPolicy.RELIABLE)
        self._client = ActionClient(self.node, Reason, action_name,
                                    goal_service_qos_profile=requests_qos,
                                    result_service_qos_profile=requests_qos,
                                    cancel_service_qos_profile=requests_qos)
        self._executor = SingleThreadedExecutor(context=self.node.context)
        self._executor.add_node(self.node)
        self._running = True
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        while self._running and self.node.context.ok():
            try:
                self._executor.spin_once(timeout_sec=0.1)
            except Exception:  # noqa: BLE001 - context shut down under us: stop spinning
                break

    def close(self) -> None:
        """Stop the spin thread and destroy the private node."""
        self._running = False
        self._thread.join(timeout=2.0)
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
    def goal(prompt: str = "", task: str = "", targets: Sequence[str] = (), **fields: Any
             ) -> Reason.Goal:
        """Build a goal; ``fields`` are any other ``Reason.Goal`` fields."""
        goal = Reason.Goal(prompt=prompt, task=task, targets=list(targets))
        for name, value in fields.items():
            setattr(goal, name, value)
        return goal

    def submit(self, goal: Reason.Goal,
               on_feedback: Callable[[Reason.Feedback], None] | None = None) -> GoalHandle:
        """Send a goal without waiting; the handle gives the result or cancels."""
        future: concurrent.futures.Future[ReasonResult] = concurrent.futures.Future()
        handle = GoalHandle(future)

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
                # The node rejects only when its goal bounds are full (or it is stopping).
                msg = ReasoningResult(error_code=ErrorCode.OVERLOADED.value,
                                      error_message="goal rejected by the node: too many goals "
                                      "running and queued (limits.max_concurrent_goals + "
                                      "limits.max_queued_goals), or shutting down")
                future.set_result(ReasonResult.from_message("rejected", msg))
                return
            handle._attach(ros_handle)
            ros_handle.get_result_async().add_done_callback(on_result)

        feedback = (lambda m: on_feedback(m.feedback)) if on_feedback else None

        def send() -> None:  # runs on the spin thread (see the module docstring)
            self._client.send_goal_async(goal, feedback_callback=feedback).add_done_callback(
                on_goal)

        self._executor.create_task(send)
        return handle

    def run(self, goal: Reason.Goal, timeout_s: float | None = 120.0,
            on_feedback: Callable[[Reason.Feedback], None] | None = None) -> ReasonResult:
        """Send a goal and wait for its result; cancel it if ``timeout_s`` passes."""
        handle = self.submit(goal, on_feedback)
        try:
            return handle.result(timeout_s)
        except concurrent.futures.TimeoutError:
            handle.cancel()
            raise

    def run_async(self, goal: Reason.Goal,
                  on_feedback: Callable[[Reason.Feedback], None] | None = None
                  ) -> concurrent.futures.Future[ReasonResult]:
        """Send a goal; the future resolves to its ``ReasonResult``."""
        return self.submit(goal, on_feedback).future

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
