"""The task registry: one ``TaskSpec`` per task says everything the package does differently.

``prompts.py`` renders a spec's template, checks its required goal fields, builds its JSON
schema and picks its sampling preset; ``parsing.py`` reads from it which answer shape to
expect. Nothing else branches on the task, so a new task is one entry in ``_SPECS``, its
member in ``types.Task`` (checked against this table at import) and its tests; the recipe is
in docs/DEVELOPING.md.

Template placeholders: ``{prompt}`` (the goal's prompt, or ``default_prompt`` when it is
empty), ``{targets}`` (the targets joined as "a, b and c"), ``{media}`` ("image", "images" or
"video") and ``{coordinates}`` (how the model family writes coordinates: the only wording
that differs between families today; see ``COORDINATE_WORDS``). Literal braces are doubled.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from cosmos_reason_ros.core.types import CoordinateConvention, Task

# Bounds inside our own schemas: random-weight models under constrained decoding only stop
# when every string, array and number has a maximum.
MAX_SCHEMA_ITEMS = 32
MAX_LABEL_CHARS = 64
MAX_REASON_CHARS = 300
MAX_CAPTION_CHARS = 200
MAX_COUNT = 1000  # 4 digits at most; a VLM's count above this means nothing
TIME_PATTERN = r"^[0-9]{2}:[0-9]{2}\.[0-9]{2}$"  # mm:ss.ff, as Reason temporal outputs use

COORDINATE_WORDS: Mapping[CoordinateConvention, str] = MappingProxyType({
    # Qwen3-VL / Reason2 write 0-1000 per axis natively; saying so keeps outputs on it.
    CoordinateConvention.NORMALIZED_1000: "with coordinates normalized to 0-1000",
    # Qwen2.5-VL / Reason1 answer in pixels of the (resized) image they see: never promise
    # 0-1000 to them.
    CoordinateConvention.INPUT_PIXELS: "with coordinates in pixels of the image",
})

# With several cameras a coordinate means nothing without the image it is in: coordinate
# tasks ask for the camera of every entry (the schema then requires it, from the goal's
# camera names). ``{cameras}`` is the names, quoted and comma-separated.
CAMERA_WORDS = ('Add "camera" to every entry: the camera whose image shows it (one of '
                "{cameras}); its coordinates are in that camera's image.")


class PromptUse(str, enum.Enum):
    """Where the goal's prompt goes in the task text."""

    INLINE = "inline"  # at ``{prompt}`` in the template (``default_prompt`` when empty)
    AFTER = "after"  # on its own line after the template, when not empty
    BEFORE = "before"  # on its own line before the template, when not empty


class AnswerKind(str, enum.Enum):
    """What a complete answer holds; the value is its name in ``ParsedAnswer.found``."""

    TEXT = "text"  # free text: nothing in particular to find
    BOXES = "boxes"
    POINTS = "points"
    TRAJECTORIES = "trajectories"
    SPANS = "spans"
    VERDICT = "yes_no"
    COUNT = "count"

    @property
    def missing(self) -> str:
        """The problem reported when the answer (empty or not) holds none of this."""
        what = {AnswerKind.VERDICT: "yes/no verdict"}.get(self, self.value)
        return f"no {what} found in the answer"


class SamplingPreset(str, enum.Enum):
    """Which of a model profile's sampling presets a task uses."""

    DEFAULT = "default"  # ``sampling_plain``, or ``sampling_reasoning`` with reasoning on
    # ``sampling_structured``, with or without reasoning: the cookbook's temperature 0.3 /
    # top_p 0.3 for grounding, pointing and trajectories.
    GROUNDING = "grounding"


@dataclass(frozen=True)
class CoordinateListSchema:
    """Schema of a bounded list of ``{key: [arity integers], "label": ...}`` objects.

    Coordinate bounds follow the model's convention and input size (``prompts.task_schema``).
    """

    key: str
    arity: int
    min_items: int = 0
    labels_from_targets: bool = True  # restrict labels to the goal's targets


@dataclass(frozen=True)
class FixedSchema:
    """A schema that does not depend on the goal, kept as JSON text so it stays immutable."""

    json_text: str

    @classmethod
    def of(cls, schema: Mapping[str, Any]) -> FixedSchema:
        """Freeze a schema given as a mapping."""
        return cls(json.dumps(schema))

    def build(self) -> dict[str, Any]:
        """Return a fresh copy (callers may change it)."""
        result: dict[str, Any] = json.loads(self.json_text)
        return result


@dataclass(frozen=True)
class TaskSpec:
    """Everything that differs between tasks: wording, required fields, answer, schema."""

    name: Task
    template: str
    template_many: str = ""  # used with two or more targets; "" = ``template``
    prompt_use: PromptUse = PromptUse.AFTER
    default_prompt: str = ""
    needs_prompt: bool = False
    prompt_means: str = "the question"  # in "prompt is empty; task 'x' needs <this> in prompt"
    needs_targets: bool = False
    targets_verb: str = ""  # in "task 'x' needs at least one object to <this>"
    needs_video: bool = False
    answer: AnswerKind = AnswerKind.TEXT
    schema: CoordinateListSchema | FixedSchema | None = None
    sampling: SamplingPreset = SamplingPreset.DEFAULT
    # ReasoningResult fields that carry this task's answer (raw_text, reasoning, parsed,
    # tokens, timings ... are filled for every task).
    result_fields: tuple[str, ...] = ("answer",)

    @property
    def has_coordinates(self) -> bool:
        """Tell whether the answer is model coordinates (mapped to original pixels later)."""
        return self.answer in (AnswerKind.BOXES, AnswerKind.POINTS, AnswerKind.TRAJECTORIES)


_BOX_SHAPE = '[{{"bbox_2d": [x1, y1, x2, y2], "label": "<object>"}}]'
_POINT_SHAPE = '[{{"point_2d": [x, y], "label": "<object>"}}]'
_ONE_ENTRY_EACH = ", one entry per object found, {coordinates}."

_SPECS: tuple[TaskSpec, ...] = (
    TaskSpec(
        Task.VQA, "{prompt}", prompt_use=PromptUse.INLINE, needs_prompt=True,
    ),
    TaskSpec(
        # "Caption the video in detail." is the model repo's caption prompt.
        Task.CAPTION, "Caption the {media} in detail.",
    ),
    TaskSpec(
        # Single target: the model repo's 2D grounding prompt, then the shape we parse.
        Task.GROUND,
        "Locate the bounding box of {targets}. Return a json. Use the format " + _BOX_SHAPE
        + _ONE_ENTRY_EACH,
        template_many="Locate the bounding boxes of {targets}. Return a json. Use the format "
        + _BOX_SHAPE + _ONE_ENTRY_EACH,
        needs_targets=True, targets_verb="locate", answer=AnswerKind.BOXES,
        schema=CoordinateListSchema("bbox_2d", 4), sampling=SamplingPreset.GROUNDING,
        result_fields=("answer", "answer_json", "boxes"),
    ),
    TaskSpec(
        Task.POINT,
        "Point to {targets}. Return a json. Use the format " + _POINT_SHAPE + _ONE_ENTRY_EACH,
        needs_targets=True, targets_verb="point at", answer=AnswerKind.POINTS,
        schema=CoordinateListSchema("point_2d", 2), sampling=SamplingPreset.GROUNDING,
        result_fields=("answer", "answer_json", "points"),
    ),
    TaskSpec(
        # The model repo's end-effector trajectory prompt, verbatim ("pixel space" included,
        # although Reason2 answers in 0-1000).
        Task.TRAJECTORY,
        'You are given the task "{prompt}". Specify the 2D trajectory your end effector should '
        "follow in pixel space. Return the trajectory coordinates in JSON format like this: "
        '{{"point_2d": [x, y], "label": "gripper trajectory"}}.',
        prompt_use=PromptUse.INLINE, needs_prompt=True, prompt_means="the task to perform",
        answer=AnswerKind.TRAJECTORIES,
        schema=CoordinateListSchema("point_2d", 2, min_items=1, labels_from_targets=False),
        sampling=SamplingPreset.GROUNDING,
        result_fields=("answer", "answer_json", "trajectories"),
    ),
    TaskSpec(
        # The model repo's embodied-reasoning question; the prompt adds context before it.
        Task.NEXT_ACTION, "What can be the next immediate action?", prompt_use=PromptUse.BEFORE,
    ),
    TaskSpec(
        Task.VERIFY,
        "{prompt}\nAnswer yes or no and give a short reason. Return a json like "
        '{{"answer": "yes", "reason": "..."}}.',
        prompt_use=PromptUse.INLINE, needs_prompt=True, answer=AnswerKind.VERDICT,
        schema=FixedSchema.of({
            "type": "object",
            "properties": {
                "answer": {"type": "string", "enum": ["yes", "no"]},
                "reason": {"type": "string", "maxLength": MAX_REASON_CHARS},
            },
            "required": ["answer", "reason"],
            "additionalProperties": False,
        }),
        result_fields=("answer", "answer_json"),
    ),
    TaskSpec(
        Task.TEMPORAL,
        "{prompt}\nFor each event give its start and end time in mm:ss.ff format and a short "
        'caption. Return a json list like [{{"start": "00:01.50", "end": "00:03.00", '
        '"caption": "..."}}].',
        prompt_use=PromptUse.INLINE, default_prompt="Describe the notable events in the video.",
        needs_video=True, answer=AnswerKind.SPANS,
        schema=FixedSchema.of({
            "type": "array",
            "minItems": 0,
            "maxItems": MAX_SCHEMA_ITEMS,
            "items": {
                "type": "object",
                "properties": {
                    "start": {"type": "string", "pattern": TIME_PATTERN, "minLength": 8,
                              "maxLength": 8},
                    "end": {"type": "string", "pattern": TIME_PATTERN, "minLength": 8,
                            "maxLength": 8},
                    "caption": {"type": "string", "maxLength": MAX_CAPTION_CHARS},
                },
                "required": ["start", "end", "caption"],
                "additionalProperties": False,
            },
        }),
        result_fields=("answer", "answer_json", "spans"),
    ),
    TaskSpec(
        # One integer for all targets together; the prompt (optional) adds conditions.
        # Default sampling like verify: the cookbook's low temperature is for coordinates.
        Task.COUNT,
        'How many {targets} are visible in the {media}? Return a json like '
        '{{"count": <number>}}, with 0 if there are none.',
        template_many='How many {targets} are visible in the {media} in total? Return a json '
        'like {{"count": <number>}}, with 0 if there are none.',
        needs_targets=True, targets_verb="count", answer=AnswerKind.COUNT,
        schema=FixedSchema.of({
            "type": "object",
            "properties": {"count": {"type": "integer", "minimum": 0, "maximum": MAX_COUNT}},
            "required": ["count"],
            "additionalProperties": False,
        }),
        result_fields=("answer", "answer_json"),
    ),
)


def _index(specs: tuple[TaskSpec, ...]) -> Mapping[Task, TaskSpec]:
    """Key the specs by task, in ``types.Task`` order.

    ``types.Task`` names the tasks and this table defines them: they must agree exactly, so a
    task without a spec (or with two) fails at import instead of at a goal.
    """
    table: dict[Task, TaskSpec] = {}
    for spec in specs:
        if spec.name in table:
            raise RuntimeError(f"core/tasks.py: two TaskSpec entries for task {spec.name.value}")
        table[spec.name] = spec
    missing = [t.value for t in Task if t not in table]
    if missing:
        raise RuntimeError(f"core/tasks.py: no TaskSpec for task(s) {', '.join(missing)}")
    return MappingProxyType({task: table[task] for task in Task})


TASKS: Mapping[Task, TaskSpec] = _index(_SPECS)
"""The registry: every ``Task`` and its spec, read-only."""

_BY_NAME: Mapping[str, TaskSpec] = MappingProxyType({t.value: s for t, s in TASKS.items()})


def spec_for(task: Task) -> TaskSpec:
    """Return the spec of a task (every ``Task`` has one)."""
    return TASKS[task]


def find_spec(name: str) -> TaskSpec | None:
    """Return the spec for an exact task name (``"ground"``), or ``None`` when unknown."""
    return _BY_NAME.get(name)
