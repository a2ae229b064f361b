"""``ReasoningResult`` boxes -> ``vision_msgs/Detection2DArray`` (for ``~/detections``).

``vision_msgs`` is optional: it is imported lazily by :func:`load_vision_msgs`, and the node
publishes detections only when it is installed. The layout targeted is vision_msgs 4.x (Humble
and later), where ``BoundingBox2D.center`` is a ``vision_msgs/Pose2D`` with ``position.x/y``
and ``theta`` (3.x used ``geometry_msgs/Pose2D`` with ``x``/``y`` directly), and a class is
``ObjectHypothesisWithPose.hypothesis.class_id`` (a string).
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

from std_msgs.msg import Header

from cosmos_reason_interfaces.msg import Box2D, ReasoningResult
from cosmos_reason_ros.ros.messages import source_header


def load_vision_msgs() -> ModuleType | None:
    """Return the ``vision_msgs.msg`` module, or ``None`` when vision_msgs is not installed.

    Never raises; the caller logs the one-time "not installed, ~/detections disabled" line
    through its node logger.
    """
    try:
        import vision_msgs.msg
    except ImportError:
        return None
    return vision_msgs.msg


def is_detection(box: Box2D) -> bool:
    """Tell whether ``box`` goes to ``vision_msgs`` outputs: it needs a width and a height.

    A degenerate box (zero width or height after clamping; the parser sets ``degenerate``)
    stays in ``~/results`` with its flag, because the answer did name it, but a zero-size
    ``BoundingBox2D`` locates nothing for a consumer to crop, track or lift. The size test also
    catches such boxes from producers that did not set the flag.
    """
    return (not box.degenerate and float(box.x_max) > float(box.x_min)
            and float(box.y_max) > float(box.y_min))


def boxes_left_out(result_msg: ReasoningResult) -> int:
    """How many of ``result_msg``'s boxes :func:`to_detection_array` leaves out (degenerate).

    For the node's ``/diagnostics`` count; counted per result, whether or not vision_msgs is
    installed, so the figure means the same on every machine.
    """
    return sum(1 for box in result_msg.boxes if not is_detection(box))


def detection_score(box: Box2D) -> float:
    """Return the ``ObjectHypothesis.score`` for ``box``: the model's, or 1.0 when it gave none.

    ``Box2D.score`` is NaN when the model named the object without a confidence (Cosmos-Reason
    rarely gives one). ``ObjectHypothesis.score`` has no "unknown", and consumers threshold on
    it or keep the best one (Isaac ROS's Detection2DArrayFilter does), so 0.0 would drop every
    unscored box: the model asserted the object, so it counts as certain. The raw score (or its
    absence) stays in ``~/results``.
    """
    score = float(box.score)
    return score if math.isfinite(score) else 1.0


def detection_id(result_msg: ReasoningResult, index: int) -> str:
    """``Detection2D.id`` of box ``index``: ``<goal_id>/<index>``, one rule for every box.

    ``index`` is the box's position in ``result_msg.boxes``, so the id also finds the box (and
    its raw score and flag) in ``~/results``; left-out boxes leave gaps, never renumbering.
    Results without a goal id (periodic runs) use ``<origin>/<sec>.<nanosec>/<index>`` with the
    source image stamp (``periodic/1700000000.000000123/0``). Unique within a message; a VLM
    does not track objects, so an id names one answer's box, not a track.
    """
    if result_msg.goal_id:
        return f"{result_msg.goal_id}/{index}"
    stamp = result_msg.header.stamp
    return f"{result_msg.origin or 'periodic'}/{stamp.sec}.{stamp.nanosec:09d}/{index}"


def to_detection_array(result_msg: ReasoningResult, vision_msgs_module: Any,
                       camera: str | None = None, header: Header | None = None) -> Any:
    """Build a ``Detection2DArray`` with one ``Detection2D`` per non-degenerate box.

    Every header is a copy of ``header``, by default the result's (the source image's stamp
    and frame_id), so detections line up with the image they were found in. With ``camera``
    only that camera's boxes are in (give that camera's frame header: one array, one image).
    Per box: ``bbox`` centre and size in original-image pixels (axis-aligned, ``theta`` 0);
    one hypothesis with ``class_id`` = the label and ``score`` from :func:`detection_score`;
    ``id`` from :func:`detection_id` (its index in all of ``result_msg.boxes``). Degenerate
    boxes are left out (:func:`is_detection`, counted by :func:`boxes_left_out`).
    """
    vm = vision_msgs_module
    header = result_msg.header if header is None else header
    array = vm.Detection2DArray()
    array.header = source_header(header)
    detections = []
    for index, box in enumerate(result_msg.boxes):
        if not is_detection(box) or (camera is not None and box.camera != camera):
            continue
        detection = vm.Detection2D()
        detection.header = source_header(header)
        detection.bbox.center.position.x = (float(box.x_min) + float(box.x_max)) / 2.0
        detection.bbox.center.position.y = (float(box.y_min) + float(box.y_max)) / 2.0
        detection.bbox.center.theta = 0.0
        detection.bbox.size_x = float(box.x_max) - float(box.x_min)
        detection.bbox.size_y = float(box.y_max) - float(box.y_min)
        hypothesis = vm.ObjectHypothesisWithPose()
        hypothesis.hypothesis.class_id = box.label
        hypothesis.hypothesis.score = detection_score(box)
        detection.results = [hypothesis]
        detection.id = detection_id(result_msg, index)
        detections.append(detection)
    array.detections = detections
    return array


def header_3d(result_msg: ReasoningResult) -> Any:
    """Return the header of 3D outputs: the source image stamp, the 3D positions' frame."""
    header = source_header(result_msg.header)
    header.frame_id = result_msg.frame_3d or header.frame_id
    return header


def to_detection3d_array(result_msg: ReasoningResult, vision_msgs_module: Any) -> Any:
    """Build a ``Detection3DArray``: one ``Detection3D`` per lifted, non-degenerate box.

    Same rules as :func:`to_detection_array` (ids, scores, degenerate boxes out); boxes
    without a valid 3D position are left out too. ``bbox`` is the box's pose in ``frame_3d``
    (position and orientation, ``Position3D.orientation``: the camera's optical axes) and its
    size along its own axes, metres; the hypothesis pose is the same pose.
    """
    vm = vision_msgs_module
    array = vm.Detection3DArray()
    array.header = header_3d(result_msg)
    detections = []
    for index, box in enumerate(result_msg.boxes):
        position = box.position_3d
        if not is_detection(box) or not position.valid:
            continue
        detection = vm.Detection3D()
        detection.header = header_3d(result_msg)
        detection.bbox.center.position = position.position
        detection.bbox.center.orientation = position.orientation
        detection.bbox.size = position.size
        hypothesis = vm.ObjectHypothesisWithPose()
        hypothesis.hypothesis.class_id = box.label
        hypothesis.hypothesis.score = detection_score(box)
        hypothesis.pose.pose.position = position.position
        hypothesis.pose.pose.orientation = position.orientation
        detection.results = [hypothesis]
        detection.id = detection_id(result_msg, index)
        detections.append(detection)
    array.detections = detections
    return array
