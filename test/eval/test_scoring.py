"""Scoring replay results against expectations, and the run summary (exit status)."""

from __future__ import annotations

import pytest

from cosmos_reason_ros.core.types import ErrorCode
from cosmos_reason_ros.eval.scenario import Expectation
from cosmos_reason_ros.eval.scoring import is_regression, score, summarize, yes_no


def result(answer="", answer_json="", boxes=(), code=0, message=""):
    return {"answer": answer, "answer_json": answer_json, "reasoning": "", "raw_text": answer,
            "boxes": [{"label": label, "x_min": b[0], "y_min": b[1], "x_max": b[2],
                       "y_max": b[3]} for label, b in boxes],
            "error_code": code, "error_message": message}


@pytest.mark.parametrize(("kind", "value", "answer", "passed"), [
    ("exact", "A red box.", "  a red box. ", True),
    ("exact", "red box", "a red box", False),
    ("contains", "Red Box", "I see a red box on the left", True),
    ("contains", "cup", "I see a red box", False),
    ("regex", r"\b\d+ objects\b", "there are 3 objects", True),
    ("regex", "^Three", "three objects", False),  # regex is case-sensitive by default
])
def test_text_kinds(kind, value, answer, passed):
    s = score(Expectation(kind, value, ignore_case=kind != "regex"), result(answer))
    assert s.passed is passed, s.reason
    assert s.regression is (not passed)


def test_text_kinds_read_the_chosen_field():
    r = result("no json here", answer_json='{"answer":"yes"}')
    assert score(Expectation("contains", '"yes"', field="answer_json"), r).passed
    assert not score(Expectation("contains", '"yes"'), r).passed


@pytest.mark.parametrize(("answer", "answer_json", "verdict"), [
    ("", '{"answer":"yes","reason":"it is"}', "yes"),
    ("", '{"verdict":false}', "no"),
    ("No, the aisle is clear.", "", "no"),
    ("Well... yes. It is blocked", "", "yes"),
    ("The yesterday box is nowhere", "", None),  # words that merely contain yes/no
    ("", '{"reason":"unsure"}', None),
])
def test_yes_no_reads_json_verdicts_then_the_text(answer, answer_json, verdict):
    assert yes_no(result(answer, answer_json)) == verdict


def test_yes_no_scores_and_explains():
    assert score(Expectation("yes_no", "yes"), result("Yes.")).passed
    s = score(Expectation("yes_no", "yes"), result("No."))
    assert not s.passed and s.reason == "answered no, expected yes"
    assert "neither yes nor no" in score(Expectation("yes_no", "no"), result("maybe")).reason


def test_box_iou_ignores_a_nan_box_in_the_answer():
    # A NaN coordinate used to give IoU NaN, and max() keeps a leading NaN: the good box was lost.
    nan = float("nan")
    boxes = [("cup", (nan, 0, 10, 10)), ("cup", (0, 0, 100, 100))]
    s = score(Expectation("box_iou", box=(0, 0, 100, 100), threshold=0.5), result(boxes=boxes))
    assert s.passed and "best IoU 1.00" in s.reason


def test_box_iou_against_ground_truth_uses_the_label():
    truth = {"Red Box": (100, 100, 200, 200), "blue cup": (300, 100, 400, 200)}
    close = result(boxes=[("blue cup", (100, 100, 200, 200)), ("red box", (110, 100, 200, 210))])
    e = Expectation("box_iou", label="red  box", threshold=0.7)
    s = score(e, close, truth)
    assert s.passed, s.reason  # the blue cup's box (a perfect match for red) is not used
    assert "best IoU 0.83 >= 0.7 over 1 box(es)" == s.reason
    far = result(boxes=[("red box", (300, 100, 400, 200))])
    assert not score(e, far, truth).passed
    assert "no box labelled 'red  box'" in score(e, result(), truth).reason
    missing = score(Expectation("box_iou", label="green cylinder"), close, truth)
    assert not missing.passed and "no ground truth for 'green cylinder'" in missing.reason
    assert "known: Red Box, blue cup" in missing.reason


def test_box_iou_with_an_explicit_box_and_no_label_takes_any_box():
    e = Expectation("box_iou", box=(0, 0, 100, 100), threshold=0.5)
    assert score(e, result(boxes=[("x", (500, 500, 600, 600)), ("y", (0, 0, 90, 100))])).passed
    assert score(e, result()).reason == "no box in the answer"


def test_a_failed_goal_fails_every_expectation_with_its_error():
    r = result(code=ErrorCode.NO_IMAGE, message="no image received")
    s = score(Expectation("contains", "x", informational=True), r)
    assert not s.passed and s.reason == "the goal failed (NO_IMAGE): no image received"
    assert not s.regression  # informational


def record(code=0, scores=()):
    return {"result": {"error_code": code},
            "scores": [{"kind": "contains", "passed": p, "reason": "", "informational": i}
                       for p, i in scores]}


def test_summary_counts_regressions_not_informational_misses():
    records = [record(scores=[(True, False), (False, True)]),  # pass + informational miss
               record(scores=[(False, False), (False, False)]),  # two failures: one record
               record(code=ErrorCode.TIMEOUT),  # an error without expectations
               record()]
    s = summarize(records)
    assert (s.queries, s.succeeded, s.errors) == (4, 3, 1)
    assert (s.scored, s.passed, s.failed, s.informational_failed) == (4, 1, 3, 1)
    assert s.regressions == 2 and not s.ok
    assert summarize(records, fail_on_error=False).regressions == 1
    assert summarize([records[0], records[3]]).ok
    assert summarize([records[0], records[3]]).to_dict()["ok"] is True
    assert is_regression(records[1]) and not is_regression(records[0])
    assert is_regression(records[2]) and not is_regression(records[2], fail_on_error=False)
