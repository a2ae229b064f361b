"""What the node publishes besides action results: ``~/results``, annotated image, detections.

Drawing and vision_msgs are separate concerns from answering (as in yolo_ros): the annotated
image is drawn only while someone subscribes, and detections only when vision_msgs exists.
"""

from __future__ import annotations

import threading

from geometry_msgs.msg import PointStamped
from rclpy.node import Node
from sensor_msgs.msg import Image
from visualization_msgs.msg import MarkerArray

from cosmos_reason_interfaces.msg import ReasoningResult
from cosmos_reason_ros.core.annotate import draw_annotations
from cosmos_reason_ros.core.pipeline import Media
from cosmos_reason_ros.core.types import CosmosReasonError
from cosmos_reason_ros.ros import messages
from cosmos_reason_ros.ros.detections import (
    boxes_left_out,
    load_vision_msgs,
    to_detection3d_array,
    to_detection_array,
)
from cosmos_reason_ros.ros.markers import target_point, to_markers

LIFT_OK, LIFT_TF_FAILED = ReasoningResult.LIFT_OK, ReasoningResult.LIFT_TF_FAILED

# ~/results is reliable keep-last: a burst (e.g. 100 goals at once, most refused OVERLOADED)
# must fit in the writer's history until a slow subscriber acknowledges it, or results drop.
RESULTS_QUEUE_DEPTH = 256


class Outputs:
    """The node's result publishers."""

    def __init__(self, node: Node, depth: bool = False) -> None:
        """Create ``~/results``, ``~/annotated_image``, with vision_msgs ``~/detections``.

        With ``depth`` (3D lifting on) also ``~/markers``, ``~/target_point`` and, with
        vision_msgs, ``~/detections_3d``.
        """
        self.node = node
        self.detections_left_out = 0  # degenerate boxes kept out of detections (diagnostics)
        self._lock = threading.Lock()
        self.results = node.create_publisher(ReasoningResult, "~/results", RESULTS_QUEUE_DEPTH)
        self.annotated = node.create_publisher(Image, "~/annotated_image", 2)
        self._vision_msgs = load_vision_msgs()
        self.detections = None
        if self._vision_msgs is None:
            node.get_logger().info("vision_msgs is not installed: ~/detections is off")
        else:
            self.detections = node.create_publisher(
                self._vision_msgs.Detection2DArray, "~/detections", 10)
        # 3D outputs exist only with depth input (docs/INTERFACES.md, "3D").
        self.detections_3d = self.markers = self.target_point = None
        if depth:
            if self._vision_msgs is not None:
                self.detections_3d = node.create_publisher(
                    self._vision_msgs.Detection3DArray, "~/detections_3d", 10)
            self.markers = node.create_publisher(MarkerArray, "~/markers", 10)
            self.target_point = node.create_publisher(PointStamped, "~/target_point", 10)

    def _publish_3d(self, msg: ReasoningResult) -> None:
        if self.detections_3d is not None and msg.boxes:
            self.detections_3d.publish(to_detection3d_array(msg, self._vision_msgs))
        if self.markers is not None:
            self.markers.publish(to_markers(msg))
        target = target_point(msg) if self.target_point is not None else None
        if target is not None:
            self.target_point.publish(target)

    def publish_result(self, msg: ReasoningResult) -> None:
        """Publish on ``~/results`` (every result, refusals included) while the context lives."""
        if self.node.context.ok():
            self.results.publish(msg)

    def publish_extras(self, msg: ReasoningResult, media: Media | None) -> None:
        """Publish detections, and the annotated image when someone subscribes (drawing costs)."""
        left_out = boxes_left_out(msg) if msg.boxes else 0
        with self._lock:  # goal threads and the periodic thread publish concurrently
            self.detections_left_out += left_out
        if self.detections is not None and len(msg.boxes) > left_out:
            self.detections.publish(to_detection_array(msg, self._vision_msgs))
        if msg.lift_code in (LIFT_OK, LIFT_TF_FAILED):
            self._publish_3d(msg)
        if media is None or self.annotated.get_subscription_count() == 0:
            return
        try:
            drawn = draw_annotations(media.original_rgb(), msg.boxes, msg.points,
                                     msg.trajectories, title=msg.answer)
        except CosmosReasonError as e:  # a drawing problem must not fail the goal
            self.node.get_logger().warning(f"annotated image skipped: {e.message}")
            return
        self.annotated.publish(messages.rgb_image(drawn, messages.source_header(msg.header)))
