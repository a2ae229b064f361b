"""Replay a rosbag2 recording against a scenario of questions; score, record and report.

    # through a running node (started with use_sim_time:=true, camera remapped as needed)
    replay BAG --scenario S.yaml --out DIR
    replay BAG --scenario S.yaml --out DIR --rate 2        # twice the recorded rate
    replay BAG --scenario S.yaml --out DIR --rate max      # as fast as the node keeps up
    # offline: the same requests straight to an engine, no ROS (quick prompt iteration)
    replay BAG --scenario S.yaml --out DIR --mode offline --preset cpu_demo --model /models/m
    # offline with 3D: the bag's registered depth + CameraInfo lift answers as the node would
    replay BAG --scenario S.yaml --out DIR --mode offline --model M --param depth.enabled:=true
    # several cameras: the bag's topics named as the node's cameras (the default one first)
    replay BAG --scenario S.yaml --out DIR --camera front=/camera/image_raw \
        --camera wrist=/wrist/image_raw/compressed

Node mode publishes the bag's messages (sqlite3 or mcap, read with ``rosbags``) under their
recorded topic names (``--remap FROM:=TO`` to rename) with ``/clock`` following the bag time,
and sends each scheduled query as a ``~/reason`` goal (``--node-name``). At the recorded rate
goals run while the stream goes on, like on the robot; with ``--rate max`` each goal is answered
before the stream moves on, so every query sees the frame at its scheduled time.

Offline mode builds the very requests the node builds (``core.query``: same resize, prompts,
schema and sampling) from the bag's frames at each query time and runs them on an engine
made from a config preset. With ``depth.enabled`` in the preset (or ``--param
depth.enabled:=true``) it also reads the bag's registered depth and CameraInfo topics (the
only 16UC1/32FC1 Image and CameraInfo topics, or ``--depth-topic`` / ``--camera-info-topic``)
and lifts answers to 3D as the node does (``core/answer3d.py``), so results carry
``position_3d``, ``lift_code`` and ``depth_stamp``. The bag's clock stands still at a query's
time while it runs: only messages recorded by then are used, so a depth frame recorded later
than its colour frame's query (late depth) is not (the node lifts after generating and may
also use depth that arrived meanwhile; offline results do not depend on the engine's speed).
Through the node, start the node with depth on and its ``depth/image`` and ``camera_info``
remapped to the bag's topics (``tools/demo.py`` does); before the first goal the replay waits,
at most ``--depth-inputs-timeout`` each, for the node to subscribe to them and to acknowledge
what was published, and reports per topic in ``summary.json`` (``depth_inputs``) and the
printed summary, so a first goal without CameraInfo is explained, not a random NO_DEPTH.

Several cameras (``--camera NAME=TOPIC``, repeatable, or the scenario's ``cameras``; the
first is the default camera) map the bag's image topics to camera names, and queries name
the cameras they ask about (``cameras: [front, wrist]``). Offline, the preset gets
``cameras.names`` from them and each camera's frames fill its own history, as in the node.
Through the node, start it with the same ``cameras.names`` and each camera's topics remapped
to the bag's (``-r front/image:=/camera/image_raw -r
wrist/image/compressed:=/wrist/image_raw/compressed``).

Outputs in ``--out``: ``results.jsonl`` (one line per query: the ``ReasoningResult`` in plain
form, the status and the scores), ``results_bag/`` (the same ``ReasoningResult`` messages,
readable by ``ros2 bag`` and ``rosbags``), ``report.html`` with ``latency.png`` and annotated
frames, ``summary.json``. Exit status: 0 when nothing regressed, 1 when a scored expectation
failed (or a goal failed, with the scenario's ``fail_on_error``), 2 for a bad scenario, bag or
argument, 3 when the node or engine cannot be reached.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import logging
import math
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cosmos_reason_ros import dds
from cosmos_reason_ros.core.answer3d import Answer3D, LiftCode
from cosmos_reason_ros.core.cameras import DEFAULT_CAMERA, camera_name_problem
from cosmos_reason_ros.core.lifting import Lifted
from cosmos_reason_ros.core.rgbd import CameraModel
from cosmos_reason_ros.core.types import CosmosReasonError, ErrorCode, FinishReason
from cosmos_reason_ros.eval import bagio, report, scoring
from cosmos_reason_ros.eval.scenario import (
    Scenario,
    ScenarioError,
    ScheduledQuery,
    build_schedule,
    load_scenario,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
SOURCES = {"latest": 0, "next": 1, "clip": 2}
FEEDBACK_STAGES = 1  # Reason.Goal.FEEDBACK_STAGES: replay reads the stages, never the text
EXIT_OK, EXIT_REGRESSION, EXIT_BAD_INPUT, EXIT_UNREACHABLE = 0, 1, 2, 3
NS = 1_000_000_000
WRITER_DEPTH = 10  # node mode: the replay's publishers keep the last 10 messages (reliable)
ACK_WAIT_S = 2.0  # node mode: longest wait for the node to acknowledge a topic's last message
NEXT_FRAMES = 3  # frames published after a 'next' goal before --rate max waits for it
_LOG = logging.getLogger("replay")


class ReplayError(Exception):
    """The replay cannot go on; ``exit_code`` says why (bad input or unreachable)."""

    def __init__(self, message: str, exit_code: int = EXIT_UNREACHABLE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class ReplayConfig:
    """What to replay, how, and where the outputs go."""

    bag: Path
    scenario: Path
    out: Path
    mode: str = "node"  # node | offline
    rate: float | None = 1.0  # None: as fast as the node keeps up
    image_topic: str = ""
    node_name: str = "cosmos_reason"
    remaps: dict[str, str] = field(default_factory=dict)
    preset: str = "cpu_demo"  # offline: config preset name or path
    model: str = ""  # offline: overrides engine.model
    results_storage: str = ""  # default: the input bag's storage
    goal_timeout_s: float = 300.0  # replay-side bound on waiting for one result
    connect_timeout_s: float = 30.0
    # Node mode, depth on: longest wait for the node to subscribe to the bag's depth and
    # CameraInfo topics, and again for it to acknowledge them before the first goal.
    depth_inputs_timeout_s: float = 10.0
    settle_s: float = 0.2  # --rate max: let the last frame arrive before a goal
    progress: bool = True
    report_frames: int = 200  # annotated frames written at most
    params: dict[str, Any] = field(default_factory=dict)  # offline: overrides the preset's
    depth_topic: str = ""  # offline with depth: the bag's depth topic (default: the only one)
    camera_info_topic: str = ""  # offline with depth: default the bag's only CameraInfo topic
    # Camera name -> the bag's image topic, the default camera first (--camera; default: the
    # scenario's cameras); empty: one camera on image_topic.
    cameras: dict[str, str] = field(default_factory=dict)


@dataclass
class ReplayRun:
    """What a replay produced."""

    records: list[dict[str, Any]]
    summary: scoring.Summary
    jsonl: Path
    results_bag: Path
    report: Path | None
    # Node mode: what became of the bag's depth and CameraInfo topics before the first goal.
    depth_inputs: list[dict[str, Any]] = field(default_factory=list)
    # Node mode: topic -> recorded messages the node did not acknowledge in time / not published.
    undelivered: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        """0 when nothing regressed, else 1."""
        return EXIT_OK if self.summary.ok else EXIT_REGRESSION


# --- records -----------------------------------------------------------------------------------


def _stamp_plain(ns: int) -> dict[str, int]:
    ns = max(0, int(ns))
    return {"sec": ns // NS, "nanosec": ns % NS}


def _plain_ns(stamp: dict[str, int] | None) -> int:
    return 0 if not stamp else int(stamp["sec"]) * NS + int(stamp["nanosec"])


def error_result(error: CosmosReasonError, item: ScheduledQuery, model: str = "",
                 header: dict[str, Any] | None = None) -> dict[str, Any]:
    """Plain ``ReasoningResult`` of a query that failed before or during generation."""
    cancelled = error.code is ErrorCode.CANCELLED
    return {"header": header or {}, "origin": "goal", "model": model, "task": item.query.goal.task,
            "prompt": item.query.goal.prompt, "error_code": int(error.code),
            "error_message": error.message,
            "finish_reason": (FinishReason.CANCELLED if cancelled else FinishReason.ERROR).value}


class Recorder:
    """Turns results into records (scored), writes the JSONL file and the results bag."""

    def __init__(self, cfg: ReplayConfig, scenario: Scenario, info: bagio.BagInfo,
                 truth: bagio.GroundTruth, truth_3d: bagio.GroundTruth3D | None = None) -> None:
        """Open the outputs (``cfg.out`` must not hold a previous run's results bag)."""
        self.cfg, self.scenario, self.info, self.truth = cfg, scenario, info, truth
        self.truth_3d = truth_3d or {}
        cfg.out.mkdir(parents=True, exist_ok=True)
        self.jsonl_path = cfg.out / "results.jsonl"
        self.bag_path = cfg.out / "results_bag"
        if self.bag_path.exists():
            raise ReplayError(f"{self.bag_path} exists: choose a new --out or remove it",
                              EXIT_BAD_INPUT)
        # Records are streamed here as they finish (a crash keeps them); the final JSONL and
        # the results bag are written in schedule order by ``close``.
        self.partial_path = cfg.out / "results.jsonl.partial"
        self._partial = self.partial_path.open("w", encoding="utf-8")
        self.records: list[dict[str, Any]] = []
        self._cdr: dict[int, bytes] = {}
        self._lock = threading.Lock()

    def add(self, item: ScheduledQuery, status: str, plain: dict[str, Any],
            delivery: dict[str, Any] | None = None) -> dict[str, Any]:
        """Score one result, append it to the JSONL file and the bag; return the record.

        ``delivery`` is the client's view of the goal's trip (``Delivery.to_dict``), kept in
        the record so a goal that never came back says which hop it was waiting for.
        """
        result, cdr = bagio.canonical_result(plain)
        stamp = _plain_ns(result["header"]["stamp"])
        truth = bagio.truth_at(self.truth, stamp) if stamp else None
        truth_3d = bagio.truth_at(self.truth_3d, stamp) if stamp else None
        scores = scoring.score_result(item.query.expect, result, truth, truth_3d)
        scheduled_ns = self.info.start_ns + int(round(item.t_s * NS))
        record = {
            "query": item.query.name, "occurrence": item.occurrence, "t_s": item.t_s,
            "mode": self.cfg.mode, "status": status,
            "frame_offset_s": (stamp - scheduled_ns) / NS if stamp else None,
            "ground_truth": {k: list(v) for k, v in truth.items()} if truth else None,
            "ground_truth_3d": truth_3d.to_dict() if truth_3d else None,
            "scores": [s.to_dict() for s in scores], "result": result,
            "delivery": delivery,
        }
        record["regression"] = scoring.is_regression(record, self.scenario.fail_on_error)
        with self._lock:
            self._partial.write(json.dumps(record, ensure_ascii=False) + "\n")
            self._partial.flush()
            self._cdr[id(record)] = cdr
            self.records.append(record)
        return record

    def close(self, schedule: tuple[ScheduledQuery, ...]) -> list[dict[str, Any]]:
        """Write the JSONL file and the results bag in schedule order; return the records.

        Bag times are the scheduled times (strictly increasing: queries scheduled together
        are 1 ns apart), so ``ros2 bag`` and ``rosbags`` read the results in this order too.
        """
        self._partial.close()
        order = {(s.query.name, s.occurrence): i for i, s in enumerate(schedule)}
        records = sorted(self.records, key=lambda r: order[(r["query"], r["occurrence"])])
        last_ns = 0
        with self.jsonl_path.open("w", encoding="utf-8") as jsonl, bagio.ResultsBagWriter(
                self.bag_path, self.cfg.results_storage or self.info.storage,
                topic=f"/{self.cfg.node_name}/results") as bag:
            for r in records:
                jsonl.write(json.dumps(r, ensure_ascii=False) + "\n")
                last_ns = max(last_ns + 1, self.info.start_ns + int(round(r["t_s"] * NS)))
                bag.write(self._cdr[id(r)], last_ns)
        self.partial_path.unlink()
        return records


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
    _LOG.info("%s", dds.use_writer_profile())
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

        # A 'next' goal needs frames published after its acceptance before anyone waits on
        # it; a few, in case a best-effort camera subscription drops one.
        pending = _Pending(item, self.client.submit(goal, on_feedback), stage,
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


# --- offline ------------------------------------------------------------------------------------


def _preset_path(preset: str) -> Path:
    path = Path(preset)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return path
    candidates = [REPO_ROOT / "config" / f"{preset}.yaml"]
    try:
        from ament_index_python.packages import get_package_share_directory

        candidates.append(Path(get_package_share_directory("cosmos_reason_ros")) / "config"
                          / f"{preset}.yaml")
    except Exception:  # noqa: BLE001 - not installed: the source tree's presets only
        pass
    for c in candidates:
        if c.is_file():
            return c
    raise ReplayError(f"--preset {preset!r}: no such preset file (looked for "
                      f"{', '.join(str(c) for c in candidates)})", EXIT_BAD_INPUT)


class OfflineRunner:
    """Answers scheduled queries from the bag's frames with an engine, as the node would."""

    def __init__(self, cfg: ReplayConfig, engine: Any = None) -> None:
        """Load the preset (the node's parameter table) and start its engine (or ``engine``).

        ``cfg.params`` override the preset's parameters (e.g. ``depth.enabled``). With depth
        on, the bag's depth and CameraInfo topics are chosen before the engine starts.
        """
        from cosmos_reason_ros.config import (
            ConfigError,
            create_configured_engine,
            load_yaml_params,
            validate,
        )
        from cosmos_reason_ros.core.models import detect_profile
        from cosmos_reason_ros.engines.runner import EngineRunner

        self.cfg = cfg
        try:
            values = load_yaml_params(str(_preset_path(cfg.preset)))
            values.update(cfg.params)
            if cfg.model:
                values["engine.model"] = cfg.model
            if cfg.cameras:  # the node would run with these cameras, in this order
                names = list(values.get("cameras.names") or cfg.cameras)
                if names != list(cfg.cameras):
                    raise ConfigError(f"cameras.names={names!r} differs from the cameras "
                                      f"mapped to the bag's topics ({', '.join(cfg.cameras)})")
                values["cameras.names"] = names
            p = self.params = validate(values)
            self.profile = detect_profile(p.engine.model or "unknown",
                                          None if p.model.family == "auto"
                                          else p.model.family)
        except (ConfigError, CosmosReasonError) as e:
            raise ReplayError(f"--preset/--model/--param: {e}", EXIT_BAD_INPUT) from e
        self.depth_topics: tuple[str, str] | None = None
        if p.depth.enabled:
            try:
                self.depth_topics = bagio.pick_depth_topics(
                    bagio.bag_info(cfg.bag), cfg.depth_topic, cfg.camera_info_topic)
            except bagio.BagError as e:
                raise ReplayError(f"depth.enabled: {e}", EXIT_BAD_INPUT) from e
            if p.depth.target_frame:
                _LOG.warning("depth.target_frame=%s is ignored offline (no tf): positions stay "
                             "in the camera's optical frame", p.depth.target_frame)
        try:
            self.runner = EngineRunner(engine or create_configured_engine(p.engine))
        except ConfigError as e:
            raise ReplayError(f"--preset/--model/--param: {e}", EXIT_BAD_INPUT) from e
        try:
            self.runner.start(timeout_s=p.engine.start_timeout_s)
        except CosmosReasonError as e:
            self.runner.close()
            raise ReplayError(f"engine did not start: {e.message}") from e

    def close(self) -> None:
        """Shut the engine down."""
        self.runner.close()

    def run(self, schedule: tuple[ScheduledQuery, ...], info: bagio.BagInfo, image_topic: str,
            recorder: Recorder, tick: Callable[[], None]) -> None:
        """Step through the bag's frames and answer each query at its time, as the node would.

        Frames (and depth frames) are stored serialized, as the node stores them, in histories
        whose clock is the query's bag time; the latest CameraInfo is kept as the camera
        model; the node's goal pipeline chooses, decodes, asks and lifts.
        """
        from cosmos_reason_ros.core.cdr import header_stamp_ns, read_stored_frame
        from cosmos_reason_ros.core.frames import FrameHistory
        from cosmos_reason_ros.core.pipeline import GoalPipeline

        p = self.params
        now = [info.start_ns]
        # One history per camera (the node's cameras.names, mapped to the bag's topics), the
        # default camera first; without named cameras the one camera on image_topic.
        camera_topics = dict(self.cfg.cameras) or {DEFAULT_CAMERA: image_topic}
        histories: dict[str, FrameHistory[tuple[bool, bytes]]] = {
            name: FrameHistory(max_frames=p.image.history_frames,
                               max_bytes=int(p.image.history_mb * 2**20), clock=lambda: now[0])
            for name in camera_topics}
        by_topic = {topic: histories[name] for name, topic in camera_topics.items()}
        depth_history: FrameHistory[tuple[bool, bytes]] | None = None
        camera = _CameraInfoReader(p.depth.rectified)
        topics = list(by_topic)
        depth_topic = ""
        if self.depth_topics is not None:
            depth_topic = self.depth_topics[0]
            clash = sorted(set(topics) & set(self.depth_topics))
            if clash:
                raise ReplayError(f"the image topic {clash[0]} is also the depth or "
                                  f"camera_info topic", EXIT_BAD_INPUT)
            depth_history = FrameHistory(max_frames=p.depth.history_frames,
                                         clock=lambda: now[0])
            topics += list(self.depth_topics)
        default = next(iter(camera_topics))
        self.pipeline = GoalPipeline.from_params(
            p, self.profile, self.runner, histories, read_stored_frame, lambda: now[0],
            depth_history=depth_history, camera_model=camera.model,
            source_name=f"{default} ({image_topic})" if self.cfg.cameras else image_topic)
        stream: Iterator[tuple[str, str, int, bytes]] = bagio.messages(info.path, topics)
        ahead = next(stream, None)

        def store() -> tuple[str, int]:
            """Store the message ahead; return its topic and receipt time, and step on."""
            nonlocal ahead
            assert ahead is not None
            topic, msgtype, t_recv, data = ahead
            ahead = next(stream, None)
            if topic in by_topic:
                by_topic[topic].append((msgtype == bagio.COMPRESSED_TYPE, data),
                                       header_stamp_ns(data) or t_recv, nbytes=len(data),
                                       received_ns=t_recv)
            elif topic == depth_topic and depth_history is not None:
                depth_history.append((False, data), header_stamp_ns(data) or t_recv,
                                     nbytes=len(data), received_ns=t_recv)
            elif msgtype == bagio.CAMERA_INFO_TYPE:
                camera.update(data, msgtype)
            return topic, t_recv

        for item in schedule:
            t_ns = info.start_ns + int(round(item.t_s * NS))
            now[0] = t_ns
            while ahead is not None and ahead[2] <= t_ns:
                store()
            if item.query.goal.source == "next":
                # The colour frame of each of the goal's cameras that arrives after the goal,
                # and whatever arrived with the last of them.
                waiting = {camera_topics[c] for c in item.query.goal.cameras or (default,)}
                while ahead is not None and waiting:
                    topic, t_recv = store()
                    waiting.discard(topic)
                    if not waiting:
                        while ahead is not None and ahead[2] <= t_recv:
                            store()
            status, plain = self.answer(item, t_ns)
            recorder.add(item, status, plain)
            tick()

    def answer(self, item: ScheduledQuery, t_ns: int) -> tuple[str, dict[str, Any]]:
        """One query through the goal pipeline; errors become error results."""
        from cosmos_reason_ros.core.pipeline import GoalFields

        g = item.query.goal
        t0 = time.monotonic()
        fields = GoalFields(
            task=g.task, prompt=g.prompt, targets=tuple(g.targets), reasoning=g.reasoning,
            source=SOURCES[g.source], max_image_age_s=g.max_image_age_s,
            # Offline nothing arrives later: a 'next' frame is stored before asking.
            wait_for_image_s=g.wait_for_image_s or 0.001, clip_duration_s=g.clip_duration_s,
            clip_fps=g.clip_fps, response_schema=g.response_schema, max_tokens=g.max_tokens,
            temperature=g.temperature, greedy=g.greedy, timeout_s=g.timeout_s,
            cameras=g.cameras)
        header: dict[str, Any] = {}
        try:
            valid = self.pipeline.validate(fields)
            run = self.pipeline.run(valid, t_start=t0, accepted_ns=t_ns)
            if run.media is not None:
                header = {"stamp": _stamp_plain(run.media.header_stamp_ns),
                          "frame_id": run.media.frame_id}
            if run.error is not None:
                raise run.error
        except CosmosReasonError as e:
            plain = error_result(e, item, self.runner.model_name, header)
            plain["total_s"] = time.monotonic() - t0
            return "aborted", plain
        assert run.media is not None and run.outcome is not None
        plain = outcome_plain(run.outcome, run.media.prepared.geometry, run.media.stamps_ns,
                              run.media.clip_start_ns, run.answer3d)
        plain.update(header=header, goal_id=uuid.uuid4().hex, origin="goal",
                     camera_frames=[_camera_frame_plain(c) for c in run.media.cameras],
                     model=self.runner.model_name, task=valid.spec.task.value, prompt=g.prompt,
                     preprocess_s=run.preprocess_s,
                     time_to_first_token_s=run.time_to_first_token_s,
                     total_s=time.monotonic() - t0)
        return "succeeded", plain


def _camera_frame_plain(camera: Any) -> dict[str, Any]:
    """Return a ``CameraFrame`` in plain form, as ``ros/messages.camera_frame`` fills it."""
    g = camera.geometry
    return {"camera": camera.camera, "header": {"stamp": _stamp_plain(camera.header_stamp_ns),
                                                "frame_id": camera.frame_id},
            "image_width": g.original_width, "image_height": g.original_height,
            "input_width": g.input_width, "input_height": g.input_height}


class _CameraInfoReader:
    """The latest CameraInfo of the bag as a ``CameraModel``, read as the node reads it."""

    def __init__(self, rectified: bool) -> None:
        self.rectified = rectified
        self._model: CameraModel | None = None
        self._warned: set[str] = set()

    def model(self) -> CameraModel | None:
        """Return the latest camera model (None before a usable CameraInfo)."""
        return self._model

    def update(self, data: bytes, msgtype: str) -> None:
        """Read one serialized CameraInfo; a bad one is ignored with a warning, as the node does."""
        msg = bagio.typestore().deserialize_cdr(data, msgtype)
        try:
            model = CameraModel.from_camera_info_fields(
                msg.k, msg.d, msg.width, msg.height, msg.header.frame_id, msg.distortion_model,
                msg.p, rectified=self.rectified)
        except CosmosReasonError as e:
            self._warn_once("bad", f"camera_info ignored: {e.message}")
            return
        if model.has_distortion:
            self._warn_once("distortion", "camera_info has non-zero distortion and "
                            "depth.rectified is false: 3D positions assume a rectified colour "
                            "image")
        self._model = model

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            _LOG.warning(message)


def _position_plain(lifted: Lifted) -> dict[str, Any]:
    """Return a ``Position3D`` in plain form (NaN as None), as ``messages.fill_3d`` fills it."""
    def num(v: float) -> float | None:
        return None if math.isnan(v) else float(v)

    x, y, z = lifted.position
    sx, sy, sz = lifted.size
    qx, qy, qz, qw = lifted.orientation
    return {"valid": bool(lifted.valid), "position": {"x": num(x), "y": num(y), "z": num(z)},
            "size": {"x": num(sx), "y": num(sy), "z": num(sz)},
            "orientation": {"x": qx, "y": qy, "z": qz, "w": qw},
            "depth_pixels": int(lifted.used_pixels), "status": lifted.reason}


def outcome_plain(outcome: Any, geometry: Any, stamps_ns: list[int],
                  clip_start_ns: int | None, answer3d: Answer3D | None = None
                  ) -> dict[str, Any]:
    """Return the plain ``ReasoningResult`` fields of an outcome (the node's ``fill_outcome``).

    With ``answer3d`` the 3D fields too, as ``fill_3d`` fills them: ``lift_code``,
    ``lift_message``, ``frame_3d``, ``depth_stamp``, and each box's, point's and waypoint's
    ``position_3d`` when lifting went ahead.
    """
    parsed = outcome.parsed

    def point(pt: Any) -> dict[str, Any]:
        return {"label": pt.label, "camera": pt.camera, "x": float(pt.x), "y": float(pt.y)}

    start = clip_start_ns or 0
    plain = {
        "frame_stamps": [_stamp_plain(s) for s in stamps_ns],
        "raw_text": parsed.raw_text, "reasoning": parsed.reasoning, "answer": parsed.answer,
        "answer_json": parsed.answer_json or "",
        "boxes": [{"label": b.label, "camera": b.camera,
                   "score": None if b.score is None else float(b.score),
                   "x_min": float(b.x_min), "y_min": float(b.y_min), "x_max": float(b.x_max),
                   "y_max": float(b.y_max), "degenerate": bool(b.degenerate)}
                  for b in outcome.boxes],
        "points": [point(pt) for pt in outcome.points],
        "trajectories": [{"label": t.label, "camera": t.camera,
                          "points": [point(pt) for pt in t.points]}
                         for t in outcome.trajectories],
        "spans": [{"start_s": float(s.start_s), "end_s": float(s.end_s), "caption": s.caption,
                   "start_stamp": _stamp_plain(start + s.start_s * NS),
                   "end_stamp": _stamp_plain(start + s.end_s * NS)} for s in parsed.spans],
        "parsed": list(parsed.found), "parse_problems": list(parsed.problems),
        "image_width": geometry.original_width, "image_height": geometry.original_height,
        "input_width": geometry.input_width, "input_height": geometry.input_height,
        "prompt_tokens": outcome.tokens.prompt, "output_tokens": outcome.tokens.output,
        "cached_prompt_tokens": outcome.tokens.cached_prompt,
        "finish_reason": outcome.finish_reason.value, "error_code": int(ErrorCode.OK),
    }
    if answer3d is not None:
        _plain_3d(plain, answer3d)
    return plain


def _plain_3d(plain: dict[str, Any], answer: Answer3D) -> None:
    """Add an ``Answer3D`` to a plain result, as ``ros/messages.fill_3d`` does to a message."""
    plain.update(lift_code=int(answer.code), lift_message=answer.message,
                 frame_3d=answer.frame_id, depth_stamp=_stamp_plain(answer.depth_stamp_ns))
    if answer.code not in (LiftCode.OK, LiftCode.TF_FAILED):
        return
    for box, lifted in zip(plain["boxes"], answer.boxes, strict=True):
        box["position_3d"] = _position_plain(lifted)
    for pt, lifted in zip(plain["points"], answer.points, strict=True):
        pt["position_3d"] = _position_plain(lifted)
    for trajectory, waypoints in zip(plain["trajectories"], answer.trajectories, strict=True):
        for pt, lifted in zip(trajectory["points"], waypoints, strict=True):
            pt["position_3d"] = _position_plain(lifted)


# --- the run -----------------------------------------------------------------------------------


def write_frames(cfg: ReplayConfig, info: bagio.BagInfo, image_topic: str,
                 records: list[dict[str, Any]]) -> dict[int, str]:
    """Second pass over the bag: draw each answered query's frame (bounded count).

    The frame drawn is the result header's: the first camera's of a multi-camera goal (its
    topic from ``cfg.cameras``), with that camera's items (``report.annotate_frame``).
    """
    wanted: dict[tuple[str, int], list[int]] = {}
    for i, r in enumerate(records):
        stamp = _plain_ns(r["result"]["header"].get("stamp"))
        frames = r["result"].get("camera_frames") or []
        topic = cfg.cameras.get(frames[0]["camera"], image_topic) if frames else image_topic
        if stamp and len(wanted) < cfg.report_frames:
            wanted.setdefault((topic, stamp), []).append(i)
    store = bagio.typestore()
    written: dict[int, str] = {}
    topics = sorted({topic for topic, _stamp in wanted})
    for topic, msgtype, _t, data in bagio.messages(info.path, topics):
        if len(written) == sum(len(v) for v in wanted.values()):
            break
        msg = store.deserialize_cdr(data, msgtype)
        for i in wanted.get((topic, bagio.header_stamp_ns(msg)), ()):
            try:
                rgb = bagio.decode_image(msg, msgtype)
                written[i] = report.write_frame(cfg.out, i, records[i], rgb)
            except CosmosReasonError as e:
                _LOG.warning("frame for %s not drawn: %s", records[i]["query"], e.message)
    return written


def run_replay(cfg: ReplayConfig, engine: Any = None) -> ReplayRun:
    """Replay ``cfg.bag`` against ``cfg.scenario``; raise ``ReplayError`` if it cannot run.

    ``engine``: offline, an ``engines.base.Engine`` to use instead of the preset's.
    """
    try:
        scenario = load_scenario(cfg.scenario)
        info = bagio.bag_info(cfg.bag)
        cfg = dataclasses.replace(cfg, cameras=replay_cameras(cfg, scenario, info))
        image_topic = next(iter(cfg.cameras.values())) if cfg.cameras \
            else bagio.pick_image_topic(info, cfg.image_topic or scenario.image_topic)
        schedule = build_schedule(scenario, info.duration_s)
        truth = bagio.load_ground_truth(cfg.bag, scenario.ground_truth_topic)
        truth_3d = bagio.load_ground_truth_3d(cfg.bag, scenario.ground_truth_topic)
    except (ScenarioError, bagio.BagError) as e:
        raise ReplayError(str(e), EXIT_BAD_INPUT) from e
    if cfg.mode != "offline" and (cfg.params or cfg.depth_topic or cfg.camera_info_topic):
        raise ReplayError("--param, --depth-topic and --camera-info-topic are for --mode "
                          "offline; through the node, set its parameters and remaps",
                          EXIT_BAD_INPUT)
    offline = OfflineRunner(cfg, engine) if cfg.mode == "offline" else None
    recorder = Recorder(cfg, scenario, info, truth, truth_3d)
    bar = _progress(len(schedule), cfg.progress)
    depth_inputs: list[dict[str, Any]] = []
    undelivered: dict[str, dict[str, int]] = {}
    try:
        if offline is not None:
            offline.run(schedule, info, image_topic, recorder, bar.update)
        else:
            depth_inputs, undelivered = run_through_node(cfg, scenario, schedule, info,
                                                         image_topic, recorder, bar.update)
    finally:
        bar.close()
        if offline is not None:
            offline.close()
    records = recorder.close(schedule)
    summary = scoring.summarize(records, scenario.fail_on_error)
    (cfg.out / "summary.json").write_text(json.dumps(
        {**summary.to_dict(), "scenario": scenario.name, "bag": str(cfg.bag),
         "mode": cfg.mode, "depth_inputs": depth_inputs, "undelivered": undelivered},
        indent=1))
    frames = write_frames(cfg, info, image_topic, records)
    meta = {"scenario": scenario.name, "bag": f"{cfg.bag} ({info.storage}, "
            f"{info.duration_s:.2f} s)", "image topic": image_topic, "mode": cfg.mode,
            "rate": "max" if cfg.rate is None else f"{cfg.rate:g}x"}
    if cfg.cameras:
        meta["cameras"] = ", ".join(f"{name}={topic}" for name, topic in cfg.cameras.items())
    html = report.write_report(cfg.out, records, frames, meta, summary.to_dict())
    return ReplayRun(records, summary, recorder.jsonl_path, recorder.bag_path, html,
                     depth_inputs, undelivered)


def replay_cameras(cfg: ReplayConfig, scenario: Scenario, info: bagio.BagInfo
                   ) -> dict[str, str]:
    """Return camera name -> bag image topic (``--camera``, else the scenario's); may be empty.

    Every topic must be an image topic of the bag, each camera its own; every camera a query
    names must be one of them. Raises ``ScenarioError`` / ``BagError`` naming the problem.
    """
    cameras = dict(cfg.cameras) or dict(scenario.cameras)
    for name, topic in cameras.items():
        bagio.pick_image_topic(info, topic)  # refuses a topic that is not an image topic
        others = [n for n, t in cameras.items() if t == topic and n != name]
        if others:
            raise ScenarioError(f"cameras {name} and {others[0]} both name {topic}: give each "
                                f"camera its own topic")
    if cameras and cfg.image_topic and cfg.image_topic != next(iter(cameras.values())):
        raise ScenarioError(f"--image-topic {cfg.image_topic} with cameras: the default "
                            f"camera's topic is the first camera's ({next(iter(cameras))}="
                            f"{next(iter(cameras.values()))}); leave --image-topic out")
    for query in scenario.queries:
        unknown = [c for c in query.goal.cameras if c not in cameras]
        if unknown:
            known = ", ".join(cameras) or "none (give --camera NAME=TOPIC or the scenario's "
            "cameras)"
            raise ScenarioError(f"query {query.name!r} names camera {unknown[0]!r}; cameras "
                                f"mapped to the bag's topics: {known}")
    return cameras


def _progress(total: int, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc="replay", unit="query", disable=not enabled,
                file=sys.stderr, dynamic_ncols=True)


def print_summary(run: ReplayRun, out: Any = sys.stdout) -> None:
    """Per-query lines and the totals."""
    for r in run.records:
        res = r["result"]
        code = res.get("error_code", 0)
        what = (f"{1000 * res['total_s']:.0f} ms  {res['answer'][:70]!r}" if code == 0
                else f"{ErrorCode(code).name}: {res['error_message'][:90]}"
                if code in ErrorCode._value2member_map_ else f"error {code}")
        marks = " ".join(("ok" if s["passed"] else "FAIL" if not s["informational"] else "miss")
                         + f":{s['kind']}" for s in r["scores"])
        print(f"  {r['query']}#{r['occurrence']:<3} t={r['t_s']:6.2f}s {r['status']:<9} {what}"
              + (f"  [{marks}]" if marks else ""), file=out)
        if r["status"] != "succeeded" and r.get("delivery"):  # which hop it waited for
            hops = " ".join(f"{k}={v}" for k, v in r["delivery"].items())
            print(f"      client's view: {hops}", file=out)
    for item in run.depth_inputs:
        print(f"replay: {item['kind']} {item['topic']}: {item['status']}", file=out)
    for topic, counts in run.undelivered.items():
        print(f"replay: {topic}: {counts['unacknowledged']} recorded messages not acknowledged "
              f"by the node within {ACK_WAIT_S:g} s, {counts['failed']} not published", file=out)
    s = run.summary
    print(f"replay: {s.queries} queries, {s.succeeded} succeeded, {s.errors} failed; "
          f"{s.scored} expectations checked: {s.passed} passed, {s.failed} failed "
          f"({s.informational_failed} informational); regressions: {s.regressions} -> "
          f"{'PASS' if s.ok else 'REGRESSION'}", file=out)
    if run.report is not None:
        print(f"replay: report {run.report}", file=out)


def parse_rate(text: str) -> float | None:
    """``--rate``: a positive factor of the recorded rate, or ``max`` (``None``)."""
    if text == "max":
        return None
    try:
        value = float(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--rate {text!r}: a positive number or 'max'") from e
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"--rate {text!r}: a positive number or 'max'")
    return value


def _remap(text: str) -> tuple[str, str]:
    src, sep, dst = text.partition(":=")
    if not sep or not src or not dst:
        raise argparse.ArgumentTypeError(f"--remap {text!r}: expected FROM:=TO")
    return src, dst


def _camera(text: str) -> tuple[str, str]:
    """``--camera NAME=TOPIC``: a camera name (ROS name token) and the bag's image topic."""
    name, sep, topic = text.partition("=")
    problem = camera_name_problem(name) if sep else "is missing"
    if problem or not topic.startswith("/"):
        raise argparse.ArgumentTypeError(
            f"--camera {text!r}: expected NAME=TOPIC, e.g. front=/camera/image_raw (name "
            f"{problem or 'ok'}; the topic an absolute name)")
    return name, topic


def _camera_map(pairs: list[tuple[str, str]]) -> dict[str, str]:
    cameras: dict[str, str] = {}
    for name, topic in pairs:
        if name in cameras:
            raise ReplayError(f"--camera {name}= is given twice", EXIT_BAD_INPUT)
        cameras[name] = topic
    return cameras


def _param(text: str) -> tuple[str, Any]:
    """``--param NAME:=VALUE``: the value read as YAML, as ``ros2 run ... -p`` reads it."""
    import yaml

    name, sep, value = text.partition(":=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"--param {text!r}: expected NAME:=VALUE")
    try:
        return name.strip(), yaml.safe_load(value) if value.strip() else ""
    except yaml.YAMLError as e:
        raise argparse.ArgumentTypeError(f"--param {text!r}: value is not YAML ({e})") from e


def build_parser() -> argparse.ArgumentParser:
    """Build the command line parser."""
    ap = argparse.ArgumentParser(prog="replay", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bag", type=Path, help="rosbag2 directory (sqlite3 or mcap)")
    ap.add_argument("--scenario", type=Path, required=True, help="scenario YAML")
    ap.add_argument("--out", type=Path, required=True, help="output directory")
    ap.add_argument("--mode", choices=("node", "offline"), default="node")
    ap.add_argument("--rate", type=parse_rate, default=1.0,
                    help="playback rate (1 = recorded) or 'max' (node mode)")
    ap.add_argument("--image-topic", default="", help="the bag's camera topic (default: "
                    "the scenario's, else the bag's only image topic)")
    ap.add_argument("--camera", type=_camera, action="append", default=[],
                    metavar="NAME=TOPIC", help="the bag's image topic of camera NAME "
                    "(repeatable; the first is the default camera; default: the scenario's "
                    "cameras): queries name cameras by NAME")
    ap.add_argument("--node-name", default="cosmos_reason")
    ap.add_argument("--remap", type=_remap, action="append", default=[],
                    help="publish a bag topic under another name, FROM:=TO (repeatable)")
    ap.add_argument("--preset", default="cpu_demo", help="offline: config preset (name or "
                    "path)")
    ap.add_argument("--model", default="", help="offline: checkpoint (overrides the preset)")
    ap.add_argument("--param", type=_param, action="append", default=[],
                    help="offline: a node parameter over the preset's, NAME:=VALUE (repeatable),"
                    " e.g. depth.enabled:=true to lift answers to 3D")
    ap.add_argument("--depth-topic", default="", help="offline with depth: the bag's registered "
                    "depth topic (default: its only 16UC1/32FC1 Image topic)")
    ap.add_argument("--camera-info-topic", default="", help="offline with depth: the bag's "
                    "colour CameraInfo topic (default: its only CameraInfo topic)")
    ap.add_argument("--results-storage", choices=bagio.STORAGES, default="",
                    help="results bag storage (default: the input bag's)")
    ap.add_argument("--goal-timeout", type=float, default=300.0,
                    help="seconds to wait for one result")
    ap.add_argument("--connect-timeout", type=float, default=30.0,
                    help="seconds to wait for the node's action server and camera topic")
    ap.add_argument("--depth-inputs-timeout", type=float, default=10.0,
                    help="node mode, depth on: seconds to wait for the node to subscribe to "
                    "the bag's depth and CameraInfo topics, and to receive them before the "
                    "first goal (reported in summary.json when it runs out)")
    ap.add_argument("--no-progress", action="store_true")
    return ap


def config_from_args(args: argparse.Namespace) -> ReplayConfig:
    """Arguments -> ``ReplayConfig``."""
    return ReplayConfig(
        bag=args.bag, scenario=args.scenario, out=args.out, mode=args.mode, rate=args.rate,
        image_topic=args.image_topic, node_name=args.node_name.strip("/"),
        remaps=dict(args.remap), preset=args.preset, model=args.model, params=dict(args.param),
        cameras=_camera_map(args.camera),
        depth_topic=args.depth_topic, camera_info_topic=args.camera_info_topic,
        results_storage=args.results_storage, goal_timeout_s=args.goal_timeout,
        connect_timeout_s=args.connect_timeout,
        depth_inputs_timeout_s=args.depth_inputs_timeout, progress=not args.no_progress)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit status (0 pass, 1 regression, 2/3 errors)."""
    logging.basicConfig(level=logging.WARNING, format="replay: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        run = run_replay(config_from_args(args))
    except ReplayError as e:
        print(f"replay: {e}", file=sys.stderr)
        return e.exit_code
    print_summary(run)
    return run.exit_code


if __name__ == "__main__":
    sys.exit(main())
