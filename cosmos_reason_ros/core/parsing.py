"""Turn raw model output into a :class:`ParsedAnswer`: reasoning, answer, JSON and geometry.

Cosmos-Reason outputs are messy in known ways (each has a case in ``test/core/test_parsing.py``):

- Reason2 / Qwen3-VL write ``<think>…</think>`` then the answer; Reason1 / Qwen2.5-VL wrap the
  answer in ``<answer>…</answer>``; Qwen3 chat templates often put ``<think>`` in the prompt, so
  only ``</think>`` appears in the output; truncated outputs leave tags unclosed.
- The reasoning contains numbers and even JSON, so JSON is looked for in the answer only.
- JSON sits in a ```` ```json ```` fence, bare, in prose, several objects in a row, or cut off
  at ``max_tokens``; key names drift (``bbox_2d`` / ``box_2d`` / ``bbox``).

Everything here is pure Python and :func:`parse_output` never raises: what cannot be parsed is
described in ``ParsedAnswer.problems``. Work is bounded (scanned length, JSON nesting depth,
items kept) so pathological input costs little. Coordinates stay model coordinates; see
``geometry.py`` for the mapping to image pixels.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Iterable
from dataclasses import replace
from typing import Any, NamedTuple

from cosmos_reason_ros.core.tasks import AnswerKind, find_spec
from cosmos_reason_ros.core.types import (
    Box,
    FinishReason,
    ParsedAnswer,
    Point,
    Task,
    TemporalSpan,
    Trajectory,
)

_LOG = logging.getLogger(__name__)

MAX_SCAN_CHARS = 100_000
"""Only this many characters of the answer are searched for JSON and box tokens."""

MAX_JSON_DEPTH = 64
"""Deeper JSON nesting is rejected (model answers are at most a few levels deep)."""

MAX_JSON_WORK = 1_000_000
"""Total characters the JSON scanner may consume over all attempts on one answer."""

MAX_JSON_ATTEMPTS = 10_000
"""At most this many brackets are tried as the start of a JSON value in one answer."""

MAX_ITEMS = 1000
"""At most this many boxes, points, trajectory points and spans are kept each."""

BOX_KEYS = ("bbox_2d", "box_2d", "bbox", "box")
POINT_KEYS = ("point_2d", "point")
TRAJECTORY_KEYS = ("trajectory", "path", "waypoints", "trace")
LABEL_KEYS = ("label", "name", "object", "class", "category")
# Which camera's image an entry is in (multi-camera requests ask for "camera").
CAMERA_KEYS = ("camera", "camera_name", "view")
SCORE_KEYS = ("score", "confidence")
CAPTION_KEYS = ("caption", "description", "event", "text", "label")
CORNER_KEYS = (
    ("x1", "y1", "x2", "y2"),
    ("x_min", "y_min", "x_max", "y_max"),
    ("xmin", "ymin", "xmax", "ymax"),
    ("left", "top", "right", "bottom"),
)
SPAN_KEYS = (("start", "end"), ("start_time", "end_time"), ("begin", "end"))
VERDICT_KEYS = ("answer", "verdict", "result", "success", "done", "ok")
COUNT_KEYS = ("count", "number", "total", "num", "quantity")
MAX_COUNT_VALUE = 2**31 - 1
"""Counts above this (int32, like ROS integer fields) are refused as unreadable."""

_THINK_OPEN = re.compile(r"<\s*think\s*>", re.IGNORECASE)
_THINK_CLOSE = re.compile(r"<\s*/\s*think\s*>", re.IGNORECASE)
_ANSWER_OPEN = re.compile(r"<\s*answer\s*>", re.IGNORECASE)
_ANSWER_CLOSE = re.compile(r"<\s*/\s*answer\s*>", re.IGNORECASE)
# End-of-turn tokens some servers leave in the text when special tokens are not skipped.
_END_TOKENS = re.compile(r"(?:<\|im_end\|>|<\|endoftext\|>|</s>)\s*\Z")
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_NUMBER_FULL = re.compile(r"\s*[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?\s*\Z")
_IDENT = re.compile(r"[^\W\d][\w\-]*")
_JSON_START = re.compile(r"[\[{]")
# Qwen's text grounding form: <|object_ref_start|>cup<|object_ref_end|><|box_start|>(x1,y1),
# (x2,y2)<|box_end|>. The label part is optional; the box body is read as "4 numbers".
_QWEN_BOX = re.compile(
    r"(?:<\|object_ref_start\|>([^<]{0,200})<\|object_ref_end\|>\s*)?"
    r"<\|box_start\|>([^<]{0,200})<\|box_end\|>"
)
_TIMESTAMP = re.compile(r"\s*(?:(\d+):)?(\d+):(\d+(?:\.\d*)?)\s*\Z")
_SECONDS = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(?:s|sec|secs|seconds)?\s*\Z", re.IGNORECASE)
_YES_NO = re.compile(r"[\s*_`#>\"'(\[]*(yes|no|true|false)\b", re.IGNORECASE)
# A whole number in prose: not part of a longer number or a decimal ("2.5", "1,5" stay out).
_WHOLE = re.compile(r"(?<![\d.,])\d{1,12}(?!\d|[.,]\d)")
_NUMBER_WORDS = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
    "nineteen", "twenty",
)
_NUMBER_WORD = re.compile(r"\b(" + "|".join(_NUMBER_WORDS) + r")\b", re.IGNORECASE)
_TRAJECTORY_WORDS = ("trajector", "path", "waypoint", "trace")


class ReasoningSplit(NamedTuple):
    """Reasoning and answer parts of a raw output, with what went wrong while splitting."""

    reasoning: str
    answer: str
    truncated: bool
    problems: tuple[str, ...]


class JsonFound(NamedTuple):
    """JSON values found in a piece of text, in order, and notes about repairs."""

    values: tuple[Any, ...]
    truncated: bool
    problems: tuple[str, ...]


# --- public API -----------------------------------------------------------------------------


def parse_output(
    text: str,
    *,
    reasoning: str | None = None,
    finish_reason: FinishReason | None = None,
    task: Task | str | None = None,
) -> ParsedAnswer:
    """Parse one model output into reasoning, answer, JSON, boxes, points, trajectories, spans.

    ``reasoning`` is the server's already-split reasoning (``message.reasoning``); when given,
    ``text`` is the answer (any stray ``</think>`` in it is still honoured). ``task`` steers
    ambiguous shapes by the answer its ``TaskSpec`` expects: with ``Task.TRAJECTORY`` every
    point list is a trajectory, with ``Task.POINT`` point lists stay separate points; by
    default a list of point objects is a trajectory only when its label says so (e.g.
    ``"gripper trajectory"``). A task whose expected answer is missing gets a problem. With
    ``Task.COUNT`` a count given only in prose ("I see 3 cups") becomes ``answer_json``
    ``{"count":3}``, so the result always carries it as JSON. Never raises.
    """
    if not isinstance(text, str):
        text = "" if text is None else str(text)
    if reasoning is not None and not isinstance(reasoning, str):
        reasoning = str(reasoning)
    try:
        return _parse(text, reasoning, finish_reason, _expected_answer(task))
    except Exception as exc:  # noqa: BLE001 - a parser bug must never fail a goal with text
        _LOG.exception("parse_output failed on %d chars", len(text))
        return ParsedAnswer(
            raw_text=text,
            reasoning=reasoning or "",
            answer=text.strip(),
            truncated=finish_reason == FinishReason.LENGTH,
            problems=(f"internal parser error: {type(exc).__name__}: {exc}",),
        )


def split_reasoning(text: str) -> ReasoningSplit:
    """Split a raw output into reasoning and answer, for both Cosmos-Reason conventions.

    Handles ``<think>…</think>answer`` (Reason2), ``<think>…</think><answer>…</answer>``
    (Reason1), a missing ``<think>`` with ``</think>`` present (the template put it in the
    prompt), no tags (all answer), an unclosed ``<think>`` (cut in the reasoning: no answer)
    and an unclosed ``<answer>``.
    """
    problems: list[str] = []
    truncated = False
    reasoning = ""
    close = _THINK_CLOSE.search(text)
    if close is not None:
        opening = _THINK_OPEN.search(text, 0, close.start())
        if opening is not None:
            reasoning = text[opening.end() : close.start()]
            before = text[: opening.start()].strip()
        else:
            reasoning = text[: close.start()]
            before = ""
        answer = text[close.end() :]
        if before and not answer.strip():
            answer = before
    else:
        opening = _THINK_OPEN.search(text)
        if opening is not None:
            rest = text[opening.end() :]
            answer_tag = _ANSWER_OPEN.search(rest)
            if answer_tag is not None:
                # Reason1 occasionally forgets </think> but still writes <answer>.
                reasoning = rest[: answer_tag.start()]
                answer = rest[answer_tag.start() :]
                problems.append("reasoning not closed (no </think>) before <answer>")
            else:
                reasoning = rest
                answer = text[: opening.start()]
                truncated = True
                problems.append("reasoning not closed (no </think>): output cut before the answer")
        else:
            answer = text

    answer, answer_truncated, answer_problems = _strip_answer_tags(answer)
    truncated = truncated or answer_truncated
    problems.extend(answer_problems)
    answer = _END_TOKENS.sub("", answer)
    return ReasoningSplit(reasoning.strip(), answer.strip(), truncated, tuple(problems))


def find_json(text: str) -> JsonFound:
    """Find JSON values (objects and arrays) in ``text``: fenced first, else bare or in prose.

    Tolerates single quotes, trailing commas, unquoted keys and Python literals, and repairs
    truncated JSON by closing open brackets (an incomplete trailing string or number is
    dropped, since its value is unknown). Each repair is noted in ``problems``.
    """
    problems: list[str] = []
    if len(text) > MAX_SCAN_CHARS:
        problems.append(f"answer has {len(text)} chars; only the first {MAX_SCAN_CHARS} scanned")
        text = text[:MAX_SCAN_CHARS]
    scanner = _Scanner(text)
    values: list[Any] = []
    truncated = False
    fences = _fenced_blocks(text)
    for start, end, closed in fences:
        found, cut = scanner.scan(start, end)
        values.extend(found)
        if not closed:
            truncated = True
            problems.append("code fence not closed (output cut inside ```)")
        truncated = truncated or cut
    if not values:
        found, cut = scanner.scan(0, len(text))
        values.extend(found)
        truncated = truncated or cut
    problems.extend(scanner.problems)
    return JsonFound(tuple(values), truncated, tuple(problems))


def read_count(answer: ParsedAnswer | str) -> int | None:
    """Read an object count (COUNT task) as a whole number >= 0, else ``None``.

    Looks at JSON first (``{"count": n}``; also ``number``, ``total``, ``num``, ``quantity``;
    a list of such objects, one per target, gives their sum), then, when the answer has no
    JSON, at prose that names exactly one number ("3", "I see three cups").
    """
    if isinstance(answer, ParsedAnswer):
        return _count_of(answer.answer_json, answer.answer)[0]
    if isinstance(answer, str):
        return _count_of(None, answer)[0]
    return None


def read_verdict(answer: ParsedAnswer | str) -> bool | None:
    """Read a yes/no verdict (VERIFY task): ``True`` for yes, ``False`` for no, else ``None``.

    Looks at JSON first (``{"answer": "yes" | "no" | true | false, ...}``; also ``verdict``,
    ``result``, ``success``), then at text that starts with yes/no/true/false (markdown and
    punctuation ignored) or with 是 / 否 / 不.
    """
    if isinstance(answer, ParsedAnswer):
        if answer.answer_json is not None:
            try:
                value = json.loads(answer.answer_json)
            except (ValueError, RecursionError):
                value = None
            verdict = _json_verdict(value)
            if verdict is not None:
                return verdict
        text = answer.answer
    elif isinstance(answer, str):
        text = answer
    else:
        return None
    return _text_verdict(text)


def parse_timestamp(value: Any) -> float | None:
    """Seconds from ``"mm:ss.ff"``, ``"hh:mm:ss.ff"``, ``"12.5"``, ``"12.5s"`` or a number.

    The part after the dot is a decimal fraction of a second. Returns ``None`` when the value
    is not a finite, non-negative time.
    """
    seconds: float | None = None
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and len(value) <= 64:
        match = _TIMESTAMP.match(value)
        if match is not None:
            hours, minutes, secs = match.groups()
            seconds = int(hours or 0) * 3600.0 + int(minutes) * 60.0 + float(secs)
        else:
            match = _SECONDS.match(value)
            if match is not None:
                seconds = float(match.group(1))
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return None
    return seconds


# --- reasoning / answer split ---------------------------------------------------------------


def _strip_answer_tags(answer: str) -> tuple[str, bool, list[str]]:
    """Return the content of ``<answer>…</answer>`` if present (Reason1), else ``answer``."""
    opening = _ANSWER_OPEN.search(answer)
    if opening is not None:
        close = _ANSWER_CLOSE.search(answer, opening.end())
        if close is None:
            return answer[opening.end() :], True, ["answer not closed (no </answer>)"]
        return answer[opening.end() : close.start()], False, []
    close = _ANSWER_CLOSE.search(answer)
    if close is not None:
        return answer[: close.start()], False, []
    return answer, False, []


# --- the parse ------------------------------------------------------------------------------


def _expected_answer(task: Task | str | None) -> AnswerKind:
    """Return the answer the task's spec expects; no task or an unknown one expects text."""
    if isinstance(task, Task):
        spec = find_spec(task.value)
    elif isinstance(task, str):
        spec = find_spec(task.strip().lower())
    else:
        spec = None
    return spec.answer if spec is not None else AnswerKind.TEXT


_REASONING_CHANNEL_PREFIX = "answer taken from the server's reasoning channel"
REASONING_CHANNEL_NOTE = (
    _REASONING_CHANNEL_PREFIX + " (the content channel {why}): the "
    "server's --reasoning-parser treated the whole output as reasoning; ask with reasoning on, "
    "or start the server without --reasoning-parser and set engine.constrains_after_reasoning "
    "false"
)
"""The problem noted when the answer had to be recovered from the reasoning channel."""


def _parse(
    text: str, given_reasoning: str | None, finish_reason: FinishReason | None,
    expect: AnswerKind,
) -> ParsedAnswer:
    parsed = _parse_channels(text, given_reasoning, finish_reason, expect)
    if not given_reasoning or not given_reasoning.strip():
        return parsed
    if _holds_answer(parsed, expect):
        return parsed
    # A server's reasoning parser (vLLM --reasoning-parser qwen3 without a think prompt) can put
    # the whole output in the reasoning channel and leave content empty: the answer is after
    # the reasoning's last </think>, or, with none, the structured answer is the whole text.
    closes = list(_THINK_CLOSE.finditer(given_reasoning))
    if closes:
        last = closes[-1]
        candidate, reasoning = given_reasoning[last.end():], given_reasoning[: last.start()]
    elif expect is not AnswerKind.TEXT:
        candidate, reasoning = given_reasoning, ""
    else:
        if not parsed.answer:
            note = "answer empty: the server put the whole output in its reasoning channel"
            return replace(parsed, problems=(*parsed.problems, note))
        return parsed
    recovered = _parse_channels(candidate, reasoning, finish_reason, expect)
    if not _holds_answer(recovered, expect):
        return parsed
    why = "held no answer" if parsed.answer else "was empty"
    return replace(recovered, raw_text=text,
                   problems=(*recovered.problems, REASONING_CHANNEL_NOTE.format(why=why)))


def answered_from_reasoning_channel(problems: Iterable[str]) -> bool:
    """Whether a parse had to take its answer from the server's reasoning channel."""
    return any(p.startswith(_REASONING_CHANNEL_PREFIX) for p in problems)


def _holds_answer(parsed: ParsedAnswer, expect: AnswerKind) -> bool:
    """Whether the answer holds what the task expects (any text for free-text tasks)."""
    return bool(parsed.answer) if expect is AnswerKind.TEXT else expect.value in parsed.found


def _parse_channels(
    text: str, given_reasoning: str | None, finish_reason: FinishReason | None,
    expect: AnswerKind,
) -> ParsedAnswer:
    split = split_reasoning(text)
    reasoning = split.reasoning
    if given_reasoning is not None and given_reasoning.strip():
        reasoning = (
            given_reasoning.strip() + "\n" + reasoning if reasoning else given_reasoning.strip()
        )
    answer = split.answer
    problems = list(split.problems)
    truncated = split.truncated
    found: list[str] = []
    if reasoning:
        found.append("reasoning")
    if finish_reason == FinishReason.LENGTH:
        truncated = True
        where = "in the reasoning, before any answer" if not answer else "in the answer"
        problems.append(f"output cut at max_tokens (finish_reason=length) {where}")

    json_found = find_json(answer)
    problems.extend(json_found.problems)
    truncated = truncated or json_found.truncated
    collector = _Collector(expect)
    answer_json: str | None = None
    if json_found.values:
        found.append("json")
        values = json_found.values
        top: Any = values[0] if len(values) == 1 else list(values)
        answer_json = _dump_json(top, problems)
        collector.walk_top(values)
    collector.qwen_text_boxes(answer[:MAX_SCAN_CHARS])
    collector.finish()
    problems.extend(collector.problems)

    for name, items in (
        ("boxes", collector.boxes),
        ("points", collector.points),
        ("trajectories", collector.trajectories),
        ("spans", collector.spans),
    ):
        if items:
            found.append(name)

    partial = ParsedAnswer(
        raw_text=text, reasoning=reasoning, answer=answer, answer_json=answer_json
    )
    verdict = read_verdict(partial)
    if verdict is not None:
        found.append("yes_no")
    if expect is AnswerKind.COUNT:
        count, problem = _count_of(answer_json, answer)
        if count is not None:
            found.append("count")
            if answer_json is None:  # prose only: give the result its count as JSON too
                answer_json = _dump_json({"count": count}, problems)
        elif problem:
            problems.append(problem)
    if expect is not AnswerKind.TEXT and expect.value not in found:
        problems.append(expect.missing)

    return ParsedAnswer(
        raw_text=text,
        reasoning=reasoning,
        answer=answer,
        answer_json=answer_json,
        boxes=tuple(collector.boxes),
        points=tuple(collector.points),
        trajectories=tuple(collector.trajectories),
        spans=tuple(collector.spans),
        truncated=truncated,
        found=tuple(found),
        problems=tuple(_dedupe(problems)),
    )


def _dedupe(items: Iterable[str]) -> list[str]:
    seen: set[str] = set()
    out = []
    for item in items:
        if item not in seen:
            seen.add(item)
            out.append(item)
    return out


def _dump_json(value: Any, problems: list[str]) -> str:
    """Compact UTF-8 JSON; non-finite numbers (not valid JSON) become ``null``."""
    replaced = [0]

    def clean(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            replaced[0] += 1
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, list):
            return [clean(x) for x in v]
        return v

    cleaned = clean(value)
    if replaced[0]:
        problems.append(f"{replaced[0]} non-finite number(s) replaced by null in answer_json")
    return json.dumps(cleaned, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


# --- JSON scanning --------------------------------------------------------------------------


def _fenced_blocks(text: str) -> list[tuple[int, int, bool]]:
    """(start, end, closed) of the bodies of ``` fences (any language tag)."""
    blocks = []
    pos = 0
    while len(blocks) < MAX_ITEMS:
        opening = text.find("```", pos)
        if opening < 0:
            break
        body = opening + 3
        line_end = text.find("\n", body)
        tag = text[body:line_end] if line_end >= 0 else text[body:]
        if line_end >= 0 and len(tag) <= 20 and "`" not in tag and "{" not in tag:
            body = line_end + 1  # skip the language tag (json, JSON, python, …)
        close = text.find("```", body)
        if close < 0:
            blocks.append((body, len(text), False))
            break
        blocks.append((body, close, True))
        pos = close + 3
    return blocks


class _Invalid(Exception):
    """Not JSON at this position (the scanner tries the next bracket)."""


class _Scanner:
    """A lenient, bounded JSON reader that finds every object/array in a range of text."""

    _LITERALS = {
        "true": True,
        "false": False,
        "null": None,
        "True": True,
        "False": False,
        "None": None,
        "NaN": math.nan,
        "Infinity": math.inf,
        "-Infinity": -math.inf,
    }
    _ESCAPES = {'"': '"', "'": "'", "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n"}
    _ESCAPES.update({"r": "\r", "t": "\t"})

    def __init__(self, text: str) -> None:
        self.s = text
        self.n = len(text)
        self.work = 0
        self.attempts = 0
        self.i = 0
        self.cut = False
        self.open_at_cut = 0
        self.too_deep_at = -1
        self.problems: list[str] = []
        self.repairs: set[str] = set()

    def scan(self, start: int, end: int) -> tuple[list[Any], bool]:
        """All top-level JSON containers in ``s[start:end]`` and whether the last was cut."""
        values: list[Any] = []
        self.n = end
        pos = start
        while self.work < MAX_JSON_WORK and self.attempts < MAX_JSON_ATTEMPTS:
            match = _JSON_START.search(self.s, pos, end)
            if match is None:
                break
            self.attempts += 1
            if len(values) >= MAX_ITEMS:
                self.problems.append(f"more than {MAX_ITEMS} JSON values; the rest ignored")
                break
            first = match.start()
            self.i = first
            self.repairs = set()
            self.cut = False
            self.open_at_cut = 0
            self.too_deep_at = -1
            try:
                value = self._value(0)
            except (_Invalid, RecursionError):
                self.work += self.i - first + 1
                # Too deep: every start before the offending bracket fails the same way, so
                # resume after it (keeps "[[[[…" linear instead of quadratic).
                pos = max(first, self.too_deep_at) + 1
                continue
            self.work += self.i - first
            values.append(value)
            for repair in sorted(self.repairs):
                self.problems.append(f"JSON repaired: {repair}")
            if self.cut:
                self.problems.append(
                    f"JSON truncated at char {end} (started at char {first}), repaired by "
                    f"closing {self.open_at_cut} bracket(s)"
                )
                return values, True
            pos = self.i
        else:
            self.problems.append(
                f"JSON scan stopped after {self.attempts} attempts / {self.work} chars of work"
            )
        return values, False

    # Each reader returns its value; ``self.cut`` is set when the end of text was reached
    # inside it (containers are then closed; incomplete scalars raise _Cut to be dropped).

    def _skip_ws(self) -> None:
        s, i, n = self.s, self.i, self.n
        while i < n and s[i] in " \t\r\n":
            i += 1
        self.i = i

    def _value(self, depth: int) -> Any:
        self._skip_ws()
        if self.i >= self.n:
            raise _Cut
        c = self.s[self.i]
        if c == "{":
            return self._object(depth + 1)
        if c == "[":
            return self._array(depth + 1)
        if c == '"' or c == "'":
            return self._string()
        if c in "-+.0123456789":
            if self.s.startswith("-Infinity", self.i):
                self.i += 9
                self.repairs.add("non-standard literal (-Infinity)")
                return -math.inf
            return self._number()
        return self._literal()

    def _enter(self, depth: int) -> None:
        if depth > MAX_JSON_DEPTH:
            msg = f"JSON nested deeper than {MAX_JSON_DEPTH} levels; ignored"
            if msg not in self.problems:
                self.problems.append(msg)
            self.too_deep_at = self.i
            raise _Invalid

    def _object(self, depth: int) -> dict[str, Any]:
        self._enter(depth)
        self.i += 1
        out: dict[str, Any] = {}
        while True:
            self._skip_ws()
            if self.i >= self.n:
                return self._close(out)
            c = self.s[self.i]
            if c == "}":
                self.i += 1
                return out
            if c == ",":
                # leading/duplicate commas: {"a":1,,} — skip leniently
                self.i += 1
                self.repairs.add("extra comma")
                continue
            try:
                key = self._key()
            except _Cut:
                return self._close(out)
            self._skip_ws()
            if self.i >= self.n:
                return self._close(out)
            if self.s[self.i] != ":":
                raise _Invalid
            self.i += 1
            try:
                value = self._value(depth)
            except _Cut:
                return self._close(out)
            out[key] = value
            if self.cut:
                return self._close(out)
            self._skip_ws()
            if self.i >= self.n:
                return self._close(out)
            c = self.s[self.i]
            if c == ",":
                self.i += 1
                self._skip_ws()
                if self.i < self.n and self.s[self.i] == "}":
                    self.repairs.add("trailing comma")
            elif c == "}":
                self.i += 1
                return out
            else:
                raise _Invalid

    def _array(self, depth: int) -> list[Any]:
        self._enter(depth)
        self.i += 1
        out: list[Any] = []
        while True:
            self._skip_ws()
            if self.i >= self.n:
                return self._close(out)
            c = self.s[self.i]
            if c == "]":
                self.i += 1
                return out
            try:
                value = self._value(depth)
            except _Cut:
                return self._close(out)
            out.append(value)
            if self.cut:
                return self._close(out)
            self._skip_ws()
            if self.i >= self.n:
                return self._close(out)
            c = self.s[self.i]
            if c == ",":
                self.i += 1
                self._skip_ws()
                if self.i < self.n and self.s[self.i] == "]":
                    self.repairs.add("trailing comma")
            elif c == "]":
                self.i += 1
                return out
            else:
                raise _Invalid

    def _close(self, container: Any) -> Any:
        """End of text inside a container: keep it, closed (count brackets for the note)."""
        self.cut = True
        self.open_at_cut += 1
        return container

    def _key(self) -> str:
        c = self.s[self.i]
        if c == '"' or c == "'":
            return self._string()
        match = _IDENT.match(self.s, self.i, self.n)
        if match is None:
            raise _Invalid
        if match.end() >= self.n:
            raise _Cut
        self.i = match.end()
        self.repairs.add("unquoted key")
        return match.group()

    def _string(self) -> str:
        s, n = self.s, self.n
        quote = s[self.i]
        if quote == "'":
            self.repairs.add("single-quoted string")
        i = self.i + 1
        parts: list[str] = []
        while True:
            j = i
            while j < n and s[j] != quote and s[j] != "\\":
                j += 1
            parts.append(s[i:j])
            if j >= n:
                self.i = n
                raise _Cut
            if s[j] == quote:
                self.i = j + 1
                return "".join(parts)
            # backslash escape
            if j + 1 >= n:
                self.i = n
                raise _Cut
            e = s[j + 1]
            if e == "u":
                hex_digits = s[j + 2 : j + 6]
                if len(hex_digits) < 4 and j + 6 > n:
                    self.i = n
                    raise _Cut
                try:
                    code = int(hex_digits, 16)
                except ValueError:
                    parts.append("\\u")
                    i = j + 2
                    continue
                i = j + 6
                if 0xD800 <= code < 0xDC00 and s.startswith("\\u", i):
                    try:
                        low = int(s[i + 2 : i + 6], 16)
                    except ValueError:
                        low = -1
                    if 0xDC00 <= low < 0xE000:
                        code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
                        i += 6
                if 0xD800 <= code < 0xE000:
                    code = 0xFFFD  # lone surrogate: not encodable as UTF-8
                parts.append(chr(code))
            else:
                parts.append(self._ESCAPES.get(e, e))
                i = j + 2

    def _number(self) -> int | float:
        match = _NUMBER.match(self.s, self.i, self.n)
        if match is None:
            if self.s[self.i : self.n] in ("-", "+", "."):
                self.i = self.n
                raise _Cut
            raise _Invalid
        if match.end() >= self.n:
            # "12" at the very end may be the start of "1234": unknown, drop it.
            self.i = self.n
            raise _Cut
        text = match.group()
        self.i = match.end()
        if text.startswith("+") or text.startswith(".") or text.endswith("."):
            self.repairs.add("non-standard number")
        digits = text.lstrip("+-")
        if digits.isdigit() and len(digits) <= 1000:
            return int(text)
        return float(text)  # huge ints become floats (or inf) instead of hitting int limits

    def _literal(self) -> Any:
        rest = self.s[self.i : min(self.n, self.i + 9)]
        for word, value in self._LITERALS.items():
            if rest.startswith(word):
                end = self.i + len(word)
                if end < self.n and (self.s[end].isalnum() or self.s[end] == "_"):
                    continue
                if word not in ("true", "false", "null"):
                    self.repairs.add(f"non-standard literal ({word})")
                self.i = end
                return value
            if self.i + len(rest) >= self.n and word.startswith(rest) and rest:
                self.i = self.n
                raise _Cut
        raise _Invalid


class _Cut(Exception):
    """End of text inside a scalar: its value is unknown and it is dropped."""


# --- geometry extraction --------------------------------------------------------------------


def _number_of(value: Any) -> float | None:
    """Return a coordinate as float (numbers and numeric strings), else ``None``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        try:
            return float(value)
        except OverflowError:
            return math.inf if value > 0 else -math.inf
    if isinstance(value, str) and len(value) <= 64 and _NUMBER_FULL.match(value):
        return float(value)
    return None


def _numbers_of(value: Any) -> list[float] | None:
    """Return numbers from a list (numbers, numeric strings) or a "1, 2, 3, 4" string."""
    if isinstance(value, (list, tuple)):
        if len(value) > 16:
            return None
        nums = [_number_of(v) for v in value]
        if any(n is None for n in nums):
            return None
        return [n for n in nums if n is not None]
    if isinstance(value, str) and len(value) <= 200:
        found = _NUMBER.findall(value)
        if found and _NUMBER.sub("", value).strip(" ,;()[]\t\n") == "":
            return [float(x) for x in found]
    return None


def _count(n: int) -> str:
    return "1 number" if n == 1 else f"{n} numbers"


def _is_pair(value: Any) -> bool:
    nums = _numbers_of(value)
    return nums is not None and len(nums) == 2


def _is_quad(value: Any) -> bool:
    nums = _numbers_of(value)
    return nums is not None and len(nums) == 4


def _first(d: dict[str, Any], keys: Iterable[str]) -> tuple[str, Any] | None:
    for key in keys:
        if key in d:
            return key, d[key]
    lowered = {k.lower(): k for k in d if isinstance(k, str)}
    for key in keys:
        if key in lowered:
            return lowered[key], d[lowered[key]]
    return None


def _label_of(d: dict[str, Any]) -> str:
    hit = _first(d, LABEL_KEYS)
    if hit is None or hit[1] is None or isinstance(hit[1], (dict, list)):
        return ""
    return str(hit[1]).strip()[:200]


def _camera_of(d: dict[str, Any]) -> str:
    hit = _first(d, CAMERA_KEYS)
    if hit is None or not isinstance(hit[1], str):
        return ""
    return hit[1].strip()[:200]


def _is_trajectory_label(label: str) -> bool:
    low = label.lower()
    return any(word in low for word in _TRAJECTORY_WORDS) or "轨迹" in label


class _Collector:
    """Walks parsed JSON values and collects boxes, points, trajectories and spans."""

    def __init__(self, expect: AnswerKind) -> None:
        self.expect = expect  # steers ambiguous point lists (points vs trajectories)
        self.boxes: list[Box] = []
        self.points: list[Point] = []
        self.trajectories: list[Trajectory] = []
        self.spans: list[TemporalSpan] = []
        self.problems: list[str] = []
        self.box_n = 0
        self.point_n = 0
        self.span_n = 0
        self.traj_n = 0

    # -- entry points --

    def walk_top(self, values: tuple[Any, ...]) -> None:
        """Several JSON values in a row are read like one list (e.g. point objects)."""
        self._walk(values[0] if len(values) == 1 else list(values), 0, bare=True)

    def qwen_text_boxes(self, answer: str) -> None:
        """Boxes in Qwen's token form ``<|box_start|>(x1,y1),(x2,y2)<|box_end|>``."""
        if "<|box_start|>" not in answer:
            return
        for match in _QWEN_BOX.finditer(answer):
            label = (match.group(1) or "").strip()
            nums = _NUMBER.findall(match.group(2))
            self._add_box([float(x) for x in nums], label, None)

    def finish(self) -> None:
        """With the trajectory task, loose points become trajectories.

        Points of one camera (all points, without cameras) form one trajectory in order,
        unless they carry several labels that each name two or more points (e.g. "left arm"
        and "right arm"): then one trajectory per label. Individually labelled points
        ("start", "grasp", "end") stay one trajectory.
        """
        if self.expect is not AnswerKind.TRAJECTORIES or not self.points or self.trajectories:
            return
        points, self.points = self.points, []
        by_camera: dict[str, list[Point]] = {}
        for p in points:
            by_camera.setdefault(p.camera, []).append(p)
        for camera, in_camera in by_camera.items():
            groups: dict[str, list[Point]] = {}
            for p in in_camera:
                groups.setdefault(p.label, []).append(p)
            if len(groups) > 1 and all(len(pts) >= 2 for pts in groups.values()):
                for label, pts in groups.items():
                    self._add_trajectory(pts, label, camera)
            else:
                self._add_trajectory(in_camera, in_camera[0].label if len(groups) == 1 else "",
                                     camera)

    # -- the walk --

    def _walk(self, value: Any, depth: int, bare: bool) -> None:
        if depth > MAX_JSON_DEPTH:
            return
        if isinstance(value, dict):
            self._dict(value, depth, bare)
        elif isinstance(value, list):
            self._list(value, depth, bare)

    def _list(self, items: list[Any], depth: int, bare: bool) -> None:
        if bare:
            nums = _numbers_of(items)
            if nums is not None and len(nums) in (2, 4):
                if len(nums) == 4:
                    self._add_box(nums, "", None)
                else:
                    self._add_point(nums, "")
                return
            if items and all(_is_pair(x) for x in items):
                if self.expect is AnswerKind.TRAJECTORIES and len(items) >= 2:
                    pts = [self._point(_numbers_of(x) or [], "") for x in items]
                    self._add_trajectory([p for p in pts if p is not None], "")
                else:
                    for x in items:
                        self._add_point(_numbers_of(x) or [], "")
                return
        if len(items) >= 2 and self.expect is not AnswerKind.POINTS \
                and all(self._is_point_obj(x) for x in items):
            labels = {_label_of(x) for x in items}
            if len(labels) == 1 and _is_trajectory_label(next(iter(labels))):
                pts = [self._point_from_obj(x) for x in items]
                self._add_trajectory([p for p in pts if p is not None], next(iter(labels)))
                return
        for item in items[: MAX_ITEMS * 4]:
            # Elements of a bare list may be bare boxes ([[x1,y1,x2,y2], …]) or label dicts.
            self._walk(item, depth + 1, bare)

    def _is_point_obj(self, value: Any) -> bool:
        if not isinstance(value, dict):
            return False
        hit = _first(value, POINT_KEYS)
        if hit is not None:
            return _is_pair(hit[1])
        return _first(value, BOX_KEYS) is None and "x" in value and "y" in value

    def _point_from_obj(self, d: dict[str, Any]) -> Point | None:
        hit = _first(d, POINT_KEYS)
        nums = _numbers_of(hit[1]) if hit else [_number_of(d.get("x")), _number_of(d.get("y"))]
        if not nums or any(n is None for n in nums):
            return None
        return self._point([n for n in nums if n is not None], _label_of(d), _camera_of(d))

    def _dict(self, d: dict[str, Any], depth: int, bare: bool) -> None:
        label = _label_of(d)
        camera = _camera_of(d)
        hit = _first(d, BOX_KEYS)
        if hit is not None:
            value = hit[1]
            if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
                for v in value:  # {"bbox_2d": [[…], […]], "label": "cup"}
                    self._box_value(v, label, d)
            else:
                self._box_value(value, label, d)
            return
        hit = _first(d, TRAJECTORY_KEYS)
        if hit is not None and isinstance(hit[1], list):
            self._trajectory_value(hit[1], label, camera)
            return
        hit = _first(d, POINT_KEYS)
        if hit is not None:
            value = hit[1]
            if isinstance(value, list) and value and all(_is_pair(v) for v in value):
                if self.expect is AnswerKind.TRAJECTORIES or _is_trajectory_label(label):
                    pts = [self._point(_numbers_of(v) or [], label, camera) for v in value]
                    self._add_trajectory([p for p in pts if p is not None], label, camera)
                else:
                    for v in value:
                        self._add_point(_numbers_of(v) or [], label, camera)
            else:
                self._point_value(value, label, camera)
            return
        if "points" in d:
            value = d["points"]
            if _is_pair(value):
                self._add_point(_numbers_of(value) or [], label, camera)
            elif isinstance(value, list) and value and all(_is_pair(v) for v in value):
                if self.expect is AnswerKind.POINTS:
                    for v in value:
                        self._add_point(_numbers_of(v) or [], label, camera)
                else:
                    self._trajectory_value(value, label, camera)
            else:
                self._walk(value, depth + 1, bare=False)
            return
        for keys in CORNER_KEYS:
            if all(k in d for k in keys):
                self._box_value([d[k] for k in keys], label, d)
                return
        if "x" in d and "y" in d:
            self._point_value([d["x"], d["y"]], label, camera)
            return
        for start_key, end_key in SPAN_KEYS:
            if start_key in d and end_key in d:
                self._span(d, start_key, end_key)
                return
        if bare and self._label_dict(d):
            return
        for value in list(d.values())[: MAX_ITEMS * 4]:
            self._walk(value, depth + 1, bare=False)

    def _label_dict(self, d: dict[str, Any]) -> bool:
        """``{"cup": [x1,y1,x2,y2], "mug": [[…], […]]}``: keys are labels, values are boxes.

        Only tried on top-level dicts, and only when every value is a 4-number list (or a list
        of them), so that e.g. ``{"size": [640, 480]}`` is not read as geometry.
        """
        if not d or len(d) > MAX_ITEMS:
            return False

        def coords(v: Any) -> bool:
            if not isinstance(v, list) or not v:
                return False
            if _is_quad(v):
                return True
            return all(isinstance(x, list) and _is_quad(x) for x in v)

        if not all(coords(v) for v in d.values()):
            return False
        for key, value in d.items():
            entries = value if all(isinstance(x, list) for x in value) else [value]
            for entry in entries:
                self._add_box(_numbers_of(entry) or [], str(key), None)
        return True

    # -- adding items, with validation --

    def _box_value(self, value: Any, label: str, d: dict[str, Any]) -> None:
        score = None
        hit = _first(d, SCORE_KEYS)
        if hit is not None:
            score = _number_of(hit[1])
            if score is None or not math.isfinite(score):
                self.problems.append(f"box {self.box_n + 1} score {hit[1]!r:.40} is not a number")
                score = None
        nums = _numbers_of(value)
        if nums is None:
            self.box_n += 1
            self.problems.append(f"box {self.box_n} is not a list of numbers: {value!r:.60}")
            return
        self._add_box(nums, label, score, _camera_of(d))

    def _add_box(self, nums: list[float], label: str, score: float | None,
                 camera: str = "") -> None:
        self.box_n += 1
        if len(nums) != 4:
            self.problems.append(f"box {self.box_n} has {_count(len(nums))} (expected 4)")
            return
        if not all(math.isfinite(n) for n in nums):
            self.problems.append(f"box {self.box_n} has a non-finite number; dropped")
            return
        if len(self.boxes) >= MAX_ITEMS:
            self._too_many("boxes")
            return
        x1, y1, x2, y2 = nums
        self.boxes.append(Box(x1, y1, x2, y2, label=label, score=score, camera=camera))

    def _point_value(self, value: Any, label: str, camera: str = "") -> None:
        nums = _numbers_of(value)
        if nums is None:
            self.point_n += 1
            self.problems.append(f"point {self.point_n} is not a list of numbers: {value!r:.60}")
            return
        self._add_point(nums, label, camera)

    def _point(self, nums: list[float], label: str, camera: str = "") -> Point | None:
        """Return a validated point (counted for messages), or ``None`` if unusable."""
        self.point_n += 1
        if len(nums) != 2:
            self.problems.append(f"point {self.point_n} has {_count(len(nums))} (expected 2)")
            return None
        if not all(math.isfinite(n) for n in nums):
            self.problems.append(f"point {self.point_n} has a non-finite number; dropped")
            return None
        return Point(nums[0], nums[1], label=label, camera=camera)

    def _add_point(self, nums: list[float], label: str, camera: str = "") -> None:
        point = self._point(nums, label, camera)
        if point is None:
            return
        if len(self.points) >= MAX_ITEMS:
            self._too_many("points")
            return
        self.points.append(point)

    def _trajectory_value(self, items: list[Any], label: str, camera: str = "") -> None:
        pts: list[Point] = []
        for item in items[:MAX_ITEMS]:
            if isinstance(item, dict):
                p = self._point_from_obj(item)
                if p is None:
                    self.point_n += 1
                    self.problems.append(f"trajectory point {item!r:.60} is not a point")
            else:
                nums = _numbers_of(item)
                p = self._point(nums, label, camera) if nums is not None else None
                if nums is None:
                    self.problems.append(f"trajectory point {item!r:.60} is not a point")
            if p is not None:
                pts.append(p)
        if len(items) > MAX_ITEMS:
            self._too_many("trajectory points")
        self._add_trajectory(pts, label, camera)

    def _add_trajectory(self, pts: list[Point], label: str, camera: str = "") -> None:
        """Add a trajectory; one whose points name different cameras becomes one per camera.

        A path lies in one image: points of two cameras cannot be joined into one, so each
        camera's run of points is its own trajectory. The trajectory's own ``camera`` (the
        object's key) wins over its points'.
        """
        if not camera and len({p.camera for p in pts}) > 1:
            runs: dict[str, list[Point]] = {}
            for p in pts:
                runs.setdefault(p.camera, []).append(p)
            for run_camera, run in runs.items():
                self._add_trajectory(run, label, run_camera)
            return
        self.traj_n += 1
        if not pts:
            self.problems.append(f"trajectory {self.traj_n} has no valid points")
            return
        if len(self.trajectories) >= MAX_ITEMS:
            self._too_many("trajectories")
            return
        camera = camera or (pts[0].camera if pts else "")
        self.trajectories.append(Trajectory(
            points=tuple(p if p.camera == camera else replace(p, camera=camera) for p in pts),
            label=label, camera=camera))

    def _span(self, d: dict[str, Any], start_key: str, end_key: str) -> None:
        self.span_n += 1
        start, end = parse_timestamp(d[start_key]), parse_timestamp(d[end_key])
        if start is None or end is None:
            bad = d[start_key] if start is None else d[end_key]
            self.problems.append(f"span {self.span_n} has an unreadable time {bad!r:.40}")
            return
        if end < start:
            self.problems.append(f"span {self.span_n} ends before it starts; swapped")
            start, end = end, start
        hit = _first(d, CAPTION_KEYS)
        caption = "" if hit is None or hit[1] is None else str(hit[1]).strip()
        if len(self.spans) >= MAX_ITEMS:
            self._too_many("spans")
            return
        self.spans.append(TemporalSpan(start_s=start, end_s=end, caption=caption))

    def _too_many(self, what: str) -> None:
        msg = f"more than {MAX_ITEMS} {what}; the rest ignored"
        if msg not in self.problems:
            self.problems.append(msg)


# --- counts ---------------------------------------------------------------------------------


def _whole_number(value: Any) -> int | None:
    """Return a whole number (int, integral float or digit string) in 0..MAX_COUNT_VALUE."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    elif isinstance(value, str) and len(value) <= 16 and value.strip().isdecimal():
        value = int(value.strip())
    if isinstance(value, int) and 0 <= value <= MAX_COUNT_VALUE:
        return value
    return None


def _json_count(value: Any, depth: int = 0) -> tuple[int | None, str | None]:
    if isinstance(value, dict):
        hit = _first(value, COUNT_KEYS)
        if hit is None:
            return None, None
        count = _whole_number(hit[1])
        if count is None:
            return None, (f"count {hit[1]!r:.40} is not a whole number in "
                          f"0..{MAX_COUNT_VALUE}")
        return count, None
    # One object per target ([{"label": "cup", "count": 2}, ...]): the total, as asked.
    if isinstance(value, list) and depth == 0 and 0 < len(value) <= MAX_ITEMS \
            and all(isinstance(v, dict) for v in value):
        total = 0
        for item in value:
            count, problem = _json_count(item, depth + 1)
            if count is None:
                return None, problem
            total += count
        return (total, None) if total <= MAX_COUNT_VALUE else (None, f"count {total} too large")
    return None, None


def _count_of(answer_json: str | None, answer: str) -> tuple[int | None, str | None]:
    """Return ``(count, problem)``: JSON when there is any, else a sole number in the prose."""
    if answer_json is not None:
        try:
            value = json.loads(answer_json)
        except (ValueError, RecursionError):
            return None, None
        return _json_count(value)
    text = answer[:MAX_SCAN_CHARS]
    values = {int(m) for m in _WHOLE.findall(text)}
    values |= {_NUMBER_WORDS.index(w.lower()) for w in _NUMBER_WORD.findall(text)}
    if len(values) > 1:
        shown = ", ".join(str(v) for v in sorted(values)[:5])
        return None, f"count is ambiguous: the answer names several numbers ({shown})"
    if values:
        count = _whole_number(values.pop())
        if count is None:
            return None, f"count in the answer is above {MAX_COUNT_VALUE}"
        return count, None
    return None, None


# --- yes / no -------------------------------------------------------------------------------


def _json_verdict(value: Any) -> bool | None:
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if not isinstance(value, dict):
        return None
    hit = _first(value, VERDICT_KEYS)
    if hit is None:
        return None
    v = hit[1]
    if isinstance(v, bool):
        return v
    if isinstance(v, str):
        return _text_verdict(v)
    return None


def _text_verdict(text: str) -> bool | None:
    head = text[:200]
    match = _YES_NO.match(head)
    if match is not None:
        return match.group(1).lower() in ("yes", "true")
    stripped = head.lstrip(" \t\r\n*_`#>\"'“「(")
    if stripped.startswith(("不是", "不对", "否", "没有")):
        return False
    if stripped.startswith(("是", "对")):
        return True
    return None
