import json

import numpy as np
import pytest

from cosmos_reason_ros.core import query
from cosmos_reason_ros.core.models import PROFILES
from cosmos_reason_ros.core.types import BadImageError, BadRequestError, Chunk, FinishReason, Task

REASON2 = PROFILES["cosmos_reason2"]
REASON1 = PROFILES["cosmos_reason1"]


def frame(width=1280, height=720):
    return np.zeros((height, width, 3), np.uint8)


def test_spec_validates_fields_and_applies_presets():
    spec = query.make_spec(REASON2, task="ground", targets=[" red cup "])
    assert spec.task is Task.GROUND and spec.targets == ("red cup",)
    assert spec.sampling.temperature == pytest.approx(0.3)  # grounding preset
    with pytest.raises(BadRequestError, match="targets"):
        query.make_spec(REASON2, task="ground")
    with pytest.raises(BadRequestError, match="max_tokens"):
        query.make_spec(REASON2, prompt="q", max_tokens=10**6)
    with pytest.raises(BadRequestError, match="response_schema"):
        query.make_spec(REASON2, prompt="q", response_schema="{not json")


def test_greedy_overrides_temperature():
    spec = query.make_spec(REASON2, prompt="q", temperature=1.2, greedy=True)
    assert spec.sampling.temperature == 0.0 and spec.sampling.top_k is None


def test_prepared_image_is_a_fixed_point_of_the_model_resize():
    media = query.prepare_image(REASON2, frame(1280, 720))
    g = media.geometry
    assert (g.original_width, g.original_height) == (1280, 720)
    assert media.images[0].shape == (g.input_height, g.input_width, 3)
    assert g.input_width % 32 == 0 and g.input_height % 32 == 0
    assert REASON2.input_size(g.input_width, g.input_height) == (g.input_width, g.input_height)


def test_clip_rejects_frames_of_different_sizes():
    with pytest.raises(BadImageError, match="clip frame 1"):
        query.prepare_clip(REASON2, [frame(), frame(640, 480)], [0, 250_000_000], 4.0)


def test_clip_keeps_relative_times():
    media = query.prepare_clip(REASON2, [frame()] * 3, [10**9, 10**9 + 25 * 10**7,
                                                      10**9 + 5 * 10**8], 4.0)
    assert media.video.timestamps_s == (0.0, 0.25, 0.5)


def test_request_has_media_first_and_task_schema_only_without_reasoning():
    media = query.prepare_image(REASON2, frame())
    spec = query.make_spec(REASON2, task="ground", targets=["cup"])
    request = query.build_request("r1", REASON2, spec, media)
    user = request.messages[-1]
    assert [p.kind for p in user.content] == ["image", "text"]
    assert request.json_schema is not None
    thinking = query.make_spec(REASON2, task="ground", targets=["cup"], reasoning=True)
    assert query.build_request("r2", REASON2, thinking, media).json_schema is None
    assert query.build_request("r3", REASON2, thinking, media,
                               engine_constrains_after_reasoning=True).json_schema is not None


def test_finish_maps_normalized_boxes_to_original_pixels():
    media = query.prepare_image(REASON2, frame(1280, 720))
    spec = query.make_spec(REASON2, task="ground", targets=["cup"])
    out = query.OutputAccumulator()
    answer = '<think>a box [1,2,3,4]</think>\n```json\n[{"bbox_2d": [500, 500, 1000, 1000], ' \
             '"label": "cup"}]\n```'
    out.add(Chunk(text_delta=answer[:10], output_tokens=3, elapsed_s=0.1))
    out.add(Chunk(text_delta=answer[10:], output_tokens=9, finish_reason=FinishReason.STOP,
                  prompt_tokens=400, cached_prompt_tokens=384, elapsed_s=0.2))
    outcome = query.finish(REASON2, spec, media, out)
    assert outcome.parsed.reasoning == "a box [1,2,3,4]"
    (box,) = outcome.boxes
    assert (box.x_min, box.y_min, box.x_max, box.y_max) == (640.0, 360.0, 1280.0, 720.0)
    assert outcome.tokens.cached_prompt == 384 and out.first_token_s == 0.1


def test_finish_maps_reason1_input_pixels_and_keeps_server_reasoning():
    media = query.prepare_image(REASON1, frame(1280, 720))
    g = media.geometry
    spec = query.make_spec(REASON1, task="ground", targets=["cup"])
    out = query.OutputAccumulator()
    out.add(Chunk(reasoning_delta="thinking", elapsed_s=0.1))
    out.add(Chunk(text_delta=json.dumps([{"bbox_2d": [0, 0, g.input_width, g.input_height]}]),
                  finish_reason=FinishReason.STOP))
    outcome = query.finish(REASON1, spec, media, out)
    assert outcome.parsed.reasoning == "thinking"
    assert "<think>" in outcome.parsed.raw_text
    (box,) = outcome.boxes
    assert (box.x_max, box.y_max) == (1280.0, 720.0)
