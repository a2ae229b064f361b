"""The node's cameras: per camera, colour (raw and/or compressed), optionally depth + CameraInfo.

Subscriptions live on the node's ingest node (callbacks there do no decoding): colour and
depth messages are stored serialized in bounded histories, stamped with their header stamp
read in place; CameraInfo, small, is kept as the latest ``CameraModel``. Topic names are
resolved with the main node's remaps. Without ``cameras.names`` the one camera, named
``default``, takes ``image``, ``image/compressed``, ``depth/image`` and ``camera_info``; a
named camera takes the same names under its own: ``front/image``, ``front/image/compressed``
(and, for the first camera with depth on, ``front/depth/image``, ``front/camera_info``),
relative, so a namespace applies and a launch file remaps each to its driver.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from rclpy.node import Node
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import CameraInfo, CompressedImage, Image

from cosmos_reason_ros.core import cdr
from cosmos_reason_ros.core.cameras import DEFAULT_CAMERA
from cosmos_reason_ros.core.frames import FrameHistory
from cosmos_reason_ros.core.params import NodeParams
from cosmos_reason_ros.core.rgbd import CameraModel
from cosmos_reason_ros.core.types import CosmosReasonError
from cosmos_reason_ros.qos import (
    on_best_effort_publisher,
    publishers_qos,
    resubscribe_best_effort,
)

StoredMessage = tuple[bool, bytes]  # (compressed, serialized bytes)

# Depth and CameraInfo readers keep this many samples: a reliable writer's burst (or a depth
# frame arriving while the ingest callback still stores the last) is queued, not replaced.
FOLLOW_QOS_DEPTH = 5


@dataclass(frozen=True)
class _Wanted:
    """One subscription subscribe() creates.

    ``follow``: the reliability follows the publishers (``qos.publishers_qos``), keeping
    ``qos``'s depth; otherwise ``qos`` as it is.
    """

    msg_type: Any
    topic: str
    callback: Callable[[Any], None]
    qos: QoSProfile
    follow: bool
    raw: bool
    colour: bool  # a colour topic (named in messages about the camera)


class Camera:
    """One camera's histories and subscriptions."""

    def __init__(self, node: Node, ingest: Node, params: NodeParams,
                 clock_ns: Callable[[], int], on_frame: Callable[[], None], *,
                 name: str = DEFAULT_CAMERA, prefix: str = "", input_kind: str = "",
                 depth: bool | None = None, subscribe: bool = True) -> None:
        """Subscribe on ``ingest`` per the ``image.*`` and ``depth.*`` parameters.

        ``prefix`` goes before every topic name (``"front/"``: ``front/image``);
        ``input_kind`` (raw, compressed, both) replaces ``image.input``; ``depth`` (default
        ``depth.enabled``) also subscribes to depth and CameraInfo. ``subscribe=False``
        leaves that to ``subscribe()`` (a managed node subscribes on activate).
        """
        p = params
        self.node = node
        self.name = name
        self._clock_ns = clock_ns
        self._on_frame = on_frame
        self.last_frame_monotonic: float | None = None
        input_kind = input_kind or p.image.input
        depth = p.depth.enabled if depth is None else depth
        self.history: FrameHistory[StoredMessage] = FrameHistory(
            max_frames=p.image.history_frames,
            max_bytes=int(p.image.history_mb * 1024 * 1024), clock=clock_ns)
        # auto (the default): the colour stream follows its publishers, like depth; a
        # best-effort reader of a reliable camera between processes loses most large frames.
        follow_colour = p.image.qos_reliability == "auto"
        qos = QoSProfile(
            history=HistoryPolicy.KEEP_LAST, depth=p.image.qos_depth,
            reliability=ReliabilityPolicy.BEST_EFFORT
            if p.image.qos_reliability == "best_effort" else ReliabilityPolicy.RELIABLE)
        # raw=True: the callback receives the serialized bytes, so ingest costs a stamp read
        # instead of a full deserialization of every 6 MB frame at 30 Hz.
        self._ingest = ingest
        self.subscriptions: list[Any] = []  # one per _wanted entry, in order, once subscribed
        self._lock = threading.Lock()  # subscriptions: a QoS event may replace one
        self._wanted: list[_Wanted] = []  # what subscribe() creates
        if input_kind in ("raw", "both"):
            self._wanted.append(_Wanted(Image, node.resolve_topic_name(prefix + "image"),
                                        lambda d: self._store(d, False), qos,
                                        follow_colour, True, True))
        if input_kind in ("compressed", "both"):
            self._wanted.append(_Wanted(
                CompressedImage, node.resolve_topic_name(prefix + "image/compressed"),
                lambda d: self._store(d, True), qos, follow_colour, True, True))
        self.depth_history: FrameHistory[StoredMessage] | None = None
        self._model: CameraModel | None = None
        self._rectified = p.depth.rectified
        self._warned_distortion = False
        if depth:
            self.depth_history = FrameHistory(max_frames=p.depth.history_frames,
                                              clock=clock_ns)
            # Depth and CameraInfo always follow their publishers' reliability: a lost depth
            # frame or CameraInfo is a goal without 3D.
            follow = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=FOLLOW_QOS_DEPTH)
            self._wanted.append(_Wanted(Image, node.resolve_topic_name(prefix + "depth/image"),
                                        self._store_depth, follow, True, True, False))
            self._wanted.append(_Wanted(
                CameraInfo, node.resolve_topic_name(prefix + "camera_info"),
                self._on_camera_info, follow, True, False, False))
        if subscribe:
            self.subscribe()

    def subscribe(self) -> None:
        """Create the subscriptions (on the ingest node) unless they exist."""
        with self._lock:
            if not self.subscriptions:
                self.subscriptions = [self._create(w, self._qos(w)) for w in self._wanted]

    def unsubscribe(self) -> None:
        """Destroy the subscriptions; the histories keep what they hold."""
        with self._lock:
            for subscription in self.subscriptions:
                self._ingest.destroy_subscription(subscription)
            self.subscriptions = []

    def reliabilities(self) -> dict[str, ReliabilityPolicy]:
        """Each subscription's reliability now, by topic (read under the resubscribe lock)."""
        with self._lock:
            return {s.topic_name: s.qos_profile.reliability for s in self.subscriptions}

    def _qos(self, wanted: _Wanted) -> QoSProfile:
        if not wanted.follow:
            return wanted.qos
        return publishers_qos(self._ingest, wanted.topic, wanted.qos.depth)

    def _create(self, wanted: _Wanted, qos: QoSProfile) -> Any:
        events = on_best_effort_publisher(qos, lambda: self._to_best_effort(wanted)) \
            if wanted.follow else None
        return self._ingest.create_subscription(
            wanted.msg_type, wanted.topic, wanted.callback, qos, raw=wanted.raw,
            event_callbacks=events)

    def _to_best_effort(self, wanted: _Wanted) -> None:
        """Resubscribe ``wanted`` best effort (a reliable reader never matches such a writer).

        Called when a best-effort publisher appeared after the reliable subscription was made.
        """
        with self._lock:
            index = self._wanted.index(wanted)
            if index >= len(self.subscriptions):  # unsubscribed meanwhile
                return
            if not resubscribe_best_effort(self._ingest, self.subscriptions, index,
                                           lambda qos: self._create(wanted, qos)):
                return
        self.node.get_logger().warning(
            f"{wanted.topic}: a best-effort publisher appeared; subscribed best effort now "
            "(large frames lost on the way are then not resent)")

    @property
    def topics(self) -> str:
        """The colour topics, for messages naming the camera (depth ones are not colour)."""
        names = [w.topic for w in self._wanted if w.colour]
        return ", ".join(names) or "(no camera subscription)"

    @property
    def image_topic(self) -> str:
        """The colour topic a viewer should show, as resolved (remaps applied): raw if taken."""
        return next((w.topic for w in self._wanted if w.colour), "")

    def camera_model(self) -> CameraModel | None:
        """Return the colour camera's intrinsics from the latest CameraInfo (None before one)."""
        return self._model

    def close(self) -> None:
        """Wake and end every wait on the histories."""
        self.history.close()
        if self.depth_history is not None:
            self.depth_history.close()

    def _store(self, data: bytes, compressed: bool) -> None:
        # Header stamp read in place; a zero stamp falls back to the receipt time.
        stamp = cdr.header_stamp_ns(data) or self._clock_ns()
        self.history.append((compressed, data), stamp, nbytes=len(data))
        self.last_frame_monotonic = time.monotonic()
        self._on_frame()

    def _store_depth(self, data: bytes) -> None:
        assert self.depth_history is not None
        stamp = cdr.header_stamp_ns(data) or self._clock_ns()
        self.depth_history.append((False, data), stamp, nbytes=len(data))

    def _on_camera_info(self, info: CameraInfo) -> None:
        try:
            model = CameraModel.from_camera_info_fields(
                info.k, info.d, info.width, info.height, info.header.frame_id,
                info.distortion_model, info.p, rectified=self._rectified)
        except CosmosReasonError as e:
            self.node.get_logger().warning(f"camera_info ignored: {e.message}",
                                           throttle_duration_sec=30.0)
            return
        if model.has_distortion and not self._warned_distortion:
            self._warned_distortion = True
            self.node.get_logger().warning(
                "camera_info has non-zero distortion and depth.rectified is false: 3D "
                "positions assume a rectified colour image and are off by the lens distortion "
                "away from the image centre (use the image_rect topic and depth.rectified)")
        self._model = model


class CameraSet:
    """Every camera of the node, the default (first) one first, on one ingest node."""

    def __init__(self, node: Node, ingest: Node, params: NodeParams,
                 clock_ns: Callable[[], int], on_frame: Callable[[], None],
                 subscribe: bool = True) -> None:
        """One ``Camera`` per ``cameras.names`` entry, or the unnamed default camera.

        Depth input (``depth.enabled``) belongs to the default camera alone: 3D lifting is
        the default camera's (docs/INTERFACES.md, "Several cameras in one goal"). So does
        ``on_frame`` (it wakes the prefill worker, which prefills the default camera's frames).
        """
        names = params.cameras.names
        inputs = params.cameras.inputs or ("",) * len(names)
        self.named = bool(names)
        if not names:
            cameras = [Camera(node, ingest, params, clock_ns, on_frame, subscribe=subscribe)]
        else:
            cameras = [Camera(node, ingest, params, clock_ns,
                              on_frame if i == 0 else _no_wake, name=name,
                              prefix=f"{name}/", input_kind=kind,
                              depth=params.depth.enabled and i == 0, subscribe=subscribe)
                       for i, (name, kind) in enumerate(zip(names, inputs, strict=True))]
        self.by_name: dict[str, Camera] = {c.name: c for c in cameras}
        self.default = cameras[0]

    def log_limits(self, logger: Any, params: NodeParams, images_per_request: int) -> None:
        """Say which cameras the node serves, and when the engine takes fewer images."""
        if not self.named:
            return
        logger.info("cameras: " + ", ".join(f"{c.name} ({c.topics})" for c in self)
                    + f"; max_skew_s={params.cameras.max_skew_s:g} "
                    f"images_per_request={images_per_request}")
        if images_per_request < len(self):
            logger.warning(
                f"engine.limit_mm_per_prompt={params.engine.limit_mm_per_prompt} takes "
                f"{images_per_request} image(s) per prompt for {len(self)} cameras: goals "
                f"naming more than {images_per_request} camera(s) are refused (BAD_REQUEST)")

    def __iter__(self) -> Iterator[Camera]:
        """Iterate over the cameras, the default one first."""
        return iter(self.by_name.values())

    def __len__(self) -> int:
        """Return the number of cameras."""
        return len(self.by_name)

    @property
    def histories(self) -> Mapping[str, FrameHistory[StoredMessage]]:
        """Name -> colour history, the default camera first (``GoalPipeline.for_cameras``)."""
        return {name: camera.history for name, camera in self.by_name.items()}

    @property
    def source_name(self) -> str:
        """How error messages name the default camera: its topics (and name, if named)."""
        topics = self.default.topics
        return f"{self.default.name} ({topics})" if self.named else topics

    def subscribe(self, on: bool = True) -> None:
        """Subscribe every camera (``on``), or destroy every subscription."""
        for camera in self:
            if on:
                camera.subscribe()
            else:
                camera.unsubscribe()

    def close(self) -> None:
        """Wake and end every wait on every camera's histories."""
        for camera in self:
            camera.close()


def _no_wake() -> None:
    """``on_frame`` of cameras other than the default one: nothing to wake."""
