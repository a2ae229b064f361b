"""The console's ROS side: the node's topics in, goals out through ``ReasonClient``.

One small node (``cosmos_reason_console``) on a context of its own, spun by one thread of its
own, subscribes to what a pane shows and the page lists:

- per camera, the camera stream (``sensor_msgs/Image`` and ``<topic>/compressed``) and the
  node's ``<node>/annotated_image`` (``<node>/<camera>/annotated_image`` for named cameras),
  kept serialized (``raw=True``) in ``frames.CameraFrames``. Keep-last 2, so a camera never
  waits for the console; reliability as the node's own camera subscription
  (``image.qos_reliability``; its ``auto`` follows the camera's publishers, best effort while
  none is known) unless ``camera_reliability`` says otherwise -- a reliable
  reader does not match a best-effort driver, and a best-effort one loses most large raw
  frames between processes (measured here: 0.17 of 15 frames/s at 640x480 rgb8 best effort,
  15 of 15 reliable); the annotated image (the node's publisher is reliable) reliably;
- ``<node>/results`` (every answer, goal-driven or periodic) and ``/diagnostics``;
- the node's ``cameras.names``, ``limits.max_prompt_chars`` and ``image.qos_reliability``,
  asked once from its parameter service (the node may come up after the console: asked again
  every second until answered).

Goals go through the package's ``ReasonClient`` (its own context and spin thread, as for any
planner). Callbacks here only store bytes or hand the message to ``ConsoleEvents``; the
console's web side does everything else on its own thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from rcl_interfaces.srv import GetParameters
from rclpy.context import Context
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.parameter import parameter_value_to_python
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.signals import SignalHandlerOptions
from sensor_msgs.msg import CompressedImage, Image

from cosmos_reason_interfaces.action import Reason
from cosmos_reason_interfaces.msg import ReasoningResult
from cosmos_reason_ros.client import GoalHandle, ReasonClient, status_name
from cosmos_reason_ros.console.frames import CameraFrames
from cosmos_reason_ros.core.cameras import DEFAULT_CAMERA
from cosmos_reason_ros.qos import (
    keep_last,
    on_best_effort_publisher,
    publishers_qos,
    resubscribe_best_effort,
)

CONSOLE_NODE_NAME = "cosmos_reason_console"
NODE_PARAMETERS = ("cameras.names", "limits.max_prompt_chars", "image.qos_reliability")
PARAMETER_POLL_S = 1.0
RELIABILITY = {"best_effort": ReliabilityPolicy.BEST_EFFORT,
               "reliable": ReliabilityPolicy.RELIABLE}
# auto: as the node's image.qos_reliability (its own auto: follow the camera's publishers)
CAMERA_RELIABILITY_CHOICES = ("auto", *RELIABILITY)
ANNOTATED_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=2,
                           reliability=ReliabilityPolicy.RELIABLE)
# ~/results: reliable like the node's writer, so no answer is missed; keep-last, so a console
# that falls behind never holds the node's writer back.
RESULTS_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=50,
                         reliability=ReliabilityPolicy.RELIABLE)


class ConsoleEvents(Protocol):
    """What the bridge reports; called on the bridge's spin thread (must not block)."""

    def on_result(self, msg: ReasoningResult) -> None:
        """Take a ``~/results`` message."""

    def on_status(self, status: dict[str, Any]) -> None:
        """Take the node's ``/diagnostics`` status: ``level``, ``message``, ``values``."""

    def on_node_parameters(self, cameras: list[str], max_prompt_chars: int | None) -> None:
        """Take the node's parameters, once read (``cameras`` are the panes now)."""

    def on_annotated(self, camera: str) -> None:
        """Note an annotated image of ``camera`` (an answer's frame may be waiting for it)."""


@dataclass(frozen=True)
class CameraTopics:
    """One pane: the camera's name and the topics its pictures come from."""

    name: str
    stream_topic: str  # Image topic, or a CompressedImage topic ending in /compressed
    annotated_topic: str


def split_node_path(node: str) -> tuple[str, str]:
    """Split a node's path: ``/robot1/cosmos_reason`` -> (``/robot1``, ``cosmos_reason``)."""
    path = "/" + node.strip("/")
    namespace, _, name = path.rpartition("/")
    return namespace or "/", name


def camera_topics(node: str, cameras: Sequence[tuple[str, str]], image_topic: str = ""
                  ) -> list[CameraTopics]:
    """Return the panes for the node at ``node`` and its ``cameras`` as (name, topic or "").

    No cameras: the node's default camera, on ``image_topic`` or the node's own ``image``
    (``<namespace>/image``). A named camera without a topic: the node's ``<name>/image``.
    """
    namespace, _ = split_node_path(node)
    node = "/" + node.strip("/")
    prefix = "" if namespace == "/" else namespace
    if not cameras:
        return [CameraTopics(DEFAULT_CAMERA, image_topic or f"{prefix}/image",
                             f"{node}/annotated_image")]
    return [CameraTopics(name, topic or f"{prefix}/{name}/image",
                         f"{node}/{name}/annotated_image") for name, topic in cameras]


class ConsoleBridge:
    """The console's node, subscriptions, parameter query and ``ReasonClient``."""

    def __init__(self, node: str, events: ConsoleEvents, *,
                 cameras: Sequence[tuple[str, str]] = (), image_topic: str = "",
                 camera_reliability: str = "auto", history_frames: int = 150,
                 history_bytes: int = 64 << 20, ros_args: Sequence[str] | None = None) -> None:
        """Subscribe for the node at path ``node`` (e.g. ``/cosmos_reason``) and start spinning.

        ``cameras`` given (name, topic or "") fixes the panes; empty = ask the node for its
        ``cameras.names``. ``camera_reliability``: best_effort, reliable, or auto (the node's
        ``image.qos_reliability``; best effort until it is known). Each camera keeps
        ``history_frames`` frames, ``history_bytes`` at most, for drawing answers on their
        own frame.
        """
        if camera_reliability not in CAMERA_RELIABILITY_CHOICES:
            raise ValueError(f"camera_reliability={camera_reliability!r}: one of "
                             f"{', '.join(CAMERA_RELIABILITY_CHOICES)}")
        self.node_path = "/" + node.strip("/")
        self.events = events
        self._cameras_fixed = bool(cameras)
        # Neither cameras nor a topic given: show the topics the node itself takes (its status
        # names them resolved, so a remapped camera is found too).
        self._follow_node_topics = not cameras and not image_topic
        self._follow_node_reliability = camera_reliability == "auto"
        self._reliability = "best_effort" if camera_reliability == "auto" else camera_reliability
        self._history = (history_frames, history_bytes)
        self.context = Context()
        # The console's main loop handles SIGINT/SIGTERM itself (an orderly close).
        rclpy.init(args=list(ros_args) if ros_args else None, context=self.context,
                   signal_handler_options=SignalHandlerOptions.NO)
        self.node = rclpy.create_node(CONSOLE_NODE_NAME, context=self.context)
        self.cameras: dict[str, CameraFrames] = {}
        self.topics: list[CameraTopics] = []
        self._camera_subscriptions: list[Any] = []
        self._lock = threading.Lock()
        self._subscribe_cameras(camera_topics(self.node_path, cameras, image_topic))
        self.node.create_subscription(ReasoningResult, f"{self.node_path}/results",
                                      events.on_result, RESULTS_QOS)
        self._status_name = status_name(self.node_path)
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, 10)
        self._parameters = self.node.create_client(GetParameters,
                                                   f"{self.node_path}/get_parameters")
        self._parameters_pending: Any = None
        self._parameters_timer = self.node.create_timer(PARAMETER_POLL_S, self._ask_parameters)
        self.client = ReasonClient(f"{self.node_path}/reason",
                                   node_name=f"{CONSOLE_NODE_NAME}_goals")
        self._executor = SingleThreadedExecutor(context=self.context)
        self._executor.add_node(self.node)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._spin, name="console-ros", daemon=True)
        self._thread.start()

    # --- cameras ---------------------------------------------------------------------------

    def _subscribe_cameras(self, topics: list[CameraTopics]) -> None:
        """Subscribe to each pane's stream and annotated image (replacing earlier panes)."""
        with self._lock:
            old, self._camera_subscriptions = self._camera_subscriptions, []
        for subscription in old:
            self.node.destroy_subscription(subscription)
        with self._lock:  # a camera that stays keeps its frames (only its QoS changed)
            cameras = {t.name: self.cameras.get(t.name) or CameraFrames(t.name, *self._history)
                       for t in topics}
        subscriptions = []
        for t in topics:
            frames = cameras[t.name]
            if t.stream_topic.endswith("/compressed"):
                streams = [(CompressedImage, t.stream_topic, True)]
            else:
                streams = [(Image, t.stream_topic, False),
                           (CompressedImage, f"{t.stream_topic.rstrip('/')}/compressed", True)]
            for msg_type, topic, compressed in streams:
                subscriptions.append(self._stream_subscription(
                    msg_type, topic, frames, compressed, self._stream_qos(topic)))
            subscriptions.append(self.node.create_subscription(
                Image, t.annotated_topic, _annotated_storer(frames, self.events, t.name),
                ANNOTATED_QOS, raw=True))
        with self._lock:
            self.cameras, self.topics = cameras, topics
            self._camera_subscriptions = subscriptions
        self._reliability_subscribed = self._reliability

    def _stream_subscription(self, msg_type: type, topic: str, frames: CameraFrames,
                             compressed: bool, qos: QoSProfile) -> Any:
        events = None
        if self._reliability == "auto":  # following the camera, as the node's camera does
            events = on_best_effort_publisher(qos, lambda: self._stream_to_best_effort(
                msg_type, topic, frames, compressed))
        return self.node.create_subscription(msg_type, topic, _storer(frames, compressed), qos,
                                             raw=True, event_callbacks=events)

    def _stream_to_best_effort(self, msg_type: type, topic: str, frames: CameraFrames,
                               compressed: bool) -> None:
        """Resubscribe a stream best effort (the node's camera does the same).

        Called when a best-effort camera appeared after the reliable subscription was made.
        """
        with self._lock:
            index = next((i for i, s in enumerate(self._camera_subscriptions)
                          if s.topic_name == topic and s.msg_type is msg_type), None)
            if index is None:  # the panes were subscribed anew meanwhile
                return
            resubscribe_best_effort(self.node, self._camera_subscriptions, index,
                                    lambda qos: self._stream_subscription(
                                        msg_type, topic, frames, compressed, qos))

    def stream_reliabilities(self) -> dict[str, ReliabilityPolicy]:
        """Return each camera subscription's reliability now, by topic."""
        with self._lock:
            return {s.topic_name: s.qos_profile.reliability
                    for s in self._camera_subscriptions}

    def _stream_qos(self, topic: str) -> QoSProfile:
        if self._reliability != "auto":
            return keep_last(2, RELIABILITY[self._reliability])
        # The node follows the camera's publishers: so does the console. With none known yet,
        # best effort, which matches whichever camera comes later.
        return publishers_qos(self.node, topic, 2, when_none=ReliabilityPolicy.BEST_EFFORT)

    def camera(self, name: str) -> CameraFrames | None:
        """Return the frames of pane ``name`` (None when there is no such pane now)."""
        with self._lock:
            return self.cameras.get(name)

    def camera_names(self) -> list[str]:
        """Return the panes' names, in the node's camera order."""
        with self._lock:
            return list(self.cameras)

    # --- the node's parameters ---------------------------------------------------------------

    def _ask_parameters(self) -> None:
        if self._parameters_pending is not None and not self._parameters_pending.done():
            return
        if not self._parameters.service_is_ready():
            return
        self._parameters_pending = self._parameters.call_async(
            GetParameters.Request(names=list(NODE_PARAMETERS)))
        self._parameters_pending.add_done_callback(self._on_parameters)

    def _on_parameters(self, future: Any) -> None:
        response = future.result()
        if response is None or len(response.values) != len(NODE_PARAMETERS):
            return  # asked again at the next poll
        self._parameters_timer.cancel()
        names, max_prompt_chars, reliability = (parameter_value_to_python(v)
                                                for v in response.values)
        names = names if isinstance(names, list) else []
        if not isinstance(max_prompt_chars, int) or isinstance(max_prompt_chars, bool):
            max_prompt_chars = None
        topics = self.topics
        if not self._cameras_fixed and names:
            topics = camera_topics(self.node_path, [(n, "") for n in names])
        if self._follow_node_reliability and reliability in CAMERA_RELIABILITY_CHOICES:
            self._reliability = reliability
        if topics != self.topics or self._reliability != self._reliability_subscribed:
            self._subscribe_cameras(topics)
        self.events.on_node_parameters(self.camera_names(), max_prompt_chars)

    # --- status ------------------------------------------------------------------------------

    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        for status in msg.status:
            if status.name == self._status_name:
                if self._follow_node_topics:
                    self._follow_topics({kv.key: kv.value for kv in status.values})
                self.events.on_status({"level": int.from_bytes(status.level, "little")
                                       if isinstance(status.level, bytes) else int(status.level),
                                       "message": status.message,
                                       "values": {kv.key: kv.value for kv in status.values}})

    def _follow_topics(self, values: dict[str, str]) -> None:
        """Resubscribe a pane whose camera the node takes from another topic (a remap)."""
        topics = self.topics
        followed = [replace(t, stream_topic=values.get(
            f"{t.name}.image_topic", values.get("image_topic", "") if len(topics) == 1 else "")
            or t.stream_topic) for t in topics]
        if followed != topics:
            self._subscribe_cameras(followed)
            self.events.on_node_parameters(self.camera_names(), None)

    # --- goals -------------------------------------------------------------------------------

    def submit(self, goal: Reason.Goal, on_feedback: Callable[[Reason.Feedback], None]
               ) -> GoalHandle:
        """Send a goal through ``ReasonClient`` (it waits, bounded, for the action server)."""
        return self.client.submit(goal, on_feedback)

    # --- life --------------------------------------------------------------------------------

    def _spin(self) -> None:
        while not self._stop.is_set() and self.context.ok():
            try:
                self._executor.spin_once(timeout_sec=0.2)
            except ExternalShutdownException:
                break

    def close(self) -> None:
        """Stop spinning, close the goal client and the node (idempotent)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(5.0)
        if self._parameters_pending is not None:
            self._parameters_pending.cancel()  # unanswered: nobody waits for it any more
        self.client.close()
        self._executor.shutdown(timeout_sec=1.0)
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)


def _storer(frames: CameraFrames, compressed: bool) -> Callable[[bytes], None]:
    return lambda data: frames.store(data, compressed)


def _annotated_storer(frames: CameraFrames, events: ConsoleEvents, camera: str
                      ) -> Callable[[bytes], None]:
    def store(data: bytes) -> None:
        frames.store_annotated(data)
        events.on_annotated(camera)
    return store
