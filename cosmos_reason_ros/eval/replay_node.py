"""Replay through a running node: publish the bag with /clock, send the goals, collect results.

Every recorded message reaches the node or is counted (``_Delivery``); the bag's depth and
CameraInfo topics are waited for before the first goal and reported (``_DepthInputs``).
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cosmos_reason_ros import dds
from cosmos_reason_ros.core.types import CosmosReasonError, ErrorCode
from cosmos_reason_ros.eval import bagio
from cosmos_reason_ros.eval.replay_records import (
    FEEDBACK_STAGES,
    NS,
    SOURCES,
    Recorder,
    ReplayConfig,
    ReplayError,
    error_result,
)
from cosmos_reason_ros.eval.scenario import Scenario, ScheduledQuery

WRITER_DEPTH = 10  # node mode: the replay's publishers keep the last 10 messages (reliable)
ACK_WAIT_S = 2.0  # node mode: longest wait for the node to acknowledge a topic's last message
NEXT_FRAMES = 3  # frames published after a 'next' goal before --rate max waits for it
_LOG = logging.getLogger("replay")


# --- through the node --------------------------------------------------------------------------


def _ros_class(msgtype: str) -> Any:
    pkg, _, name = msgtype.split("/")
    return getattr(importlib.import_module(f"{pkg}.msg"), name)


@dataclass
class _Pending:
    item: ScheduledQuery
    handle: Any
    stage: threading.Event
    frames_needed: int = 0


def run_through_node(cfg: ReplayConfig, scenario: Scenario, schedule: tuple[ScheduledQuery, ...],
                     info: bagio.BagInfo, image_topic: str, recorder: Recorder,
                     tick: Callable[[], None]
                     ) -> tuple[list[dict[str, Any]], dict[str, dict[str, int]]]:
    """Publish the bag (and /clock) to a running node and send the scheduled goals.

    Returns what became of the bag's depth and CameraInfo topics (:class:`_DepthInputs`), and
    per topic the recorded messages not acknowledged in time or not published (none: empty).
    """
    import rclpy
    from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
    from rosgraph_msgs.msg import Clock

    from cosmos_reason_ros.client import ReasonClient

    # Before the first participant: a frame the node has not acknowledged is sent again after
    # 0.1 s, not at Fast DDS's default 3 s heartbeat (deliver() waits for the acknowledgement).
    _LOG.info("%s", dds.use_profile())
    context = rclpy.context.Context()
    rclpy.init(context=context)
    node = rclpy.create_node("cosmos_reason_replay", context=context)
    client = None
    try:
        qos = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=WRITER_DEPTH,
                         reliability=ReliabilityPolicy.RELIABLE)
        publishers: dict[str, Any] = {}
        for topic, msgtype in sorted(info.topics.items()):
            try:
                cls = _ros_class(msgtype)
            except (ImportError, AttributeError, ValueError):
                _LOG.warning("topic %s: message type %s is not installed; not replayed",
                             topic, msgtype)
                continue
            publishers[topic] = node.create_publisher(cls, cfg.remaps.get(topic, topic), qos)
        clock_pub = node.create_publisher(Clock, "/clock", qos)
        # Its own participant: never behind the recorded frames this process publishes.
        client = ReasonClient(f"/{cfg.node_name}/reason",
                              node_name="cosmos_reason_replay_client")
        if not client.wait_for_server(cfg.connect_timeout_s):
            raise ReplayError(f"no action server /{cfg.node_name}/reason within "
                              f"{cfg.connect_timeout_s:g} s: is the node running (with "
                              f"use_sim_time:=true)? set --node-name if it has another name")
        deadline = time.monotonic() + cfg.connect_timeout_s
        for name, topic in (cfg.cameras or {"": image_topic}).items():
            camera = publishers[topic]
            while camera.get_subscription_count() == 0:
                if time.monotonic() > deadline:
                    raise ReplayError(_no_subscriber(camera.topic_name, topic, name,
                                                     info.topics[topic]))
                time.sleep(0.05)  # DDS discovery; bounded above
        inputs = _DepthInputs(cfg, info, publishers)
        if inputs.inputs:
            inputs.wait_subscribed(_node_depth_enabled(node, context, cfg))
        player = _NodePlayer(cfg, schedule, info, image_topic, recorder, tick, client,
                             publishers, clock_pub, Clock, inputs)
        player.play()
        return inputs.report(), player.delivery.report()
    finally:
        if client is not None:
            client.close()
        node.destroy_node()
        rclpy.try_shutdown(context=context)


def _node_depth_enabled(node: Any, context: Any, cfg: ReplayConfig) -> bool | None:
    """Return the node's ``depth.enabled`` (None when its parameter service does not answer)."""
    import rclpy
    from rcl_interfaces.msg import ParameterType
    from rcl_interfaces.srv import GetParameters
    from rclpy.executors import SingleThreadedExecutor

    client = node.create_client(GetParameters, f"/{cfg.node_name}/get_parameters")
    executor = SingleThreadedExecutor(context=context)
    try:
        if not client.wait_for_service(timeout_sec=cfg.depth_inputs_timeout_s):
            return None
        future = client.call_async(GetParameters.Request(names=["depth.enabled"]))
        rclpy.spin_until_future_complete(node, future, executor=executor,
                                         timeout_sec=cfg.depth_inputs_timeout_s)
        values = future.result().values if future.done() and future.result() else []
        if not values or values[0].type != ParameterType.PARAMETER_BOOL:
            return None
        return bool(values[0].bool_value)
    finally:
        executor.shutdown()
        node.destroy_client(client)


class _DepthInputs:
    """The bag's depth and CameraInfo topics on their way to a node with depth on.

    A node subscribes to them as it discovers their publishers (it follows their
    reliability), and a goal lifts with the latest CameraInfo the node has. So the replay
    first waits for the node to subscribe (a sample published before that is lost), then,
    before the first goal, for the node to acknowledge the samples published so far; each
    wait is bounded by ``depth_inputs_timeout_s``, and what happened is reported per topic
    (``summary.json``, the printed summary), so a first goal without CameraInfo is explained
    instead of a random ``LIFT_NO_DEPTH``.
    """

    def __init__(self, cfg: ReplayConfig, info: bagio.BagInfo,
                 publishers: dict[str, Any]) -> None:
        """Find the bag's CameraInfo and depth (16UC1/32FC1) Image topics being replayed."""
        from cosmos_reason_ros.core.rgbd import DEPTH_ENCODINGS

        self.timeout_s = cfg.depth_inputs_timeout_s
        self.inputs: dict[str, dict[str, Any]] = {}
        for topic, msgtype in sorted(info.topics.items()):
            if topic not in publishers:
                continue
            if msgtype == bagio.CAMERA_INFO_TYPE:
                kind = "camera_info"
            elif msgtype == bagio.IMAGE_TYPE and \
                    bagio.image_encoding(info.path, topic).upper() in DEPTH_ENCODINGS:
                kind = "depth"
            else:
                continue
            self.inputs[topic] = {"topic": topic, "kind": kind,
                                  "published_as": publishers[topic].topic_name,
                                  "subscribed": False, "published": 0, "acknowledged": False,
                                  "status": "not checked"}
        self.publishers = {t: publishers[t] for t in self.inputs}
        self._first_goal_done = False

    def wait_subscribed(self, depth_enabled: bool | None) -> None:
        """Wait (bounded) until the node subscribes to each topic; skipped with depth off."""
        if depth_enabled is False:
            for item in self.inputs.values():
                item["status"] = "the node has depth.enabled false: not waited for"
            return
        deadline = time.monotonic() + self.timeout_s
        waiting = set(self.inputs)
        while waiting:
            waiting = {t for t in waiting if self.publishers[t].get_subscription_count() == 0}
            if not waiting or time.monotonic() > deadline:
                break
            time.sleep(0.05)  # DDS discovery; bounded above
        for topic, item in self.inputs.items():
            item["subscribed"] = topic not in waiting
            item["status"] = "subscribed by the node"
            if topic in waiting:
                own = "camera_info" if item["kind"] == "camera_info" else "depth/image"
                item["status"] = (f"nobody subscribed to {item['published_as']} within "
                                  f"{self.timeout_s:g} s: remap the node's {own} to it "
                                  "(goals may lift nothing: LIFT_NO_DEPTH)")
                _LOG.warning("%s", item["status"])
        self._first_goal_done = depth_enabled is False

    def published(self, topic: str) -> None:
        """Count a message published on ``topic`` (any topic may be passed)."""
        item = self.inputs.get(topic)
        if item is not None:
            item["published"] += 1

    def before_first_goal(self) -> None:
        """Wait (bounded) for the node to acknowledge what each subscribed topic published."""
        if self._first_goal_done:
            return
        self._first_goal_done = True
        from rclpy.duration import Duration

        for topic, item in self.inputs.items():
            if not item["subscribed"]:
                continue
            if item["published"] == 0:
                item["status"] = (f"nothing published on {topic} before the first goal (the "
                                  "bag has none that early)")
                _LOG.warning("%s", item["status"])
                continue
            item["acknowledged"] = bool(self.publishers[topic].wait_for_all_acked(
                Duration(seconds=self.timeout_s)))
            item["status"] = "received by the node before the first goal" \
                if item["acknowledged"] else (f"not acknowledged by the node within "
                                              f"{self.timeout_s:g} s before the first goal")
            if not item["acknowledged"]:
                _LOG.warning("%s: %s", topic, item["status"])

    def report(self) -> list[dict[str, Any]]:
        """Per topic: kind, whether subscribed, published count, acknowledged, status."""
        return [dict(item) for item in self.inputs.values()]


def _no_subscriber(published: str, topic: str, camera: str, msgtype: str) -> str:
    """Say which remap makes the node take the bag's ``topic`` (as camera ``camera``)."""
    if not camera:
        return (f"nobody subscribes to {published} (the bag's {topic}): remap the node's "
                f"camera topic to it, or --remap {topic}:=/image")
    own = f"{camera}/image/compressed" if msgtype == bagio.COMPRESSED_TYPE else f"{camera}/image"
    return (f"nobody subscribes to {published} (the bag's {topic}, camera {camera}): start the "
            f"node with {camera} in cameras.names and -r {own}:={published}")


class _Delivery:
    """Node mode's publishing of recorded messages, one reliable writer per bag topic."""

    def __init__(self, publishers: dict[str, Any]) -> None:
        self.publishers = publishers
        self.in_flight: dict[str, int] = {}  # topic -> published since its last acknowledgement
        self.undelivered: dict[str, dict[str, int]] = {}  # topic -> unacknowledged / failed

    def publish(self, topic: str, data: bytes) -> None:
        """Publish one recorded message, never overwriting one the node has not acknowledged.

        A recorded frame is large (640x480 raw: ~900 kB, many DDS fragments). Handed more
        frames than its history holds before its reader acknowledges them, a reliable keep-last
        writer replaces unacknowledged ones, so the node never sees them (under CI load the
        demo's node held 9 of the 57 frames published before a goal), and Fast DDS may refuse
        the write outright ("cannot publish data"). So once a topic has a history's worth less
        one in flight, the next waits (bounded) for their acknowledgement: the node gets every
        recorded frame, late rather than never. What still fails is counted and reported, never
        dropped silently. Without a reliable reader the wait returns at once.
        """
        from rclpy.duration import Duration

        publisher = self.publishers[topic]
        counts = self.undelivered.setdefault(topic, {"unacknowledged": 0, "failed": 0})
        for attempt in range(2):
            if self.in_flight.get(topic, 0) >= WRITER_DEPTH - 1 or attempt > 0:
                if not publisher.wait_for_all_acked(Duration(seconds=ACK_WAIT_S)) \
                        and attempt == 0:
                    counts["unacknowledged"] += 1
                self.in_flight[topic] = 0
            try:
                publisher.publish(data)  # the recorded CDR bytes as they are
                self.in_flight[topic] = self.in_flight.get(topic, 0) + 1
                return
            except Exception as e:  # noqa: BLE001 - rclpy's RCLError: try once more, then count
                error = e
        counts["failed"] += 1
        _LOG.warning("%s: a recorded message was not published (%s)", topic, error)

    def report(self) -> dict[str, dict[str, int]]:
        """Topic -> counts, for the topics where something was late or not published."""
        return {topic: counts for topic, counts in self.undelivered.items()
                if any(counts.values())}


class _NodePlayer:
    """The publishing loop of node mode (one thread; results come back on the client's)."""

    def __init__(self, cfg: ReplayConfig, schedule: tuple[ScheduledQuery, ...],
                 info: bagio.BagInfo, image_topic: str, recorder: Recorder,
                 tick: Callable[[], None], client: Any, publishers: dict[str, Any],
                 clock_pub: Any, clock_cls: Any, inputs: _DepthInputs) -> None:
        self.inputs = inputs
        self.cfg, self.schedule, self.info, self.image_topic = cfg, schedule, info, image_topic
        self.recorder, self.tick, self.client = recorder, tick, client
        self.publishers, self.clock_pub, self.clock_cls = publishers, clock_pub, clock_cls
        self.pending: list[_Pending] = []
        self.wall0 = time.monotonic()
        self.clock_ns = 0
        self.delivery = _Delivery(publishers)

    def publish_clock(self, ns: int) -> None:
        if ns <= self.clock_ns:
            return
        self.clock_ns = ns
        msg = self.clock_cls()
        msg.clock.sec, msg.clock.nanosec = ns // NS, ns % NS
        self.clock_pub.publish(msg)

    def advance_to(self, ns: int) -> None:
        """Pace to bag time ``ns`` (at the rate), publishing /clock at ~50 Hz meanwhile."""
        if self.cfg.rate is not None:
            target = self.wall0 + (ns - self.info.start_ns) / NS / self.cfg.rate
            while (remaining := target - time.monotonic()) > 0:
                elapsed = (time.monotonic() - self.wall0) * self.cfg.rate
                self.publish_clock(self.info.start_ns + int(elapsed * NS))
                self.collect(block=False)
                time.sleep(min(0.02, remaining))
        self.publish_clock(ns)

    def play(self) -> None:
        goals = iter(self.schedule)
        item = next(goals, None)
        for topic, _msgtype, t_ns, data in bagio.messages(self.info.path, list(self.publishers)):
            while item is not None and self.info.start_ns + item.t_s * NS < t_ns:
                self.send(item)
                item = next(goals, None)
            if self.cfg.rate is None:
                self.collect(block=True)
            self.advance_to(t_ns)
            self.delivery.publish(topic, data)
            self.inputs.published(topic)
            if topic == self.image_topic:
                for p in self.pending:
                    p.frames_needed = max(0, p.frames_needed - 1)
                if self.cfg.rate is None:
                    time.sleep(0.005)  # --rate max: a floor between frames (queues stay small)
        while item is not None:
            self.send(item)
            item = next(goals, None)
        deadline = time.monotonic() + self.cfg.goal_timeout_s
        while self.pending and time.monotonic() < deadline:
            self.collect(block=False)
            time.sleep(0.02)
        for p in list(self.pending):  # bounded above: these never answered
            p.handle.cancel()
            self.finish(p, "timeout", error_result(CosmosReasonError(
                f"no result within {self.cfg.goal_timeout_s:g} s (replay's goal timeout)"),
                p.item) | {"error_code": int(ErrorCode.TIMEOUT)})

    def send(self, item: ScheduledQuery) -> None:
        from cosmos_reason_ros.client import ReasonClient

        g = item.query.goal
        self.advance_to(self.info.start_ns + int(round(item.t_s * NS)))
        self.inputs.before_first_goal()
        if self.cfg.rate is None:
            self.collect(block=True)
            # Reliable camera subscribers have the frames once they acknowledge them (a busy
            # node can lag the replayer by several frames); best effort gets a short settle.
            from rclpy.duration import Duration

            for publisher in self.publishers.values():
                publisher.wait_for_all_acked(Duration(seconds=5.0))
            time.sleep(self.cfg.settle_s)
        goal = ReasonClient.goal(
            g.prompt, g.task, g.targets, reasoning=g.reasoning, source=SOURCES[g.source],
            clip_duration_s=g.clip_duration_s, clip_fps=g.clip_fps, max_tokens=g.max_tokens,
            temperature=g.temperature, greedy=g.greedy, response_schema=g.response_schema,
            max_image_age_s=g.max_image_age_s, wait_for_image_s=g.wait_for_image_s,
            timeout_s=g.timeout_s, cameras=g.cameras, feedback=FEEDBACK_STAGES)
        stage = threading.Event()

        def on_feedback(fb: Any) -> None:
            if fb.stage == "waiting_for_image":
                stage.set()

        # A server seen at start-up can drop out of discovery for a while on a loaded machine:
        # each goal waits for it as long as the start did (--connect-timeout).
        handle = self.client.submit(goal, on_feedback, server_timeout_s=self.cfg.connect_timeout_s)
        # A 'next' goal needs frames published after its acceptance before anyone waits on
        # it; a few, in case a best-effort camera subscription drops one.
        pending = _Pending(item, handle, stage,
                           frames_needed=NEXT_FRAMES if g.source == "next" else 0)
        self.pending.append(pending)
        if g.source == "next":
            # The recording pauses (no frames, /clock held at the query time) until the node
            # waits for the goal's frame, so the next recorded frame is also the next one taken
            # after the goal's acceptance by the node's (sim) clock.
            paused = time.monotonic()
            end = paused + self.cfg.connect_timeout_s
            while not stage.wait(0.02) and not pending.handle.future.done() \
                    and time.monotonic() < end:
                pass
            # A pause, not a lag: the rest of the recording keeps its pace instead of
            # catching up in a burst.
            self.wall0 += time.monotonic() - paused

    def collect(self, block: bool) -> None:
        """Record finished goals; with ``block``, first wait for those not needing frames."""
        for p in list(self.pending):
            if block and p.frames_needed == 0 and not p.handle.future.done():
                try:
                    p.handle.result(self.cfg.goal_timeout_s)
                except TimeoutError:
                    pass
            if p.handle.future.done():
                try:
                    result = p.handle.result(0)
                    self.finish(p, result.status, bagio.to_plain(result.message))
                except Exception as e:  # noqa: BLE001 - a transport error ends this goal
                    self.finish(p, "error", error_result(CosmosReasonError(str(e)), p.item))
            elif block and p.frames_needed == 0:
                p.handle.cancel()
                self.finish(p, "timeout", error_result(CosmosReasonError(
                    f"no result within {self.cfg.goal_timeout_s:g} s"), p.item)
                    | {"error_code": int(ErrorCode.TIMEOUT)})

    def finish(self, p: _Pending, status: str, plain: dict[str, Any]) -> None:
        self.pending.remove(p)
        delivery = p.handle.delivery()
        self.recorder.add(p.item, status, plain, delivery and delivery.to_dict())
        self.tick()
