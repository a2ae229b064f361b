"""OpenAIServerEngine against a real ``vllm`` OpenAI server (tiny Qwen3-VL) and a fake one.

The real server (``python -m vllm.entrypoints.openai.api_server``, own process group) covers
the behaviours that matter on a robot: streaming with images and video, JSON schemas,
reasoning split, cancel by disconnect, a primary down and the fallback serving, all-down,
API-key hygiene, a server that comes up late and one killed mid-stream. A small
``aiohttp.web`` server covers the SSE parser, ordered fallbacks and recovery, the routing
header, busy retries, output bounds and the error mapping cheaply (cases a real server will
not produce on demand). The router itself is exercised in ``test/ros/test_fleet_router.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiohttp import web
from servers import VllmServer, free_port
from waiting import NEVER_S, async_wait_until

from cosmos_reason_ros.core.types import (
    BadRequestError,
    ChatRequest,
    Chunk,
    ContentPart,
    CosmosReasonError,
    EngineError,
    EngineUnavailableError,
    FinishReason,
    Message,
    OverloadedError,
    PromptTooLongError,
    Sampling,
    Video,
)
from cosmos_reason_ros.engines.base import EngineState, output_token_limit
from cosmos_reason_ros.engines.openai_http import OpenAIServerConfig, OpenAIServerEngine, SSEParser

REASONING_FORMAT = (
    "Answer the question using the following format:\n\n<think>\nYour reasoning.\n</think>\n\n"
    "Write your final answer immediately after the </think> tag."
)
SCHEMA = {
    "type": "object",
    "properties": {
        "label": {"type": "string", "maxLength": 12},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
    },
    "required": ["label", "count", "tags"],
    "additionalProperties": False,
}


# --- helpers ------------------------------------------------------------------------------------


def image(seed: int = 0, h: int = 240, w: int = 320) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def image_request(
    request_id: str | None = None,
    text: str = "What is in the image?",
    max_tokens: int = 16,
    **kwargs: Any,
) -> ChatRequest:
    sampling = kwargs.pop("sampling", None) or Sampling(max_tokens=max_tokens, seed=1)
    return ChatRequest(
        request_id=request_id or uuid.uuid4().hex,
        messages=(Message("user", (ContentPart("image"), ContentPart("text", text))),),
        sampling=sampling,
        images=kwargs.pop("images", (image(),)),
        **kwargs,
    )


def text_request(text: str = "Hello", max_tokens: int = 8, **kwargs: Any) -> ChatRequest:
    return ChatRequest(
        request_id=uuid.uuid4().hex,
        messages=(Message("user", (ContentPart("text", text),)),),
        sampling=Sampling(max_tokens=max_tokens, seed=1, **kwargs),
    )


def long_request() -> ChatRequest:
    """Runs for seconds on the tiny model (ignore_eos up to the context limit)."""
    return image_request(sampling=Sampling(max_tokens=1800, temperature=0.7, ignore_eos=True))


async def collect(engine: OpenAIServerEngine, request: ChatRequest) -> list[Chunk]:
    return [c async for c in engine.stream(request)]


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def engine_for(config: OpenAIServerConfig, start: bool = True) -> AsyncIterator[
    OpenAIServerEngine
]:
    engine = OpenAIServerEngine(config)
    try:
        if start:
            await engine.start()
        yield engine
    finally:
        await engine.close()


async def running_requests(root: str) -> float:
    async with aiohttp.ClientSession() as s, s.get(root + "/metrics") as r:
        text = await r.text()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("vllm:num_requests_running"):
            total += float(line.split()[-1])
    return total


async def generated_tokens(root: str) -> float:
    """vLLM's running total of generated tokens (all requests)."""
    async with aiohttp.ClientSession() as s, s.get(root + "/metrics") as r:
        text = await r.text()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("vllm:generation_tokens_total"))


async def wait_idle(root: str, timeout_s: float) -> float:
    """Seconds until the server reports no running request (raises on timeout)."""
    t0 = time.monotonic()

    async def idle() -> bool:
        return await running_requests(root) == 0

    await async_wait_until(idle, timeout_s, "the server still runs a request")
    return time.monotonic() - t0


SECRET = f"sk-test-{uuid.uuid4().hex}"
KEY_ENV = "COSMOS_TEST_OPENAI_KEY"


@pytest.fixture(scope="module")
def server(tiny_qwen3_vl: Path) -> Any:
    """One real server for the module; it requires the API key held in ``KEY_ENV``."""
    # 2048 tokens of context: the key-hygiene test needs a prompt the server refuses.
    srv = VllmServer(tiny_qwen3_vl, free_port(), api_key=SECRET, max_model_len=2048)
    try:
        startup = srv.wait_healthy()
        print(f"\nvllm server healthy after {startup:.1f}s")
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def key_env(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(KEY_ENV, SECRET)
    return KEY_ENV


def cfg(url: str, *fallback_urls: str, **kwargs: Any) -> OpenAIServerConfig:
    kwargs.setdefault("api_key_env", KEY_ENV)
    kwargs.setdefault("start_timeout_s", 60.0)
    kwargs.setdefault("health_period_s", 0.5)
    return OpenAIServerConfig(url=url, fallback_urls=fallback_urls, **kwargs)


# --- config -------------------------------------------------------------------------------------


def test_config_from_dict_rejects_unknown_keys_and_names_them() -> None:
    with pytest.raises(ValueError, match=r"unknown OpenAIServerConfig key\(s\) \['endpoints'\]"):
        OpenAIServerConfig.from_dict({"endpoints": ["http://x:1/v1"]})
    c = OpenAIServerConfig.from_dict({"url": "http://a:1/v1/", "fallback_urls": ["http://b:2/v1"],
                                      "read_timeout_s": 5})
    assert c.urls == ("http://a:1/v1", "http://b:2/v1")
    assert c.read_timeout_s == 5


@pytest.mark.parametrize("bad,says", [
    ({"url": "ftp://x/v1"}, "url='ftp://x/v1': allowed: http(s)://host"),
    ({"url": "http://x:8000"}, "url='http://x:8000': path '/' does not end in /v1"),
    ({"url": "http://user:pw@x/v1"}, "holds credentials"),
    ({"fallback_urls": ["http://b/v1", "http://b/v1/"]}, "[1]='http://b/v1/' is listed twice"),
    ({"url": "http://a/v1", "fallback_urls": ["http://a/v1/"]}, "repeats url='http://a/v1'"),
    ({"session_header": "X Session"}, "session_header='X Session': allowed: empty"),
    ({"session_header": "Authorization"}, "the engine sets Authorization itself"),
    ({"read_timeout_s": 0}, "read_timeout_s=0; expected a number > 0"),
    ({"busy_retries": -1}, "busy_retries=-1; expected 0..10"),
    ({"jpeg_quality": 101}, "jpeg_quality=101; expected 1..100"),
    ({"thinking": "maybe"}, "thinking='maybe'; expected one of"),
    ({"structured_outputs_field": "guided_json"}, "structured_outputs_field='guided_json'"),
])
def test_config_rejects_invalid_values_naming_field_value_and_rule(bad: dict[str, Any],
                                                                   says: str) -> None:
    with pytest.raises(ValueError) as info:
        OpenAIServerConfig.from_dict(bad)
    assert says in str(info.value)


def test_config_refuses_a_key_in_place_of_a_variable_name_without_echoing_it() -> None:
    with pytest.raises(ValueError) as info:
        OpenAIServerConfig(api_key_env=SECRET)
    assert SECRET not in str(info.value)
    assert "NAME of an environment variable" in str(info.value)


# --- SSE parsing --------------------------------------------------------------------------------


SSE_STREAM = (
    b": keep-alive comment\r\n\r\n"
    b'data: {"a": 1}\r\n\r\n'
    b'data: {"b":\ndata: "\xc3\xa9t\xc3\xa9"}\n\n'
    b"event: ping\ndata: x\r\r"
    b"data: [DONE]\n\n"
)
SSE_EVENTS = ['{"a": 1}', '{"b":\n"été"}', "x", "[DONE]"]


def test_sse_parser_whole_stream() -> None:
    assert SSEParser().feed(SSE_STREAM) == SSE_EVENTS


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 13])
def test_sse_parser_any_split_gives_the_same_events(size: int) -> None:
    parser = SSEParser()
    events: list[str] = []
    for i in range(0, len(SSE_STREAM), size):
        events += parser.feed(SSE_STREAM[i : i + size])
    assert events == SSE_EVENTS


def test_sse_parser_split_between_cr_and_lf() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: 1\r") == []
    assert parser.feed(b"\n\r") == ["1"]  # the \r\n is one line end, then a blank line
    assert parser.feed(b"\ndata: 2\n\n") == ["2"]


# --- fake server: order, fallbacks, routing header, error mapping ------------------------------


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def delta_event(content: str = "", reasoning: str = "", finish: str | None = None) -> bytes:
    delta: dict[str, Any] = {}
    if content:
        delta["content"] = content
    if reasoning:
        delta["reasoning"] = reasoning
    return sse({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class FakeServer:
    """An OpenAI-ish server on 127.0.0.1 whose chat handler a test chooses."""

    def __init__(self, chat: Handler, health_status: int = 200,
                 readiness_status: int | None = None) -> None:
        self.chat = chat
        self.health_status = health_status
        self.readiness_status = readiness_status  # None: no /readiness (like vllm serve)
        self.models = ["fake-model"]
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[Any] = []
        self.runner: web.AppRunner | None = None
        self.base = ""

    async def __aenter__(self) -> FakeServer:
        app = web.Application()
        app.router.add_get("/health", self._health)
        if self.readiness_status is not None:  # like vllm-router
            app.router.add_get("/readiness", self._readiness)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        self.runner = web.AppRunner(app, handler_cancellation=True)  # disconnect cancels
        await self.runner.setup()
        port = free_port()
        await web.TCPSite(self.runner, "127.0.0.1", port).start()
        self.base = f"http://127.0.0.1:{port}/v1"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.runner is not None
        await self.runner.cleanup()

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=self.health_status)

    async def _readiness(self, request: web.Request) -> web.Response:
        return web.Response(status=self.readiness_status or 404)

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list",
                                  "data": [{"id": m, "object": "model"} for m in self.models]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.bodies.append(await request.json())
        self.headers.append(request.headers.copy())  # case-insensitive
        return await self.chat(request)


async def stream_events(request: web.Request, events: list[bytes],
                        split: int = 0) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    data = b"".join(events)
    step = split or len(data)
    for i in range(0, len(data), step):
        await resp.write(data[i : i + step])
    await resp.write_eof()
    return resp


def good_chat(split: int = 0) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        return await stream_events(request, [
            sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
            delta_event(reasoning="hmm "),
            delta_event(reasoning="ok"),
            delta_event(content="A "),
            delta_event(content="cup", finish="stop"),
            sse({"choices": [], "usage": {"prompt_tokens": 42, "completion_tokens": 4,
                                          "prompt_tokens_details": {"cached_tokens": 32}}}),
            b"data: [DONE]\n\n",
        ], split)
    return handler


def status_chat(status: int, message: str) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": message, "code": status}}, status=status)
    return handler


def fake_cfg(*servers: FakeServer, **kwargs: Any) -> OpenAIServerConfig:
    kwargs.setdefault("health_period_s", 0.2)
    kwargs.setdefault("start_timeout_s", 10.0)
    kwargs.setdefault("warmup", False)
    return OpenAIServerConfig(url=servers[0].base,
                              fallback_urls=tuple(s.base for s in servers[1:]), **kwargs)


@pytest.mark.parametrize("split", [0, 1, 7])
def test_stream_splits_reasoning_text_usage_and_cached_tokens(split: int) -> None:
    async def body() -> None:
        async with FakeServer(good_chat(split)) as fake, engine_for(fake_cfg(fake)) as engine:
            chunks = await collect(engine, image_request())
            assert "".join(c.reasoning_delta for c in chunks) == "hmm ok"
            assert "".join(c.text_delta for c in chunks) == "A cup"
            last = chunks[-1]
            assert (last.finish_reason, last.prompt_tokens, last.cached_prompt_tokens,
                    last.output_tokens) == (FinishReason.STOP, 42, 32, 4)
            assert engine.model_name == "fake-model"
            sent = fake.bodies[-1]
            assert sent["model"] == "fake-model" and sent["stream"] is True
            assert sent["stream_options"] == {"include_usage": True}
            part = sent["messages"][0]["content"][0]
            assert part["type"] == "image_url"
            assert part["image_url"]["url"].startswith("data:image/jpeg;base64,/9j/")
    run(body())


def test_inline_reasoning_rewraps_think_tags() -> None:
    async def body() -> None:
        async with FakeServer(good_chat()) as fake, engine_for(
            fake_cfg(fake, reasoning_output="inline")
        ) as engine:
            chunks = await collect(engine, image_request())
            assert "".join(c.text_delta for c in chunks) == "<think>\nhmm ok\n</think>\n\nA cup"
            assert all(not c.reasoning_delta for c in chunks)
    run(body())


def test_request_body_sampling_schema_and_thinking_switch() -> None:
    async def body() -> None:
        async with FakeServer(good_chat()) as fake, engine_for(fake_cfg(fake)) as engine:
            sampling = Sampling(max_tokens=7, temperature=0.3, top_p=0.9, top_k=20,
                                presence_penalty=1.5, repetition_penalty=1.05, seed=3,
                                ignore_eos=True)
            await collect(engine, image_request(sampling=sampling, json_schema=SCHEMA))
            sent = fake.bodies[-1]
            for key, value in (("max_tokens", 7), ("temperature", 0.3), ("top_p", 0.9),
                               ("top_k", 20), ("presence_penalty", 1.5),
                               ("repetition_penalty", 1.05), ("seed", 3), ("ignore_eos", True)):
                assert sent[key] == value, key
            assert sent["structured_outputs"] == {"json": SCHEMA}
            assert "guided_json" not in sent and "response_format" not in sent
            assert sent["chat_template_kwargs"] == {"enable_thinking": False}
            # A prompt in the Cosmos-Reason reasoning format leaves thinking on.
            await collect(engine, image_request("odd\nid", text="Why?\n\n" + REASONING_FORMAT))
            assert fake.headers[-1]["X-Request-Id"] == "odd_id"
            assert "chat_template_kwargs" not in fake.bodies[-1]
            # No key configured: no Authorization header at all (none from OPENAI_API_KEY).
            assert "Authorization" not in fake.headers[-1]
        async with FakeServer(good_chat()) as fake, engine_for(
            fake_cfg(fake, structured_outputs_field="response_format")
        ) as engine:
            await collect(engine, image_request(json_schema=SCHEMA))
            rf = fake.bodies[-1]["response_format"]
            assert rf["type"] == "json_schema" and rf["json_schema"]["schema"] == SCHEMA
            assert "structured_outputs" not in fake.bodies[-1]
    run(body())


def test_image_part_count_must_match_images() -> None:
    async def body() -> None:
        async with FakeServer(good_chat()) as fake, engine_for(fake_cfg(fake)) as engine:
            with pytest.raises(BadRequestError, match="reference 1 image"):
                await collect(engine, image_request(images=()))
            assert fake.bodies == []
    run(body())


@pytest.mark.parametrize("status,message,error", [
    (400, "This model's maximum context length is 2048 tokens. However, ...", PromptTooLongError),
    (400, "temperature must be non-negative", BadRequestError),
    (422, "field required", BadRequestError),
])
def test_client_errors_map_to_codes_and_do_not_fail_over(
    status: int, message: str, error: type[CosmosReasonError]
) -> None:
    async def body() -> None:
        async with FakeServer(status_chat(status, message)) as a, \
                FakeServer(status_chat(status, message)) as b, \
                engine_for(fake_cfg(a, b)) as engine:
            with pytest.raises(error) as info:
                await collect(engine, image_request())
            assert message[:20] in str(info.value)
            assert len(a.bodies) + len(b.bodies) == 1  # the request itself is bad: no retry
    run(body())


def test_5xx_before_first_token_moves_to_the_fallback_and_marks_the_url_down() -> None:
    async def body() -> None:
        async with FakeServer(status_chat(502, "bad gateway")) as bad, \
                FakeServer(good_chat()) as good, \
                engine_for(fake_cfg(bad, good, health_period_s=60)) as engine:
            for _ in range(3):
                chunks = await collect(engine, image_request())
                assert "".join(c.text_delta for c in chunks) == "A cup"
            assert len(good.bodies) == 3
            assert len(bad.bodies) == 1  # tried once, then down until /health says up
            assert "bad gateway" in engine.health().detail
    run(body())


def test_busy_server_is_retried_with_jitter_before_any_fallback() -> None:
    calls = {"n": 0}

    async def busy_twice(request: web.Request) -> web.StreamResponse:
        calls["n"] += 1
        if calls["n"] <= 2:
            return web.json_response({"error": {"message": "busy", "code": 503}}, status=503,
                                     headers={"Retry-After": "0"})
        return await good_chat()(request)

    async def body() -> None:
        async with FakeServer(busy_twice) as primary, FakeServer(good_chat()) as fallback, \
                engine_for(fake_cfg(primary, fallback, health_period_s=60)) as engine:
            chunks = await collect(engine, image_request())
            assert "".join(c.text_delta for c in chunks) == "A cup"
            assert (len(primary.bodies), len(fallback.bodies)) == (3, 0)
        async with FakeServer(status_chat(429, "slow down")) as always, \
                engine_for(fake_cfg(always, busy_retries=2)) as engine:
            with pytest.raises(OverloadedError, match="slow down"):
                await collect(engine, image_request())
            assert len(always.bodies) == 3  # the first try and two retries, no more
    run(body())


def test_vllm_retryable_500_is_asked_again_on_the_same_url() -> None:
    # vLLM turns a retryable internal error (finish_reason "error", e.g. a multi-modal cache
    # miss under load) into HTTP 500, or into an error event in a stream already begun.
    calls = {"n": 0}

    async def fails_twice(request: web.Request) -> web.StreamResponse:
        calls["n"] += 1
        if calls["n"] == 1:
            return web.json_response({"error": {"message": "Multi-modal processor cache miss.",
                                                "code": 500}}, status=500)
        if calls["n"] == 2:
            return await stream_events(request, [sse({"error": {
                "message": "Multi-modal processor cache miss.", "code": 500}})], 0)
        return await good_chat()(request)

    async def body() -> None:
        async with FakeServer(fails_twice) as only, engine_for(fake_cfg(only)) as engine:
            chunks = await collect(engine, image_request())
            assert "".join(c.text_delta for c in chunks) == "A cup"
            assert len(only.bodies) == 3
        async with FakeServer(status_chat(500, "always broken")) as broken, \
                engine_for(fake_cfg(broken, busy_retries=1)) as engine:
            with pytest.raises(EngineError, match="always broken"):
                await collect(engine, image_request())
            assert len(broken.bodies) == 2  # the first try and one retry, then it gives up
    run(body())


def test_all_urls_failing_raise_with_every_reason() -> None:
    async def body() -> None:
        async with FakeServer(status_chat(500, "boom")) as a, \
                FakeServer(status_chat(502, "bad gateway")) as b, \
                engine_for(fake_cfg(a, b)) as engine:
            with pytest.raises((EngineUnavailableError, EngineError)) as info:
                await collect(engine, image_request())
            assert "boom" in str(info.value) and "bad gateway" in str(info.value)
    run(body())


def test_error_after_first_token_is_not_retried() -> None:
    async def broken(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(delta_event(content="A "))
        await resp.write(sse({"error": {"message": "engine died", "code": 500}}))
        return resp

    async def body() -> None:
        async with FakeServer(broken) as a, FakeServer(good_chat()) as b, \
                engine_for(fake_cfg(a, b)) as engine:
            got: list[str] = []
            with pytest.raises(EngineUnavailableError, match="engine died"):
                async for c in engine.stream(image_request()):
                    got.append(c.text_delta)
            assert got == ["A "] and b.bodies == []
    run(body())


async def wait_health(engine: OpenAIServerEngine, state: EngineState) -> None:
    async def reached() -> bool:  # the engine's own health loop (0.2 s period) notices
        return engine.health().state == state

    await async_wait_until(reached, NEVER_S, f"engine never {state.value}")


def test_primary_serves_while_healthy_fallback_while_not_and_primary_again_on_recovery() -> None:
    async def body() -> None:
        async with FakeServer(good_chat()) as primary, FakeServer(good_chat()) as fallback, \
                engine_for(fake_cfg(primary, fallback)) as engine:
            for _ in range(3):  # no balancing: everything goes to the primary
                await collect(engine, image_request())
            assert (len(primary.bodies), len(fallback.bodies)) == (3, 0)
            primary.health_status = 503
            await wait_health(engine, EngineState.DEGRADED)
            for _ in range(2):
                await collect(engine, image_request())
            assert (len(primary.bodies), len(fallback.bodies)) == (3, 2)
            primary.health_status = 200
            await wait_health(engine, EngineState.READY)
            await collect(engine, image_request())
            assert (len(primary.bodies), len(fallback.bodies)) == (4, 2)
    run(body())


def test_a_router_is_judged_by_readiness_a_server_by_health() -> None:
    async def body() -> None:
        # vllm-router answers /health 503 while any one backend is down; /readiness 200 while
        # one is up. Judged by /health, a working router would lose its requests.
        async with FakeServer(good_chat(), health_status=503, readiness_status=200) as router, \
                FakeServer(good_chat()) as onboard, \
                engine_for(fake_cfg(router, onboard)) as engine:
            assert engine.health().state == EngineState.READY
            await collect(engine, image_request())
            assert (len(router.bodies), len(onboard.bodies)) == (1, 0)
            router.readiness_status = 503  # no backend left behind the router
            await wait_health(engine, EngineState.DEGRADED)
            assert "GET /readiness returned HTTP 503" in engine.health().detail
            await collect(engine, image_request())
            assert (len(router.bodies), len(onboard.bodies)) == (1, 1)
    run(body())


def test_health_routes_closed_to_us_do_not_make_a_server_down() -> None:
    async def body() -> None:
        # A proxy answering 401 on /readiness and /health: reachable; its requests will say
        # what is wrong (an API key), not "down".
        async with FakeServer(status_chat(401, "Unauthorized"), health_status=401,
                              readiness_status=401) as proxy, \
                engine_for(fake_cfg(proxy)) as engine:
            assert engine.health().state == EngineState.READY
            with pytest.raises(EngineUnavailableError, match="API key rejected"):
                await collect(engine, image_request())
    run(body())


def test_a_rejected_api_key_is_a_health_problem_until_the_server_takes_a_request() -> None:
    async def body() -> None:
        # vllm serve --api-key guards /v1 only: /health stays up while every request gets 401.
        async with FakeServer(status_chat(401, "Unauthorized")) as server, \
                engine_for(fake_cfg(server, api_key_env="CR_TEST_KEY_UNSET")) as engine:
            assert engine.health().problems == ()
            with pytest.raises(EngineUnavailableError, match="API key rejected"):
                await collect(engine, image_request())
            health = engine.health()
            assert health.state == EngineState.READY
            [problem] = health.problems
            assert server.base in problem and "CR_TEST_KEY_UNSET" in problem
            server.chat = good_chat()  # the key fixed on the server's side
            await collect(engine, image_request())
            assert engine.health().problems == ()
    run(body())


def test_session_key_goes_in_the_routing_header_of_every_request() -> None:
    async def body() -> None:
        async with FakeServer(good_chat()) as fake, engine_for(fake_cfg(fake)) as engine:
            await collect(engine, image_request(session_key="/robot7/cosmos_reason/front"))
            await collect(engine, image_request())  # no key: no header
            assert fake.headers[0]["X-Session-ID"] == "/robot7/cosmos_reason/front"
            assert "X-Session-ID" not in fake.headers[1]
        async with FakeServer(good_chat()) as fake, \
                engine_for(fake_cfg(fake, session_header="X-User-ID")) as engine:
            await collect(engine, image_request(session_key="front"))
            assert fake.headers[0]["X-User-ID"] == "front"
            assert "X-Session-ID" not in fake.headers[0]
        async with FakeServer(good_chat()) as fake, \
                engine_for(fake_cfg(fake, session_header="")) as engine:
            await collect(engine, image_request(session_key="front"))
            assert "front" not in str(dict(fake.headers[0]))
        async with FakeServer(good_chat()) as fake:  # the start's warm-up, routed as the node's
            engine = OpenAIServerEngine(fake_cfg(fake, warmup=True))
            engine.route_warm_up_as("/robot7/cosmos_reason/front")
            try:
                await engine.start()
                assert fake.bodies[0]["max_tokens"] == 1  # the warm-up
                assert fake.headers[0]["X-Session-ID"] == "/robot7/cosmos_reason/front"
            finally:
                await engine.close()
    run(body())


def test_model_not_served_is_named_at_start_and_a_url_serving_it_is_used() -> None:
    async def body() -> None:
        async with FakeServer(good_chat()) as fake:
            engine = OpenAIServerEngine(fake_cfg(fake, model="cosmos-reason2-8b"))
            try:
                with pytest.raises(EngineUnavailableError) as info:
                    await engine.start()
                assert "does not serve model 'cosmos-reason2-8b' (engine.model)" in \
                    str(info.value) and "fake-model" in str(info.value)
            finally:
                await engine.close()
        async with FakeServer(good_chat()) as wrong, FakeServer(good_chat()) as right:
            wrong.models = ["another-model"]
            async with engine_for(fake_cfg(wrong, right, model="fake-model")) as engine:
                await collect(engine, image_request())
                assert (len(wrong.bodies), len(right.bodies)) == (0, 1)
                assert right.bodies[0]["model"] == "fake-model"
    run(body())


def test_stalled_stream_hits_read_timeout() -> None:
    released = asyncio.Event()  # never set while the engine reads: the stall has no end

    async def stall(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(delta_event(content="A"))
        await released.wait()
        return resp

    async def body() -> None:
        async with FakeServer(stall) as fake, \
                engine_for(fake_cfg(fake, read_timeout_s=0.5)) as engine:
            try:
                # The server never ends the stream: only the read timeout can end the request
                # (the outer 60 s means it never did).
                with pytest.raises(EngineUnavailableError, match="stalled"):
                    await asyncio.wait_for(collect(engine, image_request()), NEVER_S)
            finally:
                released.set()
    run(body())


# --- servers that ignore max_tokens ---------------------------------------------------------------


ENGINE_LOG = "cosmos_reason_ros.engines.openai_http"


class EndlessChat:
    """A server that ignores ``max_tokens`` and streams until the client goes away.

    ``kind``: ``text`` (one word per event, ~1000 events/s), ``reasoning`` (ten reasoning
    deltas, then text), ``big`` (5000 characters per event), ``usage`` (two characters per
    event but ``usage.completion_tokens`` growing by 5), ``line`` (one SSE line that never
    ends).
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.events = 0
        self.bytes = 0
        self.passed_bound_at: float | None = None  # when the first event past it was sent
        self.gone = asyncio.Event()  # the handler ended: the client disconnected

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        limit = output_token_limit((await request.json())["max_tokens"])
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            if self.kind == "line":
                await resp.write(b"data: ")
                while True:
                    await resp.write(b"x" * 4096)
                    self.bytes += 4096
                    await asyncio.sleep(0)
            while True:
                self.events += 1
                if self.kind == "big":
                    event = delta_event(content="x" * 5000)
                elif self.kind == "usage":
                    event = sse({"choices": [{"index": 0, "delta": {"content": "ab"}}],
                                 "usage": {"completion_tokens": 5 * self.events}})
                elif self.kind == "reasoning" and self.events <= 10:
                    event = delta_event(reasoning="hmm ")
                else:
                    event = delta_event(content="word ")
                if self.events == limit + 1:
                    self.passed_bound_at = time.monotonic()
                await resp.write(event)
                self.bytes += len(event)
                await asyncio.sleep(0.001)  # paces: ~1000 events/s, like a fast server
        finally:
            self.gone.set()


def overrun_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == ENGINE_LOG
            and r.levelno == logging.WARNING and "overran" in r.getMessage()]


def test_output_token_limit_is_max_tokens_plus_a_small_margin() -> None:
    assert [output_token_limit(n) for n in (1, 16, 64, 80, 1000)] == [9, 24, 72, 88, 1100]
    assert output_token_limit(0) == 9  # a nonsense request still has a bound


@pytest.mark.parametrize("kind", ["text", "reasoning", "big", "usage", "line"])
def test_server_ignoring_max_tokens_ends_with_length_and_a_disconnect(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=ENGINE_LOG)
    limit = output_token_limit(16)  # 24

    async def body() -> None:
        endless = EndlessChat(kind)
        async with FakeServer(endless) as fake, engine_for(fake_cfg(fake)) as engine:
            chunks = await asyncio.wait_for(collect(engine, image_request(max_tokens=16)), NEVER_S)
            ended_at = time.monotonic()
            # The server sees the client go away (vLLM aborts the request on a disconnect).
            await asyncio.wait_for(endless.gone.wait(), NEVER_S)
            last = chunks[-1]
            assert last.finish_reason is FinishReason.LENGTH
            assert all(c.finish_reason is None for c in chunks[:-1])
            text = "".join(c.text_delta for c in chunks)
            reasoning = "".join(c.reasoning_delta for c in chunks)
            if kind == "text":  # the partial answer comes back: exactly what the bound allows
                assert text == "word " * limit and last.output_tokens == limit
            elif kind == "reasoning":  # reasoning counts toward the same max_tokens
                assert reasoning == "hmm " * 10 and text == "word " * (limit - 10)
            elif kind == "big":  # one delta holding many tokens: cut at the character rule
                assert text == "x" * (limit * 32) and last.output_tokens >= limit
            elif kind == "usage":  # usage says 25 tokens after the fifth event
                assert text == "ab" * 4 and last.output_tokens == 25
            else:  # one endless line: bounded in bytes, nothing to return
                assert text == "" and endless.bytes < 4 * 1024 * 1024
            # How soon after the bound the request ends is a drill's figure
            # (test/drills/test_engine_timing.py); here, that it ends there.
            if endless.passed_bound_at is not None:
                print(f"\n{kind}: ended {(ended_at - endless.passed_bound_at) * 1000:.1f} ms "
                      f"after the server passed the bound")
            warnings = overrun_warnings(caplog)
            assert len(warnings) == 1 and fake.base in warnings[0], warnings
            # Not a failure of the server: it stays up and serves the next request.
            assert engine._servers[0].up is True
    run(body())


def test_output_right_at_the_limit_is_never_cut(caplog: pytest.LogCaptureFixture) -> None:
    """At the edge of every count (24 deltas, 24 x 32 characters, usage 24) nothing trips."""
    caplog.set_level(logging.WARNING, logger=ENGINE_LOG)
    limit = output_token_limit(16)

    async def edge(request: web.Request) -> web.StreamResponse:
        return await stream_events(request, [
            *(delta_event(content=f"{i:02d}" + "y" * 30) for i in range(limit - 1)),
            delta_event(content="z" * 32, finish="length"),
            sse({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": limit}}),
            b"data: [DONE]\n\n",
        ], split=5)

    async def body() -> None:
        async with FakeServer(edge) as fake, engine_for(fake_cfg(fake)) as engine:
            chunks = await collect(engine, image_request(max_tokens=16))
            text = "".join(c.text_delta for c in chunks)
            assert len(text) == limit * 32 and text.endswith("z" * 32)
            assert (chunks[-1].finish_reason, chunks[-1].output_tokens,
                    chunks[-1].prompt_tokens) == (FinishReason.LENGTH, limit, 9)

    run(body())
    assert overrun_warnings(caplog) == []


def test_warm_up_against_a_server_ignoring_max_tokens_finishes_promptly(
    caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=ENGINE_LOG)

    async def body() -> float:
        endless = EndlessChat("text")
        async with FakeServer(endless) as fake:
            engine = OpenAIServerEngine(fake_cfg(fake, warmup=True))
            try:
                t0 = time.monotonic()
                # Unbounded, the warm-up would read until request_timeout_s (600 s).
                await asyncio.wait_for(engine.start(), NEVER_S)
                took = time.monotonic() - t0
                await asyncio.wait_for(endless.gone.wait(), NEVER_S)
                assert fake.bodies[0]["max_tokens"] == 1
                # The client stopped after the 10th event (unbounded: tens of thousands).
                assert endless.events < output_token_limit(1) + 40
                assert engine.health().state == EngineState.READY
            finally:
                await engine.close()
        assert any("warm-up done" in r.getMessage() for r in caplog.records)
        assert len(overrun_warnings(caplog)) == 1
        return took

    took = run(body())
    print(f"\nstart-up with warm-up against an endless server: {took:.3f}s")


def test_error_body_that_never_ends_is_read_only_in_part() -> None:
    async def endless_error(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(status=400, headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        await resp.write(b'{"error": {"message": "temperature must be non-negative", "x": "')
        while True:
            await resp.write(b"y" * 4096)
            await asyncio.sleep(0)

    async def body() -> None:
        async with FakeServer(endless_error) as fake, engine_for(fake_cfg(fake)) as engine:
            with pytest.raises(BadRequestError, match="temperature must be"):
                # read_timeout_s (30 s) would end a full read; the capped read ends at once.
                await asyncio.wait_for(collect(engine, image_request()), 10)  # bound: not 30
    run(body())


# --- real vLLM server -----------------------------------------------------------------------------


@pytest.mark.engine
def test_prefilled_frame_is_served_from_the_server_prefix_cache(
    server: VllmServer, key_env: str, tiny_qwen3_vl: Path
) -> None:
    from cosmos_reason_ros.core import query
    from cosmos_reason_ros.core.models import detect_profile

    profile = detect_profile(str(tiny_qwen3_vl))
    spec = query.make_spec(profile, task="vqa", prompt="Is the cup full?", max_tokens=4)

    async def go() -> tuple[int | None, int | None]:
        async with engine_for(cfg(server.base)) as engine:
            fresh = query.prepare_image(profile, image(seed=41, h=480, w=640))
            control = await collect(engine, query.build_request("c", profile, spec, fresh))
            media = query.prepare_image(profile, image(seed=42, h=480, w=640))
            prefill = await collect(engine, query.build_prefill_request("p", profile, media))
            assert prefill[-1].finish_reason is not FinishReason.ERROR
            goal = await collect(engine, query.build_request("g", profile, spec, media))
            return control[-1].cached_prompt_tokens, goal[-1].cached_prompt_tokens

    control_cached, goal_cached = run(go())
    image_tokens = profile.visual_tokens(*query.input_size(profile, 640, 480))
    # Whole 32-token blocks of the shared prefix (system turn + image) come from the cache.
    assert goal_cached is not None and goal_cached >= image_tokens - 32, goal_cached
    assert (control_cached or 0) < goal_cached


@pytest.mark.engine
def test_streams_text_for_an_image_question(server: VllmServer, key_env: str) -> None:
    async def body() -> None:
        async with engine_for(cfg(server.base)) as engine:
            assert engine.model_name == "tiny"
            assert engine.health().state == EngineState.READY
            t0 = time.monotonic()
            chunks = await collect(engine, image_request(max_tokens=24))
            latency = time.monotonic() - t0
            text = "".join(c.text_delta for c in chunks)
            assert text and len(chunks) >= 3
            assert all(c.finish_reason is None for c in chunks[:-1])
            last = chunks[-1]
            assert last.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
            assert last.output_tokens <= 24
            if last.finish_reason == FinishReason.LENGTH:
                assert last.output_tokens == 24
            only_text = await collect(engine, text_request("What is in the image?"))
            # The image really reached the model: it costs prompt tokens.
            assert last.prompt_tokens is not None and only_text[-1].prompt_tokens is not None
            assert last.prompt_tokens > only_text[-1].prompt_tokens + 20
            elapsed = [c.elapsed_s for c in chunks]
            assert elapsed == sorted(elapsed)
            ttfts, totals = [], []
            for _ in range(5):  # figures for the report, not asserted
                t0 = time.monotonic()
                timed = await collect(engine, image_request(max_tokens=24))
                totals.append(time.monotonic() - t0)
                ttfts.append(next(c.elapsed_s for c in timed if c.text_delta))
            print(f"\nimage 320x240 + 24 tokens: first {latency * 1000:.0f} ms; median of 5: "
                  f"ttft {sorted(ttfts)[2] * 1000:.0f} ms, total {sorted(totals)[2] * 1000:.0f} ms")
    run(body())


@pytest.mark.engine
def test_reasoning_prompt_streams_reasoning_plain_prompt_streams_text(
    server: VllmServer, key_env: str
) -> None:
    async def body() -> None:
        async with engine_for(cfg(server.base)) as engine:
            # The qwen3 reasoning parser calls everything reasoning until </think> (which the
            # random model never writes) unless thinking is switched off for plain prompts.
            plain = await collect(engine, image_request(max_tokens=12))
            assert "".join(c.text_delta for c in plain)
            assert not "".join(c.reasoning_delta for c in plain)
            thinking = await collect(engine, image_request(text="Why?\n\n" + REASONING_FORMAT,
                                                           max_tokens=12))
            assert "".join(c.reasoning_delta for c in thinking)
    run(body())


def check_schema(value: Any) -> None:
    assert set(value) == {"label", "count", "tags"}
    assert isinstance(value["label"], str) and len(value["label"]) <= 12
    assert isinstance(value["count"], int) and 0 <= value["count"] <= 99
    assert isinstance(value["tags"], list) and len(value["tags"]) <= 3
    assert all(isinstance(t, str) and len(t) <= 6 for t in value["tags"])


@pytest.mark.engine
@pytest.mark.parametrize("field", ["structured_outputs", "response_format"])
def test_json_schema_yields_valid_json(server: VllmServer, key_env: str, field: str) -> None:
    async def body() -> None:
        async with engine_for(cfg(server.base, structured_outputs_field=field)) as engine:
            for seed in range(4):
                sampling = Sampling(max_tokens=200, temperature=1.0, seed=seed)
                chunks = await collect(engine, image_request(sampling=sampling,
                                                             json_schema=SCHEMA))
                assert chunks[-1].finish_reason == FinishReason.STOP
                check_schema(json.loads("".join(c.text_delta for c in chunks)))
    run(body())


@pytest.mark.engine
def test_video_clip_is_sent_as_mp4_and_reaches_the_model(server: VllmServer,
                                                         key_env: str) -> None:
    frames = tuple(image(i, 96, 128) for i in range(8))
    video = Video(frames, tuple(i / 4 for i in range(8)), 4.0)
    request = ChatRequest(
        request_id="clip",
        messages=(Message("user", (ContentPart("video"), ContentPart("text", "What happens?"))),),
        sampling=Sampling(max_tokens=8, seed=1),
        video=video,
    )

    async def body() -> None:
        async with engine_for(cfg(server.base)) as engine:
            chunks = await collect(engine, request)
            without = await collect(engine, text_request("What happens?"))
            assert chunks[-1].finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
            assert chunks[-1].prompt_tokens is not None and without[-1].prompt_tokens
            assert chunks[-1].prompt_tokens > without[-1].prompt_tokens + 20
            assert engine._encoder.mp4_ok  # sent as a video, not as the frames fallback
    run(body())


@pytest.mark.engine
@pytest.mark.parametrize("how", ["aclose", "task_cancel", "abort"])
def test_cancel_stops_the_request_on_the_server(server: VllmServer, key_env: str,
                                                how: str) -> None:
    async def body() -> None:
        async with engine_for(cfg(server.base)) as engine:
            await wait_idle(server.root, 30)
            tokens_before = await generated_tokens(server.root)
            request = long_request()
            received: list[Chunk] = []
            gen = engine.stream(request)
            t_start = time.monotonic()
            if how == "aclose":
                async for c in gen:
                    received.append(c)
                    if len(received) == 30:
                        break
                task = None
            else:
                first = asyncio.Event()

                async def consume() -> None:
                    async for c in gen:
                        received.append(c)
                        if len(received) == 30:
                            first.set()

                task = asyncio.create_task(consume())
                await asyncio.wait_for(first.wait(), NEVER_S)
            rate = len(received) / (time.monotonic() - t_start)  # tokens/s, prefill included
            assert await running_requests(server.root) == 1
            if how == "aclose":
                await gen.aclose()
            elif how == "task_cancel":
                assert task is not None
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            else:
                assert task is not None
                await engine.abort(request.request_id)
                await asyncio.wait_for(task, NEVER_S)
                assert received[-1].finish_reason == FinishReason.CANCELLED
            idle_after = await wait_idle(server.root, 60)
            remaining = (1800 - len(received)) / rate  # how long the request had left
            print(f"\n{how}: server idle {idle_after:.2f}s after cancel "
                  f"(request had ~{remaining:.1f}s left)")
            # The server stopped generating: far fewer than the request's 1800 tokens were
            # made (a request left running would reach all 1800: ignore_eos).
            made = await generated_tokens(server.root) - tokens_before
            print(f"{how}: {made:.0f} of 1800 tokens generated")
            assert made < 0.8 * 1800
            assert engine.health().running_requests == 0
    run(body())


@pytest.mark.engine
def test_primary_down_the_fallback_serves(server: VllmServer, key_env: str) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"

    async def body() -> None:
        async with engine_for(cfg(dead, server.base)) as engine:
            health = engine.health()
            assert health.state == EngineState.DEGRADED and dead in health.detail
            for _ in range(3):
                chunks = await collect(engine, image_request(max_tokens=4))
                assert chunks[-1].finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
            # (the warm-up request counts too)
            assert engine._servers[0].served == 0 and engine._servers[1].served >= 3
    run(body())


@pytest.mark.engine
def test_unprobed_dead_primary_moves_on_at_connection_refused(server: VllmServer,
                                                              key_env: str) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"

    async def body() -> None:
        engine = OpenAIServerEngine(cfg(dead, server.base, model="tiny", health_period_s=60))
        try:
            # No start(): the first request races the first health probe, so the dead
            # primary may still be "unknown" and be tried; it must move on either way.
            chunks = await collect(engine, image_request(max_tokens=4))
            assert chunks[-1].finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
            assert engine._servers[0].up is False
        finally:
            await engine.close()
    run(body())


def test_all_urls_down_fails_fast() -> None:
    dead = [f"http://127.0.0.1:{free_port()}/v1" for _ in range(2)]

    async def body() -> None:
        engine = OpenAIServerEngine(cfg(*dead, start_timeout_s=1.0))
        try:
            with pytest.raises(EngineUnavailableError, match="no URL became healthy"):
                await engine.start()
            assert engine.health().state == EngineState.UNAVAILABLE
            # "no healthy URL" is the error of the path that tries no server at all: no
            # waiting on a dead server's connect timeout.
            with pytest.raises(EngineUnavailableError, match="no healthy URL") as info:
                await collect(engine, image_request())
            assert all(d in str(info.value) for d in dead)
        finally:
            await engine.close()
        assert engine.health().state == EngineState.CLOSED
    run(body())


@pytest.mark.engine
def test_api_key_never_appears_in_logs_reprs_or_errors(
    server: VllmServer, key_env: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    dead = f"http://127.0.0.1:{free_port()}/v1"
    errors: list[str] = []

    async def body() -> None:
        config = cfg(dead, server.base)
        async with engine_for(config) as engine:
            await collect(engine, image_request(max_tokens=4))
            errors.extend([repr(config), str(config), repr(engine), str(engine.health())])
            for bad in (text_request("x " * 3000), text_request(temperature=-1.0)):
                with pytest.raises(CosmosReasonError) as info:
                    await collect(engine, bad)
                errors.append(str(info.value))
        async with engine_for(cfg(dead, start_timeout_s=0.5), start=False) as engine:
            with pytest.raises(EngineUnavailableError) as info:
                await engine.start()
            errors.append(str(info.value))

    run(body())
    assert any("maximum context length" in e for e in errors)  # the errors were real ones
    assert len(caplog.records) > 3
    for text in [caplog.text, *errors, *(str(r.args) for r in caplog.records)]:
        assert SECRET not in text


@pytest.mark.engine
def test_missing_or_wrong_key_is_a_clear_engine_unavailable_error(
    server: VllmServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrong = f"sk-wrong-{uuid.uuid4().hex}"
    monkeypatch.setenv(KEY_ENV, wrong)

    async def body() -> None:
        # The model name comes from GET /v1/models, which needs the key too.
        engine = OpenAIServerEngine(cfg(server.base))
        try:
            with pytest.raises(EngineUnavailableError) as info:
                await engine.start()
            assert "API key rejected" in str(info.value) and KEY_ENV in str(info.value)
            assert wrong not in str(info.value)
        finally:
            await engine.close()
        async with engine_for(cfg(server.base, model="tiny", api_key_env=""),
                              start=False) as engine:
            with pytest.raises(EngineUnavailableError, match="HTTP 401.*api_key_env"):
                await collect(engine, image_request(max_tokens=2))

    run(body())


@pytest.mark.engine
def test_server_up_late_is_used_then_sigkill_mid_stream_is_unavailable(
    tiny_qwen3_vl: Path,
) -> None:
    """One server start serves both behaviours (each start costs ~1 min on 2 cores)."""
    port = free_port()
    base = f"http://127.0.0.1:{port}/v1"
    holder: dict[str, VllmServer] = {}

    async def body() -> None:
        engine = OpenAIServerEngine(cfg(base, api_key_env="", start_timeout_s=1.0,
                                        read_timeout_s=600.0))
        try:
            with pytest.raises(EngineUnavailableError):
                await engine.start()  # nothing listens yet
            with pytest.raises(EngineUnavailableError):
                await collect(engine, image_request())
            srv = holder["srv"] = VllmServer(tiny_qwen3_vl, port)
            startup = await asyncio.to_thread(srv.wait_healthy)
            print(f"\nsecond vllm server healthy after {startup:.1f}s")
            await wait_health(engine, EngineState.READY)  # its own health loop notices
            chunks = await collect(engine, image_request(max_tokens=4))
            assert chunks[-1].finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
            assert engine.model_name == "tiny"

            received = 0
            t_kill = 0.0
            with pytest.raises(EngineUnavailableError) as info:
                async for _ in engine.stream(long_request()):
                    received += 1
                    if received == 20:
                        t_kill = time.monotonic()
                        srv.kill(signal.SIGKILL)
            print(f"SIGKILL mid-stream -> {type(info.value).__name__} after "
                  f"{time.monotonic() - t_kill:.2f}s: {info.value}")
            # Noticed as the connection's loss, not after read_timeout_s of silence
            # (600 s here: a test that waited for it would time out instead).
            assert received >= 20 and "connection lost mid-stream" in str(info.value)
            await wait_health(engine, EngineState.UNAVAILABLE)  # the health loop notices
        finally:
            await engine.close()

    try:
        run(body())
    finally:
        if "srv" in holder:
            holder["srv"].stop()
