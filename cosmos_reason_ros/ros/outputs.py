"""What the node publishes besides action results: ``~/results``, annotated images, detections.

Drawing and vision_msgs are separate concerns from answering (as in yolo_ros): the annotated
image is drawn only while someone subscribes, and detections only when vision_msgs exists.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from geometry_msgs.msg import PointStamped, PoseStamped
from rclpy.node import Node
from sensor_msgs.msg import Image
from std_msgs.msg import Header
from visualization_msgs.msg import MarkerArray

from cosmos_reason_interfaces.msg import ReasoningResult
from cosmos_reason_ros.core.annotate import draw_annotations
from cosmos_reason_ros.core.answer3d import DepthLifter
from cosmos_reason_ros.core.cameras import DEFAULT_CAMERA
from cosmos_reason_ros.core.pipeline import Media
from cosmos_reason_ros.core.types import CosmosReasonError, ErrorCode
from cosmos_reason_ros.ros import messages
from cosmos_reason_ros.ros.detections import (
    boxes_left_out,
    is_detection,
    load_vision_msgs,
    to_detection3d_array,
    to_detection_array,
)
from cosmos_reason_ros.ros.markers import pose_target, target_point, target_pose, to_markers

LIFT_OK, LIFT_TF_FAILED = ReasoningResult.LIFT_OK, ReasoningResult.LIFT_TF_FAILED

# ~/results is reliable keep-last: a burst (e.g. 100 goals at once, most refused OVERLOADED)
# must fit in the writer's history until a slow subscriber acknowledges it, or results drop.
RESULTS_QUEUE_DEPTH = 256


class Outputs:
    """The node's result publishers."""

    def __init__(self, node: Node, depth: bool = False, default_camera: str = DEFAULT_CAMERA,
                 cameras: tuple[str, ...] = (), lifter: DepthLifter | None = None) -> None:
        """Create ``~/results``, ``~/annotated_image``, with vision_msgs ``~/detections``.

        ``~/annotated_image`` and ``~/detections`` show the ``default_camera``'s image (and
        an image carried in the goal). Each of the named ``cameras`` also gets
        ``~/<camera>/annotated_image`` and ``~/<camera>/detections``. With ``depth`` (3D
        lifting on, the default camera's) also ``~/markers``, ``~/target_point``,
        ``~/target_pose`` and, with vision_msgs, ``~/detections_3d``. ``lifter`` (the goal
        pipeline's) reads the surface normal for ``~/target_pose`` from the answer's depth frame.
        """
        self.node = node
        self._lifter = lifter
        self.default_camera = default_camera
        self.detections_left_out = 0  # degenerate boxes kept out of detections (diagnostics)
        self._lock = threading.Lock()
        self.results = node.create_publisher(ReasoningResult, "~/results", RESULTS_QUEUE_DEPTH)
        self.annotated = node.create_publisher(Image, "~/annotated_image", 2)
        self.camera_annotated = {name: node.create_publisher(Image, f"~/{name}/annotated_image",
                                                             2) for name in cameras}
        self._vision_msgs = load_vision_msgs()
        self.detections = None
        self.camera_detections: dict[str, Any] = {}
        if self._vision_msgs is None:
            node.get_logger().info("vision_msgs is not installed: ~/detections is off")
        else:
            self.detections = node.create_publisher(
                self._vision_msgs.Detection2DArray, "~/detections", 10)
            self.camera_detections = {name: node.create_publisher(
                self._vision_msgs.Detection2DArray, f"~/{name}/detections", 10)
                for name in cameras}
        # 3D outputs exist only with depth input (docs/INTERFACES.md, "3D").
        self.detections_3d = self.markers = self.target_point = self.target_pose = None
        if depth:
            if self._vision_msgs is not None:
                self.detections_3d = node.create_publisher(
                    self._vision_msgs.Detection3DArray, "~/detections_3d", 10)
            self.markers = node.create_publisher(MarkerArray, "~/markers", 10)
            self.target_point = node.create_publisher(PointStamped, "~/target_point", 10)
            self.target_pose = node.create_publisher(PoseStamped, "~/target_pose", 10)

    def _publish_3d(self, msg: ReasoningResult) -> None:
        # Markers for every answer, lifted or not: each MarkerArray starts with DELETEALL, so
        # an answer that lifts nothing (a question, no depth, another camera) clears the
        # previous answer's cubes instead of leaving them in RViz as if they were its own.
        if self.markers is not None:
            self.markers.publish(to_markers(msg))
        if msg.lift_code not in (LIFT_OK, LIFT_TF_FAILED):
            return
        if self.detections_3d is not None and msg.boxes:
            self.detections_3d.publish(to_detection3d_array(msg, self._vision_msgs))
        target = target_point(msg) if self.target_point is not None else None
        if target is not None:
            self.target_point.publish(target)
        if self.target_pose is not None:
            self._publish_pose(msg)

    def _publish_pose(self, msg: ReasoningResult) -> None:
        """Publish ``~/target_pose`` when the surface at the target gives a normal.

        The normal is read from the depth frame the answer was lifted with, through the
        pipeline's lifter (it holds the depth history and CameraInfo); a patch too sparse for
        a plane publishes no pose (a NaN-free topic) and says why.
        """
        item = pose_target(msg)
        lifter = self._lifter
        if item is None or lifter is None:
            return
        position3d, u, v = item
        stamp_ns = msg.depth_stamp.sec * 1_000_000_000 + msg.depth_stamp.nanosec
        normal = lifter.normal_at(stamp_ns, msg.image_width, u, v)
        if not normal.valid:
            self.node.get_logger().warning(
                f"~/target_pose not published: {normal.reason}", throttle_duration_sec=10.0)
            return
        self.target_pose.publish(target_pose(msg, position3d, normal.orientation))

    def publish_result(self, msg: ReasoningResult) -> None:
        """Publish on ``~/results`` (every result, refusals included) while the context lives."""
        if self.node.context.ok():
            self.results.publish(msg)

    def publish_extras(self, msg: ReasoningResult, media: Media | None) -> None:
        """Publish an answer's detections, 3D outputs and, where someone subscribes, drawings.

        Per camera of the result: its boxes and drawing, with its own frame's header. The
        default camera's go on ``~/detections`` and ``~/annotated_image`` (so does an image
        carried in the goal, which has no camera), each named camera's on its own topics.
        """
        left_out = boxes_left_out(msg) if msg.boxes else 0
        with self._lock:  # goal threads and the periodic thread publish concurrently
            self.detections_left_out += left_out
        self._publish_3d(msg)
        views = media.cameras if media is not None else ()
        if not views and self.detections is not None and len(msg.boxes) > left_out:
            self.detections.publish(to_detection_array(msg, self._vision_msgs))
        for view in views:
            detections = [p for p in (self.camera_detections.get(view.camera),
                                      self.detections if view.camera == self.default_camera
                                      else None) if p is not None]
            if detections and any(b.camera == view.camera and is_detection(b)
                                  for b in msg.boxes):
                header = messages.camera_frame(view).header  # this camera's frame
                array = to_detection_array(msg, self._vision_msgs, view.camera, header)
                for publisher in detections:
                    publisher.publish(array)
        self.publish_drawings(msg, media)

    def publish_drawings(self, msg: ReasoningResult, media: Media | None,
                         answered: bool = True) -> None:
        """Publish each frame of the goal with its items drawn, where someone subscribes.

        A goal that ended without an answer (cancelled, timed out, failed after its frames
        were taken) gets its frames too, titled with its code and nothing drawn on them: a
        viewer (the console, rqt) then shows what every goal looked at, not only the answered.
        """
        if media is None or not self.node.context.ok():
            return
        drawing = msg if answered else ReasoningResult(answer=ErrorCode(msg.error_code).name)
        if not media.cameras:  # the goal's own image: everything is about it
            if self.annotated.get_subscription_count() > 0:
                drawn = self._draw(media.original_rgb, drawing, None, msg.header)
                if drawn is not None:
                    self.annotated.publish(drawn)
            return
        for view in media.cameras:
            annotated = [p for p in (self.camera_annotated.get(view.camera),
                                     self.annotated if view.camera == self.default_camera
                                     else None)
                         if p is not None and p.get_subscription_count() > 0]
            if not annotated:
                continue
            header = messages.camera_frame(view).header  # this camera's frame
            drawn = self._draw(view.original_rgb, drawing, view.camera, header)
            for publisher in annotated if drawn is not None else ():
                publisher.publish(drawn)

    def _draw(self, original_rgb: Callable[[], Any], msg: ReasoningResult, camera: str | None,
              header: Header) -> Image | None:
        """Draw ``msg``'s items of ``camera`` (None: all) on the frame (None if it fails)."""
        def mine(items: Any) -> list[Any]:
            return [i for i in items if camera is None or i.camera == camera]

        try:
            drawn = draw_annotations(original_rgb(), mine(msg.boxes), mine(msg.points),
                                     mine(msg.trajectories), title=msg.answer)
        except CosmosReasonError as e:  # a drawing problem must not fail the goal
            self.node.get_logger().warning(f"annotated image skipped: {e.message}")
            return None
        return messages.rgb_image(drawn, messages.source_header(header))
