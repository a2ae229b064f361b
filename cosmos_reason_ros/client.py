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

Replies can be lost too. The goal, cancel and result replies of an action are service
responses, and rmw_fastrtps drops a response whose writer has not yet matched the client's
response reader ("failed to send response (timeout): client will not receive response"; see
ros2/ros2#1253, ros2/rmw_fastrtps#842): under discovery lag a goal the node accepted and ran
was never answered. The action's status topic (``<action>/_action/status``, reliable and
transient-local) still lists the goal, so the client also watches it: a goal seen there is
accepted even without its goal response, a result request is repeated while the status says
the goal ended and no result came, and a cancel is repeated until the status shows it taken.
A goal with neither a goal response nor a place in the status within ``delivery_timeout_s``,
or whose result never came that long after it ended, ends ``not_delivered``
(``ErrorCode.NOT_DELIVERED``) with a message naming the lost hop, never a silent wait.
``ReasonResult.delivery`` is the client's view of each goal's trip.
"""

from __future__ import annotations

import concurrent.futures
import copy
import inspect
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import rclpy
from action_msgs.msg import GoalStatus, GoalStatusArray
from rclpy.action import ActionClient
from rclpy.action.client import ClientGoalHandle
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from unique_identifier_msgs.msg import UUID

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
# Goal sources by name (``query --source``, the console's form): ``Reason.Goal.SOURCE_*``.
SOURCES = {"latest": Reason.Goal.SOURCE_LATEST, "next": Reason.Goal.SOURCE_NEXT,
           "clip": Reason.Goal.SOURCE_CLIP}
DEFAULT_SERVER_TIMEOUT_S = 30.0  # submit()/run_async(): how long a goal waits for the server
# How long a reply may be missing before the goal ends not delivered: the goal response (or
# the goal in the status), and the result once the status says the goal ended. Discovery lag
# on a loaded 2-core machine is 0.1-3 s; far above it, far below a goal's 120 s.
DEFAULT_DELIVERY_TIMEOUT_S = 30.0
# A lost result or cancel request is sent again after 1 s, then 2, 4, 8, 8, ... s: soon enough
# to fetch a result before the node expires it (limits.result_keep_s, 10 s), few enough to
# cost nothing. Shorter delivery timeouts start at a quarter of theirs.
RESEND_FIRST_S = 1.0
_RESEND_MAX_S = 8.0
_CHECK_PERIOD_S = 0.05  # how often the spin thread looks at the deadlines of goals in flight
_WAITING_POLL_S = 0.01  # spin period while a goal waits for discovery (rclpy's own poll: 0.25)
_WARN_WAITING_AFTER_S = 5.0
_HELD_S = 1.0  # a spin-loop turn this long means the client was held (a turn: <= 0.1 s)
_STATUS = {GoalStatus.STATUS_SUCCEEDED: "succeeded", GoalStatus.STATUS_ABORTED: "aborted",
           GoalStatus.STATUS_CANCELED: "canceled"}
_ENDED = frozenset(_STATUS)
_CANCEL_TAKEN = _ENDED | {GoalStatus.STATUS_CANCELING}


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
class Delivery:
    """The client's view of one goal's trip; times are ``time.monotonic()`` seconds.

    ``accepted_via`` says how the client learnt the goal was accepted: ``"response"`` (the
    goal response), ``"status"`` (the goal listed in the action status before its response
    came) or ``""`` (never: rejected or not delivered); ``goal_response`` is None when the
    response never came (lost). ``result_requests`` and ``cancel_requests`` above 1 are
    repeats after a reply did not come.
    """

    goal_id: str  # hex UUID, as the result's goal_id and the node's log
    sent: float  # goal request sent
    accepted: float | None
    accepted_via: str
    goal_response: float | None
    first_feedback: float | None
    ended: float | None  # the status first showed the goal ended
    result: float | None  # the result response arrived
    result_requests: int
    cancel_requests: int
    goal_requests: int = 1

    def to_dict(self) -> dict[str, Any]:
        """Plain form for results files: each hop in seconds after the goal was sent."""
        def after(t: float | None) -> float | None:
            return None if t is None else round(t - self.sent, 4)
        return {"goal_id": self.goal_id, "accepted_s": after(self.accepted),
                "accepted_via": self.accepted_via, "goal_response_s": after(self.goal_response),
                "first_feedback_s": after(self.first_feedback), "ended_s": after(self.ended),
                "result_s": after(self.result), "goal_requests": self.goal_requests,
                "result_requests": self.result_requests,
                "cancel_requests": self.cancel_requests}

    def summary(self) -> str:
        """One line: each hop in seconds after the goal was sent, and any repeats."""
        def at(name: str, t: float | None) -> str:
            return f"{name}=+{t - self.sent:.3f}s" if t is not None else f"{name}=-"
        via = f" via={self.accepted_via}" if self.accepted_via else ""
        return (f"goal={self.goal_id[:8]} {at('accepted', self.accepted)}{via} "
                f"{at('goal_response', self.goal_response)} "
                f"{at('first_feedback', self.first_feedback)} {at('ended', self.ended)} "
                f"{at('result', self.result)} goal_requests={self.goal_requests} "
                f"result_requests={self.result_requests} cancel_requests={self.cancel_requests}")


@dataclass(frozen=True)
class ResultBox(Box):
    """A result's box in original-image pixels, with its 3D position.

    ``position_3d`` is the node's ``Position3D`` message: ``valid`` (lifted), ``position`` (a
    ``geometry_msgs/Point``, metres, in ``message.frame_3d``), ``size``, ``depth_pixels``,
    ``status``; ``valid`` is false when the goal had no depth to lift from.
    """

    position_3d: Any = None


@dataclass(frozen=True)
class ResultPoint(Point):
    """A result's point in original-image pixels, with its 3D position (as ``ResultBox``)."""

    position_3d: Any = None


@dataclass(frozen=True)
class ReasonResult:
    """A finished goal: status, error, answer and geometry (original-image pixels)."""

    status: str  # succeeded | aborted | canceled | rejected | not_delivered
    error_code: ErrorCode
    error_message: str
    answer: str
    reasoning: str
    answer_json: str
    boxes: tuple[ResultBox, ...]
    points: tuple[ResultPoint, ...]
    trajectories: tuple[Trajectory, ...]
    message: ReasoningResult  # the full result message
    delivery: Delivery | None = None  # the client's view of the trip; None: never sent

    @property
    def ok(self) -> bool:
        """True when the goal succeeded."""
        return self.status == "succeeded" and self.error_code is ErrorCode.OK

    @classmethod
    def from_message(cls, status: str, msg: ReasoningResult,
                     delivery: Delivery | None = None) -> ReasonResult:
        """Convert a ``ReasoningResult`` message."""
        def point(p: Any) -> ResultPoint:
            return ResultPoint(p.x, p.y, p.label, p.camera, p.position_3d)
        try:
            code = ErrorCode(msg.error_code)
        except ValueError:
            code = ErrorCode.ENGINE_ERROR
        return cls(
            status=status, error_code=code, error_message=msg.error_message,
            answer=msg.answer, reasoning=msg.reasoning, answer_json=msg.answer_json,
            boxes=tuple(ResultBox(b.x_min, b.y_min, b.x_max, b.y_max, b.label,
                                  None if b.score != b.score else b.score, b.degenerate,
                                  b.camera, b.position_3d)
                        for b in msg.boxes),
            points=tuple(point(p) for p in msg.points),
            trajectories=tuple(Trajectory(tuple(point(p) for p in t.points), t.label,
                                          t.camera) for t in msg.trajectories),
            message=msg, delivery=delivery)

    @property
    def cameras(self) -> tuple[str, ...]:
        """The cameras whose frames the answer is about, in prompt order.

        Each box, point and trajectory names its camera (``Box.camera``); the frame of each
        camera (header, sizes) is in ``message.camera_frames``.
        """
        return tuple(f.camera for f in self.message.camera_frames)


def status_name(node_path: str) -> str:
    """Return the node's ``/diagnostics`` status name, for the node at ``node_path``.

    The namespace is in it (as diagnostic_updater's ``use_fqn``): robots in their own
    namespaces publish on one ``/diagnostics``, and only the namespace tells them apart.
    """
    return f"{node_path}: visual reasoning"


def _settle(future: concurrent.futures.Future[ReasonResult], result: ReasonResult | None = None,
            error: BaseException | None = None) -> None:
    """Complete ``future`` unless something completed it first (e.g. a cancel before sending)."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]
    except concurrent.futures.InvalidStateError:
        pass  # already done: the first outcome stands


class GoalHandle:
    """A submitted goal: wait for its result, or cancel it."""

    def __init__(self, future: concurrent.futures.Future[ReasonResult],
                 send_cancel: Callable[[GoalHandle], None]) -> None:
        """Wrap the result future (created by ``ReasonClient.submit``).

        ``send_cancel(handle)`` has the client's spin thread cancel the goal once sent.
        """
        self.future = future
        self._send_cancel = send_cancel
        self._flight: _Flight | None = None  # set by the spin thread when the goal is sent
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

    def cancel(self) -> None:
        """Ask the node to cancel (the result then has status 'canceled')."""
        with self._lock:
            self._cancel_requested = True
            sent = self._sent
            if not sent and not self.future.done():
                # Still waiting for the server: the goal will never be sent.
                msg = ReasoningResult(error_code=ErrorCode.CANCELLED.value,
                                      error_message="cancelled before the action server was "
                                      "available; the goal was never sent")
                self.future.set_result(ReasonResult.from_message("canceled", msg))
        if sent:
            self._send_cancel(self)

    def result(self, timeout_s: float | None = None) -> ReasonResult:
        """Block until the goal ends; ``TimeoutError`` after ``timeout_s`` (goal continues)."""
        return self.future.result(timeout=timeout_s)

    def delivery(self) -> Delivery | None:
        """Return the client's view of the goal's trip so far (None: not sent yet).

        For a goal still without a result it tells which hop the goal is waiting for.
        """
        flight = self._flight
        return None if flight is None else flight.delivery()


@dataclass(frozen=True)
class _WaitingGoal:
    """A submitted goal not sent yet: it waits for the action server to be discovered."""

    handle: GoalHandle
    send: Callable[[], None]
    submitted: float  # time.monotonic()
    deadline: float | None  # None: wait as long as it takes
    timeout_s: float | None


@dataclass(eq=False)
class _Flight:
    """A sent goal as the spin thread follows it (only that thread reads or writes it)."""

    handle: GoalHandle
    goal_id: UUID
    sent: float
    resend_first_s: float
    goal: Any = None  # the goal message, sent again (same id) while no reply shows it arrived
    on_feedback: Callable[[Any], None] | None = None
    goal_requests: int = 0
    next_goal_request: float | None = None
    goal_interval: float = 0.0
    refused: bool = False  # a repeated request was rejected: a duplicate, or a real refusal
    goal_future: Any = None  # rclpy Future of the first goal response
    ros_handle: ClientGoalHandle | None = None  # from the goal response, or made for status
    accepted: float | None = None
    accepted_via: str = ""
    goal_response: float | None = None
    first_feedback: float | None = None
    status: int = GoalStatus.STATUS_UNKNOWN  # the newest status seen
    ended: float | None = None  # the status first showed the goal ended
    result: float | None = None
    result_requests: int = 0
    next_result_request: float | None = None  # set once ended: ask again then
    result_interval: float = 0.0
    cancel_wanted: bool = False
    cancel_requests: int = 0
    cancel_started: float | None = None
    cancel_settled: bool = False  # a cancel response came, or the status shows it taken
    next_cancel: float | None = None
    cancel_interval: float = 0.0
    # How long this client's own spin thread was held (not turning: its process frozen or
    # starved) while the goal was in flight: no reply could be taken meanwhile, so each
    # delivery timeout waits that much longer. A rehearsal's client, held 30 s or more by the
    # machine, woke past its deadlines and ended goals not delivered whose replies were there.
    held_s: float = 0.0
    done: bool = False

    @property
    def key(self) -> bytes:
        """The goal id as the status message's ``bytes(goal_id.uuid)``."""
        return bytes(self.goal_id.uuid)

    def delivery(self) -> Delivery:
        """Return a frozen snapshot for the result."""
        return Delivery(goal_id=self.key.hex(), sent=self.sent, accepted=self.accepted,
                        accepted_via=self.accepted_via, goal_response=self.goal_response,
                        first_feedback=self.first_feedback,
                        ended=self.ended, result=self.result,
                        result_requests=self.result_requests,
                        cancel_requests=self.cancel_requests, goal_requests=self.goal_requests)


def _taken_status(taken_data: Any) -> GoalStatusArray | None:
    """Return the status message in what ``ActionClient.take_data()`` took, if any.

    The one private detail the client reads: rclpy has no public hook for the status topic
    its ActionClient already subscribes to, and ``take_data()`` has returned a dict with the
    status message under ``"status"`` from Humble to Kilted. Should that change, no status
    is observed and goals fall back to their responses alone (the status-path tests fail).
    """
    if isinstance(taken_data, dict):
        status = taken_data.get("status")
        if isinstance(status, GoalStatusArray):
            return status
    return None


class _StatusWatchingActionClient(ActionClient):
    """rclpy's ``ActionClient`` that also hands every status message to ``status_observer``.

    A second subscription to ``<action>/_action/status`` would do with public API only, but
    every status message lists each goal the node still keeps, and decoding it in Python
    costs ~16 ms per 1 000 goals (docs/INTERFACES.md): the client would pay that twice.
    """

    # Called with each status message on the executor's thread; set after construction.
    status_observer: Callable[[GoalStatusArray], None] | None = None

    async def execute(self, taken_data: Any) -> None:
        """Let rclpy handle the taken data (responses first), then show the status."""
        done = super().execute(taken_data)
        if inspect.isawaitable(done):
            await done
        status = _taken_status(taken_data)
        if status is not None and self.status_observer is not None:
            self.status_observer(status)


class ReasonClient:
    """Action client for ``~/reason`` with typed helpers for the common tasks."""

    def __init__(self, action_name: str = DEFAULT_ACTION, context: Any = None,
                 node_name: str = "cosmos_reason_client",
                 delivery_timeout_s: float = DEFAULT_DELIVERY_TIMEOUT_S) -> None:
        """Create a private node in ``context`` and spin it.

        ``context=None`` (the default) gives the client a context of its own, and so its own
        DDS participant. Sharing one with a publisher of camera frames in the same process
        delayed about 1 % of goals by 0.3-3 s: a request lost behind the frames is repaired
        only at the next Fast DDS heartbeat (every 3 s). See docs/PERFORMANCE.md.

        ``delivery_timeout_s`` bounds each reply the client waits for in transport: a sent
        goal with no goal response and no place in the action status, or an ended goal (by
        the status) whose result does not come despite repeated requests, ends
        ``not_delivered`` that long after it was sent or ended; so does an accepted goal with
        a time limit of its own (``timeout_s``) whose end never shows, that long after the
        limit.
        """
        if not delivery_timeout_s > 0:
            raise ValueError(f"delivery_timeout_s={delivery_timeout_s!r}: expected seconds > 0")
        self.action_name = action_name
        self.delivery_timeout_s = float(delivery_timeout_s)
        self._status_topic = f"{action_name}/_action/status"
        self._own_context: Context | None = None
        if context is None:
            context = self._own_context = Context()
            rclpy.init(context=context)
        self.node: Node = rclpy.create_node(node_name, context=context)
        # Deep request and feedback queues, like the node's: the default (10) drops bursts of
        # goals, and a goal's one-off feedback stages behind other goals' token feedback.
        requests_qos = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=256,
                                  reliability=ReliabilityPolicy.RELIABLE)
        self._client = _StatusWatchingActionClient(
            self.node, Reason, action_name, goal_service_qos_profile=requests_qos,
            result_service_qos_profile=requests_qos, cancel_service_qos_profile=requests_qos,
            feedback_sub_qos_profile=requests_qos)
        self._client.status_observer = self._on_status
        self._executor = SingleThreadedExecutor(context=self.node.context)
        self._executor.add_node(self.node)
        # Goals waiting for the server; filled by submit(), sent or expired by the spin thread.
        self._waiting: list[_WaitingGoal] = []
        self._waiting_lock = threading.Lock()
        self._warned_waiting = False
        # Goals to cancel, sent by the spin thread in one go (also under _waiting_lock).
        self._cancels: list[GoalHandle] = []
        # Sent goals not ended yet, by goal id (spin thread only).
        self._flights: dict[bytes, _Flight] = {}
        self._next_check = 0.0
        self._last_look = time.monotonic()  # the spin thread's last look at the clock
        self._running = True
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        while self._running and self.node.context.ok():
            self._note_hold(time.monotonic())
            with self._waiting_lock:
                waiting = bool(self._waiting)
            try:
                # Discovery wakes no executor: poll briefly while a goal waits for the server.
                self._executor.spin_once(timeout_sec=_WAITING_POLL_S if waiting else 0.1)
            except Exception as e:  # noqa: BLE001 - the spin thread must outlive any callback
                if not self._running or not self.node.context.ok():
                    break  # shut down under us: stop spinning
                # A dead spin thread would leave every goal of this client waiting silently.
                self.node.get_logger().error(f"spin thread: {e!r}; the client goes on",
                                             throttle_duration_sec=5.0)
            if waiting:
                self._send_waiting()
            if self._flights:
                now = time.monotonic()
                if now >= self._next_check:
                    self._next_check = now + _CHECK_PERIOD_S
                    self._note_hold(now)
                    self._check_flights(now)

    def _note_hold(self, now: float) -> None:
        """Credit the goals in flight with the time since the last look, if the client was held.

        Looks come at each turn of the spin thread and before each deadline check: a turn
        takes at most 0.1 s unless the process was frozen or starved.
        """
        if now - self._last_look > _HELD_S:
            for flight in self._flights.values():
                flight.held_s += now - self._last_look
        self._last_look = now

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

    # --- one goal's trip (all on the spin thread) -------------------------------------------

    def _send_goal(self, handle: GoalHandle, goal: Reason.Goal,
                   on_feedback: Callable[[Reason.Feedback], None] | None) -> None:
        """Send the goal request with an id of the client's own, and follow the goal."""
        flight = _Flight(handle, UUID(uuid=list(uuid.uuid4().bytes)), time.monotonic(),
                         resend_first_s=min(RESEND_FIRST_S, self.delivery_timeout_s / 4))
        handle._flight = flight
        self._flights[flight.key] = flight

        def feedback(msg: Any) -> None:
            if flight.first_feedback is None:
                flight.first_feedback = time.monotonic()
            if on_feedback is not None:
                try:
                    on_feedback(msg.feedback)
                except Exception as e:  # noqa: BLE001 - the caller's bug must not end the goal
                    self.node.get_logger().error(
                        f"goal {flight.key.hex()[:8]}: feedback callback raised {e!r}; the goal "
                        "goes on", throttle_duration_sec=5.0)

        flight.goal, flight.on_feedback = goal, feedback
        flight.goal_interval = flight.resend_first_s
        self._send_goal_request(flight)

    def _send_goal_request(self, flight: _Flight) -> None:
        """Send (or send again) the goal request, always with the flight's own goal id.

        The id is chosen by the client, not by rclpy, so the status can be matched to the goal
        even when its goal response never comes, and a repeat is the same goal: a node that
        got the first request answers a repeat "rejected" (rclpy refuses a known goal id), and
        the goal shows in its status. A request can be lost when the node's request reader
        has not yet matched this client's writer although the client already sees the node.
        """
        first = flight.goal_requests == 0
        flight.goal_requests += 1
        flight.next_goal_request = time.monotonic() + flight.goal_interval
        flight.goal_interval = min(2 * flight.goal_interval, _RESEND_MAX_S)
        future = self._client.send_goal_async(flight.goal, feedback_callback=flight.on_feedback,
                                              goal_uuid=flight.goal_id)
        future.add_done_callback(lambda f: self._on_goal_response(flight, f, first))
        if first:
            flight.goal_future = future

    def _on_goal_response(self, flight: _Flight, ros_future: Any, first: bool = True) -> None:
        if flight.done:
            return
        if flight.goal_response is None:
            flight.goal_response = time.monotonic()
        if flight.accepted is not None:
            return  # accepted from the status, which came first (another DDS reader)
        ros_handle = self._reply(flight, ros_future)
        if ros_handle is None:
            return
        if not ros_handle.accepted and not first:
            # A repeat's rejection: the node refused the goal, or already has it (the status
            # then lists it). The status decides, by the delivery deadline.
            flight.refused = True
            return
        if not ros_handle.accepted:
            # The node rejects only when its goal bounds are full, it is stopping, or (a
            # managed node) it is not active; the node's ~/results message says which.
            self._end_by_client(flight, "rejected", ErrorCode.OVERLOADED,
                                "goal rejected by the node: too many goals running and queued "
                                "(limits.max_concurrent_goals + limits.max_queued_goals), "
                                "shutting down, or a managed node not active (see its "
                                "~/results)")
            return
        self._accept(flight, ros_handle, "response")

    def _on_status(self, msg: GoalStatusArray) -> None:
        """Status of the action's goals (spin thread): follow those of this client."""
        if not self._flights:
            return
        now = time.monotonic()
        for entry in msg.status_list:
            flight = self._flights.get(bytes(entry.goal_info.goal_id.uuid))
            if flight is not None and entry.status != GoalStatus.STATUS_UNKNOWN:
                self._on_goal_status(flight, entry.status, now)

    def _on_goal_status(self, flight: _Flight, status: int, now: float) -> None:
        flight.status = status
        if flight.accepted is None and flight.goal_future is not None \
                and flight.goal_future.done():
            # The response came in the same executor pass: its callback is queued behind
            # this status; take the response now so the goal counts as accepted by it.
            self._on_goal_response(flight, flight.goal_future)
        if flight.done:
            return
        if flight.accepted is None:
            # Listed in the status, so the node accepted it. Its response may still come (the
            # status is another DDS reader, often first) or be lost: either way the result
            # request can go now.
            response = Reason.Impl.SendGoalService.Response(accepted=True)
            self._accept(flight, ClientGoalHandle(self._client, flight.goal_id, response),
                         "status")
        if status in _ENDED and flight.ended is None:
            flight.ended = now
            flight.result_interval = flight.resend_first_s
            flight.next_result_request = now + flight.result_interval
        if flight.cancel_wanted and status in _CANCEL_TAKEN:
            flight.cancel_settled = True

    def _accept(self, flight: _Flight, ros_handle: ClientGoalHandle, via: str) -> None:
        flight.accepted, flight.accepted_via = time.monotonic(), via
        flight.next_goal_request = None
        flight.ros_handle = ros_handle
        if flight.ended is None:
            # Should the status never show this goal (its reader not matched), the result is
            # still asked for again now and then: a request is idempotent at the node.
            flight.result_interval = _RESEND_MAX_S
            flight.next_result_request = flight.accepted + self.delivery_timeout_s
        self._request_result(flight)
        if flight.cancel_wanted:
            self._send_cancel_request(flight)

    def _request_result(self, flight: _Flight) -> None:
        """Ask for the result (idempotent at the node: a repeat gets the same result)."""
        assert flight.ros_handle is not None
        flight.result_requests += 1
        flight.ros_handle.get_result_async().add_done_callback(
            lambda f: self._on_result_response(flight, f))

    def _on_result_response(self, flight: _Flight, ros_future: Any) -> None:
        if flight.done:
            return  # a repeated request's answer after the first one
        response = self._reply(flight, ros_future)
        if response is None:
            return
        if response.status == GoalStatus.STATUS_UNKNOWN and flight.ended is not None:
            # The node no longer knows the goal: it expired the result before a repeated
            # request reached it (limits.result_keep_s).
            self._not_delivered(flight, f"result response not delivered: the goal ended in "
                                f"{self._status_topic} but its result had expired at the node "
                                f"(limits.result_keep_s) when result request "
                                f"{flight.result_requests} reached it")
            return
        flight.result = time.monotonic()
        status = _STATUS.get(response.status, f"status_{response.status}")
        self._end(flight, ReasonResult.from_message(status, response.result.result,
                                                    flight.delivery()))

    def _check_flights(self, now: float) -> None:
        """Deadlines of goals in flight (spin thread): repeat requests, or give up."""
        timeout = self.delivery_timeout_s
        for flight in list(self._flights.values()):
            wait = timeout + flight.held_s
            if flight.accepted is None:
                if now >= flight.sent + wait and flight.refused:
                    self._end_by_client(
                        flight, "rejected", ErrorCode.OVERLOADED,
                        f"goal rejected by the node (its first goal response was lost; a "
                        f"repeated request was rejected and the goal never appeared in "
                        f"{self._status_topic}): see the node's ~/results for why")
                elif now >= flight.sent + wait:
                    self._not_delivered(
                        flight, f"goal request not delivered: no goal response and the goal id "
                        f"never appeared in {self._status_topic} within {timeout:.1f} s "
                        f"({flight.goal_requests} goal requests)")
                    self._cancel_lost_goal(flight)
                elif flight.next_goal_request is not None and now >= flight.next_goal_request:
                    self.node.get_logger().info(
                        f"goal {flight.key.hex()[:8]}: no goal response and not in "
                        f"{self._status_topic} {now - flight.sent:.2f} s after it was sent: "
                        f"goal request {flight.goal_requests + 1}")
                    self._send_goal_request(flight)
                continue
            # An accepted goal with a time limit of its own: the node has ended it by then, so
            # an end that never showed was lost in transport.
            if flight.ended is None and flight.goal.timeout_s > 0 \
                    and now >= flight.accepted + flight.goal.timeout_s + wait:
                self._not_delivered(
                    flight, f"result not delivered: the goal was accepted "
                    f"{now - flight.accepted:.1f} s ago and its time limit (timeout_s="
                    f"{flight.goal.timeout_s:g}) has passed, but neither its end in "
                    f"{self._status_topic} nor a result response came "
                    f"({flight.result_requests} result requests)")
                continue
            if flight.next_result_request is not None and now >= flight.next_result_request \
                    and flight.ended is None:
                # Accepted, not ended by the status (or no status seen): ask again, slowly.
                self._request_result(flight)
                flight.next_result_request = now + flight.result_interval
            elif flight.next_result_request is not None and now >= flight.next_result_request:
                assert flight.ended is not None
                if now >= flight.ended + wait:
                    self._not_delivered(
                        flight, f"result response not delivered: the goal ended "
                        f"({_STATUS.get(flight.status, flight.status)} in "
                        f"{self._status_topic}) {now - flight.ended:.1f} s ago and no result "
                        f"response came after {flight.result_requests} result requests")
                    continue
                self.node.get_logger().info(
                    f"goal {flight.key.hex()[:8]} ended {now - flight.ended:.2f} s ago without "
                    f"a result response: result request {flight.result_requests + 1}")
                self._request_result(flight)
                flight.result_interval = min(2 * flight.result_interval, _RESEND_MAX_S)
                flight.next_result_request = min(now + flight.result_interval,
                                                 flight.ended + wait)
            if flight.next_cancel is not None and now >= flight.next_cancel:
                if flight.cancel_settled:
                    flight.next_cancel = None
                elif flight.cancel_started is not None \
                        and now >= flight.cancel_started + wait:
                    flight.next_cancel = None  # the goal goes on to its own end or time limit
                    self.node.get_logger().warning(
                        f"goal {flight.key.hex()[:8]}: cancel not taken after "
                        f"{flight.cancel_requests} requests in {timeout:.1f} s (no cancel "
                        f"response, and {self._status_topic} shows the goal "
                        f"status={flight.status}); the goal runs to its end")
                else:
                    self._send_cancel_request(flight)

    def _not_delivered(self, flight: _Flight, message: str) -> None:
        self.node.get_logger().warning(f"goal {flight.key.hex()[:8]}: {message}")
        self._end_by_client(flight, "not_delivered", ErrorCode.NOT_DELIVERED, message)

    def _end_by_client(self, flight: _Flight, status: str, code: ErrorCode,
                       message: str) -> None:
        """End the goal with a result the client makes (no result message came from the node)."""
        msg = ReasoningResult(goal_id=flight.key.hex(), error_code=code.value,
                              error_message=message)
        self._end(flight, ReasonResult.from_message(status, msg, flight.delivery()))

    def _reply(self, flight: _Flight, ros_future: Any) -> Any:
        """Return a goal or result reply; a transport error ends the goal with it (None)."""
        try:
            return ros_future.result()
        except Exception as e:  # noqa: BLE001 - surface transport errors to the caller
            self._end(flight, error=e)
            return None

    def _cancel_lost_goal(self, flight: _Flight) -> None:
        # A goal request delayed rather than lost would run with nobody waiting for it: one
        # cancel for its id (a node that never got it answers "unknown goal", harmlessly).
        response = Reason.Impl.SendGoalService.Response(accepted=True)
        ClientGoalHandle(self._client, flight.goal_id, response).cancel_goal_async()

    def _end(self, flight: _Flight, result: ReasonResult | None = None,
             error: BaseException | None = None) -> None:
        flight.done = True
        self._flights.pop(flight.key, None)
        _settle(flight.handle.future, result, error)

    # --- cancels ------------------------------------------------------------------------------

    def _queue_cancel(self, handle: GoalHandle) -> None:
        """Have the spin thread send a cancel request for the goal of ``handle``.

        Sent from the caller's thread, each request waited for the GIL against the spin
        thread decoding feedback and status: 50 cancels in a loop took up to 2 s under CPU
        load (docs/RELIABILITY.md, "Mass cancel"). Queued, a burst goes out in one wake-up.
        """
        with self._waiting_lock:
            self._cancels.append(handle)
        self._executor.create_task(self._send_cancels)

    def _send_cancels(self) -> None:
        with self._waiting_lock:
            cancels, self._cancels = self._cancels, []
        for handle in cancels:
            flight = handle._flight
            if flight is None or flight.done or flight.cancel_wanted:
                continue
            flight.cancel_wanted = True
            if flight.ros_handle is not None:
                self._send_cancel_request(flight)
            # else: sent once the goal is accepted (by its response or the status)

    def _send_cancel_request(self, flight: _Flight) -> None:
        """Send a cancel; repeated (backing off) until the node answers or the status shows it.

        A cancel response is a service response, lost like the others under discovery lag.
        """
        assert flight.ros_handle is not None
        now = time.monotonic()
        if flight.cancel_started is None:
            flight.cancel_started = now
            flight.cancel_interval = flight.resend_first_s
        else:
            flight.cancel_interval = min(2 * flight.cancel_interval, _RESEND_MAX_S)
        flight.next_cancel = now + flight.cancel_interval
        flight.cancel_requests += 1
        flight.ros_handle.cancel_goal_async().add_done_callback(
            lambda f: self._on_cancel_response(flight))

    @staticmethod
    def _on_cancel_response(flight: _Flight) -> None:
        flight.cancel_settled = True  # the node got the cancel, whatever it answered

    def close(self) -> None:
        """Stop the spin thread and destroy the private node.

        Goals still waiting for the server, and sent goals still without a result, fail with
        ``RuntimeError``: nothing is left to deliver their results.
        """
        self._running = False
        self._executor.create_task(lambda: None)  # wake spin_once now, not after its 0.1 s
        self._thread.join(timeout=2.0)
        self._send_cancels()  # cancels asked for just before closing still go out
        with self._waiting_lock:
            waiting, self._waiting = self._waiting, []
        for entry in waiting:
            entry.handle._fail_unsent(RuntimeError(
                f"ReasonClient closed while the goal waited for {self.action_name}"))
        for flight in list(self._flights.values()):
            self._end(flight, error=RuntimeError(
                f"ReasonClient closed before the goal's result came from {self.action_name}"))
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
        """Wait until the node's action server is up.

        Looks every 10 ms: rclpy's own ``wait_for_server`` sleeps 0.25 s between looks, so a
        client started beside the node waited a quarter second longer than discovery took.
        """
        deadline = time.monotonic() + timeout_s
        while not self._client.server_is_ready():
            if time.monotonic() >= deadline or not self.node.context.ok():
                return False
            time.sleep(_WAITING_POLL_S)
        return True

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
        feedback (``FEEDBACK_NONE``, unless ``goal.feedback`` asks for some). A goal whose
        replies are lost in transport ends ``not_delivered`` (see the module docstring).
        """
        if on_feedback is None and goal.feedback == Reason.Goal.FEEDBACK_ALL:
            # Nobody reads it: the result alone (every client decodes every goal's feedback).
            goal = copy.copy(goal)
            goal.feedback = Reason.Goal.FEEDBACK_NONE
        future: concurrent.futures.Future[ReasonResult] = concurrent.futures.Future()
        handle = GoalHandle(future, self._queue_cancel)

        def send() -> None:  # runs on the spin thread (see the module docstring)
            self._send_goal(handle, goal, on_feedback)

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
