"""Score replay results against a scenario's expectations; aggregate into a summary.

A result is the plain form of a ``ReasoningResult`` (a dict with the message's field names,
as written to the replay's JSONL file): ``error_code``, ``answer``, ``answer_json``,
``boxes`` (dicts with ``label``, ``x_min`` ..., ``position_3d``), ``points``, ``lift_code``,
``frame_3d``. Pure Python; the replay tool and the tests use the same functions.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from cosmos_reason_ros.core.geometry import box_iou
from cosmos_reason_ros.core.types import Box, ErrorCode
from cosmos_reason_ros.eval.bagio import BoxTuple, Truth3D
from cosmos_reason_ros.eval.scenario import Expectation

_YES = frozenset({"yes", "true", "y"})
_NO = frozenset({"no", "false", "n"})
_VERDICT_KEYS = ("answer", "verdict", "result")
_LIFT_NAMES = {0: "LIFT_OFF", 1: "LIFT_OK", 2: "LIFT_NO_DEPTH", 3: "LIFT_BAD_DEPTH",
               4: "LIFT_TF_FAILED"}  # ReasoningResult.LIFT_*


@dataclass(frozen=True)
class Score:
    """The outcome of one expectation on one result."""

    kind: str
    passed: bool
    reason: str
    informational: bool = False
    label: str = ""  # the object scored (box_iou, position_error)
    value: float | None = None  # the best IoU (box_iou) or the 3D error in metres

    @property
    def regression(self) -> bool:
        """A failed expectation that counts (not informational)."""
        return not self.passed and not self.informational

    def to_dict(self) -> dict[str, Any]:
        """Plain form for the JSONL file."""
        return asdict(self)


def yes_no(result: Mapping[str, Any]) -> str | None:
    """Return the verdict of an answer: from its JSON (``answer``/``verdict``), else its first word.

    Returns ``"yes"``, ``"no"`` or ``None`` when the answer states neither.
    """
    text = str(result.get("answer_json") or "")
    if text:
        try:
            doc = json.loads(text)
        except ValueError:
            doc = None
        if isinstance(doc, Mapping):
            for key in _VERDICT_KEYS:
                value = doc.get(key)
                if isinstance(value, bool):
                    return "yes" if value else "no"
                if isinstance(value, str) and value.strip().lower() in _YES | _NO:
                    return "yes" if value.strip().lower() in _YES else "no"
    match = re.search(r"\b(yes|no)\b", str(result.get("answer") or ""), re.IGNORECASE)
    return match.group(1).lower() if match else None


def score(expect: Expectation, result: Mapping[str, Any],
          truth: Mapping[str, BoxTuple] | None = None,
          truth_3d: Truth3D | None = None) -> Score:
    """Check one expectation against one result; never raises.

    ``truth`` maps labels to ground-truth pixel boxes of the frame the result used (needed
    only by ``box_iou`` expectations without an explicit box); ``truth_3d`` holds that
    frame's 3D object centres (needed by ``position_error``).
    """
    def verdict(passed: bool, reason: str, value: float | None = None) -> Score:
        return Score(expect.kind, passed, reason, expect.informational, expect.label, value)

    code = int(result.get("error_code", 0))
    if code != ErrorCode.OK:
        name = ErrorCode(code).name if code in ErrorCode._value2member_map_ else str(code)
        return verdict(False, f"the goal failed ({name}): {result.get('error_message', '')}")
    if expect.kind == "box_iou":
        return _score_box(expect, result, truth, verdict)
    if expect.kind == "position_error":
        return _score_position(expect, result, truth_3d, verdict)
    if expect.kind == "yes_no":
        got = yes_no(result)
        if got is None:
            return verdict(False, "the answer says neither yes nor no")
        return verdict(got == expect.value, f"answered {got}, expected {expect.value}")
    text = str(result.get(expect.field) or "")
    shown = text if len(text) <= 60 else text[:57] + "..."
    if expect.kind == "regex":
        flags = re.IGNORECASE if expect.ignore_case else 0
        found = re.search(expect.value, text, flags) is not None
        return verdict(found, f"{expect.field} {'matches' if found else 'does not match'} "
                              f"/{expect.value}/: {shown!r}")
    a, b = text.strip(), expect.value.strip()
    if expect.ignore_case:
        a, b = a.casefold(), b.casefold()
    if expect.kind == "exact":
        return verdict(a == b, f"{expect.field} {'equals' if a == b else 'is'} {shown!r}"
                               + ("" if a == b else f", expected {expect.value!r}"))
    found = b in a
    return verdict(found, f"{expect.field} {'contains' if found else 'lacks'} "
                          f"{expect.value!r}: {shown!r}")


def _score_box(expect: Expectation, result: Mapping[str, Any],
               truth: Mapping[str, BoxTuple] | None, verdict: Any) -> Score:
    if expect.box is not None:
        target = expect.box
    else:
        truth = truth or {}
        key = _find_label(expect.label, truth)
        if key is None:
            return verdict(False, f"no ground truth for {expect.label!r} at the frame used "
                                  f"(known: {', '.join(sorted(truth)) or 'none'})")
        target = truth[key]
    boxes = [b for b in result.get("boxes") or ()
             if not expect.label or _same_label(str(b.get("label", "")), expect.label)]
    if not boxes:
        return verdict(False, f"no box labelled {expect.label!r} in the answer"
                       if expect.label else "no box in the answer")
    # geometry.box_iou is 0 (never NaN) for boxes with no finite area, so max() stays sound.
    best = max(box_iou(Box(b["x_min"], b["y_min"], b["x_max"], b["y_max"]), Box(*target))
               for b in boxes)
    passed = best >= expect.threshold
    return verdict(passed, f"best IoU {best:.2f} {'>=' if passed else '<'} "
                           f"{expect.threshold:g} over {len(boxes)} box(es)", best)


def lifted_positions(result: Mapping[str, Any], label: str = ""
                     ) -> list[tuple[str, tuple[float, float, float]]]:
    """Return the valid 3D positions of the result's boxes and points labelled ``label``.

    Any label when ``label`` is empty. Pairs ``(what, (x, y, z))``, ``what`` naming the item
    (``box 0``, ``point 1``).
    """
    out = []
    for kind, name in (("boxes", "box"), ("points", "point")):
        for i, item in enumerate(result.get(kind) or ()):
            if label and not _same_label(str(item.get("label", "")), label):
                continue
            p3 = item.get("position_3d") or {}
            pos = p3.get("position") or {}
            xyz = [pos.get(k) for k in ("x", "y", "z")]
            if p3.get("valid") and all(isinstance(v, (int, float)) and math.isfinite(v)
                                       for v in xyz):
                out.append((f"{name} {i}", (float(xyz[0]), float(xyz[1]), float(xyz[2]))))
    return out


def position_error(a: tuple[float, float, float], b: tuple[float, float, float]) -> float:
    """Euclidean distance between two 3D points (metres)."""
    return math.dist(a, b)


def _score_position(expect: Expectation, result: Mapping[str, Any], truth: Truth3D | None,
                    verdict: Any) -> Score:
    key = None if truth is None else _find_label(expect.label, truth.centers)
    if truth is None or key is None:
        known = ", ".join(sorted(truth.centers)) if truth is not None else ""
        return verdict(False, f"no 3D ground truth for {expect.label!r} at the frame used "
                              f"(known: {known or 'none'})")
    target = truth.centers[key]
    lift = int(result.get("lift_code", 0))
    items = lifted_positions(result, expect.label)
    if not items:
        labelled = [b for kind in ("boxes", "points") for b in result.get(kind) or ()
                    if _same_label(str(b.get("label", "")), expect.label)]
        if not labelled:
            return verdict(False, f"no box or point labelled {expect.label!r} in the answer")
        if lift != 1:
            name = _LIFT_NAMES.get(lift, str(lift))
            why = result.get("lift_message") or "depth input off?"
            return verdict(False, f"not lifted to 3D ({name}): {why}")
        status = next((str((b.get("position_3d") or {}).get("status") or "")
                       for b in labelled), "")
        return verdict(False, f"no valid 3D position for {expect.label!r} over "
                              f"{len(labelled)} item(s): {status or 'no depth'}")
    frame = str(result.get("frame_3d") or "")
    if truth.frame_id and frame and frame != truth.frame_id:
        return verdict(False, f"positions are in frame {frame!r}; the ground truth is in "
                              f"{truth.frame_id!r}")
    errors = [(position_error(xyz, target), what, xyz) for what, xyz in items]
    best, what, xyz = min(errors)
    passed = best <= expect.threshold
    shown = ", ".join(f"{v:.3f}" for v in xyz)
    truth_shown = ", ".join(f"{v:.3f}" for v in target)
    return verdict(passed, f"3D error {best:.3f} m {'<=' if passed else '>'} "
                           f"{expect.threshold:g} m ({what} at ({shown}), truth ({truth_shown}); "
                           f"best of {len(items)})", best)


def _same_label(a: str, b: str) -> bool:
    return " ".join(a.split()).casefold() == " ".join(b.split()).casefold()


def _find_label(label: str, truth: Mapping[str, Any]) -> str | None:
    return next((k for k in truth if _same_label(k, label)), None)


def score_result(expect: Iterable[Expectation], result: Mapping[str, Any],
                 truth: Mapping[str, BoxTuple] | None = None,
                 truth_3d: Truth3D | None = None) -> tuple[Score, ...]:
    """Score every expectation of one query."""
    return tuple(score(e, result, truth, truth_3d) for e in expect)


@dataclass(frozen=True)
class Summary:
    """Totals over a replay run."""

    queries: int
    succeeded: int
    errors: int
    scored: int  # expectations checked
    passed: int
    failed: int
    regressions: int  # failed expectations that count, plus errors when fail_on_error
    informational_failed: int

    @property
    def ok(self) -> bool:
        """True when nothing regressed (the replay exits 0)."""
        return self.regressions == 0

    def to_dict(self) -> dict[str, Any]:
        """Plain form for JSON."""
        return {**asdict(self), "ok": self.ok}


def summarize(records: Iterable[Mapping[str, Any]], fail_on_error: bool = True) -> Summary:
    """Aggregate replay records (each with ``result`` and ``scores`` as plain dicts)."""
    queries = succeeded = errors = scored = passed = regressions = info_failed = 0
    for record in records:
        queries += 1
        ok = int(record["result"].get("error_code", 0)) == ErrorCode.OK
        succeeded += ok
        errors += not ok
        record_regressed = False
        for s in record.get("scores", ()):
            scored += 1
            if s["passed"]:
                passed += 1
            elif s["informational"]:
                info_failed += 1
            else:
                record_regressed = True
        regressions += record_regressed or (fail_on_error and not ok)
    return Summary(queries, succeeded, errors, scored, passed, scored - passed, regressions,
                   info_failed)


def is_regression(record: Mapping[str, Any], fail_on_error: bool = True) -> bool:
    """Return True when this one record counts against the run."""
    return summarize([record], fail_on_error).regressions > 0
