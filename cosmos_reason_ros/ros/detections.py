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

from cosmos_reason_interfaces.msg import ReasoningResult
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


def to_detection_array(result_msg: ReasoningResult, vision_msgs_module: Any) -> Any:
    """Build a ``Detection2DArray`` with one ``Detection2D`` per box of ``result_msg``.

    Every header is a copy of the result's header (the source image's stamp and frame_id), so
    detections line up with the image they were found in. Per box: ``bbox`` centre and size in
    original-image pixels (axis-aligned, ``theta`` 0); one hypothesis with ``class_id`` = the
    label and ``score`` = the model's confidence; ``id`` = the label, or the box index when the
    label is empty. A VLM does not track objects, so ``id`` names what was found, not a track;
    two boxes with one label share it.

    ``Box2D.score`` is NaN when the model gave no confidence (Cosmos-Reason rarely does);
    ``ObjectHypothesis.score`` has no "unknown" value, so NaN becomes 0.0. Consumers that
    threshold on score will therefore drop unscored boxes; the real score (or its absence)
    stays in ``~/results``.
    """
    vm = vision_msgs_module
    array = vm.Detection2DArray()
    array.header = source_header(result_msg.header)
    detections = []
    for index, box in enumerate(result_msg.boxes):
        detection = vm.Detection2D()
        detection.header = source_header(result_msg.header)
        detection.bbox.center.position.x = (float(box.x_min) + float(box.x_max)) / 2.0
        detection.bbox.center.position.y = (float(box.y_min) + float(box.y_max)) / 2.0
        detection.bbox.center.theta = 0.0
        detection.bbox.size_x = float(box.x_max) - float(box.x_min)
        detection.bbox.size_y = float(box.y_max) - float(box.y_min)
        hypothesis = vm.ObjectHypothesisWithPose()
        hypothesis.hypothesis.class_id = box.label
        score = float(box.score)
        hypothesis.hypothesis.score = score if math.isfinite(score) else 0.0
        detection.results = [hypothesis]
        detection.id = box.label or str(index)
        detections.append(detection)
    array.detections = detections
    return array
