import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cosmos_reason_ros.core import prompts
from cosmos_reason_ros.core.models import (
    COSMOS_REASON1,
    COSMOS_REASON2,
    PROFILES,
    QWEN2_5_VL,
    QWEN3_VL,
)
from cosmos_reason_ros.core.prompts import (
    build_request_messages,
    parse_response_schema,
    parse_task,
    prefix_messages,
    sampling_for,
    task_schema,
    validate_schema,
)
from cosmos_reason_ros.core.types import (
    BadRequestError,
    ContentPart,
    CoordinateConvention,
    ErrorCode,
    Message,
    Task,
)

REASON2_FORMAT = (
    "Answer the question using the following format:\n\n<think>\nYour reasoning.\n</think>\n\n"
    "Write your final answer immediately after the </think> tag."
)
REASON1_SYSTEM = (
    "You are a helpful assistant. Answer the question in the following format: "
    "<think>\nyour reasoning\n</think>\n\n<answer>\nyour answer\n</answer>."
)
ALL_PROFILES = list(PROFILES.values())
PROFILE_IDS = list(PROFILES)

# A valid goal for every task (task, prompt, targets, video).
GOALS = {
    Task.VQA: ("Is the aisle ahead blocked?", (), False),
    Task.CAPTION: ("", (), False),
    Task.GROUND: ("", ("red cup",), False),
    Task.POINT: ("", ("red cup", "blue box"), False),
    Task.TRAJECTORY: ("put the cup in the sink", (), False),
    Task.NEXT_ACTION: ("", (), False),
    Task.VERIFY: ("Did the gripper pick up the part?", (), False),
    Task.TEMPORAL: ("", (), True),
    Task.COUNT: ("", ("red cup",), False),
}


def user_text(messages):
    user = messages[-1]
    assert user.role == "user"
    texts = [p for p in user.content if p.kind == "text"]
    assert len(texts) == 1
    return texts[0].text


def system_text(messages):
    systems = [m for m in messages if m.role == "system"]
    return systems[0].content[0].text if systems else None


# --- tasks ----------------------------------------------------------------------------------


@pytest.mark.parametrize("task", list(Task))
def test_parse_task_accepts_every_task_name(task):
    assert parse_task(task.value) is task
    assert parse_task(task.value.upper().replace("_", "-")) is task
    assert parse_task(task) is task


def test_parse_task_empty_means_vqa():
    assert parse_task("") is Task.VQA
    assert parse_task("   ") is Task.VQA


def test_parse_task_unknown_lists_allowed_tasks():
    with pytest.raises(BadRequestError) as info:
        parse_task("segment")
    message = str(info.value)
    assert "'segment'" in message
    for task in Task:
        assert task.value in message


# --- message structure ----------------------------------------------------------------------


MEDIA_CASES = [
    (task, n, video)
    for task in Task
    for n, video in [(1, False), (3, False), (0, True), (2, True)]
    if video or not GOALS[task][2]
]


@pytest.mark.parametrize("profile", ALL_PROFILES, ids=PROFILE_IDS)
@pytest.mark.parametrize("reasoning", [False, True])
@pytest.mark.parametrize(("task", "n_images", "video"), MEDIA_CASES)
def test_every_request_starts_with_the_shared_media_prefix(
    profile, task, reasoning, n_images, video
):
    prompt, targets, _ = GOALS[task]
    messages = build_request_messages(
        profile, task, prompt, targets, reasoning, n_images=n_images, video=video
    )
    prefix = prefix_messages(profile, n_images=n_images, video=video, reasoning=reasoning)
    # Same system turn, then the same user turn with the media first and the text last.
    assert messages[: len(prefix) - 1] == prefix[:-1]
    media = prefix[-1].content
    user = messages[len(prefix) - 1]
    assert len(messages) == len(prefix)
    assert user.role == prefix[-1].role == "user"
    assert user.content[: len(media)] == media
    assert [p.kind for p in user.content[len(media) :]] == ["text"]
    kinds = [p.kind for p in media]
    assert kinds == ["image"] * n_images + (["video"] if video else [])
    assert all(isinstance(m, Message) for m in messages)


@pytest.mark.parametrize("profile", [COSMOS_REASON2, QWEN3_VL], ids=["reason2", "qwen3"])
def test_user_suffix_profiles_share_one_prefix_with_reasoning_on_or_off(profile):
    assert prefix_messages(profile, reasoning=True) == prefix_messages(profile, reasoning=False)


def test_prefix_is_independent_of_task_and_prompt():
    first = build_request_messages(COSMOS_REASON2, "vqa", "What is on the table?")
    second = build_request_messages(COSMOS_REASON2, "ground", "", ["mug"])
    assert first[0] == second[0]
    assert first[1].content[0] == second[1].content[0] == ContentPart("image")
    assert user_text(first) != user_text(second)


def test_prefix_has_no_system_turn_where_the_template_supplies_it():
    assert [m.role for m in prefix_messages(QWEN3_VL)] == ["user"]
    assert [m.role for m in prefix_messages(QWEN2_5_VL)] == ["user"]
    assert [m.role for m in prefix_messages(COSMOS_REASON2)] == ["system", "user"]


@pytest.mark.parametrize(
    ("n_images", "video", "match"),
    [
        (0, False, "at least one image or a video"),
        (17, False, "n_images=17"),
        (-1, True, "n_images=-1"),
    ],
)
def test_media_counts_are_validated(n_images, video, match):
    with pytest.raises(BadRequestError, match=match):
        build_request_messages(COSMOS_REASON2, "vqa", "hi", n_images=n_images, video=video)


# --- reasoning ------------------------------------------------------------------------------


def test_reason2_reasoning_appends_the_format_after_a_blank_line():
    messages = build_request_messages(
        COSMOS_REASON2, "vqa", "Is the aisle blocked?", reasoning=True
    )
    assert user_text(messages) == "Is the aisle blocked?\n\n" + REASON2_FORMAT
    assert system_text(messages) == "You are a helpful assistant."


def test_reason2_without_reasoning_has_no_format_text():
    messages = build_request_messages(COSMOS_REASON2, "vqa", "Is the aisle blocked?")
    assert user_text(messages) == "Is the aisle blocked?"
    assert system_text(messages) == "You are a helpful assistant."


def test_reason1_reasoning_goes_into_the_system_prompt():
    messages = build_request_messages(
        COSMOS_REASON1, "vqa", "Is the aisle blocked?", reasoning=True
    )
    assert system_text(messages) == REASON1_SYSTEM
    assert user_text(messages) == "Is the aisle blocked?"


def test_reason1_without_reasoning_uses_the_plain_system_prompt():
    messages = build_request_messages(COSMOS_REASON1, "vqa", "Is the aisle blocked?")
    assert system_text(messages) == "You are a helpful assistant."
    assert "<think>" not in json.dumps([m.content[0].text for m in messages])


def test_plain_qwen_reasoning_prompts():
    qwen3 = build_request_messages(QWEN3_VL, "vqa", "Why?", reasoning=True)
    assert system_text(qwen3) is None
    assert user_text(qwen3) == "Why?\n\n" + QWEN3_VL.reasoning_prompt
    qwen25 = build_request_messages(QWEN2_5_VL, "vqa", "Why?", reasoning=True)
    assert system_text(qwen25) == REASON1_SYSTEM
    assert build_request_messages(QWEN2_5_VL, "vqa", "Why?")[0].role == "user"


@pytest.mark.parametrize("profile", ALL_PROFILES, ids=PROFILE_IDS)
@pytest.mark.parametrize("task", list(Task))
def test_reasoning_off_never_mentions_think_tags(profile, task):
    prompt, targets, video = GOALS[task]
    messages = build_request_messages(profile, task, prompt, targets, False, video=video)
    for message in messages:
        for part in message.content:
            assert "<think>" not in part.text


@pytest.mark.parametrize("profile", ALL_PROFILES, ids=PROFILE_IDS)
@pytest.mark.parametrize("task", list(Task))
def test_reasoning_on_asks_for_think_tags_exactly_once(profile, task):
    prompt, targets, video = GOALS[task]
    messages = build_request_messages(profile, task, prompt, targets, True, video=video)
    everything = "".join(p.text for m in messages for p in m.content)
    assert everything.count(profile.reasoning_prompt) == 1


# --- task wording ---------------------------------------------------------------------------


def test_vqa_text_is_the_prompt():
    assert user_text(build_request_messages(COSMOS_REASON2, "vqa", "What is this?")) == (
        "What is this?"
    )


@pytest.mark.parametrize(
    "prompt", ["货架上有几个红色的杯子？", "Qué ves?\n", "  spaced  ", "emoji 🤖"]
)
@pytest.mark.parametrize("profile", ALL_PROFILES, ids=PROFILE_IDS)
def test_non_ascii_prompts_pass_through_byte_for_byte(prompt, profile):
    plain = user_text(build_request_messages(profile, "vqa", prompt))
    assert plain.encode("utf-8") == prompt.encode("utf-8")
    reasoned = user_text(build_request_messages(profile, "vqa", prompt, reasoning=True))
    assert reasoned.encode("utf-8").startswith(prompt.encode("utf-8"))


@settings(max_examples=100, deadline=None)
@given(
    st.text(st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=200).filter(
        str.strip
    )
)
def test_any_printable_prompt_is_kept_exactly(prompt):
    assert user_text(build_request_messages(COSMOS_REASON2, "vqa", prompt)) == prompt


def test_caption_wording_for_video_images_and_extra_instruction():
    def caption(**kwargs):
        return user_text(build_request_messages(COSMOS_REASON2, "caption", **kwargs))

    assert caption(video=True, n_images=0) == "Caption the video in detail."
    assert caption() == "Caption the image in detail."
    assert caption(n_images=2) == "Caption the images in detail."
    assert caption(prompt="Mention any people.") == (
        "Caption the image in detail.\nMention any people."
    )


def test_ground_single_target_uses_the_model_repo_wording():
    text = user_text(build_request_messages(COSMOS_REASON2, "ground", "", ["red cup"]))
    assert text.startswith("Locate the bounding box of red cup. Return a json.")
    assert '"bbox_2d"' in text
    assert "0-1000" in text


def test_ground_several_targets_ask_for_one_list():
    text = user_text(
        build_request_messages(COSMOS_REASON2, "ground", "", ["red cup", " blue box ", "", "drill"])
    )
    assert text.startswith("Locate the bounding boxes of red cup, blue box and drill.")
    assert "one entry per object found" in text


@pytest.mark.parametrize("task", ["ground", "point"])
@pytest.mark.parametrize("profile", [COSMOS_REASON1, QWEN2_5_VL], ids=["reason1", "qwen2_5"])
def test_input_pixel_profiles_are_never_promised_0_1000(task, profile):
    text = user_text(build_request_messages(profile, task, "", ["cup"]))
    assert "1000" not in text
    assert "pixels" in text


def test_point_wording_uses_point_2d():
    text = user_text(build_request_messages(COSMOS_REASON2, "point", "", ["cup", "plate"]))
    assert text.startswith("Point to cup and plate. Return a json.")
    assert '"point_2d": [x, y]' in text


def test_ground_extra_prompt_is_appended():
    text = user_text(
        build_request_messages(COSMOS_REASON2, "ground", "Only on the table.", ["cup"])
    )
    assert text.endswith("\nOnly on the table.")


def test_trajectory_uses_the_exact_model_repo_wording():
    text = user_text(build_request_messages(COSMOS_REASON2, "trajectory", "pick up the apple"))
    assert text == (
        'You are given the task "pick up the apple". Specify the 2D trajectory your end '
        "effector should follow in pixel space. Return the trajectory coordinates in JSON "
        'format like this: {"point_2d": [x, y], "label": "gripper trajectory"}.'
    )


def test_next_action_wording_with_and_without_context():
    plain = user_text(build_request_messages(COSMOS_REASON2, "next_action"))
    assert plain == "What can be the next immediate action?"
    context = user_text(
        build_request_messages(COSMOS_REASON2, "next_action", "The robot is clearing the table.")
    )
    assert context == "The robot is clearing the table.\nWhat can be the next immediate action?"


def test_verify_asks_for_yes_no_and_reason_as_json():
    text = user_text(build_request_messages(COSMOS_REASON2, "verify", "Is the door closed?"))
    assert text.startswith("Is the door closed?\n")
    assert "yes or no" in text
    assert '"answer"' in text and '"reason"' in text


def test_temporal_asks_for_mm_ss_ff_spans_and_needs_a_clip():
    text = user_text(build_request_messages(COSMOS_REASON2, "temporal", "", video=True, n_images=0))
    assert "mm:ss.ff" in text
    assert '"start"' in text and '"end"' in text and '"caption"' in text
    with pytest.raises(BadRequestError, match="'temporal' needs a video"):
        build_request_messages(COSMOS_REASON2, "temporal", "")


def test_count_asks_how_many_and_for_a_count_json():
    text = user_text(build_request_messages(COSMOS_REASON2, "count", "", ["red cup"]))
    assert text == (
        'How many red cup are visible in the image? Return a json like {"count": <number>}, '
        "with 0 if there are none."
    )


def test_count_several_targets_asks_for_the_total_and_keeps_the_prompt():
    text = user_text(build_request_messages(
        COSMOS_REASON1, "count", "Only on the top shelf.", ["cup", " plate ", ""], n_images=0,
        video=True,
    ))
    assert text == (
        'How many cup and plate are visible in the video in total? Return a json like '
        '{"count": <number>}, with 0 if there are none.\nOnly on the top shelf.'
    )


@pytest.mark.parametrize("profile", ALL_PROFILES, ids=PROFILE_IDS)
def test_count_wording_is_the_same_for_every_model_family(profile):
    # No coordinates in the answer, so nothing differs between 0-1000 and pixel models.
    assert user_text(build_request_messages(profile, "count", "", ["cup"])) == user_text(
        build_request_messages(COSMOS_REASON2, "count", "", ["cup"])
    )


@pytest.mark.parametrize("targets", [(), ("",), ("  ",)])
def test_count_needs_targets(targets):
    with pytest.raises(BadRequestError,
                       match="targets is empty; task 'count' needs at least one object to count"):
        build_request_messages(COSMOS_REASON2, "count", "How many?", targets)


def test_count_schema_is_one_bounded_non_negative_integer():
    schema = task_schema("count", ["cup"], CoordinateConvention.INPUT_PIXELS, (644, 476))
    assert schema == {
        "type": "object",
        "properties": {"count": {"type": "integer", "minimum": 0, "maximum": 1000}},
        "required": ["count"],
        "additionalProperties": False,
    }
    schema["properties"]["count"]["maximum"] = 5  # callers get a fresh copy every time
    assert task_schema("count")["properties"]["count"]["maximum"] == 1000


def test_count_schema_accepts_counts_and_rejects_others():
    jsonschema = pytest.importorskip("jsonschema")
    schema = task_schema("count")
    for good in ({"count": 0}, {"count": 7}, {"count": 1000}):
        jsonschema.validate(good, schema)
    for bad in ({"count": -1}, {"count": 1001}, {"count": 2.5}, {"count": "3"}, {},
                {"count": 3, "label": "cup"}, [{"count": 3}]):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


@pytest.mark.parametrize("profile", ALL_PROFILES, ids=PROFILE_IDS)
def test_count_uses_the_default_presets_not_the_grounding_one(profile):
    assert sampling_for(profile, "count", False) == profile.sampling_plain
    assert sampling_for(profile, "count", True) == profile.sampling_reasoning


# --- goal validation ------------------------------------------------------------------------


@pytest.mark.parametrize("task", ["vqa", "verify", "trajectory"])
@pytest.mark.parametrize("prompt", ["", "   \n"])
def test_tasks_needing_a_prompt_reject_an_empty_one(task, prompt):
    with pytest.raises(BadRequestError, match=f"prompt is empty; task '{task}'"):
        build_request_messages(COSMOS_REASON2, task, prompt)


def test_default_task_is_vqa_and_needs_a_prompt():
    with pytest.raises(BadRequestError, match="task 'vqa'"):
        build_request_messages(COSMOS_REASON2, "", "")


@pytest.mark.parametrize("task", ["ground", "point"])
@pytest.mark.parametrize("targets", [(), ("",), ("  ",)])
def test_grounding_tasks_reject_missing_targets(task, targets):
    with pytest.raises(BadRequestError, match=f"targets is empty; task '{task}'"):
        build_request_messages(COSMOS_REASON2, task, "", targets)


def test_prompt_length_is_bounded():
    build_request_messages(COSMOS_REASON2, "vqa", "x" * 100, max_prompt_chars=100)
    with pytest.raises(BadRequestError, match="prompt has 101 characters; at most 100"):
        build_request_messages(COSMOS_REASON2, "vqa", "x" * 101, max_prompt_chars=100)
    with pytest.raises(BadRequestError, match="at most 4000"):
        build_request_messages(COSMOS_REASON2, "vqa", "y" * 4001)


def test_control_characters_are_rejected_naming_the_field():
    with pytest.raises(BadRequestError, match="prompt contains control character U\\+0000"):
        build_request_messages(COSMOS_REASON2, "vqa", "hi\x00there")
    with pytest.raises(BadRequestError, match="targets\\[1\\] contains control character"):
        build_request_messages(COSMOS_REASON2, "ground", "", ["cup", "bad\x07"])
    assert user_text(build_request_messages(COSMOS_REASON2, "vqa", "a\tb\r\nc")) == "a\tb\r\nc"


def test_targets_are_bounded_and_must_be_a_list():
    with pytest.raises(BadRequestError, match="targets has 17 entries; at most 16"):
        build_request_messages(COSMOS_REASON2, "ground", "", [f"t{i}" for i in range(17)])
    with pytest.raises(BadRequestError, match="targets\\[0\\] has 201 characters"):
        build_request_messages(COSMOS_REASON2, "ground", "", ["x" * 201])
    with pytest.raises(BadRequestError, match="not one string"):
        build_request_messages(COSMOS_REASON2, "ground", "", "cup")


def test_prompt_must_be_a_string():
    with pytest.raises(BadRequestError, match="prompt must be a string"):
        build_request_messages(COSMOS_REASON2, "vqa", b"bytes")  # type: ignore[arg-type]


# --- schemas --------------------------------------------------------------------------------


def assert_bounded(schema, path="#"):
    """Every string, array and number in our schemas has a finite bound."""
    kind = schema.get("type")
    if "enum" in schema:
        return
    if kind == "string":
        assert "maxLength" in schema, path
    elif kind == "array":
        assert "maxItems" in schema, path
        assert_bounded(schema["items"], f"{path}/items")
    elif kind in ("integer", "number"):
        assert "minimum" in schema and "maximum" in schema, path
    elif kind == "object":
        assert schema.get("additionalProperties") is False, path
        assert set(schema["required"]) == set(schema["properties"]), path
        for name, sub in schema["properties"].items():
            assert_bounded(sub, f"{path}/{name}")
    else:
        raise AssertionError(f"unexpected schema at {path}: {schema}")


STRUCTURED = [Task.GROUND, Task.POINT, Task.TRAJECTORY, Task.VERIFY, Task.TEMPORAL, Task.COUNT]


@pytest.mark.parametrize("task", [Task.VQA, Task.CAPTION, Task.NEXT_ACTION])
def test_free_text_tasks_have_no_schema(task):
    assert task_schema(task) is None
    assert not prompts.task_needs_schema(task)


@pytest.mark.parametrize("convention", list(CoordinateConvention))
@pytest.mark.parametrize("task", STRUCTURED)
def test_structured_schemas_are_valid_and_bounded(task, convention):
    schema = task_schema(task, ["red cup"], convention, input_size=(644, 476))
    assert prompts.task_needs_schema(task)
    assert validate_schema(schema) is schema
    assert_bounded(schema)
    json.dumps(schema)  # plain JSON data


@pytest.mark.parametrize("task", STRUCTURED)
def test_structured_schemas_pass_a_real_json_schema_validator(task):
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator.check_schema(task_schema(task, ["cup"]))


def test_coordinate_bounds_follow_the_convention():
    normalized = task_schema("ground", ["cup"], CoordinateConvention.NORMALIZED_1000)
    box = normalized["items"]["properties"]["bbox_2d"]
    assert box["items"] == {"type": "integer", "minimum": 0, "maximum": 1000}
    assert box["minItems"] == box["maxItems"] == 4
    pixels = task_schema("point", ["cup"], CoordinateConvention.INPUT_PIXELS, (644, 476))
    point = pixels["items"]["properties"]["point_2d"]
    assert point["items"]["maximum"] == 644
    assert point["minItems"] == point["maxItems"] == 2
    unknown = task_schema("point", ["cup"], CoordinateConvention.INPUT_PIXELS)
    assert unknown["items"]["properties"]["point_2d"]["items"]["maximum"] == (
        prompts.MAX_INPUT_SIDE
    )


def test_labels_are_restricted_to_the_targets():
    schema = task_schema("ground", [" red cup ", "mug", ""])
    assert schema["items"]["properties"]["label"] == {"type": "string", "enum": ["red cup", "mug"]}
    trajectory = task_schema("trajectory", ["ignored"])
    assert trajectory["items"]["properties"]["label"]["maxLength"] == prompts.MAX_LABEL_CHARS
    assert trajectory["minItems"] == 1


def test_schemas_accept_model_shaped_answers_and_reject_others():
    jsonschema = pytest.importorskip("jsonschema")
    ground = task_schema("ground", ["cup"])
    jsonschema.validate([{"bbox_2d": [10, 20, 300, 400], "label": "cup"}], ground)
    jsonschema.validate([], ground)
    for bad in (
        [{"bbox_2d": [10, 20, 300, 1001], "label": "cup"}],
        [{"bbox_2d": [10, 20, 300], "label": "cup"}],
        [{"bbox_2d": [10, 20, 300, 400], "label": "plate"}],
        [{"bbox_2d": [1.5, 20, 300, 400], "label": "cup"}],
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, ground)
    verify = task_schema("verify")
    jsonschema.validate({"answer": "no", "reason": "the door is open"}, verify)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"answer": "maybe", "reason": ""}, verify)
    temporal = task_schema("temporal")
    jsonschema.validate([{"start": "00:01.50", "end": "00:03.00", "caption": "a"}], temporal)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"start": "1.5", "end": "00:03.00", "caption": "a"}], temporal)
    trajectory = task_schema("trajectory")
    jsonschema.validate([{"point_2d": [1, 2], "label": "gripper trajectory"}], trajectory)


def test_schema_for_request_prefers_the_users_schema():
    user = {"type": "object", "properties": {"n": {"type": "integer"}}}
    assert (
        prompts.schema_for_request(
            "ground", ["cup"], CoordinateConvention.NORMALIZED_1000, user_schema=user
        )
        == user
    )
    assert prompts.schema_for_request("vqa", [], CoordinateConvention.NORMALIZED_1000) is None
    with pytest.raises(BadRequestError):
        prompts.schema_for_request(
            "vqa", [], CoordinateConvention.NORMALIZED_1000, user_schema={"type": "thing"}
        )


# --- user schema validation -----------------------------------------------------------------


def test_parse_response_schema_empty_means_none():
    assert parse_response_schema("") is None
    assert parse_response_schema("  \n") is None


def test_parse_response_schema_accepts_a_valid_schema():
    text = json.dumps(
        {
            "type": "object",
            "properties": {
                "ok": {"type": "boolean"},
                "items": {"type": ["string", "null"]},
                "anything": True,
            },
            "required": ["ok"],
            "$defs": {"x": {"anyOf": [{"type": "integer", "minimum": 0}, {"const": "n/a"}]}},
            "description": "free text is fine",
        }
    )
    assert parse_response_schema(text)["required"] == ["ok"]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("[1, 2]", "must be a JSON object, got list"),
        ('"string"', "must be a JSON object, got str"),
        ("{not json", "not valid JSON"),
        ('{"type": "thing"}', "at #/type: 'thing' is not a JSON Schema type"),
        ('{"type": []}', "at #/type"),
        ('{"type": ["string", "string"]}', "repeats a type"),
        ('{"properties": {"a": 5}}', "at #/properties/a: expected a schema object, got int"),
        ('{"properties": []}', "at #/properties: expected an object"),
        ('{"items": {"maxLength": -1}}', "at #/items/maxLength: -1 must be a non-negative"),
        ('{"minItems": 5, "maxItems": 2}', "minItems=5 exceeds maxItems=2"),
        ('{"minimum": 5, "maximum": 2}', "minimum=5 exceeds maximum=2"),
        ('{"required": "a"}', "#/required: expected a list of property names"),
        ('{"enum": []}', "#/enum: expected a non-empty list"),
        ('{"anyOf": []}', "#/anyOf: expected a non-empty list of schemas"),
        ('{"multipleOf": 0}', "must be greater than 0"),
        ('{"maximum": "10"}', "#/maximum: '10' must be a finite number"),
        ('{"pattern": 5}', "#/pattern: expected a string"),
        ('{"maxLength": true}', "#/maxLength: True must be a non-negative integer"),
    ],
)
def test_parse_response_schema_rejects_invalid_schemas(text, match):
    with pytest.raises(BadRequestError, match=match.replace("[", "\\[").replace("$", "\\$")):
        parse_response_schema(text)


def test_response_schema_size_is_bounded():
    big = json.dumps({"type": "object", "description": "x" * 20000})
    with pytest.raises(BadRequestError, match="bytes; at most 16384"):
        parse_response_schema(big)
    with pytest.raises(BadRequestError, match="bytes; at most 16384"):
        validate_schema(json.loads(big))
    # Size counts UTF-8 bytes, not characters.
    wide = json.dumps({"description": "货" * 6000}, ensure_ascii=False)
    assert len(wide) < 16384
    with pytest.raises(BadRequestError, match="bytes"):
        parse_response_schema(wide)


def test_response_schema_depth_is_bounded():
    deep: dict = {"type": "string"}
    for _ in range(20):
        deep = {"type": "array", "items": deep}
    with pytest.raises(BadRequestError, match="nested deeper than 16 levels"):
        validate_schema(deep)
    with pytest.raises(BadRequestError):
        parse_response_schema("[" * 5000 + "]" * 5000)
    shallow: dict = {"type": "string"}
    for _ in range(10):
        shallow = {"type": "array", "items": shallow}
    assert validate_schema(shallow) is shallow


def test_validate_schema_rejects_non_json_values():
    with pytest.raises(BadRequestError, match="not JSON-serializable"):
        validate_schema({"maximum": math.nan})
    with pytest.raises(BadRequestError, match="not JSON-serializable"):
        validate_schema({"const": object()})


# --- sampling -------------------------------------------------------------------------------


@pytest.mark.parametrize("profile", ALL_PROFILES, ids=PROFILE_IDS)
def test_sampling_presets_by_task_and_reasoning(profile):
    assert sampling_for(profile, "vqa", False) == profile.sampling_plain
    assert sampling_for(profile, "caption", True) == profile.sampling_reasoning
    assert sampling_for(profile, "verify", True) == profile.sampling_reasoning
    assert sampling_for(profile, "temporal", False) == profile.sampling_plain
    for task in ("ground", "point", "trajectory"):
        for reasoning in (False, True):
            assert sampling_for(profile, task, reasoning) == profile.sampling_structured


def test_reason2_plain_preset_values_reach_the_request():
    sampling = sampling_for(COSMOS_REASON2, "vqa", False)
    assert (sampling.temperature, sampling.top_p, sampling.top_k) == (0.7, 0.8, 20)
    assert sampling.presence_penalty == 1.5
    assert sampling.max_tokens == 4096


def test_overrides_replace_preset_values():
    sampling = sampling_for(
        COSMOS_REASON2, "vqa", True, max_tokens=256, temperature=0.1, top_p=0.5, seed=7
    )
    assert (sampling.max_tokens, sampling.temperature, sampling.top_p, sampling.seed) == (
        256,
        0.1,
        0.5,
        7,
    )
    assert sampling.top_k == 20  # untouched preset fields stay


@pytest.mark.parametrize("unset", [0, -1, -100])
def test_zero_or_negative_overrides_mean_preset(unset):
    # max_tokens: only 0 means the preset (a negative one is refused, see below).
    sampling = sampling_for(
        COSMOS_REASON1, "vqa", True, max_tokens=0, temperature=unset, top_p=unset, seed=unset
    )
    assert sampling == COSMOS_REASON1.sampling_reasoning


@pytest.mark.parametrize("max_tokens", [-1, -5, -(2**31)])
def test_negative_max_tokens_is_a_bad_request_naming_the_field(max_tokens):
    # -5 used to fall back to the preset; the action documents 0 and 1..limit only.
    with pytest.raises(BadRequestError) as info:
        sampling_for(COSMOS_REASON2, "vqa", False, max_tokens=max_tokens, max_tokens_cap=512)
    assert info.value.code is ErrorCode.BAD_REQUEST
    assert info.value.message == (
        f"max_tokens={max_tokens} is negative; allowed 1..512, or 0 for the model preset"
    )


def test_preset_max_tokens_is_capped_but_explicit_excess_is_an_error():
    assert sampling_for(COSMOS_REASON2, "vqa", False, max_tokens_cap=512).max_tokens == 512
    assert (
        sampling_for(COSMOS_REASON2, "vqa", False, max_tokens=512, max_tokens_cap=512).max_tokens
        == 512
    )
    with pytest.raises(BadRequestError, match="max_tokens=513 exceeds the limit; allowed 1..512"):
        sampling_for(COSMOS_REASON2, "vqa", False, max_tokens=513, max_tokens_cap=512)
    with pytest.raises(BadRequestError, match="max_tokens_cap=0"):
        sampling_for(COSMOS_REASON2, "vqa", False, max_tokens_cap=0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"temperature": math.nan}, "temperature=nan is not a finite number"),
        ({"temperature": math.inf}, "temperature=inf is not a finite number"),
        ({"temperature": -math.inf}, "temperature=-inf is not a finite number"),
        ({"temperature": 2.5}, "temperature=2.5 is too high; allowed 0 < temperature <= 2.0"),
        ({"temperature": "hot"}, "temperature='hot' must be a number"),
        ({"top_p": 1.5}, "top_p=1.5 is too high; allowed 0 < top_p <= 1"),
        ({"top_p": math.nan}, "top_p=nan is not a finite number"),
        ({"max_tokens": 10**9}, "max_tokens=1000000000 exceeds the limit"),
        ({"max_tokens": 1.5}, "max_tokens=1.5 must be an integer"),
        ({"max_tokens": True}, "max_tokens=True must be an integer"),
        ({"seed": 2**63}, "seed=9223372036854775808 is too large"),
        ({"seed": "x"}, "seed='x' must be an integer"),
    ],
)
def test_invalid_sampling_overrides_name_the_field(kwargs, match):
    with pytest.raises(BadRequestError, match=match):
        sampling_for(COSMOS_REASON2, "vqa", False, **kwargs)


def test_sampling_rejects_unknown_task():
    with pytest.raises(BadRequestError, match="unknown task 'dance'"):
        sampling_for(COSMOS_REASON2, "dance", False)
