import json
import math
from dataclasses import FrozenInstanceError

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from cosmos_reason_ros.core import models
from cosmos_reason_ros.core.models import (
    COSMOS_REASON1,
    COSMOS_REASON2,
    PROFILES,
    QWEN2_5_VL,
    QWEN3_VL,
    AnswerStyle,
    ReasoningPlacement,
    detect_profile,
    smart_resize,
)
from cosmos_reason_ros.core.types import (
    BadImageError,
    BadRequestError,
    CoordinateConvention,
    Sampling,
)

REASON2_FORMAT = (
    "Answer the question using the following format:\n\n<think>\nYour reasoning.\n</think>\n\n"
    "Write your final answer immediately after the </think> tag."
)
REASON1_SYSTEM = (
    "You are a helpful assistant. Answer the question in the following format: "
    "<think>\nyour reasoning\n</think>\n\n<answer>\nyour answer\n</answer>."
)


def qwen_reference_smart_resize(height, width, factor, min_pixels, max_pixels):
    """transformers' Qwen2-VL smart_resize, verbatim (height, width order)."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError("absolute aspect ratio must be smaller than 200")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


# --- profiles -------------------------------------------------------------------------------


def test_registry_holds_the_four_families_by_key():
    assert set(PROFILES) == {"cosmos_reason2", "cosmos_reason1", "qwen3_vl", "qwen2_5_vl"}
    for key, profile in PROFILES.items():
        assert profile.key == key


def test_profiles_are_frozen():
    with pytest.raises(FrozenInstanceError):
        COSMOS_REASON2.unit = 28  # type: ignore[misc]


def test_reason2_conventions_match_the_model_card():
    p = COSMOS_REASON2
    assert p.architecture == "Qwen3VLForConditionalGeneration"
    assert p.system_prompt == "You are a helpful assistant."
    assert p.reasoning_placement is ReasoningPlacement.USER_SUFFIX
    assert p.reasoning_prompt == REASON2_FORMAT
    assert p.answer_style is AnswerStyle.THINK
    assert p.coordinates is CoordinateConvention.NORMALIZED_1000
    assert p.unit == 32  # patch 16 x merge 2
    assert p.video_fps == 4.0
    assert p.is_cosmos


def test_reason1_conventions_match_the_model_card():
    p = COSMOS_REASON1
    assert p.architecture == "Qwen2_5_VLForConditionalGeneration"
    assert p.reasoning_placement is ReasoningPlacement.SYSTEM_PROMPT
    assert p.reasoning_prompt == REASON1_SYSTEM
    assert p.answer_style is AnswerStyle.ANSWER_TAGS
    assert p.coordinates is CoordinateConvention.INPUT_PIXELS
    assert p.unit == 28
    assert p.video_fps == 4.0
    # Reason1 card: about 8192 visual tokens for a whole clip.
    assert p.video_total_pixels == 8192 * 28 * 28


def test_plain_qwen3_vl_differs_from_reason2_only_in_prompts():
    assert QWEN3_VL.coordinates is COSMOS_REASON2.coordinates
    assert QWEN3_VL.unit == COSMOS_REASON2.unit
    assert QWEN3_VL.answer_style is COSMOS_REASON2.answer_style
    assert QWEN3_VL.reasoning_placement is ReasoningPlacement.USER_SUFFIX
    assert QWEN3_VL.reasoning_prompt != COSMOS_REASON2.reasoning_prompt
    assert "</think>" in QWEN3_VL.reasoning_prompt
    assert QWEN3_VL.system_prompt is None
    assert not QWEN3_VL.is_cosmos


def test_plain_qwen2_5_vl_shares_reason1_conventions():
    assert QWEN2_5_VL.coordinates is CoordinateConvention.INPUT_PIXELS
    assert QWEN2_5_VL.unit == 28
    assert QWEN2_5_VL.answer_style is AnswerStyle.ANSWER_TAGS
    assert QWEN2_5_VL.system_prompt is None  # the chat template adds its default
    assert not QWEN2_5_VL.is_cosmos


def test_reason2_sampling_presets_match_the_model_card():
    assert COSMOS_REASON2.sampling_plain == Sampling(
        max_tokens=4096, temperature=0.7, top_p=0.8, top_k=20, presence_penalty=1.5
    )
    assert COSMOS_REASON2.sampling_reasoning == Sampling(
        max_tokens=4096, temperature=0.6, top_p=0.95, top_k=20
    )
    structured = COSMOS_REASON2.sampling_structured
    assert (structured.temperature, structured.top_p) == (0.3, 0.3)


def test_reason1_sampling_presets_match_the_model_card():
    reasoning = COSMOS_REASON1.sampling_reasoning
    assert reasoning.max_tokens == 4096
    assert (reasoning.temperature, reasoning.top_p) == (0.6, 0.95)
    assert reasoning.repetition_penalty == 1.05
    assert (
        COSMOS_REASON1.sampling_structured.temperature,
        COSMOS_REASON1.sampling_structured.top_p,
    ) == (0.3, 0.3)


@pytest.mark.parametrize("profile", list(PROFILES.values()), ids=list(PROFILES))
def test_profile_budgets_are_consistent(profile):
    assert profile.unit**2 <= profile.min_pixels <= profile.default_max_pixels
    assert profile.default_max_pixels <= profile.max_pixels
    assert profile.video_min_pixels <= profile.video_max_pixels <= profile.max_pixels
    assert profile.temporal_patch_size == 2


# --- smart_resize ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "unit", "expected"),
    [
        ((640, 480), 28, (644, 476)),  # each side rounded to the nearest multiple of 28
        ((640, 480), 32, (640, 480)),  # already multiples of 32
        ((1920, 1080), 32, (1920, 1088)),
    ],
)
def test_smart_resize_rounds_sides_to_the_unit(size, unit, expected):
    assert smart_resize(*size, unit, unit * unit, 1 << 24) == expected


def test_smart_resize_scales_down_to_the_budget_keeping_aspect():
    w, h = smart_resize(1920, 1080, 32, 1024, 1024 * 32 * 32)
    assert w * h <= 1024 * 32 * 32
    assert (w, h) == (1344, 768)
    assert abs(w / h - 1920 / 1080) < 0.05


def test_smart_resize_scales_up_to_the_minimum():
    w, h = smart_resize(40, 30, 28, 3136 * 16, 1 << 24)
    assert w * h >= 3136 * 16
    assert w % 28 == 0 and h % 28 == 0
    assert (w, h) == (280, 196)
    assert qwen_reference_smart_resize(30, 40, 28, 3136 * 16, 1 << 24) == (196, 280)


@pytest.mark.parametrize("size", [(0, 10), (10, 0), (-5, 10), (10, -1)])
def test_smart_resize_rejects_non_positive_sizes(size):
    with pytest.raises(BadImageError, match="must be a positive integer"):
        smart_resize(*size, 32, 1024, 1 << 20)


def test_smart_resize_rejects_aspect_ratio_above_200_like_qwen():
    with pytest.raises(BadImageError, match="aspect ratio 201.0"):
        smart_resize(201, 1, 32, 1024, 1 << 20)
    assert smart_resize(200 * 32, 32, 32, 1024, 1 << 24) == (6400, 32)


def test_smart_resize_rejects_invalid_budgets():
    with pytest.raises(BadRequestError, match="min_pixels=5000 exceeds max_pixels=4096"):
        smart_resize(100, 100, 32, 5000, 4096)
    with pytest.raises(BadRequestError, match="below one visual token"):
        smart_resize(100, 100, 32, 0, 1000)
    with pytest.raises(BadRequestError, match="max_pixels=0"):
        smart_resize(100, 100, 32, 0, 0)
    with pytest.raises(BadRequestError, match="unit=0"):
        smart_resize(100, 100, 0, 0, 4096)


def test_smart_resize_corner_case_lands_inside_the_budget():
    # The Qwen rule alone gives 4512x32 here (its "at least one unit" clamp exceeds the
    # budget), which the processor would shrink again.
    h_ref, w_ref = qwen_reference_smart_resize(33, 6600, 32, 1024, 100 * 1024)
    assert w_ref * h_ref > 100 * 1024
    w, h = smart_resize(6600, 33, 32, 1024, 100 * 1024)
    assert w * h <= 100 * 1024
    assert qwen_reference_smart_resize(h, w, 32, 1024, 100 * 1024) == (h, w)


def _is_processor_fixed_point(w, h, unit, min_pixels, max_pixels):
    return qwen_reference_smart_resize(h, w, unit, min_pixels, max_pixels) == (h, w)


@st.composite
def resize_cases(draw):
    unit = draw(st.sampled_from([14, 16, 28, 32]))
    width = draw(st.integers(1, 8000))
    height = draw(st.integers(1, 8000))
    assume(max(width, height) / min(width, height) <= 200)
    max_tokens = draw(st.integers(1, 20000))
    # Real budgets span orders of magnitude; a budget of [M/2, M] tokens always holds a
    # near-square size, while e.g. exactly 311 tokens (a prime) holds none within aspect 200.
    min_tokens = draw(st.integers(0, max_tokens // 2))
    min_pixels = min_tokens * unit * unit - draw(st.integers(0, unit * unit - 1)) * (min_tokens > 0)
    max_pixels = max_tokens * unit * unit + draw(st.integers(0, unit * unit - 1))
    return width, height, unit, min_pixels, max_pixels


@settings(max_examples=250, deadline=None)
@given(resize_cases())
def test_smart_resize_is_idempotent_and_processor_stable(case):
    width, height, unit, min_pixels, max_pixels = case
    w, h = smart_resize(width, height, unit, min_pixels, max_pixels)
    assert w % unit == 0 and h % unit == 0 and w >= unit and h >= unit
    assert min_pixels <= w * h <= max_pixels
    assert max(w, h) / min(w, h) <= 200
    assert smart_resize(w, h, unit, min_pixels, max_pixels) == (w, h)
    # The real processor must leave the package's output unchanged.
    assert _is_processor_fixed_point(w, h, unit, min_pixels, max_pixels)


@settings(max_examples=150, deadline=None)
@given(
    st.integers(64, 4096),
    st.integers(64, 4096),
    st.sampled_from([28, 32]),
    st.integers(64, 16384),
)
def test_smart_resize_agrees_with_qwen_whenever_qwen_is_stable(width, height, unit, max_tokens):
    min_pixels, max_pixels = 4 * unit * unit, max_tokens * unit * unit
    h_ref, w_ref = qwen_reference_smart_resize(height, width, unit, min_pixels, max_pixels)
    if _is_processor_fixed_point(w_ref, h_ref, unit, min_pixels, max_pixels):
        assert smart_resize(width, height, unit, min_pixels, max_pixels) == (w_ref, h_ref)


# --- profile helpers ------------------------------------------------------------------------


def test_input_size_uses_the_default_budget():
    w, h = COSMOS_REASON2.input_size(3840, 2160)
    assert w * h <= COSMOS_REASON2.default_max_pixels
    assert w % 32 == 0 and h % 32 == 0
    assert COSMOS_REASON2.input_size(640, 480) == (640, 480)
    assert COSMOS_REASON1.input_size(640, 480) == (644, 476)


def test_input_size_honours_a_smaller_budget_and_clamps_to_processor_bounds():
    w, h = COSMOS_REASON2.input_size(1920, 1080, max_pixels=256 * 1024)
    assert w * h <= 256 * 1024
    # Larger than the processor allows: clamped so the processor will not resize again.
    w, h = COSMOS_REASON2.input_size(20000, 10000, max_pixels=1 << 30)
    assert w * h <= COSMOS_REASON2.max_pixels
    # Below the processor minimum: clamped up to it.
    w, h = COSMOS_REASON2.input_size(640, 480, max_pixels=1024)
    assert w * h >= COSMOS_REASON2.min_pixels


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, 1 << 31])
def test_input_size_rejects_bad_budgets_naming_the_field(bad):
    with pytest.raises(BadRequestError, match="max_pixels"):
        COSMOS_REASON2.input_size(640, 480, max_pixels=bad)


def test_visual_token_counts():
    assert COSMOS_REASON2.visual_tokens(640, 480) == 20 * 15
    assert COSMOS_REASON1.visual_tokens(644, 476) == 23 * 17
    assert COSMOS_REASON2.max_visual_tokens() == 1024
    assert COSMOS_REASON1.max_visual_tokens() == 1280
    assert COSMOS_REASON2.max_visual_tokens(256 * 1024) == 256
    w, h = COSMOS_REASON2.input_size(1920, 1080)
    assert COSMOS_REASON2.visual_tokens(w, h) <= COSMOS_REASON2.max_visual_tokens()


def test_video_frames_share_the_total_budget():
    profile = COSMOS_REASON1
    few = profile.video_frame_size(1280, 720, 4)
    many = profile.video_frame_size(1280, 720, 64)
    assert few[0] * few[1] > many[0] * many[1]
    tokens = profile.video_tokens(*many, 64)
    assert tokens <= profile.video_total_pixels // profile.pixels_per_token
    assert profile.video_tokens(*many, 3) == 2 * (many[0] // 28) * (many[1] // 28)
    assert many[0] * many[1] >= profile.video_min_pixels
    with pytest.raises(BadRequestError, match="n_frames=0"):
        profile.video_frame_size(1280, 720, 0)


# --- detection ------------------------------------------------------------------------------


def _checkpoint(tmp_path, name, architecture=None, model_type=None, preprocessor=None, extra=None):
    directory = tmp_path / name
    directory.mkdir(parents=True)
    config = {}
    if architecture is not None:
        config["architectures"] = [architecture]
    if model_type is not None:
        config["model_type"] = model_type
    config.update(extra or {})
    (directory / "config.json").write_text(json.dumps(config))
    if preprocessor is not None:
        (directory / "preprocessor_config.json").write_text(json.dumps(preprocessor))
    return str(directory)


@pytest.mark.parametrize(
    ("name", "architecture", "model_type", "expected"),
    [
        ("Cosmos-Reason2-2B", "Qwen3VLForConditionalGeneration", "qwen3_vl", "cosmos_reason2"),
        ("cosmos_reason2_8b", "Qwen3VLForConditionalGeneration", "qwen3_vl", "cosmos_reason2"),
        ("my-REASON2-finetune", "Qwen3VLForConditionalGeneration", None, "cosmos_reason2"),
        ("Cosmos-Reason1-7B", "Qwen2_5_VLForConditionalGeneration", "qwen2_5_vl", "cosmos_reason1"),
        ("Qwen3-VL-2B-Instruct", "Qwen3VLForConditionalGeneration", "qwen3_vl", "qwen3_vl"),
        ("tiny-vlm", "Qwen3VLForConditionalGeneration", None, "qwen3_vl"),
        ("tiny-moe", "Qwen3VLMoeForConditionalGeneration", None, "qwen3_vl"),
        ("Qwen2.5-VL-7B-Instruct", "Qwen2_5_VLForConditionalGeneration", None, "qwen2_5_vl"),
        ("from-model-type", None, "qwen2_5_vl", "qwen2_5_vl"),
    ],
)
def test_detect_profile_from_config_and_name(tmp_path, name, architecture, model_type, expected):
    path = _checkpoint(tmp_path, name, architecture, model_type)
    assert detect_profile(path).key == expected


def test_detect_profile_uses_name_or_path_for_hub_cache_snapshots(tmp_path):
    # HF cache snapshot directories are named by commit hash; config.json keeps the name.
    path = _checkpoint(
        tmp_path,
        "snapshots/0123abcd",
        "Qwen3VLForConditionalGeneration",
        extra={"_name_or_path": "nvidia/Cosmos-Reason2-2B"},
    )
    assert detect_profile(path) is COSMOS_REASON2


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("nvidia/Cosmos-Reason2-2B", "cosmos_reason2"),
        ("NVIDIA/COSMOS-REASON2-8B", "cosmos_reason2"),
        ("nvidia/Cosmos-Reason1-7B", "cosmos_reason1"),
        ("Qwen/Qwen3-VL-8B-Instruct", "qwen3_vl"),
        ("Qwen/Qwen2.5-VL-3B-Instruct", "qwen2_5_vl"),
    ],
)
def test_detect_profile_from_hub_name_without_directory(name, expected):
    assert detect_profile(name).key == expected


def test_detect_profile_unknown_name_without_config_asks_for_the_family():
    with pytest.raises(BadRequestError, match="cannot detect the model family of 'some/model'"):
        detect_profile("some/model")


def test_detect_profile_mistyped_path_says_the_path_does_not_exist(tmp_path):
    (tmp_path / "models" / "Cosmos-Reason2-2B").mkdir(parents=True)
    typo = tmp_path / "models" / "my-finetune"  # a name that names no family
    with pytest.raises(BadRequestError) as e:
        detect_profile(str(typo))
    message = e.value.message
    assert f"no such directory {typo} (looked for {typo / 'config.json'}" in message
    assert f"nearest existing folder is {tmp_path / 'models'}, with folders: Cosmos-Reason2-2B" \
        in message
    assert "cannot detect" not in message
    with pytest.raises(BadRequestError, match=r"'/nonexistent/model': no such directory "
                                              r"/nonexistent/model \(looked for "
                                              r"/nonexistent/model/config\.json"):
        detect_profile("/nonexistent/model")
    # Not a path: a hub-style name still asks for the family.
    with pytest.raises(BadRequestError, match="cannot detect the model family"):
        detect_profile("org/weights")
    # A missing path the name identifies (e.g. a served model name) still resolves.
    assert detect_profile("/models/Cosmos-Reason2-2B") is COSMOS_REASON2


def test_detect_profile_directory_without_config_falls_back_to_the_name(tmp_path):
    directory = tmp_path / "cosmos-reason1-local"
    directory.mkdir()
    assert detect_profile(str(directory)) is COSMOS_REASON1
    anonymous = tmp_path / "weights"
    anonymous.mkdir()
    with pytest.raises(BadRequestError, match="no config.json"):
        detect_profile(str(anonymous))


@pytest.mark.parametrize("override", ["cosmos_reason2", "cosmos_reason1", "qwen3_vl", "qwen2_5_vl"])
def test_override_wins_over_detection(tmp_path, override):
    path = _checkpoint(tmp_path, "Cosmos-Reason2-2B", "Qwen3VLForConditionalGeneration")
    assert detect_profile(path, override=override) is PROFILES[override]


@pytest.mark.parametrize("override", [None, "", "auto", "AUTO", " auto "])
def test_auto_override_detects(tmp_path, override):
    path = _checkpoint(tmp_path, "Cosmos-Reason1-7B", "Qwen2_5_VLForConditionalGeneration")
    assert detect_profile(path, override=override) is COSMOS_REASON1


def test_override_accepts_dashes_and_case():
    assert detect_profile("anything", override="Cosmos-Reason2") is COSMOS_REASON2
    assert detect_profile("anything", override="qwen2.5-vl") is QWEN2_5_VL


def test_unknown_override_names_the_allowed_values():
    with pytest.raises(BadRequestError) as info:
        detect_profile("nvidia/Cosmos-Reason2-2B", override="llava")
    message = str(info.value)
    assert "'llava'" in message
    for allowed in ("auto", "cosmos_reason2", "cosmos_reason1", "qwen3_vl", "qwen2_5_vl"):
        assert allowed in message


def test_unreadable_config_is_an_error_unless_overridden(tmp_path):
    directory = tmp_path / "Cosmos-Reason2-2B"
    directory.mkdir()
    (directory / "config.json").write_text("{not json")
    with pytest.raises(BadRequestError, match="cannot read .*config.json"):
        detect_profile(str(directory))
    assert detect_profile(str(directory), override="cosmos_reason2") is COSMOS_REASON2


def test_unknown_architecture_is_named_in_the_error(tmp_path):
    path = _checkpoint(tmp_path, "llava", "LlavaForConditionalGeneration", "llava")
    with pytest.raises(BadRequestError, match="LlavaForConditionalGeneration.*model_type='llava'"):
        detect_profile(path)
    assert detect_profile(path, override="qwen3_vl") is QWEN3_VL


def test_name_contradicting_the_architecture_is_an_error(tmp_path):
    path = _checkpoint(tmp_path, "Cosmos-Reason2-2B", "Qwen2_5_VLForConditionalGeneration")
    with pytest.raises(BadRequestError, match="named like Cosmos-Reason2 but .* Qwen2.5-VL"):
        detect_profile(path)


def test_processor_budgets_from_min_max_pixels_keys(tmp_path):
    path = _checkpoint(
        tmp_path,
        "Cosmos-Reason1-tiny",
        "Qwen2_5_VLForConditionalGeneration",
        preprocessor={"min_pixels": 784, "max_pixels": 64 * 784, "patch_size": 14, "merge_size": 2},
    )
    profile = detect_profile(path)
    assert profile.key == "cosmos_reason1"
    assert (profile.min_pixels, profile.max_pixels, profile.unit) == (784, 64 * 784, 28)
    assert profile.default_max_pixels == 64 * 784
    assert profile.video_max_pixels <= 64 * 784
    assert profile.video_min_pixels <= profile.video_max_pixels
    w, h = profile.input_size(1920, 1080)
    assert w * h <= 64 * 784
    assert _is_processor_fixed_point(w, h, 28, 784, 64 * 784)
    assert COSMOS_REASON1.max_pixels == 12845056  # the registry entry is untouched


def test_processor_budgets_from_size_edges_are_pixel_areas(tmp_path):
    # Qwen3-VL's preprocessor_config.json: size.shortest_edge/longest_edge are pixel areas.
    path = _checkpoint(
        tmp_path,
        "tiny",
        "Qwen3VLForConditionalGeneration",
        preprocessor={
            "size": {"shortest_edge": 1024, "longest_edge": 65536},
            "patch_size": 16,
            "merge_size": 2,
        },
    )
    profile = detect_profile(path)
    assert profile.key == "qwen3_vl"
    assert (profile.min_pixels, profile.max_pixels, profile.unit) == (1024, 65536, 32)
    assert profile.max_visual_tokens() == 64


def test_processor_budgets_from_transformers5_processor_config(tmp_path):
    path = _checkpoint(tmp_path, "tiny", "Qwen3VLForConditionalGeneration")
    with open(f"{path}/processor_config.json", "w") as f:
        json.dump({"image_processor": {"size": {"shortest_edge": 1024, "longest_edge": 32768}}}, f)
    profile = detect_profile(path)
    assert (profile.min_pixels, profile.max_pixels) == (1024, 32768)


def test_processor_budgets_apply_with_an_override(tmp_path):
    path = _checkpoint(
        tmp_path,
        "tiny",
        "Qwen3VLForConditionalGeneration",
        preprocessor={"max_pixels": 65536, "min_pixels": 1024},
    )
    profile = detect_profile(path, override="cosmos_reason2")
    assert profile.key == "cosmos_reason2"
    assert profile.max_pixels == 65536


@pytest.mark.parametrize(
    ("preprocessor", "match"),
    [
        ({"max_pixels": -5}, "max_pixels=-5"),
        ({"min_pixels": "big"}, "min_pixels='big'"),
        ({"min_pixels": 100000, "max_pixels": 65536}, "min_pixels=100000 max_pixels=65536"),
        ({"max_pixels": 100}, "invalid for unit 32"),
    ],
)
def test_invalid_processor_budgets_are_errors(tmp_path, preprocessor, match):
    path = _checkpoint(
        tmp_path, "tiny", "Qwen3VLForConditionalGeneration", preprocessor=preprocessor
    )
    with pytest.raises(BadRequestError, match=match):
        detect_profile(path)


def test_with_processor_budgets_keeps_other_fields():
    profile = models.with_processor_budgets(COSMOS_REASON2, min_pixels=1024, max_pixels=65536)
    assert profile.reasoning_prompt == COSMOS_REASON2.reasoning_prompt
    assert profile.coordinates is COSMOS_REASON2.coordinates
    assert profile.default_max_pixels == 65536


@pytest.mark.parametrize("bad", ["", "  ", None])
def test_detect_profile_requires_a_model_name(bad):
    with pytest.raises(BadRequestError, match="must name a checkpoint directory"):
        detect_profile(bad)  # type: ignore[arg-type]
