"""Property-based fuzzing of the core layer: every input either works or raises the package's
own error with its code; nothing else escapes, and what works satisfies the invariants the node
relies on (shapes, bounds, finite sampling, pixels inside the original image).

Deterministic (``derandomize=True``, no example database) so CI runs the same cases every time;
about 1500 examples in total, a few seconds on one core. Reproduce a failure by rerunning the
test: the same example comes back. See docs/RELIABILITY.md.
"""

from __future__ import annotations

import io
import json
import math
import struct
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from cosmos_reason_ros.core import imaging, parsing, prompts, query
from cosmos_reason_ros.core.models import PROFILES
from cosmos_reason_ros.core.types import (
    BadImageError,
    BadRequestError,
    Chunk,
    CosmosReasonError,
    ErrorCode,
    FinishReason,
    ImageGeometry,
    Sampling,
    Task,
)


def FUZZ(max_examples: int) -> settings:  # noqa: N802 - reads like a decorator
    """Deterministic settings: same examples every run, no database, no deadline."""
    return settings(max_examples=max_examples, derandomize=True, database=None, deadline=None,
                    print_blob=True, suppress_health_check=[HealthCheck.too_slow,
                                                            HealthCheck.data_too_large])


REASON2 = PROFILES["cosmos_reason2"]
REASON1 = PROFILES["cosmos_reason1"]
LIMITS = query.QueryLimits(max_tokens=512)
MAX_PIXELS = 4096  # small bound so declared sizes above it are refused before allocation

# --- images ---------------------------------------------------------------------------------

ENCODINGS = st.one_of(
    st.sampled_from(imaging.SUPPORTED_ENCODINGS),
    st.sampled_from(["RGB8", " bgr8 ", "rgb16", "32FC3", "jpeg", "", "mono\x00", "bayer"]),
    st.text(max_size=12),
)


@st.composite
def raw_images(draw):
    """Image fields that are mostly consistent, with one or more fields pushed off."""
    encoding = draw(ENCODINGS)
    try:
        bpp = imaging.bytes_per_pixel(encoding)
    except BadImageError:
        bpp = draw(st.integers(1, 4))
    width = draw(st.one_of(st.integers(1, 24), st.integers(-3, 0), st.integers(10**4, 10**6)))
    height = draw(st.one_of(st.integers(1, 24), st.integers(-3, 0), st.integers(10**4, 10**6)))
    pad = draw(st.one_of(st.just(0), st.integers(-8, 16)))
    step = max(0, width) * bpp + pad
    rows = max(0, min(height, 64))
    size = max(0, step) * rows + draw(st.one_of(st.just(0), st.integers(-16, 16)))
    data = draw(st.binary(min_size=max(0, min(size, 4096)), max_size=max(0, min(size, 4096))))
    big = draw(st.booleans())
    return width, height, encoding, big, step, data


@FUZZ(max_examples=400)
@given(raw_images(), st.one_of(st.none(), st.tuples(st.integers(1, 40), st.integers(1, 40))))
def test_raw_image_fields_convert_or_raise_bad_image(fields, size):
    width, height, encoding, big, step, data = fields
    try:
        rgb = imaging.image_to_rgb(width, height, encoding, big, step, data,
                                   max_pixels=MAX_PIXELS, size=size)
    except BadImageError as e:
        assert e.code is ErrorCode.BAD_IMAGE and e.message
        return
    want_w, want_h = size or (width, height)
    assert rgb.shape == (want_h, want_w, 3) and rgb.dtype == np.uint8
    assert rgb.flags.c_contiguous


def _png(width: int, height: int, bit_depth: int = 8, color_type: int = 2) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF))
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(
        b"\x00" * 16)) + chunk(b"IEND", b"")


def _encoded(fmt: str, w: int, h: int, seed: int) -> bytes:
    rgb = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(rgb).save(out, format=fmt)
    return out.getvalue()


VALID = [_encoded("JPEG", 17, 11, 1), _encoded("PNG", 9, 13, 2)]


@st.composite
def compressed_payloads(draw):
    kind = draw(st.sampled_from(["mutated", "truncated", "random", "declared"]))
    if kind == "random":
        return draw(st.binary(max_size=256))
    if kind == "declared":  # a PNG header that declares a (possibly huge) size
        return _png(draw(st.integers(0, 2**31 - 1)), draw(st.integers(0, 2**31 - 1)),
                    draw(st.sampled_from([1, 8, 16])), draw(st.sampled_from([0, 2, 6])))
    data = bytearray(draw(st.sampled_from(VALID)))
    if kind == "truncated":
        return bytes(data[: draw(st.integers(0, len(data)))])
    for _ in range(draw(st.integers(1, 8))):
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data)


@FUZZ(max_examples=300)
@given(compressed_payloads(), st.sampled_from(["jpeg", "png", "rgb8; jpeg compressed bgr8",
                                                "16UC1; compressedDepth png", "", "\xff"]))
def test_compressed_bytes_decode_or_raise_bad_image(data, fmt):
    try:
        rgb = imaging.compressed_to_rgb(fmt, data, MAX_PIXELS)
    except BadImageError as e:
        assert e.message
        return
    assert rgb.ndim == 3 and rgb.shape[2] == 3 and rgb.dtype == np.uint8
    assert rgb.shape[0] * rgb.shape[1] <= MAX_PIXELS


@FUZZ(max_examples=200)
@given(st.integers(1, 20000), st.integers(1, 20000), st.sampled_from([REASON1, REASON2]),
       st.sampled_from([0, 65536, 200_000]))
def test_model_input_size_is_bounded_and_a_fixed_point(width, height, profile, budget):
    limits = query.QueryLimits(max_image_pixels=budget)
    try:
        in_w, in_h = query.input_size(profile, width, height, limits)
    except BadImageError as e:  # the Qwen processor refuses aspect ratios above 200
        assert "aspect ratio" in e.message and max(width, height) / min(width, height) > 200
        return
    assert in_w > 0 and in_h > 0
    assert in_w * in_h <= max(budget or profile.default_max_pixels, profile.min_pixels) * 1.01
    # The package's resize is what the model sees: resizing again changes nothing.
    assert query.input_size(profile, in_w, in_h, limits) == (in_w, in_h)


# --- goal fields ----------------------------------------------------------------------------

TEXT = st.one_of(st.just(""), st.text(max_size=40), st.sampled_from([
        "x" * 4000, "\u00e9" * 4001, "\u6c34" * 3999, "a\x00" * 2000,
        "What is on the table?", "file:///etc/passwd", "http://127.0.0.1:1/x", "\x00", " \n\t",
        "a\ud800b"]))
FLOAT32 = st.one_of(st.floats(width=32), st.sampled_from([0.0, -1.0, 0.7, 2.0, 2.0001, 1e30]))
SCHEMA_JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=False),
              st.text(max_size=8)),
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(
        st.sampled_from(["type", "properties", "items", "required", "enum", "maxLength",
                         "minItems", "maxItems", "$ref", "anyOf", "minimum", "maximum", "x"]),
        children, max_size=4)),
    max_leaves=12)
SCHEMAS = st.one_of(st.just(""), st.text(max_size=30), SCHEMA_JSON.map(json.dumps),
                    st.sampled_from(['{"$ref": "http://127.0.0.1:1/s.json"}',
                                     '{"$ref": "file:///etc/passwd"}',
                                     '{"$defs": {"a": {"type": "string"}}, "$ref": "#/$defs/a"}',
                                     '{"type": "object"}', "[" * 5000, "{" + " " * 20000 + "}"]))


@FUZZ(max_examples=400)
@given(task=st.one_of(st.sampled_from([t.value for t in Task] + ["", "VQA", " ground"]),
                      st.text(max_size=8)),
       prompt=TEXT, targets=st.lists(TEXT, max_size=18), reasoning=st.booleans(),
       schema=SCHEMAS, max_tokens=st.integers(-2**31, 2**31 - 1) | st.integers(-2, 600),
       temperature=FLOAT32, greedy=st.booleans(), profile=st.sampled_from([REASON1, REASON2]))
def test_goal_fields_give_a_valid_spec_or_bad_request(task, prompt, targets, reasoning, schema,
                                                      max_tokens, temperature, greedy, profile):
    try:
        spec = query.make_spec(profile, task=task, prompt=prompt, targets=targets,
                               reasoning=reasoning, response_schema=schema,
                               max_tokens=max_tokens, temperature=temperature, greedy=greedy,
                               limits=LIMITS)
    except BadRequestError as e:
        assert e.code is ErrorCode.BAD_REQUEST and e.message
        return
    s = spec.sampling
    assert 1 <= s.max_tokens <= LIMITS.max_tokens
    assert math.isfinite(s.temperature) and 0.0 <= s.temperature <= prompts.MAX_TEMPERATURE
    assert 0.0 < s.top_p <= 1.0
    assert len(spec.prompt) <= LIMITS.max_prompt_chars
    spec.prompt.encode("utf-8")  # whatever passes can be sent to a tokenizer or over HTTP
    for t in spec.targets:
        t.encode("utf-8")
    assert len(spec.targets) <= prompts.MAX_TARGETS
    if spec.user_schema is not None:
        text = json.dumps(spec.user_schema)
        assert len(text.encode()) <= LIMITS.max_schema_bytes
        assert "http:" not in text and "file:" not in text  # nothing to fetch
    # The validated spec always builds a request (the node's next step).
    media = query.prepare_image(profile, np.zeros((48, 64, 3), np.uint8), LIMITS)
    try:
        request = query.build_request("r", profile, spec, media)
    except BadRequestError as e:
        assert spec.task is Task.TEMPORAL and "video" in e.message  # needs a clip
        return
    assert request.images[0].shape == (media.geometry.input_height, media.geometry.input_width,
                                       3)
    assert request.messages[-1].role == "user"
    assert request.messages[-1].content[0].kind == "image"  # media first


# --- model output ---------------------------------------------------------------------------

JSONISH = st.one_of(
    st.text(max_size=200),
    st.lists(st.sampled_from([
        "<think>", "</think>", "<answer>", "</answer>", "```json", "```", "[", "]", "{", "}",
        '"bbox_2d":', '"box_2d":', '"point_2d":', '"label":', '"start":', '"end":', ",", " ",
        "1e309", "-5", "999999", "NaN", "0", "500", "1000", '"cup"', "\n", '"00:01.50"']),
        max_size=60).map("".join))


@FUZZ(max_examples=300)
@given(text=JSONISH, reasoning=st.one_of(st.none(), st.text(max_size=40)),
       finish=st.sampled_from(list(FinishReason)),
       task=st.sampled_from(list(Task)), profile=st.sampled_from([REASON1, REASON2]),
       size=st.tuples(st.integers(20, 4000), st.integers(20, 4000)))
def test_any_model_output_parses_and_maps_inside_the_original_image(text, reasoning, finish,
                                                                   task, profile, size):
    parsed = parsing.parse_output(text, reasoning=reasoning, finish_reason=finish, task=task)
    assert isinstance(parsed.answer, str) and isinstance(parsed.raw_text, str)
    if parsed.answer_json is not None:
        json.loads(parsed.answer_json)
    width, height = size
    in_w, in_h = profile.input_size(width, height)
    media = query.PreparedMedia(ImageGeometry(width, height, in_w, in_h))
    spec = query.QuerySpec(task, "q", (), False, Sampling())
    out = query.OutputAccumulator()
    out.add(Chunk(text_delta=text, reasoning_delta=reasoning or "", output_tokens=3,
                        finish_reason=finish))
    outcome = query.finish(profile, spec, media, out)
    for b in outcome.boxes:
        assert 0 <= b.x_min <= b.x_max <= width and 0 <= b.y_min <= b.y_max <= height
    for p in (*outcome.points, *(q for t in outcome.trajectories for q in t.points)):
        assert 0 <= p.x <= width and 0 <= p.y <= height
    assert outcome.finish_reason is finish


def test_fuzz_errors_are_package_errors_only():
    # The properties above catch only the package's own errors: anything else fails them.
    assert issubclass(BadImageError, CosmosReasonError)
    assert issubclass(BadRequestError, CosmosReasonError)
    with pytest.raises(BadImageError):
        imaging.image_to_rgb(2, 2, "rgb8", False, 6, b"\x00" * 11)
