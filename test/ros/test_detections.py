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
from cosmos_reason_ros.ros.detections import (  # noqa: E402
    boxes_left_out,
    detection_id,
    detection_score,
    is_detection,
    load_vision_msgs,
    to_detection_array,
)

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


GOAL_ID = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"  # hex UUID, as the node fills goal_id


def result_with_boxes() -> ReasoningResult:
    """A goal's result: scored, degenerate, unlabelled and unscored, and a repeated label."""
    msg = ReasoningResult(goal_id=GOAL_ID, origin="goal")
    msg.header = Header(stamp=Time(sec=1_700_000_000, nanosec=123_456_789), frame_id="camera")
    msg.boxes = [
        Box2D(label="red cup", score=0.75, x_min=10.0, y_min=20.0, x_max=110.0, y_max=70.0),
        Box2D(label="", score=math.nan, x_min=300.5, y_min=0.0, x_max=300.5, y_max=40.0,
              degenerate=True),
        Box2D(label="", score=math.nan, x_min=200.0, y_min=100.0, x_max=260.0, y_max=180.0),
        Box2D(label="red cup", score=math.nan, x_min=400.0, y_min=50.0, x_max=450.0,
              y_max=90.0),
    ]
    return msg


# --- tests ---------------------------------------------------------------------------------


def test_one_detection_per_non_degenerate_box_with_centre_size_label_and_score():
    array = to_detection_array(result_with_boxes(), STAND_IN)
    assert isinstance(array, Detection2DArray)
    assert len(array.detections) == 3
    cup, unlabelled, second_cup = array.detections
    assert (cup.bbox.center.position.x, cup.bbox.center.position.y) == (60.0, 45.0)
    assert (cup.bbox.size_x, cup.bbox.size_y) == (100.0, 50.0)
    assert cup.bbox.center.theta == 0.0
    assert len(cup.results) == 1
    assert cup.results[0].hypothesis.class_id == "red cup"
    assert cup.results[0].hypothesis.score == pytest.approx(0.75)
    assert (unlabelled.bbox.center.position.x, unlabelled.bbox.size_x) == (230.0, 60.0)
    assert unlabelled.results[0].hypothesis.class_id == ""
    assert second_cup.results[0].hypothesis.class_id == "red cup"


def test_box_without_a_score_gets_one_and_a_scored_box_keeps_its_score():
    # The model asserted the object without a confidence: 1.0, so score filters keep it.
    scores = [d.results[0].hypothesis.score
              for d in to_detection_array(result_with_boxes(), STAND_IN).detections]
    assert scores == [pytest.approx(0.75), 1.0, 1.0]
    assert detection_score(Box2D(score=0.0)) == 0.0  # a real 0 stays 0
    assert detection_score(Box2D(score=math.inf)) == 1.0  # not a score either


def test_degenerate_boxes_stay_out_of_detections_and_are_counted():
    msg = result_with_boxes()
    # Zero height without the flag (another producer): no detection either.
    msg.boxes.append(Box2D(label="plate", score=0.5, x_min=5.0, y_min=9.0, x_max=50.0,
                           y_max=9.0))
    array = to_detection_array(msg, STAND_IN)
    assert all(d.bbox.size_x > 0 and d.bbox.size_y > 0 for d in array.detections)
    assert [d.id for d in array.detections] == [f"{GOAL_ID}/0", f"{GOAL_ID}/2", f"{GOAL_ID}/3"]
    assert boxes_left_out(msg) == 2
    assert len(msg.boxes) == 5 and msg.boxes[1].degenerate  # the result keeps them
    assert [is_detection(b) for b in msg.boxes] == [True, False, True, True, False]
    assert boxes_left_out(ReasoningResult()) == 0


def test_ids_are_goal_id_and_box_index_unique_even_for_repeated_labels():
    msg = result_with_boxes()
    detections = to_detection_array(msg, STAND_IN).detections
    assert len({d.id for d in detections}) == len(detections) == 3
    for detection in detections:
        goal_id, index = detection.id.split("/")
        assert goal_id == GOAL_ID
        box = msg.boxes[int(index)]  # the id finds the box in ~/results
        assert box.label == detection.results[0].hypothesis.class_id
        assert (box.x_max + box.x_min) / 2 == detection.bbox.center.position.x


def test_periodic_result_ids_use_origin_and_source_stamp():
    msg = result_with_boxes()
    msg.goal_id, msg.origin = "", "periodic"
    msg.header.stamp = Time(sec=1_700_000_000, nanosec=123)
    ids = [d.id for d in to_detection_array(msg, STAND_IN).detections]
    assert ids == ["periodic/1700000000.000000123/0", "periodic/1700000000.000000123/2",
                   "periodic/1700000000.000000123/3"]
    msg.origin = ""
    assert detection_id(msg, 4) == "periodic/1700000000.000000123/4"


def test_headers_are_copies_of_the_source_image_header():
    msg = result_with_boxes()
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
