"""ReasoningResult -> vision_msgs/Detection2DArray, and the lazy, optional vision_msgs import.

vision_msgs is NOT installable on these machines, so the conversion is tested against a
STAND-IN: plain Python classes below that copy the vision_msgs 4.x (Humble, Jazzy, Kilted)
message layout field for field, including rosidl's behaviour that matters here (a fixed field
set, type-checked assignment, nested messages constructed by default, sequences as lists):

    Detection2DArray:          std_msgs/Header header, Detection2D[] detections
    Detection2D:               std_msgs/Header header, ObjectHypothesisWithPose[] results,
                               BoundingBox2D bbox, string id
    ObjectHypothesisWithPose:  ObjectHypothesis hypothesis, geometry_msgs/PoseWithCovariance pose
    ObjectHypothesis:          string class_id, float64 score
    BoundingBox2D:             vision_msgs/Pose2D center, float64 size_x, float64 size_y
    Pose2D:                    vision_msgs/Point2D position, float64 theta
    Point2D:                   float64 x, float64 y

(ros-perception/vision_msgs, vision_msgs/msg/*.msg at 4.x; 3.x had ``geometry_msgs/Pose2D
center`` with ``center.x``, which this package does not target.) ``std_msgs/Header`` and
``geometry_msgs/PoseWithCovariance`` are the real messages. Where vision_msgs is installed,
the node's own tests exercise the real classes.
"""

from __future__ import annotations

import math
import sys
import types
from typing import Any, ClassVar

import pytest

pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
from builtin_interfaces.msg import Time  # noqa: E402
from geometry_msgs.msg import PoseWithCovariance  # noqa: E402
from std_msgs.msg import Header  # noqa: E402

from cosmos_reason_interfaces.msg import Box2D, ReasoningResult  # noqa: E402
from cosmos_reason_ros.ros.detections import load_vision_msgs, to_detection_array  # noqa: E402

pytestmark = pytest.mark.ros


# --- stand-in for vision_msgs 4.x ----------------------------------------------------------


class _StandInMessage:
    """rosidl-like: only declared fields, type-checked assignment, nested defaults."""

    FIELDS: ClassVar[dict[str, Any]] = {}  # name -> type, or [type] for a sequence

    def __init__(self, **kwargs: Any) -> None:
        for name, kind in self.FIELDS.items():
            object.__setattr__(self, name, [] if isinstance(kind, list) else kind())
        for name, value in kwargs.items():
            setattr(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self.FIELDS:
            raise AttributeError(f"{type(self).__name__} has no field {name!r}")
        kind = self.FIELDS[name]
        if isinstance(kind, list):
            assert all(isinstance(v, kind[0]) for v in value), f"{name}: must hold {kind[0]}"
            value = list(value)
        else:
            assert isinstance(value, kind), f"{name}: must be {kind.__name__}, got {value!r}"
        object.__setattr__(self, name, value)


class Point2D(_StandInMessage):
    FIELDS: ClassVar = {"x": float, "y": float}


class Pose2D(_StandInMessage):
    FIELDS: ClassVar = {"position": Point2D, "theta": float}


class BoundingBox2D(_StandInMessage):
    FIELDS: ClassVar = {"center": Pose2D, "size_x": float, "size_y": float}


class ObjectHypothesis(_StandInMessage):
    FIELDS: ClassVar = {"class_id": str, "score": float}


class ObjectHypothesisWithPose(_StandInMessage):
    FIELDS: ClassVar = {"hypothesis": ObjectHypothesis, "pose": PoseWithCovariance}


class Detection2D(_StandInMessage):
    FIELDS: ClassVar = {"header": Header, "results": [ObjectHypothesisWithPose],
                        "bbox": BoundingBox2D, "id": str}


class Detection2DArray(_StandInMessage):
    FIELDS: ClassVar = {"header": Header, "detections": [Detection2D]}


STAND_IN = types.SimpleNamespace(
    Point2D=Point2D, Pose2D=Pose2D, BoundingBox2D=BoundingBox2D,
    ObjectHypothesis=ObjectHypothesis, ObjectHypothesisWithPose=ObjectHypothesisWithPose,
    Detection2D=Detection2D, Detection2DArray=Detection2DArray,
)


def result_with_two_boxes() -> ReasoningResult:
    msg = ReasoningResult()
    msg.header = Header(stamp=Time(sec=1_700_000_000, nanosec=123_456_789), frame_id="camera")
    msg.boxes = [
        Box2D(label="red cup", score=0.75, x_min=10.0, y_min=20.0, x_max=110.0, y_max=70.0),
        Box2D(label="", score=math.nan, x_min=300.5, y_min=0.0, x_max=300.5, y_max=40.0,
              degenerate=True),
    ]
    return msg


# --- tests ---------------------------------------------------------------------------------


def test_one_detection_per_box_with_centre_size_label_and_score():
    array = to_detection_array(result_with_two_boxes(), STAND_IN)
    assert isinstance(array, Detection2DArray)
    assert len(array.detections) == 2
    cup, unlabelled = array.detections
    assert (cup.bbox.center.position.x, cup.bbox.center.position.y) == (60.0, 45.0)
    assert (cup.bbox.size_x, cup.bbox.size_y) == (100.0, 50.0)
    assert cup.bbox.center.theta == 0.0
    assert len(cup.results) == 1
    assert cup.results[0].hypothesis.class_id == "red cup"
    assert cup.results[0].hypothesis.score == pytest.approx(0.75)
    assert cup.id == "red cup"
    # A degenerate box is kept (zero width), an empty label falls back to the index.
    assert (unlabelled.bbox.center.position.x, unlabelled.bbox.size_x) == (300.5, 0.0)
    assert unlabelled.bbox.size_y == 40.0
    assert unlabelled.id == "1" and unlabelled.results[0].hypothesis.class_id == ""


def test_nan_score_becomes_zero():
    array = to_detection_array(result_with_two_boxes(), STAND_IN)
    score = array.detections[1].results[0].hypothesis.score
    assert score == 0.0 and not math.isnan(score)


def test_headers_are_copies_of_the_source_image_header():
    msg = result_with_two_boxes()
    array = to_detection_array(msg, STAND_IN)
    for header in [array.header] + [d.header for d in array.detections]:
        assert header == msg.header
        assert header is not msg.header  # later edits to the result do not leak in
    msg.header.frame_id = "changed"
    assert array.header.frame_id == "camera"


def test_result_without_boxes_gives_an_empty_array_with_the_header():
    msg = ReasoningResult()
    msg.header.frame_id = "camera"
    array = to_detection_array(msg, STAND_IN)
    assert array.detections == [] and array.header.frame_id == "camera"


def test_load_vision_msgs_matches_what_is_installed():
    try:
        import vision_msgs.msg as installed  # noqa: F401
    except ImportError:
        assert load_vision_msgs() is None  # the case on these machines
    else:
        assert load_vision_msgs() is installed


def test_load_vision_msgs_returns_none_when_the_import_fails(monkeypatch):
    monkeypatch.setitem(sys.modules, "vision_msgs", None)  # makes `import` raise ImportError
    assert load_vision_msgs() is None


def test_load_vision_msgs_returns_the_msg_module_when_present(monkeypatch):
    package = types.ModuleType("vision_msgs")
    msg = types.ModuleType("vision_msgs.msg")
    msg.Detection2DArray = Detection2DArray
    package.msg = msg
    monkeypatch.setitem(sys.modules, "vision_msgs", package)
    monkeypatch.setitem(sys.modules, "vision_msgs.msg", msg)
    assert load_vision_msgs() is msg
