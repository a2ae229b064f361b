"""The ``position_error`` expectation: parsing, scoring against 3D ground truth, the report."""

from __future__ import annotations

import math

import pytest

from cosmos_reason_ros.eval import report
from cosmos_reason_ros.eval.bagio import Truth3D
from cosmos_reason_ros.eval.scenario import Expectation, ScenarioError, parse_scenario
from cosmos_reason_ros.eval.scoring import lifted_positions, score, score_result

TRUTH = Truth3D("cam", {"Red Box": (0.1, 0.2, 1.0), "blue cup": (0.5, 0.2, 1.2)})


def p3(x, y, z, valid=True, status=""):
    return {"valid": valid, "position": {"x": x, "y": y, "z": z},
            "size": {"x": 0.1, "y": 0.1, "z": 0.0}, "depth_pixels": 50, "status": status}


def result(boxes=(), points=(), lift_code=1, frame="cam", message="", code=0):
    return {"error_code": code, "error_message": "", "lift_code": lift_code,
            "lift_message": message, "frame_3d": frame,
            "boxes": [{"label": label, "x_min": 0, "y_min": 0, "x_max": 1, "y_max": 1,
                       **({"position_3d": pos} if pos else {})} for label, pos in boxes],
            "points": [{"label": label, "x": 0, "y": 0, "position_3d": pos}
                       for label, pos in points]}


def expect(label="red box", threshold=0.05, informational=False):
    return Expectation("position_error", label=label, threshold=threshold,
                       informational=informational)


def test_the_best_lifted_item_with_the_label_is_scored_in_metres():
    r = result(boxes=[("red box", p3(0.1, 0.2, 1.3)), ("red box", p3(0.13, 0.24, 1.0)),
                      ("blue cup", p3(0.1, 0.2, 1.0))])  # the cup's box is not the red box
    s = score(expect(), r, truth_3d=TRUTH)
    assert s.passed and s.label == "red box"
    assert s.value == pytest.approx(0.05)  # (0.03, 0.04, 0) from the truth
    assert s.reason == ("3D error 0.050 m <= 0.05 m (box 1 at (0.130, 0.240, 1.000), truth "
                        "(0.100, 0.200, 1.000); best of 2)")
    far = score(expect(threshold=0.01), r, truth_3d=TRUTH)
    assert not far.passed and far.regression and "0.050 m > 0.01 m" in far.reason


def test_points_count_and_invalid_items_do_not():
    r = result(boxes=[("red box", p3(math.nan, math.nan, math.nan, valid=False,
                                     status="no valid depth in box"))],
               points=[("red box", p3(0.1, 0.2, 1.02))])
    s = score(expect(), r, truth_3d=TRUTH)
    assert s.passed and s.value == pytest.approx(0.02) and "(point 0 at" in s.reason
    assert lifted_positions(r) == [("point 0", (0.1, 0.2, 1.02))]
    # A position given as None (NaN in the message) is never used, even if flagged valid.
    assert lifted_positions(result(boxes=[("red box", p3(None, 0.2, 1.0))])) == []


@pytest.mark.parametrize(("r", "reason"), [
    (result(boxes=[("red box", None)], lift_code=3, message="depth frame_id='x' is not ..."),
     "not lifted to 3D (LIFT_BAD_DEPTH): depth frame_id='x' is not ..."),
    (result(boxes=[("red box", None)], lift_code=0, frame=""),
     "not lifted to 3D (LIFT_OFF): depth input off?"),
    (result(boxes=[("red box", p3(0, 0, 0, valid=False, status="no valid depth in box: 3 of "
                                   "400 pixels valid"))]),
     "no valid 3D position for 'red box' over 1 item(s): no valid depth in box: 3 of 400"),
    (result(boxes=[("blue cup", p3(0.5, 0.2, 1.2))]),
     "no box or point labelled 'red box' in the answer"),
    (result(boxes=[("red box", p3(0.1, 0.2, 1.0))], frame="base_link"),
     "positions are in frame 'base_link'; the ground truth is in 'cam'"),
])
def test_failures_say_why(r, reason):
    s = score(expect(), r, truth_3d=TRUTH)
    assert not s.passed and s.value is None
    assert s.reason.startswith(reason), s.reason


def test_missing_ground_truth_and_failed_goals():
    r = result(boxes=[("red box", p3(0.1, 0.2, 1.0))])
    assert score(expect(), r).reason == "no 3D ground truth for 'red box' at the frame used " \
                                        "(known: none)"
    s = score(expect("green cylinder"), r, truth_3d=TRUTH)
    assert "known: Red Box, blue cup" in s.reason
    failed = score(expect(informational=True), result(code=7), truth_3d=TRUTH)
    assert not failed.passed and not failed.regression and "the goal failed" in failed.reason


def test_box_iou_scores_carry_their_value_and_label_too():
    r = {"error_code": 0, "boxes": [{"label": "red box", "x_min": 0, "y_min": 0, "x_max": 10,
                                     "y_max": 10}]}
    (s,) = score_result([Expectation("box_iou", label="red box", box=(0, 0, 10, 20))], r)
    assert s.value == pytest.approx(0.5) and s.label == "red box"
    assert s.to_dict()["value"] == pytest.approx(0.5)


def doc(*expectations, targets=("red box",)):
    return {"queries": [{"name": "g", "at": 0, "task": "ground", "targets": list(targets),
                         "expect": list(expectations)}]}


def test_scenarios_declare_position_error_in_metres():
    s = parse_scenario(doc({"kind": "position_error", "threshold": 0.05, "informational": True},
                           {"kind": "position_error", "label": "blue cup", "threshold": 0.1},
                           targets=("red box",)))
    a, b = s.queries[0].expect
    assert (a.kind, a.label, a.threshold, a.informational) == ("position_error", "red box",
                                                               0.05, True)
    assert (b.label, b.threshold, b.informational) == ("blue cup", 0.1, False)


@pytest.mark.parametrize(("e", "targets", "match"), [
    ({"kind": "position_error"}, ("red box",), r"expect\[0\]\.threshold: position_error needs"),
    ({"kind": "position_error", "threshold": 0}, ("red box",), r"threshold=0.0: expected a"),
    ({"kind": "position_error", "threshold": 0.1}, ("a", "b"), r"expect\[0\]\.label: "),
    ({"kind": "position_error", "threshold": 0.1, "box": [0, 0, 1, 1]}, ("a",),
     r"expect\[0\]\.box: not used with kind position_error"),
    ({"kind": "contains", "value": "x", "threshold": 0.1}, ("a",),
     r"threshold: only used with kind box_iou or position_error"),
])
def test_bad_position_expectations_name_the_field(e, targets, match):
    with pytest.raises(ScenarioError, match=match):
        parse_scenario(doc(e, targets=targets))


def test_the_report_shows_iou_and_3d_error_per_query(tmp_path):
    scores = [{"kind": "box_iou", "passed": False, "reason": "", "informational": True,
               "label": "red box", "value": 0.123},
              {"kind": "position_error", "passed": True, "reason": "", "informational": True,
               "label": "red box", "value": 0.0341},
              {"kind": "position_error", "passed": False, "reason": "", "informational": True,
               "label": "blue cup", "value": None}]
    rec = {"query": "ground", "occurrence": 0, "t_s": 1.0, "status": "succeeded",
           "scores": scores, "regression": False,
           "result": {"error_code": 0, "answer": "", "total_s": 0.5,
                      "time_to_first_token_s": 0.1, "lift_code": 1, "frame_3d": "cam",
                      "boxes": [{"label": "red box", "x_min": 1, "y_min": 2, "x_max": 3,
                                 "y_max": 4, "position_3d": p3(0.1, 0.2, 1.0)}]}}
    assert report.geometry_scores(rec) == "red box: IoU 0.12, 0.034 m; blue cup: 3D n/a"
    html = report.write_report(tmp_path, [rec], {}, {"scenario": "s"}, {"ok": True}).read_text()
    assert "<td>red box: IoU 0.12, 0.034 m; blue cup: 3D n/a</td>" in html
    assert "3D error p50 / max (m)</th><td>0.034 / 0.034 over 1" in html
    assert "3D (0.100, 0.200, 1.000) m" in html and "LIFT_OK in &#x27;cam&#x27;" in html
