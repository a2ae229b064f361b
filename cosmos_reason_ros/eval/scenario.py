"""Replay scenarios: which questions to ask about a recording, when, and what to expect.

A scenario is a YAML file. Each query mirrors the fields of ``Reason.action`` and says when
it runs, relative to the first message of the recording (``at``: one time or a list;
``every``: a period, with optional ``start``/``end``), plus optional expectations that
``eval.scoring`` checks::

    name: shelf check
    image_topic: /camera/image_raw        # optional; the replay tool can also pick it
    cameras:                              # optional: named cameras, the default one first
      front: /camera/image_raw            # camera name: the bag's Image/CompressedImage topic
      wrist: /wrist/image_raw/compressed
    defaults: {max_tokens: 64, greedy: true}
    queries:
      - name: red box
        every: 1.0
        task: ground
        targets: [red box]
        expect:
          - {kind: box_iou, label: red box, box: ground_truth, threshold: 0.5}
          - {kind: position_error, label: red box, threshold: 0.05}   # metres, needs depth
      - name: blocked
        at: [0.5, 2.0]
        task: verify
        prompt: The aisle is blocked.
        expect: {kind: yes_no, value: "no", informational: true}
      - name: gripper
        at: 1.0
        cameras: [front, wrist]           # one question about both views (goal field cameras)
        prompt: Is the red box in the gripper?

Pure Python (no rclpy, no vLLM): loading validates every field once and raises
``ScenarioError`` naming the field (``queries[1].expect[0].threshold``), the value and what
is allowed; ``build_schedule`` expands the times into one time-ordered list.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cosmos_reason_ros.core.cameras import camera_name_problem
from cosmos_reason_ros.core.pipeline import MAX_CLIP_FPS
from cosmos_reason_ros.core.types import BadRequestError, Task

SOURCES = ("latest", "next", "clip")
EXPECT_KINDS = ("exact", "contains", "regex", "yes_no", "box_iou", "position_error")
EXPECT_FIELDS = ("answer", "answer_json", "reasoning", "raw_text")
GROUND_TRUTH = "ground_truth"
MAX_QUERIES = 1000  # declared queries per scenario
MAX_SCHEDULED = 10_000  # scheduled goals after expanding at/every
MAX_FILE_BYTES = 1_000_000
_TIME_EPS = 1e-9

_QUERY_KEYS = frozenset({
    "name", "at", "every", "start", "end", "prompt", "task", "targets", "reasoning", "source",
    "clip_duration_s", "clip_fps", "max_tokens", "temperature", "greedy", "response_schema",
    "max_image_age_s", "wait_for_image_s", "timeout_s", "expect", "cameras",
})
_GOAL_KEYS = _QUERY_KEYS - {"name", "at", "every", "start", "end", "expect"}
_TOP_KEYS = frozenset({"name", "description", "image_topic", "ground_truth_topic", "defaults",
                       "fail_on_error", "queries", "version", "cameras"})
_EXPECT_KEYS = frozenset({"kind", "value", "field", "ignore_case", "informational", "label",
                          "box", "threshold"})


class ScenarioError(BadRequestError):
    """A scenario file or field is invalid; the message names the field."""


@dataclass(frozen=True)
class Expectation:
    """What one answer should satisfy (see ``eval.scoring``).

    ``informational`` expectations are scored and reported but never count as a regression.
    ``box`` is a pixel box ``(x_min, y_min, x_max, y_max)`` or ``None`` for the recording's
    ground truth of ``label``. ``threshold`` is the least IoU for ``box_iou`` and the largest
    3D distance in metres for ``position_error`` (the answer's lifted position of ``label``
    against the recording's 3D ground truth; needs depth input).
    """

    kind: str
    value: str = ""
    field: str = "answer"
    ignore_case: bool = True
    informational: bool = False
    label: str = ""
    box: tuple[float, float, float, float] | None = None
    threshold: float = 0.5


@dataclass(frozen=True)
class QueryGoal:
    """The goal fields of one query (``Reason.action`` names; 0 / empty = node default)."""

    prompt: str = ""
    task: str = ""
    targets: tuple[str, ...] = ()
    reasoning: bool = False
    source: str = "latest"
    clip_duration_s: float = 0.0
    clip_fps: float = 0.0
    max_tokens: int = 0
    temperature: float = 0.0
    greedy: bool = False
    response_schema: str = ""
    max_image_age_s: float = 0.0
    wait_for_image_s: float = 0.0
    timeout_s: float = 0.0
    cameras: tuple[str, ...] = ()  # camera names, in prompt order; empty = the default camera


@dataclass(frozen=True)
class ScenarioQuery:
    """One declared query: its goal, when it runs and what it should answer."""

    name: str
    goal: QueryGoal
    at: tuple[float, ...] = ()
    every: float = 0.0
    start: float = 0.0
    end: float | None = None
    expect: tuple[Expectation, ...] = ()


@dataclass(frozen=True)
class Scenario:
    """A validated scenario file."""

    name: str
    queries: tuple[ScenarioQuery, ...]
    description: str = ""
    image_topic: str = ""
    ground_truth_topic: str = "/ground_truth"
    fail_on_error: bool = True  # a goal that ends with an error counts as a regression
    path: str = ""
    # Camera name -> the bag's image topic, the default camera first (empty: one camera).
    cameras: tuple[tuple[str, str], ...] = ()

    @property
    def scored(self) -> bool:
        """True when at least one expectation can regress."""
        return any(not e.informational for q in self.queries for e in q.expect)


@dataclass(frozen=True)
class ScheduledQuery:
    """One goal to send: the query, its time from the recording start, and its occurrence."""

    t_s: float
    query: ScenarioQuery
    occurrence: int = 0
    order: int = field(default=0, compare=False)  # declaration index (stable sort key)

    @property
    def key(self) -> str:
        """A readable unique id, e.g. ``ground#2``."""
        return f"{self.query.name}#{self.occurrence}"


# --- loading -----------------------------------------------------------------------------------


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario YAML file."""
    import yaml

    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError as e:
        raise ScenarioError(f"scenario {str(p)!r}: cannot read ({e.strerror})") from e
    if size > MAX_FILE_BYTES:
        raise ScenarioError(f"scenario {str(p)!r}: {size} bytes; at most {MAX_FILE_BYTES}")
    try:
        doc = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ScenarioError(f"scenario {str(p)!r}: not valid YAML: {e}") from e
    scenario = parse_scenario(doc, default_name=p.stem)
    return Scenario(**{**scenario.__dict__, "path": str(p)})


def parse_scenario(doc: Any, default_name: str = "scenario") -> Scenario:
    """Validate a scenario already parsed from YAML (a mapping)."""
    if not isinstance(doc, Mapping):
        raise ScenarioError(f"scenario: expected a mapping with 'queries', got "
                            f"{type(doc).__name__}")
    _no_unknown(doc, _TOP_KEYS, "scenario")
    version = doc.get("version", 1)
    if version != 1:
        raise ScenarioError(f"version={version!r}: only version 1 is supported")
    defaults = doc.get("defaults") or {}
    if not isinstance(defaults, Mapping):
        raise ScenarioError(f"defaults: expected a mapping of goal fields, got "
                            f"{type(defaults).__name__}")
    _no_unknown(defaults, _GOAL_KEYS, "defaults")
    raw_queries = doc.get("queries")
    if not isinstance(raw_queries, list) or not raw_queries:
        raise ScenarioError("queries: expected a non-empty list of queries")
    if len(raw_queries) > MAX_QUERIES:
        raise ScenarioError(f"queries: {len(raw_queries)} queries; at most {MAX_QUERIES}")
    cameras = _parse_cameras(doc.get("cameras"))
    queries = []
    names: set[str] = set()
    for i, raw in enumerate(raw_queries):
        where = f"queries[{i}]"
        if not isinstance(raw, Mapping):
            raise ScenarioError(f"{where}: expected a mapping, got {type(raw).__name__}")
        query = _parse_query({**defaults, **raw}, where, i)
        if query.name in names:
            raise ScenarioError(f"{where}.name={query.name!r}: names must be unique")
        unknown = [c for c in query.goal.cameras if cameras and c not in dict(cameras)]
        if unknown:
            raise ScenarioError(f"{where}.cameras: {unknown[0]!r} is not one of the "
                                f"scenario's cameras ({', '.join(c for c, _ in cameras)})")
        names.add(query.name)
        queries.append(query)
    return Scenario(
        name=_string(doc, "name", "scenario", default_name),
        description=_string(doc, "description", "scenario"),
        image_topic=_string(doc, "image_topic", "scenario"),
        ground_truth_topic=_string(doc, "ground_truth_topic", "scenario", "/ground_truth"),
        fail_on_error=_bool(doc, "fail_on_error", "scenario", True),
        queries=tuple(queries),
        cameras=cameras,
    )


def _parse_cameras(raw: Any) -> tuple[tuple[str, str], ...]:
    """``cameras: {front: /camera/image_raw, ...}``: names (ROS name tokens) -> bag topics."""
    if raw is None:
        return ()
    if not isinstance(raw, Mapping) or not raw:
        raise ScenarioError(f"cameras: expected a mapping of camera name to the bag's image "
                            f"topic (e.g. {{front: /camera/image_raw}}), got {raw!r}")
    out = []
    for name, topic in raw.items():
        problem = camera_name_problem(name)
        if problem:
            raise ScenarioError(f"cameras: name {name!r} {problem}")
        if not isinstance(topic, str) or not topic.startswith("/"):
            raise ScenarioError(f"cameras.{name}={topic!r}: expected the bag's image topic, "
                                f"an absolute name such as /camera/image_raw")
        out.append((name, topic))
    return tuple(out)


def _parse_query(raw: Mapping[str, Any], where: str, index: int) -> ScenarioQuery:
    _no_unknown(raw, _QUERY_KEYS, where)
    name = _string(raw, "name", where, f"query{index}")
    if not name.strip():
        raise ScenarioError(f"{where}.name: must not be empty")
    goal = _parse_goal(raw, where)
    has_at, has_every = "at" in raw, "every" in raw
    if has_at == has_every:
        raise ScenarioError(f"{where} ({name!r}): give exactly one of 'at' (seconds from the "
                            f"recording start, or a list) and 'every' (a period in seconds)")
    at: tuple[float, ...] = ()
    every = 0.0
    if has_at:
        values = raw["at"] if isinstance(raw["at"], list) else [raw["at"]]
        if not values:
            raise ScenarioError(f"{where}.at: the list is empty")
        at = tuple(sorted(_number(v, f"{where}.at", low=0.0) for v in values))
        for key in ("start", "end"):
            if key in raw:
                raise ScenarioError(f"{where}.{key}: only used with 'every'")
    else:
        every = _number(raw["every"], f"{where}.every", low=0.0, low_open=True)
    start = _number(raw.get("start", 0.0), f"{where}.start", low=0.0)
    end = None if raw.get("end") is None else _number(raw["end"], f"{where}.end", low=0.0)
    if end is not None and end < start:
        raise ScenarioError(f"{where}.end={end:g}: must not be before start={start:g}")
    expect_raw = raw.get("expect")
    if expect_raw is None:
        expect_list: list[Any] = []
    elif isinstance(expect_raw, list):
        expect_list = expect_raw
    else:
        expect_list = [expect_raw]
    expect = tuple(_parse_expect(e, f"{where}.expect[{j}]", goal)
                   for j, e in enumerate(expect_list))
    return ScenarioQuery(name=name, goal=goal, at=at, every=every, start=start, end=end,
                         expect=expect)


def _parse_goal(raw: Mapping[str, Any], where: str) -> QueryGoal:
    task = _string(raw, "task", where).strip()
    if task:
        allowed = [t.value for t in Task]
        if task.lower() not in allowed:
            raise ScenarioError(f"{where}.task={task!r}: allowed {', '.join(allowed)} "
                                f"(or empty for vqa)")
        task = task.lower()
    targets_raw = raw.get("targets", [])
    if isinstance(targets_raw, str):
        targets_raw = [targets_raw]
    if not isinstance(targets_raw, list) or not all(isinstance(t, str) for t in targets_raw):
        raise ScenarioError(f"{where}.targets: expected a list of strings, got {targets_raw!r}")
    source = _string(raw, "source", where, "latest").strip().lower()
    if source not in SOURCES:
        raise ScenarioError(f"{where}.source={source!r}: allowed {', '.join(SOURCES)}")
    schema = raw.get("response_schema", "")
    if isinstance(schema, Mapping):
        schema = json.dumps(schema)
    elif not isinstance(schema, str):
        raise ScenarioError(f"{where}.response_schema: expected a mapping or JSON text, got "
                            f"{type(schema).__name__}")
    elif schema.strip():
        try:
            json.loads(schema)
        except ValueError as e:
            raise ScenarioError(f"{where}.response_schema: not valid JSON ({e})") from e
    max_tokens = raw.get("max_tokens", 0)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        raise ScenarioError(f"{where}.max_tokens={max_tokens!r}: expected an integer >= 0")
    return QueryGoal(
        prompt=_string(raw, "prompt", where),
        task=task,
        targets=tuple(t.strip() for t in targets_raw if t.strip()),
        reasoning=_bool(raw, "reasoning", where, False),
        source=source,
        clip_duration_s=_number(raw.get("clip_duration_s", 0.0), f"{where}.clip_duration_s",
                                low=0.0),
        clip_fps=_number(raw.get("clip_fps", 0.0), f"{where}.clip_fps", low=0.0,
                         high=MAX_CLIP_FPS),
        max_tokens=max_tokens,
        temperature=_number(raw.get("temperature", 0.0), f"{where}.temperature", low=0.0),
        greedy=_bool(raw, "greedy", where, False),
        response_schema=schema,
        max_image_age_s=_number(raw.get("max_image_age_s", 0.0), f"{where}.max_image_age_s",
                                low=0.0),
        wait_for_image_s=_number(raw.get("wait_for_image_s", 0.0),
                                 f"{where}.wait_for_image_s", low=0.0),
        timeout_s=_number(raw.get("timeout_s", 0.0), f"{where}.timeout_s", low=0.0),
        cameras=_goal_cameras(raw.get("cameras", []), where),
    )


def _goal_cameras(raw: Any, where: str) -> tuple[str, ...]:
    """Return a query's ``cameras``: distinct camera names (one name: a list of one)."""
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list):
        raise ScenarioError(f"{where}.cameras={raw!r}: expected a list of camera names")
    for i, name in enumerate(raw):
        problem = camera_name_problem(name)
        if problem:
            raise ScenarioError(f"{where}.cameras[{i}]={name!r} {problem}")
        if name in raw[:i]:
            raise ScenarioError(f"{where}.cameras[{i}]={name!r}: named twice")
    return tuple(raw)


def _parse_expect(raw: Any, where: str, goal: QueryGoal) -> Expectation:
    if not isinstance(raw, Mapping):
        raise ScenarioError(f"{where}: expected a mapping with 'kind', got {type(raw).__name__}")
    _no_unknown(raw, _EXPECT_KEYS, where)
    kind = _string(raw, "kind", where).strip().lower()
    if kind not in EXPECT_KINDS:
        raise ScenarioError(f"{where}.kind={kind!r}: allowed {', '.join(EXPECT_KINDS)}")
    fld = _string(raw, "field", where, "answer")
    if fld not in EXPECT_FIELDS:
        raise ScenarioError(f"{where}.field={fld!r}: allowed {', '.join(EXPECT_FIELDS)}")
    value = raw.get("value", "")
    if isinstance(value, bool):  # YAML reads a bare yes/no as a boolean
        value = "yes" if value else "no"
    if not isinstance(value, (str, int, float)):
        raise ScenarioError(f"{where}.value: expected text, got {type(value).__name__}")
    value = str(value)
    common = {"kind": kind, "field": fld, "informational": _bool(raw, "informational", where,
                                                                  False)}
    if kind == "box_iou":
        return _parse_box_expect(raw, where, goal, common)
    if kind == "position_error":
        return _parse_position_expect(raw, where, goal, common)
    for key in ("label", "box", "threshold"):
        if key in raw:
            raise ScenarioError(f"{where}.{key}: only used with kind box_iou or "
                                f"position_error")
    if kind in ("exact", "contains", "regex") and not value:
        raise ScenarioError(f"{where}.value: {kind} needs a non-empty value")
    ignore_case = _bool(raw, "ignore_case", where, kind != "regex")
    if kind == "regex":
        try:
            re.compile(value, re.IGNORECASE if ignore_case else 0)
        except re.error as e:
            raise ScenarioError(f"{where}.value={value!r}: not a valid regular expression "
                                f"({e})") from e
    if kind == "yes_no":
        value = value.strip().lower()
        if value not in ("yes", "no"):
            raise ScenarioError(f"{where}.value={value!r}: allowed yes, no")
    return Expectation(value=value, ignore_case=ignore_case, **common)


def _parse_box_expect(raw: Mapping[str, Any], where: str, goal: QueryGoal,
                      common: dict[str, Any]) -> Expectation:
    for key in ("value", "ignore_case"):
        if key in raw:
            raise ScenarioError(f"{where}.{key}: not used with kind box_iou (use label, box, "
                                f"threshold)")
    label = _string(raw, "label", where).strip()
    if not label and len(goal.targets) == 1:
        label = goal.targets[0]
    box_raw = raw.get("box", GROUND_TRUTH)
    box: tuple[float, float, float, float] | None
    if box_raw == GROUND_TRUTH:
        if not label:
            raise ScenarioError(f"{where}.label: box_iou against the ground truth needs the "
                                f"object's label")
        box = None
    else:
        if not isinstance(box_raw, list) or len(box_raw) != 4:
            raise ScenarioError(f"{where}.box={box_raw!r}: expected [x_min, y_min, x_max, "
                                f"y_max] in pixels or '{GROUND_TRUTH}'")
        x0, y0, x1, y1 = (_number(v, f"{where}.box") for v in box_raw)
        if x1 <= x0 or y1 <= y0:
            raise ScenarioError(f"{where}.box={box_raw!r}: need x_min < x_max and "
                                f"y_min < y_max")
        box = (x0, y0, x1, y1)
    threshold = _number(raw.get("threshold", 0.5), f"{where}.threshold", low=0.0, high=1.0,
                        low_open=True)
    return Expectation(label=label, box=box, threshold=threshold, **common)


def _parse_position_expect(raw: Mapping[str, Any], where: str, goal: QueryGoal,
                           common: dict[str, Any]) -> Expectation:
    for key in ("value", "ignore_case", "box", "field"):
        if key in raw:
            raise ScenarioError(f"{where}.{key}: not used with kind position_error (use label, "
                                f"threshold)")
    label = _string(raw, "label", where).strip()
    if not label and len(goal.targets) == 1:
        label = goal.targets[0]
    if not label:
        raise ScenarioError(f"{where}.label: position_error needs the object's label (its 3D "
                            f"ground truth is looked up by label)")
    if "threshold" not in raw:
        raise ScenarioError(f"{where}.threshold: position_error needs the largest error "
                            f"allowed, in metres (e.g. 0.05)")
    threshold = _number(raw["threshold"], f"{where}.threshold", low=0.0, low_open=True)
    return Expectation(label=label, threshold=threshold, **common)


# --- scheduling --------------------------------------------------------------------------------


def build_schedule(scenario: Scenario, duration_s: float) -> tuple[ScheduledQuery, ...]:
    """Expand ``at``/``every`` into goals ordered by time (then declaration order).

    ``duration_s`` is the recording's length (last minus first message time). ``every``
    runs from ``start`` to ``end`` (default: the recording's end), both inclusive. A time
    past the end is an error (its goal would see no new frame).
    """
    if not math.isfinite(duration_s) or duration_s < 0:
        raise ScenarioError(f"recording duration {duration_s!r}: expected >= 0 seconds")
    out: list[ScheduledQuery] = []
    for order, q in enumerate(scenario.queries):
        where = f"query {q.name!r}"
        if q.at:
            times = list(q.at)
            late = [t for t in times if t > duration_s + _TIME_EPS]
            if late:
                raise ScenarioError(f"{where}: at={late[0]:g} s is past the end of the "
                                    f"recording ({duration_s:.3f} s)")
        else:
            end = duration_s if q.end is None else q.end
            if end > duration_s + _TIME_EPS:
                raise ScenarioError(f"{where}: end={end:g} s is past the end of the recording "
                                    f"({duration_s:.3f} s)")
            if q.start > end + _TIME_EPS:
                raise ScenarioError(f"{where}: start={q.start:g} s is past the end "
                                    f"({end:.3f} s)")
            count = int(math.floor((end - q.start) / q.every + 1e-6)) + 1
            if count > MAX_SCHEDULED:
                raise ScenarioError(f"{where}: every={q.every:g} s gives {count} goals; at most "
                                    f"{MAX_SCHEDULED}")
            times = [q.start + k * q.every for k in range(count)]
        out.extend(ScheduledQuery(round(t, 9), q, k, order) for k, t in enumerate(times))
        if len(out) > MAX_SCHEDULED:
            raise ScenarioError(f"the scenario schedules more than {MAX_SCHEDULED} goals")
    return tuple(sorted(out, key=lambda s: (s.t_s, s.order, s.occurrence)))


# --- field helpers -----------------------------------------------------------------------------


def _no_unknown(raw: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    unknown = sorted(str(k) for k in raw if k not in allowed)
    if unknown:
        raise ScenarioError(f"{where}: unknown field(s) {', '.join(unknown)}; allowed: "
                            f"{', '.join(sorted(allowed))}")


def _string(raw: Mapping[str, Any], key: str, where: str, default: str = "") -> str:
    value = raw.get(key, default)
    if value is None:
        return default
    if not isinstance(value, str):
        raise ScenarioError(f"{where}.{key}={value!r}: expected text")
    return value


def _bool(raw: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise ScenarioError(f"{where}.{key}={value!r}: expected true or false")
    return value


def _number(value: Any, where: str, low: float = -math.inf, high: float = math.inf,
            low_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ScenarioError(f"{where}={value!r}: expected a number")
    value = float(value)
    too_low = value <= low if low_open else value < low
    if not math.isfinite(value) or too_low or value > high:
        bounds = f"{'>' if low_open else '>='} {low:g}" if low > -math.inf else ""
        if high < math.inf:
            bounds += f"{', ' if bounds else ''}<= {high:g}"
        raise ScenarioError(f"{where}={value!r}: expected a finite number {bounds}".rstrip())
    return value

