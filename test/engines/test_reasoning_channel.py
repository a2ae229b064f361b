"""A server whose reasoning parser takes the whole output: the answer is still found.

vLLM's ``--reasoning-parser qwen3`` with no think prompt can stream every token as reasoning
and leave ``content`` empty. The real HTTP engine reads both field names (``reasoning``, and
the older ``reasoning_content``) and the goal's finish step recovers the boxes from that
channel, noting where they came from, instead of reporting "nothing found".
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from aiohttp import web
from test_openai_http import FakeServer, engine_for, fake_cfg, run, sse, stream_events

from cosmos_reason_ros.core import parsing, query
from cosmos_reason_ros.core.models import PROFILES

REASON2 = PROFILES["cosmos_reason2"]
ANSWER = '[{"bbox_2d": [500, 500, 1000, 1000], "label": "cup"}]'


def reasoning_only_chat(field: str, text: str):
    async def handler(request: web.Request) -> web.StreamResponse:
        half = len(text) // 2
        events = [sse({"choices": [{"index": 0, "delta": {field: part}, "finish_reason": None}]})
                  for part in (text[:half], text[half:])]
        events.append(sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
        return await stream_events(request, [*events, b"data: [DONE]\n\n"])
    return handler


def ground_through(field: str, text: str) -> Any:
    media = query.prepare_image(REASON2, np.zeros((720, 1280, 3), np.uint8))
    spec = query.make_spec(REASON2, task="ground", targets=["cup"])
    request = query.build_request("r1", REASON2, spec, media)

    async def body() -> Any:
        async with FakeServer(reasoning_only_chat(field, text)) as fake, \
                engine_for(fake_cfg(fake)) as engine:
            out = query.OutputAccumulator()
            async for chunk in engine.stream(request):
                out.add(chunk)
            return query.finish(REASON2, spec, media, out)
    return run(body())


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
@pytest.mark.parametrize("text", [ANSWER, "The cup is on the right.</think>\n" + ANSWER],
                         ids=["whole-output", "after-think"])
def test_boxes_streamed_only_as_reasoning_are_returned_and_noted(field: str, text: str) -> None:
    outcome = ground_through(field, text)
    (box,) = outcome.boxes
    assert (box.x_min, box.y_min, box.x_max, box.y_max) == (640.0, 360.0, 1280.0, 720.0)
    assert parsing.answered_from_reasoning_channel(outcome.parsed.problems)
    assert json.loads(outcome.parsed.answer_json)[0]["label"] == "cup"
