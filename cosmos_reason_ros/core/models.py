"""Model profiles: what differs between Cosmos-Reason2, Cosmos-Reason1 and their Qwen bases.

A ``ModelProfile`` holds every model-specific convention the rest of the package needs: the
system prompt, how reasoning is requested and delimited, the coordinate convention of boxes
and points, the processor's pixel unit and budgets, video defaults and sampling presets.
``detect_profile`` picks one from a checkpoint directory (``config.json``,
``preprocessor_config.json``) or a hub name, or from an explicit override.

Pixel sizes here are always ``(width, height)``; the Qwen processors document
``(height, width)``, which is the usual source of swapped-axis bugs.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cosmos_reason_ros.core.types import (
    BadImageError,
    BadRequestError,
    CoordinateConvention,
    Sampling,
)

# Qwen's processors refuse images whose long side is more than 200 times the short side.
MAX_ASPECT_RATIO = 200.0
# Largest pixel budget accepted anywhere (2^30 px = 32768 x 32768): far above any processor
# default (Qwen3-VL: 16777216), small enough that budget arithmetic stays cheap.
MAX_PIXEL_BUDGET = 1 << 30

ARCH_QWEN3_VL = "Qwen3VLForConditionalGeneration"
ARCH_QWEN3_VL_MOE = "Qwen3VLMoeForConditionalGeneration"
ARCH_QWEN2_5_VL = "Qwen2_5_VLForConditionalGeneration"


class ReasoningPlacement(str, enum.Enum):
    """Where the instruction that turns on step-by-step reasoning goes."""

    USER_SUFFIX = "user_suffix"  # appended to the user text after a blank line (Reason2)
    SYSTEM_PROMPT = "system_prompt"  # replaces the system prompt (Reason1)


class AnswerStyle(str, enum.Enum):
    """How the final answer is delimited from the reasoning in the model's output."""

    THINK = "think"  # "<think>...</think>" then the answer as plain text (Reason2)
    ANSWER_TAGS = "answer_tags"  # "<think>...</think>" then "<answer>...</answer>" (Reason1)


# Exact texts from the model cards (nvidia/Cosmos-Reason2-2B/-8B, nvidia/Cosmos-Reason1-7B).
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."
REASON2_REASONING_PROMPT = (
    "Answer the question using the following format:\n\n<think>\nYour reasoning.\n</think>\n\n"
    "Write your final answer immediately after the </think> tag."
)
REASON1_REASONING_SYSTEM_PROMPT = (
    "You are a helpful assistant. Answer the question in the following format: "
    "<think>\nyour reasoning\n</think>\n\n<answer>\nyour answer\n</answer>."
)
# Plain Qwen3-VL Instruct checkpoints were not trained on Reason2's sentence; this asks for the
# same output shape (reasoning in <think>, answer after </think>) in plainer words.
QWEN3_VL_REASONING_PROMPT = (
    "Think step by step first. Write your reasoning between <think> and </think>, then write "
    "your final answer immediately after the </think> tag."
)


@dataclass(frozen=True)
class ModelProfile:
    """Everything model-specific: prompt conventions, coordinates, pixel budgets, sampling.

    ``min_pixels``/``max_pixels`` are the checkpoint processor's bounds: an image whose sides
    are multiples of ``unit`` and whose area lies within them passes the processor unchanged.
    ``default_max_pixels`` is the package's own (smaller) default budget, chosen for latency
    on a robot; callers may ask for anything up to ``max_pixels``.
    """

    key: str  # registry key, e.g. "cosmos_reason2"
    family: str  # human-readable, e.g. "Cosmos-Reason2"
    architecture: str  # the transformers class in config.json "architectures"
    system_prompt: str | None  # None: let the chat template apply its own default
    reasoning_placement: ReasoningPlacement
    reasoning_prompt: str  # the user suffix, or the whole reasoning system prompt
    answer_style: AnswerStyle
    coordinates: CoordinateConvention
    unit: int  # pixels per visual token side: patch_size * merge_size
    min_pixels: int
    max_pixels: int
    default_max_pixels: int
    sampling_plain: Sampling
    sampling_reasoning: Sampling
    sampling_structured: Sampling  # grounding, pointing, trajectories
    temporal_patch_size: int = 2  # two consecutive video frames share one token grid
    video_fps: float = 4.0  # Reason1 recommendation; Reason2 examples use 4 too
    video_max_frames: int = 64
    video_min_pixels: int = 0  # per frame; 0 means min_pixels
    video_max_pixels: int = 0  # per frame; 0 means default_max_pixels
    video_total_pixels: int = 0  # all frames together (counted per temporal pair)
    is_cosmos: bool = True
    # How a multi-camera request names its images, one sentence per image in camera order
    # ({index} from 1, {camera} the name). It goes at the start of the text, after all the
    # images (media before text, as both model cards show), so the first camera's image stays
    # a prefix that a speculative prefill of that camera's frame shares.
    camera_intro: str = 'Image {index} is from the camera "{camera}".'

    @property
    def pixels_per_token(self) -> int:
        """Image area covered by one visual token (unit squared)."""
        return self.unit * self.unit

    def input_size(self, width: int, height: int, max_pixels: int | None = None) -> tuple[int, int]:
        """Return the ``(width, height)`` to resize an image to before sending it to the model.

        ``max_pixels`` (default ``default_max_pixels``) is clamped into the processor's
        ``[min_pixels, max_pixels]`` so that the processor never resizes the result again.
        """
        budget = self.default_max_pixels if max_pixels is None else max_pixels
        _check_budget("max_pixels", budget)
        budget = min(max(budget, self.min_pixels), self.max_pixels)
        return smart_resize(width, height, self.unit, self.min_pixels, budget)

    def max_visual_tokens(self, max_pixels: int | None = None) -> int:
        """Upper bound on visual tokens for one image under a pixel budget (default budget)."""
        budget = self.default_max_pixels if max_pixels is None else max_pixels
        _check_budget("max_pixels", budget)
        budget = min(max(budget, self.min_pixels), self.max_pixels)
        return budget // self.pixels_per_token

    def visual_tokens(self, width: int, height: int) -> int:
        """Visual tokens the processor produces for an image of this size.

        Sizes the package produced (multiples of ``unit`` within budget) count as
        ``(width / unit) * (height / unit)``; other sizes are first resized as the processor
        would.
        """
        w, h = smart_resize(width, height, self.unit, self.min_pixels, self.max_pixels)
        return (w // self.unit) * (h // self.unit)

    def video_frame_size(
        self, width: int, height: int, n_frames: int, total_pixels: int | None = None
    ) -> tuple[int, int]:
        """Return the per-frame ``(width, height)`` for a clip of ``n_frames`` frames.

        The total budget is shared by the frames, counted per temporal pair like
        ``qwen_vl_utils`` does, and each frame stays within the per-frame bounds.
        """
        if n_frames < 1:
            raise BadRequestError(f"n_frames={n_frames} must be >= 1")
        total = self.video_total_pixels if total_pixels is None else total_pixels
        _check_budget("video_total_pixels", total)
        frame_min = self.video_min_pixels or self.min_pixels
        frame_max = self.video_max_pixels or self.default_max_pixels
        per_frame = total * self.temporal_patch_size // n_frames
        budget = max(min(frame_max, per_frame), frame_min, self.pixels_per_token)
        budget = min(budget, self.max_pixels)
        return smart_resize(width, height, self.unit, frame_min, budget)

    def introduce_cameras(self, cameras: Sequence[str]) -> str:
        """Return the text that names each image of a multi-camera request, in order."""
        return " ".join(self.camera_intro.format(index=i, camera=name)
                        for i, name in enumerate(cameras, start=1))

    def video_tokens(self, width: int, height: int, n_frames: int) -> int:
        """Visual tokens of a clip whose frames are already ``(width, height)``."""
        if n_frames < 1:
            raise BadRequestError(f"n_frames={n_frames} must be >= 1")
        pairs = math.ceil(n_frames / self.temporal_patch_size)
        return pairs * (width // self.unit) * (height // self.unit)


def _check_budget(field_name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequestError(f"{field_name}={value!r} must be an integer number of pixels")
    if not 0 < value <= MAX_PIXEL_BUDGET:
        raise BadRequestError(
            f"{field_name}={value} is out of range; expected 1..{MAX_PIXEL_BUDGET} pixels"
        )


def _qwen_rule(width: int, height: int, unit: int, min_pixels: int, max_pixels: int
               ) -> tuple[int, int]:
    """Qwen2-VL/2.5-VL/3-VL ``smart_resize`` (as in ``qwen_vl_utils``), in (w, h) order."""
    h_bar = max(unit, round(height / unit) * unit)
    w_bar = max(unit, round(width / unit) * unit)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(unit, math.floor(height / beta / unit) * unit)
        w_bar = max(unit, math.floor(width / beta / unit) * unit)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / unit) * unit
        w_bar = math.ceil(width * beta / unit) * unit
    return w_bar, h_bar


def _is_fixed_point(w: int, h: int, unit: int, min_pixels: int, max_pixels: int) -> bool:
    """Tell whether the Qwen processor keeps ``(w, h)`` exactly as it is (and accepts it)."""
    return (
        w >= unit
        and h >= unit
        and w % unit == 0
        and h % unit == 0
        and min_pixels <= w * h <= max_pixels
        and max(w, h) / min(w, h) <= MAX_ASPECT_RATIO
    )


def _nearest_fixed_point(width: int, height: int, unit: int, min_pixels: int, max_pixels: int
                         ) -> tuple[int, int]:
    """Find the in-budget size closest in aspect ratio (then largest) to ``width x height``.

    Only reached at extreme aspect ratios or narrow budgets, where the Qwen rule's floors and
    ceilings land outside ``[min_pixels, max_pixels]`` and the processor would resize again.
    """
    lo_tokens = max(1, math.ceil(min_pixels / (unit * unit)))
    hi_tokens = max_pixels // (unit * unit)
    target = math.log(width / height)
    best: tuple[float, int, int, int] | None = None
    # Columns beyond sqrt(200 * hi_tokens) cannot meet the aspect-ratio limit.
    max_cols = min(hi_tokens, math.isqrt(int(MAX_ASPECT_RATIO) * hi_tokens) + 1)
    for cols in range(1, max_cols + 1):
        row_lo = max(1, math.ceil(lo_tokens / cols), math.ceil(cols / MAX_ASPECT_RATIO))
        row_hi = min(hi_tokens // cols, int(cols * MAX_ASPECT_RATIO))
        if row_lo > row_hi:
            continue
        rows = min(max(round(cols * height / width), row_lo), row_hi)
        score = (abs(math.log(cols / rows) - target), -cols * rows, cols, rows)
        if best is None or score < best:
            best = score
    if best is None:
        raise BadRequestError(
            f"pixel budget [{min_pixels}, {max_pixels}] holds no image whose sides are "
            f"multiples of {unit}"
        )
    return best[2] * unit, best[3] * unit


def smart_resize(width: int, height: int, unit: int, min_pixels: int, max_pixels: int
                 ) -> tuple[int, int]:
    """Return the ``(width, height)`` the Qwen processor resizes an image to.

    Each side is rounded to a multiple of ``unit``; if the area leaves
    ``[min_pixels, max_pixels]`` both sides are scaled by the same factor (aspect ratio kept)
    and floored/ceiled to multiples of ``unit``. Unlike the processor, the result is always a
    size the processor keeps unchanged (idempotent): in rare corner cases (aspect ratio near
    200, narrow budgets) the closest such size is chosen instead.

    Raises ``BadImageError`` for non-positive sizes or an aspect ratio above 200 (as Qwen
    does) and ``BadRequestError`` for an invalid unit or budget.
    """
    for name, value in (("width", width), ("height", height)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise BadImageError(f"image {name}={value!r} must be a positive integer")
    if max(width, height) / min(width, height) > MAX_ASPECT_RATIO:
        raise BadImageError(
            f"image {width}x{height} has aspect ratio {max(width, height) / min(width, height):.1f}"
            f"; the processor accepts at most {MAX_ASPECT_RATIO:.0f}"
        )
    if isinstance(unit, bool) or not isinstance(unit, int) or not 1 <= unit <= 1024:
        raise BadRequestError(f"unit={unit!r} must be an integer in 1..1024")
    if isinstance(min_pixels, bool) or not isinstance(min_pixels, int) or min_pixels < 0:
        raise BadRequestError(f"min_pixels={min_pixels!r} must be a non-negative integer")
    _check_budget("max_pixels", max_pixels)
    if max_pixels < unit * unit:
        raise BadRequestError(
            f"max_pixels={max_pixels} is below one visual token ({unit}x{unit}={unit * unit})"
        )
    if min_pixels > max_pixels:
        raise BadRequestError(f"min_pixels={min_pixels} exceeds max_pixels={max_pixels}")
    w, h = _qwen_rule(width, height, unit, min_pixels, max_pixels)
    if _is_fixed_point(w, h, unit, min_pixels, max_pixels):
        return w, h
    return _nearest_fixed_point(width, height, unit, min_pixels, max_pixels)


# --- profiles --------------------------------------------------------------------------------

# Reason2 sampling presets as the model card and the Cosmos cookbook give them.
_REASON2_PLAIN = Sampling(
    max_tokens=4096, temperature=0.7, top_p=0.8, top_k=20, presence_penalty=1.5
)
_REASON2_REASONING = Sampling(max_tokens=4096, temperature=0.6, top_p=0.95, top_k=20)
_REASON2_STRUCTURED = Sampling(max_tokens=4096, temperature=0.3, top_p=0.3, top_k=20)
# Reason1 publishes only the reasoning preset; the plain and structured presets reuse its
# repetition penalty (Qwen2.5-VL's generation_config uses 1.05 too), the structured one the
# cookbook's low temperature for coordinates.
_REASON1_REASONING = Sampling(
    max_tokens=4096, temperature=0.6, top_p=0.95, repetition_penalty=1.05
)
_REASON1_PLAIN = _REASON1_REASONING
_REASON1_STRUCTURED = Sampling(
    max_tokens=4096, temperature=0.3, top_p=0.3, repetition_penalty=1.05
)

# Qwen3-VL: patch 16 x spatial merge 2 = 32 px per token side; processor bounds from its
# preprocessor_config.json (size.shortest_edge 65536, size.longest_edge 16777216).
_QWEN3_UNIT = 32
# Qwen2.5-VL: patch 14 x merge 2 = 28; processor bounds 3136 .. 12845056 (4 .. 16384 tokens).
_QWEN2_5_UNIT = 28

COSMOS_REASON2 = ModelProfile(
    key="cosmos_reason2",
    family="Cosmos-Reason2",
    architecture=ARCH_QWEN3_VL,
    system_prompt=DEFAULT_SYSTEM_PROMPT,
    reasoning_placement=ReasoningPlacement.USER_SUFFIX,
    reasoning_prompt=REASON2_REASONING_PROMPT,
    answer_style=AnswerStyle.THINK,
    coordinates=CoordinateConvention.NORMALIZED_1000,  # 0-1000 per axis, origin top-left
    unit=_QWEN3_UNIT,
    min_pixels=65536,
    max_pixels=16777216,
    default_max_pixels=1024 * _QWEN3_UNIT * _QWEN3_UNIT,  # 1024 tokens, about 1024x1024
    sampling_plain=_REASON2_PLAIN,
    sampling_reasoning=_REASON2_REASONING,
    sampling_structured=_REASON2_STRUCTURED,
    video_min_pixels=128 * _QWEN3_UNIT * _QWEN3_UNIT,
    video_max_pixels=768 * _QWEN3_UNIT * _QWEN3_UNIT,
    video_total_pixels=8192 * _QWEN3_UNIT * _QWEN3_UNIT,
)

# Plain Qwen3-VL shares Reason2's conventions (same architecture, same 0-1000 coordinates)
# except the reasoning prompt and the system prompt (its chat template has no default). Its
# sampling presets mirror Cosmos-Reason2's, which were tuned from Qwen3-VL's own.
QWEN3_VL = dataclasses.replace(
    COSMOS_REASON2,
    key="qwen3_vl",
    family="Qwen3-VL",
    system_prompt=None,
    reasoning_prompt=QWEN3_VL_REASONING_PROMPT,
    is_cosmos=False,
)

COSMOS_REASON1 = ModelProfile(
    key="cosmos_reason1",
    family="Cosmos-Reason1",
    architecture=ARCH_QWEN2_5_VL,
    system_prompt=DEFAULT_SYSTEM_PROMPT,
    reasoning_placement=ReasoningPlacement.SYSTEM_PROMPT,
    reasoning_prompt=REASON1_REASONING_SYSTEM_PROMPT,
    answer_style=AnswerStyle.ANSWER_TAGS,
    coordinates=CoordinateConvention.INPUT_PIXELS,  # pixels of the resized model input
    unit=_QWEN2_5_UNIT,
    min_pixels=3136,
    max_pixels=12845056,
    default_max_pixels=1280 * _QWEN2_5_UNIT * _QWEN2_5_UNIT,  # Qwen's 1280-token example
    sampling_plain=_REASON1_PLAIN,
    sampling_reasoning=_REASON1_REASONING,
    sampling_structured=_REASON1_STRUCTURED,
    video_min_pixels=128 * _QWEN2_5_UNIT * _QWEN2_5_UNIT,
    video_max_pixels=768 * _QWEN2_5_UNIT * _QWEN2_5_UNIT,
    # Reason1 card: total video budget about 8192 tokens.
    video_total_pixels=8192 * _QWEN2_5_UNIT * _QWEN2_5_UNIT,
)

# Plain Qwen2.5-VL: Reason1's conventions; its chat template supplies "You are a helpful
# assistant." itself. Presets mirror Cosmos-Reason1's.
QWEN2_5_VL = dataclasses.replace(
    COSMOS_REASON1,
    key="qwen2_5_vl",
    family="Qwen2.5-VL",
    system_prompt=None,
    is_cosmos=False,
)

PROFILES: dict[str, ModelProfile] = {
    p.key: p for p in (COSMOS_REASON2, COSMOS_REASON1, QWEN3_VL, QWEN2_5_VL)
}
AUTO = "auto"


# --- detection -------------------------------------------------------------------------------

_ARCH_FAMILY = {  # architecture or model_type -> "qwen3_vl" | "qwen2_5_vl"
    ARCH_QWEN3_VL: "qwen3_vl",
    ARCH_QWEN3_VL_MOE: "qwen3_vl",
    ARCH_QWEN2_5_VL: "qwen2_5_vl",
    "qwen3_vl": "qwen3_vl",
    "qwen3_vl_moe": "qwen3_vl",
    "qwen2_5_vl": "qwen2_5_vl",
}
_COSMOS_OF_BASE = {"qwen3_vl": "cosmos_reason2", "qwen2_5_vl": "cosmos_reason1"}
_BASE_OF_COSMOS = {v: k for k, v in _COSMOS_OF_BASE.items()}


def _normalize_key(text: str) -> str:
    return text.strip().lower().replace("-", "_").replace(".", "_")


def _name_hint(name: str) -> str | None:
    """Profile key implied by a model name or path, or None."""
    flat = _normalize_key(name)
    if "reason2" in flat:
        return "cosmos_reason2"
    if "reason1" in flat:
        return "cosmos_reason1"
    if "qwen3_vl" in flat or "qwen3vl" in flat:
        return "qwen3_vl"
    if "qwen2_5_vl" in flat or "qwen2_5vl" in flat:
        return "qwen2_5_vl"
    return None


def _read_json(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise BadRequestError(f"cannot read {path}: {type(e).__name__}: {e}") from e
    if not isinstance(data, dict):
        raise BadRequestError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def _base_from_config(config: Mapping[str, Any], path: str) -> str:
    """Return "qwen3_vl" or "qwen2_5_vl" from config.json's architectures / model_type."""
    architectures = config.get("architectures") or []
    if isinstance(architectures, str):
        architectures = [architectures]
    model_type = config.get("model_type")
    for candidate in [*architectures, model_type]:
        if isinstance(candidate, str) and candidate in _ARCH_FAMILY:
            return _ARCH_FAMILY[candidate]
    raise BadRequestError(
        f"{path}: unsupported architecture {architectures!r} (model_type={model_type!r}); "
        f"supported: {ARCH_QWEN3_VL}, {ARCH_QWEN3_VL_MOE}, {ARCH_QWEN2_5_VL}; "
        f"or set the model family explicitly ({', '.join(PROFILES)})"
    )


def _positive_int(data: Mapping[str, Any], key: str, path: str) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise BadRequestError(f"{path}: {key}={value!r} must be a positive integer")
    return value


def _processor_overrides(model_dir: str) -> dict[str, int]:
    """Pixel unit and budgets from the checkpoint's image processor config, where present.

    Qwen processors store budgets as ``min_pixels``/``max_pixels`` or as
    ``size: {shortest_edge, longest_edge}`` (both are pixel *areas*, not edge lengths);
    transformers 5 nests the image processor inside ``processor_config.json``.
    """
    path = os.path.join(model_dir, "preprocessor_config.json")
    if os.path.isfile(path):
        data: Mapping[str, Any] = _read_json(path)
    else:
        path = os.path.join(model_dir, "processor_config.json")
        if not os.path.isfile(path):
            return {}
        nested = _read_json(path).get("image_processor")
        if not isinstance(nested, dict):
            return {}
        data = nested
    size = data.get("size")
    size = size if isinstance(size, dict) else {}
    min_pixels = _positive_int(data, "min_pixels", path) or _positive_int(
        size, "shortest_edge", path
    )
    max_pixels = _positive_int(data, "max_pixels", path) or _positive_int(
        size, "longest_edge", path
    )
    patch = _positive_int(data, "patch_size", path)
    merge = _positive_int(data, "merge_size", path)
    found: dict[str, int] = {}
    if min_pixels is not None:
        found["min_pixels"] = min_pixels
    if max_pixels is not None:
        found["max_pixels"] = max_pixels
    if patch is not None and merge is not None:
        found["unit"] = patch * merge
    return found


def with_processor_budgets(
    profile: ModelProfile,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    unit: int | None = None,
) -> ModelProfile:
    """Return a copy of ``profile`` that follows a checkpoint processor's unit and budgets.

    The package default and the video budgets are clamped into the new bounds so that tiny
    test checkpoints (a few dozen tokens per image) work with the same code as real ones.
    """
    unit = profile.unit if unit is None else unit
    lo = profile.min_pixels if min_pixels is None else min_pixels
    hi = profile.max_pixels if max_pixels is None else max_pixels
    _check_budget("max_pixels", hi)
    if not 1 <= unit <= 1024:
        raise BadRequestError(f"unit={unit} must be in 1..1024")
    if hi < unit * unit or lo > hi:
        raise BadRequestError(
            f"processor budget min_pixels={lo} max_pixels={hi} is invalid for unit {unit}: "
            f"expected {unit * unit} <= max_pixels and min_pixels <= max_pixels"
        )
    default_max = min(max(profile.default_max_pixels, lo), hi)
    video_max = min(max(profile.video_max_pixels or default_max, lo), hi)
    video_min = min(max(profile.video_min_pixels or lo, lo), video_max)
    return dataclasses.replace(
        profile,
        unit=unit,
        min_pixels=lo,
        max_pixels=hi,
        default_max_pixels=default_max,
        video_min_pixels=video_min,
        video_max_pixels=video_max,
        video_total_pixels=max(profile.video_total_pixels, video_max),
    )


def profile_for_key(key: str) -> ModelProfile:
    """Return the registered profile for ``key`` (dashes/dots accepted for underscores)."""
    normalized = _normalize_key(key)
    if normalized not in PROFILES:
        raise BadRequestError(
            f"unknown model family {key!r}; allowed: {', '.join([AUTO, *PROFILES])}"
        )
    return PROFILES[normalized]


def looks_like_local_path(name: str) -> bool:
    """Tell whether ``name`` is written as a local path, not a hub id (``org/model``).

    Absolute (``/models/x``), relative to here or home (``./x``, ``../x``, ``~/x``), or with
    more folders than a hub id has.
    """
    return (name.startswith(("/", "./", "../", "~")) or name in (".", "..")
            or name.count("/") >= 2)


def missing_path_hint(path: str) -> str:
    """Say where ``path`` stops existing: its nearest existing folder and its subfolders."""
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.isdir(parent):
        parent = os.path.dirname(parent)
    if parent == os.path.dirname(parent):  # the root: its listing would say nothing useful
        return f"nothing of it exists below {parent}"
    try:
        folders = sorted(e for e in os.listdir(parent) if not e.startswith(".")
                         and os.path.isdir(os.path.join(parent, e)))
    except OSError:
        return f"the nearest existing folder is {parent}"
    shown = ", ".join(folders[:8]) + (", ..." if len(folders) > 8 else "")
    return f"the nearest existing folder is {parent}, with folders: {shown or 'none'}"


def detect_profile(model_dir_or_name: str, override: str | None = None) -> ModelProfile:
    """Choose the profile for a checkpoint directory or a hub name like ``nvidia/...``.

    The architecture comes from ``config.json`` (a Qwen3-VL checkpoint is Cosmos-Reason2 only
    when its path or name says so, otherwise plain Qwen3-VL; likewise Qwen2.5-VL and
    Cosmos-Reason1); without a config the name decides. ``override`` (a ``PROFILES`` key or
    ``"auto"``) skips detection, and errors in ``config.json`` are then ignored. Processor
    budgets from ``preprocessor_config.json`` are applied either way.
    """
    if not isinstance(model_dir_or_name, str) or not model_dir_or_name.strip():
        raise BadRequestError(
            f"model={model_dir_or_name!r} must name a checkpoint directory or a hub model id"
        )
    if override is not None and not isinstance(override, str):
        raise BadRequestError(f"model family override={override!r} must be a string")
    forced: ModelProfile | None = None
    if override is not None and _normalize_key(override) not in ("", AUTO):
        forced = profile_for_key(override)
    model_dir = model_dir_or_name if os.path.isdir(model_dir_or_name) else None
    if forced is not None:
        profile = forced
    else:
        profile = _detect_family(model_dir_or_name, model_dir)
    if model_dir is None:
        return profile
    try:
        overrides = _processor_overrides(model_dir)
    except BadRequestError:
        if forced is None:
            raise
        overrides = {}
    return with_processor_budgets(profile, **overrides) if overrides else profile


def _detect_family(name: str, model_dir: str | None) -> ModelProfile:
    config_path = os.path.join(model_dir, "config.json") if model_dir is not None else None
    if config_path is None or not os.path.exists(config_path):
        hint = _name_hint(name)
        if hint is None and model_dir is None and looks_like_local_path(name):
            # A mistyped checkpoint path: say so, not "set the family".
            path = os.path.abspath(os.path.expanduser(name))
            raise BadRequestError(
                f"model {name!r}: no such directory {path} (looked for "
                f"{os.path.join(path, 'config.json')} to detect the model family; "
                f"{missing_path_hint(path)}); give an existing checkpoint directory, a hub "
                f"model id such as nvidia/Cosmos-Reason2-2B, or the family: one of "
                f"{', '.join(PROFILES)}"
            )
        if hint is None:
            where = f"no config.json in {model_dir}" if model_dir else "not a local directory"
            raise BadRequestError(
                f"cannot detect the model family of {name!r} ({where}, and the name names "
                f"none); set it explicitly: one of {', '.join(PROFILES)}"
            )
        return PROFILES[hint]
    config = _read_json(config_path)
    base = _base_from_config(config, config_path)
    hint = _name_hint(f"{name} {config.get('_name_or_path', '')}")
    if hint in _BASE_OF_COSMOS:
        if _BASE_OF_COSMOS[hint] != base:
            raise BadRequestError(
                f"{name!r} is named like {PROFILES[hint].family} but {config_path} describes a "
                f"{PROFILES[base].family} model; set the model family explicitly"
            )
        return PROFILES[hint]
    return PROFILES[base]
