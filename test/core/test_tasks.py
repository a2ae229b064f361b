"""Tests for core/tasks.py: the registry is complete, consistent, and what the others read."""

from __future__ import annotations

import re
import string
from pathlib import Path

import pytest

from cosmos_reason_ros.core import parsing, tasks
from cosmos_reason_ros.core.tasks import (
    TASKS,
    AnswerKind,
    CoordinateListSchema,
    FixedSchema,
    PromptUse,
    SamplingPreset,
    spec_for,
)
from cosmos_reason_ros.core.types import CoordinateConvention, ParsedAnswer, Task

ROOT = Path(__file__).resolve().parents[2]
PLACEHOLDERS = {"prompt", "targets", "media", "coordinates"}


def placeholders(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}


def templates(spec: tasks.TaskSpec) -> list[str]:
    return [spec.template] + ([spec.template_many] if spec.template_many else [])


def test_every_task_has_exactly_one_spec_under_its_own_name():
    assert list(TASKS) == list(Task)
    for task, spec in TASKS.items():
        assert spec.name is task and spec_for(task) is spec
        assert tasks.find_spec(task.value) is spec
    assert tasks.find_spec("dance") is None


def test_the_registry_is_read_only():
    with pytest.raises(TypeError):
        TASKS[Task.VQA] = TASKS[Task.CAPTION]  # type: ignore[index]


def test_a_task_without_a_spec_or_with_two_fails_at_import():
    specs = tuple(TASKS.values())
    with pytest.raises(RuntimeError, match="no TaskSpec for task\\(s\\) count"):
        tasks._index(tuple(s for s in specs if s.name is not Task.COUNT))
    with pytest.raises(RuntimeError, match="two TaskSpec entries for task vqa"):
        tasks._index(specs + (TASKS[Task.VQA],))


@pytest.mark.parametrize("spec", TASKS.values(), ids=[t.value for t in TASKS])
def test_templates_use_only_known_placeholders_and_place_the_prompt_once(spec):
    for template in templates(spec):
        used = placeholders(template)
        assert used <= PLACEHOLDERS, used - PLACEHOLDERS
        # The prompt is either in the template (INLINE) or added around it, never both.
        assert ("prompt" in used) is (spec.prompt_use is PromptUse.INLINE)
        assert ("targets" in used) is spec.needs_targets
        assert ("coordinates" in used) is (spec.answer in (AnswerKind.BOXES, AnswerKind.POINTS))


@pytest.mark.parametrize("convention", list(CoordinateConvention))
@pytest.mark.parametrize("spec", TASKS.values(), ids=[t.value for t in TASKS])
def test_every_template_renders_for_every_family(spec, convention):
    for template in templates(spec):
        text = template.format(prompt="P", targets="T", media="image",
                               coordinates=tasks.COORDINATE_WORDS[convention])
        assert "{{" not in text and "}}" not in text
        assert text.count("{") == text.count("}")  # JSON examples survive with single braces


@pytest.mark.parametrize("spec", TASKS.values(), ids=[t.value for t in TASKS])
def test_required_fields_come_with_their_error_wording(spec):
    assert bool(spec.targets_verb) is spec.needs_targets
    assert spec.prompt_means
    if spec.needs_prompt:
        assert not spec.default_prompt  # a required prompt has no default


@pytest.mark.parametrize("spec", TASKS.values(), ids=[t.value for t in TASKS])
def test_coordinate_answers_get_a_coordinate_schema_and_the_grounding_preset(spec):
    # Cookbook: grounding, pointing and trajectories sample at temperature 0.3 / top_p 0.3.
    assert spec.has_coordinates is (spec.sampling is SamplingPreset.GROUNDING)
    assert spec.has_coordinates is isinstance(spec.schema, CoordinateListSchema)
    if spec.answer is not AnswerKind.TEXT:
        assert spec.schema is not None, "a structured answer needs a schema to constrain it"
    if isinstance(spec.schema, FixedSchema):
        assert spec.schema.build() == spec.schema.build()
        assert spec.schema.build() is not spec.schema.build()


def test_answer_kinds_name_parsed_answer_fields_or_found_tags():
    for kind in (AnswerKind.BOXES, AnswerKind.POINTS, AnswerKind.TRAJECTORIES, AnswerKind.SPANS):
        assert kind.value in ParsedAnswer.__dataclass_fields__
    assert AnswerKind.VERDICT.missing == "no yes/no verdict found in the answer"
    assert AnswerKind.COUNT.missing == "no count found in the answer"


@pytest.mark.parametrize("spec", TASKS.values(), ids=[t.value for t in TASKS])
def test_the_parser_reports_a_missing_answer_of_the_kind_the_spec_expects(spec):
    out = parsing.parse_output("Nothing to see here.", task=spec.name)
    if spec.answer is AnswerKind.TEXT:
        assert out.problems == ()
    else:
        assert spec.answer.missing in out.problems


def _message_fields(path: Path) -> set[str]:
    fields = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and "=" not in line:
            fields.add(line.split()[1])
    return fields


@pytest.mark.parametrize("spec", TASKS.values(), ids=[t.value for t in TASKS])
def test_result_fields_are_fields_of_the_result_message(spec):
    fields = _message_fields(ROOT / "cosmos_reason_interfaces" / "msg" / "ReasoningResult.msg")
    assert "answer" in spec.result_fields
    assert set(spec.result_fields) <= fields


def _action_task_comment() -> str:
    lines = (ROOT / "cosmos_reason_interfaces/action/Reason.action").read_text().splitlines()
    end = lines.index("string task")
    start = end
    while lines[start - 1].startswith("#"):
        start -= 1
    return "\n".join(lines[start:end])


def _interfaces_task_row() -> str:
    text = (ROOT / "docs/INTERFACES.md").read_text()
    return next(line for line in text.splitlines() if line.startswith("| `task` |"))


@pytest.mark.parametrize("where", [_action_task_comment, _interfaces_task_row],
                         ids=["Reason.action", "INTERFACES.md"])
def test_the_interface_docs_list_every_task(where):
    text = where()
    for task in Task:
        assert re.search(rf"\b{task.value}\b", text), f"{text!r} does not list {task.value}"
