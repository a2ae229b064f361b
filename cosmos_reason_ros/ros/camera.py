"""One camera's inputs: colour (raw and/or compressed), registered depth and CameraInfo.

Subscriptions live on the node's ingest node (callbacks there do no decoding): colour and
depth messages are stored serialized in bounded histories, stamped with their header stamp
read in place; CameraInfo, small, is kept as the latest ``CameraModel``. Topic names are
resolved with the main node's remaps (``image``, ``image/compressed``, ``depth/image``,
``camera_info``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rclpy.node import Node
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from sensor_msgs.msg import CameraInfo, CompressedImage, Image

from cosmos_reason_ros.core.frames import FrameHistory
from cosmos_reason_ros.core.params import NodeParams
from cosmos_reason_ros.core.rgbd import CameraModel
from cosmos_reason_ros.core.types import CosmosReasonError
from cosmos_reason_ros.ros import cdr

StoredMessage = tuple[bool, bytes]  # (compressed, serialized bytes)


class Camera:
    """A camera's histories and subscriptions (the node's default camera today)."""

    def __init__(self, node: Node, ingest: Node, params: NodeParams,
                 clock_ns: Callable[[], int], on_frame: Callable[[], None]) -> None:
        """Subscribe on ``ingest`` per the ``image.*`` and ``depth.*`` parameters."""
        p = params
        self.node = node
        self._clock_ns = clock_ns
        self._on_frame = on_frame
        self.last_frame_monotonic: float | None = None
        self.history: FrameHistory[StoredMessage] = FrameHistory(
            max_frames=p.image.history_frames,
            max_bytes=int(p.image.history_mb * 1024 * 1024), clock=clock_ns)
        qos = QoSProfile(
            history=HistoryPolicy.KEEP_LAST, depth=p.image.qos_depth,
            reliability=ReliabilityPolicy.BEST_EFFORT
            if p.image.qos_reliability == "best_effort" else ReliabilityPolicy.RELIABLE)
        # raw=True: the callback receives the serialized bytes, so ingest costs a stamp read
        # instead of a full deserialization of every 6 MB frame at 30 Hz.
        self.subscriptions = []
        if p.image.input in ("raw", "both"):
            self.subscriptions.append(ingest.create_subscription(
                Image, node.resolve_topic_name("image"), lambda d: self._store(d, False), qos,
                raw=True))
        if p.image.input in ("compressed", "both"):
            self.subscriptions.append(ingest.create_subscription(
                CompressedImage, node.resolve_topic_name("image/compressed"),
                lambda d: self._store(d, True), qos, raw=True))
        self.depth_history: FrameHistory[StoredMessage] | None = None
        self._model: CameraModel | None = None
        self._rectified = p.depth.rectified
        self._warned_distortion = False
        if p.depth.enabled:
            self.depth_history = FrameHistory(max_frames=p.depth.history_frames,
                                              clock=clock_ns)
            # Depth with the colour stream's QoS (a driver publishes both alike); CameraInfo
            # as drivers publish it, sensor data QoS.
            self.subscriptions.append(ingest.create_subscription(
                Image, node.resolve_topic_name("depth/image"), self._store_depth, qos,
                raw=True))
            self.subscriptions.append(ingest.create_subscription(
                CameraInfo, node.resolve_topic_name("camera_info"), self._on_camera_info,
                qos_profile_sensor_data))

    @property
    def topics(self) -> str:
        """The colour topics, for messages naming the camera."""
        names = [s.topic_name for s in self.subscriptions
                 if not s.topic_name.endswith(("depth/image", "camera_info"))]
        return ", ".join(names) or "(no camera subscription)"

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
