"""Task templates -> chat messages, JSON schemas for structured tasks, and sampling choice.

What each task says, needs and returns is data in ``core/tasks.py``; this module renders it.

Every request about the same media shares one message prefix (system turn, then the user
turn's media placeholders) whatever the task or prompt: ``prefix_messages`` returns it, and
``build_request_messages`` only appends the task text after it. Rendered by the chat template,
everything up to the end of the media is then a token prefix of every request, so vLLM's
prefix cache can reuse a frame's vision blocks across questions.

Goal fields are validated here once (``BadRequestError`` names the field, the value and what
is allowed); the prompt text itself passes through unchanged, so any language works.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cosmos_reason_ros.core.models import ModelProfile, ReasoningPlacement
from cosmos_reason_ros.core.tasks import (
    CAMERA_WORDS,
    COORDINATE_WORDS,
    MAX_LABEL_CHARS,
    MAX_SCHEMA_ITEMS,
    FixedSchema,
    PromptUse,
    SamplingPreset,
    spec_for,
)
from cosmos_reason_ros.core.types import (
    BadRequestError,
    ContentPart,
    CoordinateConvention,
    Message,
    Sampling,
    Task,
)

MAX_PROMPT_CHARS = 4000
MAX_TARGETS = 16
MAX_TARGET_CHARS = 200
MAX_IMAGES = 16
DEFAULT_MAX_TOKENS_CAP = 8192
MAX_TEMPERATURE = 2.0
# Bounds that keep user-supplied schemas cheap to compile into a grammar.
MAX_SCHEMA_BYTES = 16384
MAX_SCHEMA_DEPTH = 16
# Upper bound for absolute-pixel coordinates when the input size is not known (Qwen2.5-VL
# inputs stay well below this even at the processor's largest budget).
MAX_INPUT_SIDE = 32768


DEFAULT_TASK = Task.VQA  # what an empty ``task`` field means


def parse_task(value: str | Task) -> Task:
    """Return the ``Task`` named by ``value``; empty means ``Task.VQA``.

    Case and ``-``/``_`` are ignored (``"Next-Action"`` is ``Task.NEXT_ACTION``).
    """
    if isinstance(value, Task):
        return value
    if not isinstance(value, str):
        raise BadRequestError(f"task={value!r} must be a string")
    name = value.strip().lower().replace("-", "_")
    if not name:
        return DEFAULT_TASK
    try:
        return Task(name)
    except ValueError:
        allowed = ", ".join(t.value for t in Task)
        raise BadRequestError(f"unknown task {value!r}; allowed: {allowed}") from None


def _check_text(field_name: str, text: str, max_chars: int) -> None:
    if not isinstance(text, str):
        raise BadRequestError(f"{field_name} must be a string, got {type(text).__name__}")
    if len(text) > max_chars:
        raise BadRequestError(
            f"{field_name} has {len(text)} characters; at most {max_chars} are allowed"
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:  # lone surrogates (e.g. from surrogateescape'd argv)
        raise BadRequestError(
            f"{field_name} is not valid Unicode text: {text[e.start]!r} at index {e.start} "
            "cannot be encoded as UTF-8"
        ) from None
    for ch in text:
        # Tabs and newlines are fine; other C0 controls (NUL above all) break tokenizers and
        # JSON transports.
        if ord(ch) < 0x20 and ch not in "\t\n\r":
            raise BadRequestError(
                f"{field_name} contains control character U+{ord(ch):04X}; only tab, CR and LF "
                "are allowed"
            )


def validate_goal_text(
    task: str | Task,
    prompt: str = "",
    targets: Iterable[str] = (),
    max_prompt_chars: int = MAX_PROMPT_CHARS,
) -> tuple[Task, str, tuple[str, ...]]:
    """Check a goal's task, prompt and targets; return ``(task, prompt, targets)``.

    The prompt is returned unchanged (never stripped or re-encoded); targets are stripped of
    surrounding whitespace and empty ones dropped.
    """
    task = parse_task(task)
    _check_text("prompt", prompt, max_prompt_chars)
    if isinstance(targets, str):
        raise BadRequestError("targets must be a list of strings, not one string")
    cleaned: list[str] = []
    for i, target in enumerate(targets):
        _check_text(f"targets[{i}]", target, MAX_TARGET_CHARS)
        if target.strip():
            cleaned.append(target.strip())
    if len(cleaned) > MAX_TARGETS:
        raise BadRequestError(
            f"targets has {len(cleaned)} entries; at most {MAX_TARGETS} are allowed"
        )
    spec = spec_for(task)
    if spec.needs_prompt and not prompt.strip():
        raise BadRequestError(
            f"prompt is empty; task '{task.value}' needs {spec.prompt_means} in prompt"
        )
    if spec.needs_targets and not cleaned:
        raise BadRequestError(
            f"targets is empty; task '{task.value}' needs at least one object to "
            f"{spec.targets_verb}"
        )
    return task, prompt, tuple(cleaned)


def _check_media(n_images: int, video: bool) -> None:
    if isinstance(n_images, bool) or not isinstance(n_images, int):
        raise BadRequestError(f"n_images={n_images!r} must be an integer")
    if not 0 <= n_images <= MAX_IMAGES:
        raise BadRequestError(f"n_images={n_images} is out of range; allowed 0..{MAX_IMAGES}")
    if n_images == 0 and not video:
        raise BadRequestError("a request needs at least one image or a video (n_images=0)")


def _system_text(profile: ModelProfile, reasoning: bool) -> str | None:
    if reasoning and profile.reasoning_placement is ReasoningPlacement.SYSTEM_PROMPT:
        return profile.reasoning_prompt  # Reason1: the reasoning format is the system prompt
    return profile.system_prompt


def _media_parts(n_images: int, video: bool) -> tuple[ContentPart, ...]:
    # Media before text in the user turn (both model cards); images first, then the clip.
    parts = tuple(ContentPart("image") for _ in range(n_images))
    return parts + ((ContentPart("video"),) if video else ())


def prefix_messages(
    profile: ModelProfile, n_images: int = 1, video: bool = False, reasoning: bool = False
) -> tuple[Message, ...]:
    """Return the conversation start that every request about the same media shares.

    System turn (when the profile has one) and a user turn holding only the media
    placeholders. It does not depend on the task or prompt. It depends on ``reasoning`` only
    for profiles that request reasoning through the system prompt (Cosmos-Reason1,
    Qwen2.5-VL); for Cosmos-Reason2 and Qwen3-VL it is the same with reasoning on or off.
    """
    _check_media(n_images, video)
    messages: list[Message] = []
    system = _system_text(profile, reasoning)
    if system is not None:
        messages.append(Message("system", (ContentPart("text", system),)))
    messages.append(Message("user", _media_parts(n_images, video)))
    return tuple(messages)


def _join_targets(targets: Sequence[str]) -> str:
    if len(targets) == 1:
        return targets[0]
    return ", ".join(targets[:-1]) + " and " + targets[-1]


def _media_noun(n_images: int, video: bool) -> str:
    if video:
        return "video"
    return "image" if n_images == 1 else "images"


def task_text(
    task: Task,
    prompt: str,
    targets: Sequence[str],
    convention: CoordinateConvention,
    n_images: int = 1,
    video: bool = False,
) -> str:
    """Return the user text for a validated task (without any reasoning instruction).

    Renders the task's template from ``core/tasks.py`` and places the prompt as it says.
    """
    spec = spec_for(task)
    given = bool(prompt.strip())
    template = spec.template_many if len(targets) > 1 and spec.template_many else spec.template
    text = template.format(
        # An empty prompt stays as given unless the task has a default (vqa echoes it).
        prompt=prompt if given or not spec.default_prompt else spec.default_prompt,
        targets=_join_targets(targets) if targets else "",
        media=_media_noun(n_images, video),
        coordinates=COORDINATE_WORDS[convention],
    )
    if spec.prompt_use is PromptUse.AFTER and given:
        return f"{text}\n{prompt}"
    if spec.prompt_use is PromptUse.BEFORE and given:
        return f"{prompt}\n{text}"
    return text


def _check_cameras(cameras: Sequence[str], n_images: int, video: bool) -> None:
    if len(cameras) > 1 and (video or len(cameras) != n_images):
        raise BadRequestError(
            f"{len(cameras)} camera names for {n_images} images"
            f"{' and a video' if video else ''}; a multi-camera request has one image per "
            f"camera and no video"
        )


def quote_cameras(cameras: Sequence[str]) -> str:
    """Camera names as the prompt and problems quote them: ``"front", "wrist"``."""
    return ", ".join(f'"{name}"' for name in cameras)


def build_request_messages(
    profile: ModelProfile,
    task: str | Task,
    prompt: str = "",
    targets: Iterable[str] = (),
    reasoning: bool = False,
    n_images: int = 1,
    video: bool = False,
    max_prompt_chars: int = MAX_PROMPT_CHARS,
    cameras: Sequence[str] = (),
) -> tuple[Message, ...]:
    """Build the chat messages for one goal: ``prefix_messages`` plus the task text.

    With reasoning on, Cosmos-Reason2 / Qwen3-VL get the format instruction appended to the
    user text after a blank line; Cosmos-Reason1 / Qwen2.5-VL get it as the system prompt.

    ``cameras`` names the images of a multi-camera request, in order (one name per image).
    With two or more, the text starts with the profile's sentence naming each image, and
    coordinate tasks ask for the camera of every entry. One name or none changes nothing.
    """
    task, prompt, cleaned = validate_goal_text(task, prompt, targets, max_prompt_chars)
    if spec_for(task).needs_video and not video:
        raise BadRequestError(
            f"task '{task.value}' needs a video clip; the request has only images"
        )
    _check_cameras(cameras, n_images, video)
    prefix = prefix_messages(profile, n_images, video, reasoning)
    text = task_text(task, prompt, cleaned, profile.coordinates, n_images, video)
    if len(cameras) > 1:
        if spec_for(task).has_coordinates:
            text = f"{text}\n{CAMERA_WORDS.format(cameras=quote_cameras(cameras))}"
        text = f"{profile.introduce_cameras(cameras)}\n{text}"
    if reasoning and profile.reasoning_placement is ReasoningPlacement.USER_SUFFIX:
        text = f"{text}\n\n{profile.reasoning_prompt}"
    media_turn = prefix[-1]
    user = Message("user", media_turn.content + (ContentPart("text", text),))
    return prefix[:-1] + (user,)


# --- schemas ---------------------------------------------------------------------------------


def _coordinate_schema(
    convention: CoordinateConvention, input_size: tuple[int, int] | None
) -> dict[str, Any]:
    if convention is CoordinateConvention.NORMALIZED_1000:
        maximum = 1000
    elif input_size is not None:
        maximum = max(input_size)
    else:
        maximum = MAX_INPUT_SIDE
    # Integers, not numbers: an unbounded fraction could run until max_tokens.
    return {"type": "integer", "minimum": 0, "maximum": maximum}


def _label_schema(targets: Sequence[str]) -> dict[str, Any]:
    if targets:
        return {"type": "string", "enum": list(targets)}
    return {"type": "string", "maxLength": MAX_LABEL_CHARS}


def _coordinates_array(key: str, count: int, coordinate: dict[str, Any],
                       label: dict[str, Any], min_items: int,
                       cameras: Sequence[str] = ()) -> dict[str, Any]:
    properties: dict[str, Any] = {
        key: {"type": "array", "items": coordinate, "minItems": count, "maxItems": count},
        "label": label,
    }
    required = [key, "label"]
    if len(cameras) > 1:  # which image the coordinates are in; an enum, so never guessed
        properties["camera"] = {"type": "string", "enum": list(cameras)}
        required.append("camera")
    return {
        "type": "array",
        "minItems": min_items,
        "maxItems": MAX_SCHEMA_ITEMS,
        "items": {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": False,
        },
    }


def task_schema(
    task: str | Task,
    targets: Iterable[str] = (),
    convention: CoordinateConvention = CoordinateConvention.NORMALIZED_1000,
    input_size: tuple[int, int] | None = None,
    cameras: Sequence[str] = (),
) -> dict[str, Any] | None:
    """JSON schema for a structured task's answer (``None`` for free-text tasks).

    Every string, array and number is bounded so that constrained decoding terminates even
    with random weights. Coordinates are integers in 0..1000 for ``NORMALIZED_1000`` and in
    0..max(``input_size``) for ``INPUT_PIXELS`` (with several images: the largest input
    side of any). Labels are restricted to the targets when targets are given. With two or
    more ``cameras`` every coordinate entry requires a ``camera``, one of those names;
    answers about the whole scene (verify, count) keep their schema.
    """
    shape = spec_for(parse_task(task)).schema
    if shape is None:
        return None
    if isinstance(shape, FixedSchema):
        return shape.build()
    cleaned = [t.strip() for t in targets if t.strip()] if shape.labels_from_targets else []
    return _coordinates_array(shape.key, shape.arity, _coordinate_schema(convention, input_size),
                              _label_schema(cleaned), shape.min_items, cameras)


_SCHEMA_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
_SUBSCHEMA_KEYS = frozenset({
    "additionalProperties", "not", "contains", "propertyNames", "if", "then", "else",
    "additionalItems", "unevaluatedItems", "unevaluatedProperties",
})
_SUBSCHEMA_LIST_KEYS = frozenset({"anyOf", "oneOf", "allOf", "prefixItems"})
_SUBSCHEMA_MAP_KEYS = frozenset({
    "properties", "patternProperties", "$defs", "definitions", "dependentSchemas",
})
_COUNT_KEYS = frozenset({
    "minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties",
    "minContains", "maxContains",
})
_NUMBER_KEYS = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                          "multipleOf"})
_STRING_KEYS = frozenset({"pattern", "format", "$ref", "$schema", "$id", "title"})


def _schema_error(path: str, message: str) -> BadRequestError:
    return BadRequestError(f"response_schema at {path}: {message}")


def _check_subschema(node: Any, path: str, depth: int, max_depth: int) -> None:
    if depth > max_depth:
        raise _schema_error(path, f"nested deeper than {max_depth} levels")
    if isinstance(node, bool):
        return  # true / false are valid schemas
    if not isinstance(node, dict):
        raise _schema_error(path, f"expected a schema object, got {type(node).__name__}")
    for key, value in node.items():
        where = f"{path}/{key}"
        if key == "type":
            names = value if isinstance(value, list) else [value]
            if not names or any(not isinstance(n, str) or n not in _SCHEMA_TYPES for n in names):
                raise _schema_error(
                    where, f"{value!r} is not a JSON Schema type; allowed: "
                    f"{', '.join(sorted(_SCHEMA_TYPES))} (or a list of them)"
                )
            if len(set(names)) != len(names):
                raise _schema_error(where, f"{value!r} repeats a type")
        elif key == "items":
            if isinstance(value, list):  # draft-04..2019 tuple form
                for i, sub in enumerate(value):
                    _check_subschema(sub, f"{where}/{i}", depth + 1, max_depth)
            else:
                _check_subschema(value, where, depth + 1, max_depth)
        elif key in _SUBSCHEMA_KEYS:
            _check_subschema(value, where, depth + 1, max_depth)
        elif key in _SUBSCHEMA_LIST_KEYS:
            if not isinstance(value, list) or not value:
                raise _schema_error(where, "expected a non-empty list of schemas")
            for i, sub in enumerate(value):
                _check_subschema(sub, f"{where}/{i}", depth + 1, max_depth)
        elif key in _SUBSCHEMA_MAP_KEYS:
            if not isinstance(value, dict):
                raise _schema_error(where, f"expected an object, got {type(value).__name__}")
            for name, sub in value.items():
                _check_subschema(sub, f"{where}/{name}", depth + 1, max_depth)
        elif key == "required":
            if not isinstance(value, list) or any(not isinstance(n, str) for n in value):
                raise _schema_error(where, "expected a list of property names")
        elif key == "enum":
            if not isinstance(value, list) or not value:
                raise _schema_error(where, "expected a non-empty list")
        elif key in _COUNT_KEYS:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise _schema_error(where, f"{value!r} must be a non-negative integer")
        elif key in _NUMBER_KEYS:
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value)):
                raise _schema_error(where, f"{value!r} must be a finite number")
            if key == "multipleOf" and value <= 0:
                raise _schema_error(where, f"{value!r} must be greater than 0")
        elif key in _STRING_KEYS and not isinstance(value, str):
            raise _schema_error(where, f"expected a string, got {type(value).__name__}")
        elif key == "$ref" and not value.startswith("#"):
            # Only references inside the schema: a goal must never make the node (or the
            # engine's grammar compiler) read a file or fetch a URL.
            raise _schema_error(where, f"{value!r} is not a local reference; only '#...' "
                                "references inside the schema are allowed")
    for low, high in (("minLength", "maxLength"), ("minItems", "maxItems"),
                      ("minimum", "maximum"), ("minProperties", "maxProperties")):
        if low in node and high in node and node[low] > node[high]:
            raise _schema_error(path, f"{low}={node[low]} exceeds {high}={node[high]}")


def validate_schema(
    schema: Any, max_bytes: int = MAX_SCHEMA_BYTES, max_depth: int = MAX_SCHEMA_DEPTH
) -> dict[str, Any]:
    """Check that a user-supplied JSON schema is structurally valid and small; return it.

    Structural checks only (``jsonschema`` may be absent on a robot): a JSON object at the top,
    known ``type`` names, well-formed sub-schemas, non-negative counts, finite numbers,
    consistent min/max pairs, at most ``max_bytes`` of UTF-8 JSON and ``max_depth`` levels.
    """
    if not isinstance(schema, dict):
        raise BadRequestError(
            f"response_schema must be a JSON object, got {type(schema).__name__}"
        )
    try:
        size = len(json.dumps(schema, ensure_ascii=False, allow_nan=False).encode("utf-8"))
    except (TypeError, ValueError, RecursionError) as e:
        raise BadRequestError(f"response_schema is not JSON-serializable: {e}") from e
    if size > max_bytes:
        raise BadRequestError(f"response_schema is {size} bytes; at most {max_bytes} allowed")
    _check_subschema(schema, "#", 0, max_depth)
    return schema


def parse_response_schema(
    text: str, max_bytes: int = MAX_SCHEMA_BYTES, max_depth: int = MAX_SCHEMA_DEPTH
) -> dict[str, Any] | None:
    """Parse and validate a goal's ``response_schema`` text; empty text means no schema."""
    if not isinstance(text, str):
        raise BadRequestError(f"response_schema must be JSON text, got {type(text).__name__}")
    if not text.strip():
        return None
    size = len(text.encode("utf-8", errors="replace"))
    if size > max_bytes:
        raise BadRequestError(f"response_schema is {size} bytes; at most {max_bytes} allowed")
    try:
        schema = json.loads(text)
    except ValueError as e:
        raise BadRequestError(f"response_schema is not valid JSON: {e}") from e
    except RecursionError as e:
        raise BadRequestError(
            f"response_schema is nested deeper than {max_depth} levels"
        ) from e
    return validate_schema(schema, max_bytes, max_depth)


# --- sampling --------------------------------------------------------------------------------


def preset_for(profile: ModelProfile, task: str | Task, reasoning: bool) -> Sampling:
    """Return the profile's sampling preset for a task: coordinates, reasoning, or plain."""
    if spec_for(parse_task(task)).sampling is SamplingPreset.GROUNDING:
        # Cookbook: grounding, pointing and trajectories want low temperature and top_p
        # (0.3 / 0.3) with or without reasoning.
        return profile.sampling_structured
    return profile.sampling_reasoning if reasoning else profile.sampling_plain


def _finite(field_name: str, value: Any, allowed: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequestError(f"{field_name}={value!r} must be a number; {allowed}")
    if not math.isfinite(value):
        raise BadRequestError(f"{field_name}={value!r} is not a finite number; {allowed}")
    return float(value)


def sampling_for(
    profile: ModelProfile,
    task: str | Task,
    reasoning: bool,
    max_tokens: int = 0,
    temperature: float = -1.0,
    top_p: float = 0.0,
    seed: int | None = None,
    max_tokens_cap: int = DEFAULT_MAX_TOKENS_CAP,
) -> Sampling:
    """Return the sampling for one goal: the preset with the goal's overrides, validated.

    ``max_tokens`` 0 means "use the preset" (ROS message fields default to 0); 1..cap is an
    explicit limit; anything else is an error (Reason.action documents only these). The
    preset's ``max_tokens`` is capped at ``max_tokens_cap``. ``temperature`` and ``top_p`` at 0
    or below mean the preset. A ``seed`` of 0 or below means none (0 is also the ROS default).
    """
    if isinstance(max_tokens_cap, bool) or not isinstance(max_tokens_cap, int) \
            or max_tokens_cap < 1:
        raise BadRequestError(f"max_tokens_cap={max_tokens_cap!r} must be a positive integer")
    preset = preset_for(profile, task, reasoning)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        raise BadRequestError(f"max_tokens={max_tokens!r} must be an integer")
    if max_tokens < 0:
        # A negative limit used to fall back to the preset silently; refuse it.
        raise BadRequestError(
            f"max_tokens={max_tokens} is negative; allowed 1..{max_tokens_cap}, or 0 for the "
            f"model preset"
        )
    if max_tokens > max_tokens_cap:
        raise BadRequestError(
            f"max_tokens={max_tokens} exceeds the limit; allowed 1..{max_tokens_cap}, or 0 for "
            f"the model preset"
        )
    tokens = max_tokens if max_tokens > 0 else min(preset.max_tokens, max_tokens_cap)

    allowed_temperature = f"allowed 0 < temperature <= {MAX_TEMPERATURE}, or <= 0 for the preset"
    temp = _finite("temperature", temperature, allowed_temperature)
    if temp > MAX_TEMPERATURE:
        raise BadRequestError(f"temperature={temperature!r} is too high; {allowed_temperature}")
    temp = temp if temp > 0 else preset.temperature

    allowed_top_p = "allowed 0 < top_p <= 1, or <= 0 for the preset"
    nucleus = _finite("top_p", top_p, allowed_top_p)
    if nucleus > 1.0:
        raise BadRequestError(f"top_p={top_p!r} is too high; {allowed_top_p}")
    nucleus = nucleus if nucleus > 0 else preset.top_p

    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise BadRequestError(f"seed={seed!r} must be an integer")
        if seed >= 2**63:
            raise BadRequestError(f"seed={seed} is too large; allowed 0..{2**63 - 1}")
        seed = seed if seed > 0 else None

    return Sampling(
        max_tokens=tokens,
        temperature=temp,
        top_p=nucleus,
        top_k=preset.top_k,
        presence_penalty=preset.presence_penalty,
        repetition_penalty=preset.repetition_penalty,
        seed=seed,
    )


def task_needs_schema(task: str | Task) -> bool:
    """Tell whether a task's answer is JSON with a fixed shape (see ``task_schema``)."""
    return spec_for(parse_task(task)).schema is not None


def schema_for_request(
    task: str | Task,
    targets: Iterable[str],
    convention: CoordinateConvention,
    input_size: tuple[int, int] | None = None,
    user_schema: Mapping[str, Any] | None = None,
    cameras: Sequence[str] = (),
) -> dict[str, Any] | None:
    """Return the schema to constrain a request with: the user's (validated) or the task's."""
    if user_schema is not None:
        return validate_schema(dict(user_schema))
    return task_schema(task, targets, convention, input_size, cameras)
