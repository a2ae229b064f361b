"""Side by side: HTTP clients for the openai engine (the openai SDK or our aiohttp).

    python scripts/bench_http_client.py [--server http://127.0.0.1:8000/v1] [--old-rev 5670373]

1. Bare clients against a local server: reading 256 one-token deltas, and one 1-token
   request carrying a 320x240 JPEG (the per-request cost): the SDK's typed
   ``chat.completions.create``, its untyped ``post``, httpx2 (the SDK's transport) and aiohttp.
2. This engine and an older one (``--old-rev``, loaded from git) reading the
   same 256 deltas, alternating, and with ``--server`` (a ``vllm serve`` of the tiny model,
   served as "tiny"): TTFT and total time of a 320x240 image question, 24 and 128 tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import httpx2
import numpy as np
import openai
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cosmos_reason_ros.bench.processes import free_port  # noqa: E402
from cosmos_reason_ros.core.imaging import encode_jpeg  # noqa: E402
from cosmos_reason_ros.core.types import ChatRequest, ContentPart, Message, Sampling  # noqa: E402
from cosmos_reason_ros.engines.openai_http import (  # noqa: E402
    OpenAIServerConfig,
    OpenAIServerEngine,
)


def _old_engine_module(rev: str):
    source = subprocess.run(["git", "show", f"{rev}:cosmos_reason_ros/engines/openai_http.py"],
                            cwd=ROOT, check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "old_openai_http.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("old_openai_http", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_openai_http"] = module
    spec.loader.exec_module(module)
    return module


def _request(max_tokens: int, seed: int = 0) -> ChatRequest:
    image = np.random.default_rng(seed).integers(0, 256, (240, 320, 3), dtype=np.uint8)
    return ChatRequest(uuid.uuid4().hex, (Message("user", (
        ContentPart("image"), ContentPart("text", "What is in the image?"))),),
        Sampling(max_tokens=max_tokens, seed=1, temperature=0.0), (image,))


def _sse(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _chunk(content: str, finish: str | None) -> dict:
    return {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": {"content": content, "reasoning": None},
                         "logprobs": None, "finish_reason": finish}]}


async def _fake_chat(req: web.Request) -> web.StreamResponse:
    n = (await req.json())["max_tokens"]
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(req)
    for i in range(n):
        await resp.write(_sse(_chunk("tok ", "length" if i == n - 1 else None)))
    await resp.write(_sse({**_chunk("", None), "choices": [],
                          "usage": {"prompt_tokens": 10, "completion_tokens": n}}))
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def _ok(_req: web.Request) -> web.Response:
    return web.Response()


async def _models(_req: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})


def _q(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(p / 100 * (len(values) - 1)))]


async def _timed(engine, r: ChatRequest) -> tuple[float, float]:
    t0 = time.perf_counter()
    first = None
    async for c in engine.stream(r):
        if c.text_delta and first is None:
            first = time.perf_counter() - t0
    return first or 0.0, time.perf_counter() - t0


async def _engines_side_by_side(old, base: str, model: str, rounds: int, max_tokens: int,
                               label: str) -> None:
    new = OpenAIServerEngine(OpenAIServerConfig(url=base, model=model, warmup=False))
    ours = old.OpenAIServerEngine(old.OpenAIServerConfig(endpoints=(base,), model=model,
                                                         warmup=False))
    engines = {"this engine": new, "before #22": ours}
    for e in engines.values():
        await e.start()
        for _ in range(3):
            await _timed(e, _request(max_tokens))
    results: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in engines}
    for i in range(rounds):
        for name in (list(engines) if i % 2 == 0 else list(engines)[::-1]):
            first, total = await _timed(engines[name], _request(max_tokens, i))
            results[name][0].append(first)
            results[name][1].append(total)
    for e in engines.values():
        await e.close()
    for name, (first, total) in results.items():
        print(f"{label:26s} {name:12s} ttft p50 {statistics.median(first) * 1e3:7.1f} ms "
              f"p95 {_q(first, 95) * 1e3:7.1f} | total p50 {statistics.median(total) * 1e3:7.1f}"
              f" ms p95 {_q(total, 95) * 1e3:7.1f} (n={rounds})")


def _sdk_streams(client: Any, body: dict[str, Any]) -> tuple[Callable[[], Awaitable[None]],
                                                             Callable[[], Awaitable[None]]]:
    """Stream ``body`` to the end through the SDK: typed ``create()``, untyped ``post()``."""
    async def typed() -> None:
        async for _ in await client.chat.completions.create(**body):
            pass

    async def untyped() -> None:
        async for _ in await client.post("/chat/completions", body=body, cast_to=object,
                                         stream=True, stream_cls=openai.AsyncStream[object]):
            pass
    return typed, untyped


async def _bare_clients(base: str, rounds: int) -> None:
    client = openai.AsyncOpenAI(base_url=base, api_key="unused", max_retries=0)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 256,
            "stream": True}

    typed, untyped = _sdk_streams(client, body)

    async with aiohttp.ClientSession() as session:
        async def plain() -> None:
            async with session.post(base + "/chat/completions", json=body) as r:
                async for line in r.content:
                    if line.startswith(b"data: {"):
                        json.loads(line[6:])

        for name, run in (("SDK typed create()", typed), ("SDK untyped post()", untyped),
                          ("aiohttp + json", plain)):
            await _report(f"bare client, 256 deltas     {name}", run, rounds)
        # One request with an image and one token back: what each client costs per request.
        image = _request(1).images[0]
        url = "data:image/jpeg;base64," + base64.b64encode(encode_jpeg(image, 90)).decode()
        one = {**body, "max_tokens": 1, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "hi"}]}]}
        payload = json.dumps(one).encode()
        transport = httpx2.AsyncClient(timeout=None)

        one_typed, one_untyped = _sdk_streams(client, one)

        async def one_httpx2() -> None:
            async with transport.stream("POST", base + "/chat/completions", json=one) as r:
                async for _ in r.aiter_lines():
                    pass

        async def one_aiohttp() -> None:
            async with session.post(base + "/chat/completions", data=payload,
                                    headers={"Content-Type": "application/json"}) as r:
                async for _ in r.content:
                    pass

        for name, run in (("SDK typed create()", one_typed), ("SDK untyped post()", one_untyped),
                          ("httpx2 (SDK transport)", one_httpx2), ("aiohttp", one_aiohttp)):
            await _report(f"bare client, image request  {name}", run, rounds * 5)
        await transport.aclose()
    await client.close()


async def _report(label: str, run, rounds: int) -> None:
    for _ in range(3):
        await run()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        await run()
        times.append(time.perf_counter() - t0)
    print(f"{label:54s} p50 {statistics.median(times) * 1e3:6.2f} ms (n={rounds})")


async def main() -> None:
    """Run the comparisons and print one line per client."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", default="", help="a vllm serve of the tiny model (/v1)")
    parser.add_argument("--old-rev", default="5670373", help="git revision of the old engine")
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    old = _old_engine_module(args.old_rev)
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _fake_chat)
    app.router.add_get("/health", _ok)
    app.router.add_get("/v1/models", _models)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    base = f"http://127.0.0.1:{port}/v1"
    await _bare_clients(base, args.rounds // 2)
    await _engines_side_by_side(old, base, "", args.rounds, 256, "local server, 256 deltas")
    await runner.cleanup()
    if args.server:
        for tokens in (24, 128):
            await _engines_side_by_side(old, args.server, "tiny", args.rounds, tokens,
                                       f"vllm tiny, {tokens} tokens")


if __name__ == "__main__":
    asyncio.run(main())
