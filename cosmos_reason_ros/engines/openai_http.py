"""Engine for OpenAI-compatible servers (``vllm serve``), with health checks and failover.

One :class:`OpenAIServerEngine` talks to one or more base URLs (``http://host:8000/v1``) that
serve the same model. A background task probes ``GET /health`` on every endpoint; requests go
to the least busy healthy endpoint and move to the next one when an endpoint fails *before*
the first token (connection refused, connect timeout, HTTP 5xx/429/401/404). After the first
token nothing is retried: a broken stream raises :class:`EngineUnavailableError`.

Request fields this module sends, as verified against vLLM 0.32.0's server (see
``test/engines/test_openai_http.py``):

- Images: ``image_url`` parts with ``data:image/jpeg;base64,...`` URLs.
- Video: a ``video_url`` part with a ``data:video/mp4;base64,...`` URL (the clip written with
  OpenCV's ``mp4v`` writer at the clip's fps; the server samples frames itself). Where the
  local OpenCV cannot write mp4, or with ``video_mode="frames"``, the clip goes as one image
  per frame, each preceded by its timestamp in text (models then see images, not a video).
- Structured outputs: ``structured_outputs: {"json": schema}`` (vLLM's own field, the
  default). ``response_format: {"type": "json_schema", ...}`` is honoured too and is the
  portable choice for other OpenAI-compatible servers (``structured_outputs_field``).
  The legacy ``guided_json`` is silently ignored by vLLM >= 0.12 and is never sent.
- Reasoning: with ``--reasoning-parser qwen3`` the server splits ``<think>`` blocks into
  ``delta.reasoning`` (older servers: ``reasoning_content``); those arrive as
  ``Chunk.reasoning_delta`` (or, with ``reasoning_output="inline"``, re-wrapped in ``<think>``
  tags inside ``text_delta``). That parser treats *all* output as reasoning until
  ``</think>`` unless the request says ``chat_template_kwargs: {"enable_thinking": false}``,
  and it holds structured outputs back until the reasoning ends; so with ``thinking="auto"``
  the engine sends ``enable_thinking: false`` for requests that do not ask for reasoning
  (``request.reasoning`` if the request type has it, else: no ``<think>`` in any prompt text).
- Sampling: ``temperature``, ``top_p``, ``max_tokens``, ``seed`` and vLLM's extra top-level
  parameters ``top_k``, ``presence_penalty``, ``repetition_penalty``, ``ignore_eos``.
- Bounds: whatever a server streams, reading stops a little past the request's
  ``max_tokens`` (``output_token_limit``; reasoning counts too), judged by content deltas,
  ``usage`` and characters, and the whole body is bounded in bytes. The stream is then
  closed (the server sees a disconnect), the request ends with ``LENGTH`` and one warning
  names the endpoint. The warm-up request is bounded the same way.

The API key is read from the environment variable *named* by ``api_key_env`` at each request;
the key itself never enters the config, a log line, a repr or an error message.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import re
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

import aiohttp
import numpy as np

from cosmos_reason_ros.core.imaging import encode_jpeg as _encode_jpeg
from cosmos_reason_ros.core.types import (
    BadRequestError,
    ChatRequest,
    Chunk,
    ContentPart,
    CosmosReasonError,
    DeadlineExceededError,
    EngineError,
    EngineUnavailableError,
    FinishReason,
    Message,
    OverloadedError,
    PromptTooLongError,
    Sampling,
    Video,
)
from cosmos_reason_ros.engines.base import Engine, EngineHealth, EngineState

_LOG = logging.getLogger(__name__)
_T = TypeVar("_T")

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TOO_LONG = re.compile(
    r"maximum context length|longer than|context length|too long|exceeds the model",
    re.IGNORECASE,
)
_FINISH = {
    "stop": FinishReason.STOP,
    "eos": FinishReason.STOP,
    "tool_calls": FinishReason.STOP,
    "function_call": FinishReason.STOP,
    "length": FinishReason.LENGTH,
    "abort": FinishReason.CANCELLED,
    "cancelled": FinishReason.CANCELLED,
}
_THINKING = ("auto", "on", "off", "server")
_REASONING_OUTPUT = ("split", "inline")
_STRUCTURED_FIELDS = ("structured_outputs", "response_format")
_VIDEO_MODES = ("mp4", "frames")
_WARMUP_SIZE = 64  # px; a multiple of every Qwen-VL patch unit (28 and 32)
_EOL = re.compile(rb"\r\n|\r|\n")
_ERROR_BODY_BYTES = 64 * 1024  # enough for any error message; the rest is not read

# A server that ignores max_tokens (a proxy, another implementation, ignore_eos set by
# mistake) must not make an answer, a goal or the start-up unbounded: reading stops a little
# past what the request allows (see ``output_token_limit``). Three counts, each a lower bound
# on the tokens a server has sent, so a server that keeps to max_tokens never trips them:
# - content deltas: a token-streaming server (vLLM) sends at least one token per delta;
# - ``usage.completion_tokens``, when a server reports it mid-stream;
# - characters / _MAX_CHARS_PER_TOKEN, for servers that batch many tokens into one delta.
#   Answers average ~4 characters per token (English), ~3 (JSON, code); only text made of
#   nothing but the longest whitespace or punctuation tokens averages more than 32.
_MAX_CHARS_PER_TOKEN = 32
# Everything else a server sends (SSE framing, the JSON around each delta, usage, comments,
# one line that never ends) is bounded in bytes: vLLM's event for one token is ~250-400 bytes.
_MAX_BYTES_PER_TOKEN = 4096
_BYTES_SLACK = 64 * 1024


@dataclass(frozen=True)
class OpenAIServerConfig:
    """Where the servers are and how to talk to them; validated on construction.

    ``endpoints`` are base URLs ending in ``/v1``; health is probed at the server root
    (``/health``). ``model`` empty means: ask the first healthy server (``GET /v1/models``).
    ``api_key_env`` is the *name* of an environment variable holding the key (empty: no key).
    ``read_timeout_s`` is the longest gap allowed between stream chunks once generation has
    begun; ``first_token_timeout_s`` bounds queueing plus prefill; ``request_timeout_s``
    bounds the whole request. ``max_in_flight`` is per endpoint; when every healthy endpoint
    is full, requests fail at once with ``OverloadedError``.
    """

    endpoints: tuple[str, ...] = ("http://127.0.0.1:8000/v1",)
    model: str = ""
    api_key_env: str = ""
    connect_timeout_s: float = 3.0
    read_timeout_s: float = 30.0
    first_token_timeout_s: float = 120.0
    request_timeout_s: float = 600.0
    start_timeout_s: float = 60.0
    health_period_s: float = 2.0
    health_timeout_s: float = 2.0
    max_in_flight: int = 32
    jpeg_quality: int = 90
    thinking: str = "auto"  # auto | on | off | server (send nothing)
    reasoning_output: str = "split"  # split: Chunk.reasoning_delta; inline: <think> in text
    structured_outputs_field: str = "structured_outputs"  # or "response_format"
    video_mode: str = "mp4"  # mp4: one video_url; frames: timestamped images
    warmup: bool = True

    def __post_init__(self) -> None:
        """Normalise ``endpoints`` to a tuple and check every field."""
        eps = self.endpoints
        if isinstance(eps, str):
            eps = (eps,)
        eps = tuple(str(e).rstrip("/") for e in eps)
        object.__setattr__(self, "endpoints", eps)
        if not eps:
            raise ValueError("endpoints is empty; expected at least one base URL like "
                             "'http://127.0.0.1:8000/v1'")
        for e in eps:
            if not e.startswith(("http://", "https://")):
                raise ValueError(f"endpoints entry {e!r} is not an http(s) URL; expected "
                                 "a base URL like 'http://127.0.0.1:8000/v1'")
        if len(set(eps)) != len(eps):
            raise ValueError(f"endpoints={list(eps)} lists an endpoint twice")
        if self.api_key_env and not _ENV_NAME.match(self.api_key_env):
            # Never echo the value: a user may have pasted the key itself here.
            raise ValueError("api_key_env must be the NAME of an environment variable "
                             "(letters, digits, underscore), not the key itself")
        for name in ("connect_timeout_s", "read_timeout_s", "first_token_timeout_s",
                     "request_timeout_s", "start_timeout_s", "health_period_s",
                     "health_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name}={value!r}; expected a number > 0")
        if not isinstance(self.max_in_flight, int) or self.max_in_flight < 1:
            raise ValueError(f"max_in_flight={self.max_in_flight!r}; expected an integer >= 1")
        if not isinstance(self.jpeg_quality, int) or not 1 <= self.jpeg_quality <= 100:
            raise ValueError(f"jpeg_quality={self.jpeg_quality!r}; expected 1..100")
        for name, allowed in (("thinking", _THINKING), ("reasoning_output", _REASONING_OUTPUT),
                              ("structured_outputs_field", _STRUCTURED_FIELDS),
                              ("video_mode", _VIDEO_MODES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}={getattr(self, name)!r}; expected one of {allowed}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OpenAIServerConfig:
        """Build from a plain mapping (parameters, YAML); unknown keys are an error."""
        allowed = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(allowed))
        if unknown:
            raise ValueError(f"unknown OpenAIServerConfig key(s) {unknown}; "
                             f"allowed keys: {allowed}")
        kwargs = dict(data)
        if "endpoints" in kwargs and not isinstance(kwargs["endpoints"], str):
            kwargs["endpoints"] = tuple(kwargs["endpoints"])
        return cls(**kwargs)


# --- server-sent events -----------------------------------------------------------------------


class SSEParser:
    r"""Incremental ``text/event-stream`` parser: feed bytes in any split, get event data.

    Lines may end in ``\n``, ``\r\n`` or ``\r`` and may be cut anywhere (also inside a
    UTF-8 sequence); several ``data:`` lines of one event are joined with ``\n``; comments
    (``:``) and other fields are ignored.
    """

    def __init__(self) -> None:
        """Start with an empty buffer."""
        self._partial: list[bytes] = []  # the current line, not yet ended
        self._data: list[str] = []
        self._pending_cr = False

    def feed(self, raw: bytes) -> list[str]:
        """Add bytes; return the data of every event completed by them, in order."""
        if self._pending_cr and raw.startswith(b"\n"):
            raw = raw[1:]  # the \n of a \r\n split across two reads
        self._pending_cr = False
        events: list[str] = []
        start = 0
        # Only the new bytes are scanned (a C-level search), so a long line that arrives in
        # many reads costs linear time, not a rescan of everything buffered per read.
        for end in _EOL.finditer(raw):
            if end.group() == b"\r" and end.end() == len(raw):
                self._pending_cr = True
            line = raw[start : end.start()]
            if self._partial:
                line = b"".join((*self._partial, line))
                self._partial = []
            self._line(line.decode("utf-8", errors="replace"), events)
            start = end.end()
        if start < len(raw):
            self._partial.append(raw[start:])
        return events

    def _line(self, line: str, events: list[str]) -> None:
        if not line:
            if self._data:
                events.append("\n".join(self._data))
                self._data = []
            return
        if line.startswith(":"):
            return
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)


# --- endpoints ----------------------------------------------------------------------------------


@dataclass
class _Endpoint:
    """Mutable state of one server, only touched on the engine's loop."""

    base: str  # .../v1
    root: str  # server root, for /health
    index: int
    up: bool | None = None  # None: not probed yet
    in_flight: int = 0
    last_error: str = ""
    served: int = 0


class _Failover(Exception):
    """The endpoint failed before the first token; the next endpoint may be tried."""

    def __init__(self, error: CosmosReasonError, mark_down: bool) -> None:
        super().__init__(error.message)
        self.error = error
        self.mark_down = mark_down


@dataclass
class _Active:
    """A request in flight, so that ``abort`` can close its HTTP response."""

    response: aiohttp.ClientResponse | None = None
    cancelled: bool = False


def output_token_limit(max_tokens: int) -> int:
    """Return the most output tokens read for a request asking for ``max_tokens``.

    The margin (8 tokens or 10 %, whichever is more) absorbs servers that count a token or
    two differently (a stop token, a detokenizer flush); beyond it a server is overrunning.
    """
    asked = max(1, int(max_tokens))
    return asked + max(8, -(-asked // 10))


@dataclass
class _OutputBound:
    """What a request allows a server to send, and how much of it has arrived."""

    max_tokens: int
    deltas: int = 0  # content or reasoning deltas passed on
    chars: int = 0  # their characters
    usage_tokens: int = 0  # the largest usage.completion_tokens seen
    bytes_read: int = 0  # everything read from the response body
    limit: int = field(init=False)  # tokens
    max_chars: int = field(init=False)
    max_bytes: int = field(init=False)

    def __post_init__(self) -> None:
        """Derive the limits once."""
        self.limit = output_token_limit(self.max_tokens)
        self.max_chars = self.limit * _MAX_CHARS_PER_TOKEN
        self.max_bytes = _BYTES_SLACK + self.limit * _MAX_BYTES_PER_TOKEN

    def tokens(self) -> int:
        """Return a lower bound on the output tokens read so far."""
        return max(self.deltas, self.usage_tokens, -(-self.chars // _MAX_CHARS_PER_TOKEN))


def _server_root(base: str) -> str:
    return base[: -len("/v1")] if base.endswith("/v1") else base


def _error_text(body: str, limit: int = 300) -> str:
    """Extract the server's error message from a JSON error body (or raw text), shortened."""
    message = body
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        parsed = json.loads(body)
        err = parsed.get("error", parsed) if isinstance(parsed, dict) else parsed
        if isinstance(err, dict):
            message = str(err.get("message") or err)
        elif isinstance(err, str):
            message = err
    message = " ".join(message.split())
    return message[:limit] + ("..." if len(message) > limit else "")


async def _within(awaitable: Awaitable[_T], timeout_s: float) -> _T:
    """Await with a timeout (raises ``asyncio.TimeoutError``) that never eats a cancel.

    ``asyncio.wait_for`` on Python 3.10/3.11 may return the result and swallow a concurrent
    ``cancel()`` when both happen at once; a lost cancel would leave a stream running on the
    server. ``asyncio.wait`` always re-raises the cancel. A result produced while the caller
    is being cancelled (an HTTP response) is closed.
    """
    task = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait((task,), timeout=max(0.0, timeout_s))
    except BaseException:
        task.cancel()
        if task.done() and not task.cancelled() and task.exception() is None:
            close = getattr(task.result(), "close", None)
            if callable(close):
                close()
        raise
    if not done:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise asyncio.TimeoutError
    return task.result()


async def _read_capped(resp: aiohttp.ClientResponse, limit: int) -> str:
    """Read at most ``limit`` bytes of a body (an error page need not be read whole)."""
    data = b""
    while len(data) < limit:
        part = await resp.content.read(limit - len(data))
        if not part:
            break
        data += part
    return data.decode("utf-8", errors="replace")


def _data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode("ascii")


def _encode_mp4(video: Video) -> bytes | None:
    """Write the clip as mp4 (OpenCV ``mp4v``); ``None`` where this OpenCV cannot."""
    import cv2

    if not video.frames:
        raise BadRequestError("video has no frames; expected at least one")
    h, w = video.frames[0].shape[:2]
    fps = float(video.fps) if video.fps and video.fps > 0 else 4.0
    fd, path = tempfile.mkstemp(suffix=".mp4", prefix="cosmos_reason_clip_")
    os.close(fd)
    try:
        writer = cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*"mp4v"), fps, (w, h))
        if not writer.isOpened():
            return None
        try:
            for i, frame in enumerate(video.frames):
                if frame.shape[:2] != (h, w) or frame.dtype != np.uint8:
                    raise BadRequestError(
                        f"video.frames[{i}] shape={frame.shape} dtype={frame.dtype}; expected "
                        f"{h}x{w}x3 uint8 like the first frame"
                    )
                writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
        finally:
            writer.release()
        with open(path, "rb") as f:
            data = f.read()
        return data or None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)



# --- the engine ---------------------------------------------------------------------------------


class OpenAIServerEngine(Engine):
    """Streams chat completions from one or more OpenAI-compatible servers (``vllm serve``).

    ``start()`` waits (up to ``start_timeout_s``) for a healthy endpoint, learns the model
    name and warms every healthy endpoint up with a tiny image request. If no endpoint comes
    up it raises ``EngineUnavailableError`` but stays usable: health probing goes on and
    requests succeed as soon as a server answers ``/health``.
    """

    def __init__(self, config: OpenAIServerConfig) -> None:
        """Keep the config; nothing is connected until ``start()`` or the first request."""
        self._config = config
        self._endpoints = [
            _Endpoint(base=e, root=_server_root(e), index=i)
            for i, e in enumerate(config.endpoints)
        ]
        self._model = config.model
        self._session: aiohttp.ClientSession | None = None
        self._health_task: asyncio.Task[None] | None = None
        self._health_changed: asyncio.Event | None = None
        self._active: dict[str, _Active] = {}
        self._starting = False
        self._closed = False
        self._rotate = 0
        self._mp4_ok = True

    def __repr__(self) -> str:
        """Endpoints and model only (the config holds no secret, only a variable name)."""
        endpoints = list(self._config.endpoints)
        return f"OpenAIServerEngine(endpoints={endpoints}, model={self._model!r})"

    # -- Engine interface --------------------------------------------------------------------

    @property
    def start_failure_is_fatal(self) -> bool:
        """A server that is down now may come up: the node keeps serving meanwhile."""
        return False

    @property
    def model_name(self) -> str:
        """The configured or discovered model name ("" until a server has been asked)."""
        return self._model

    @property
    def config(self) -> OpenAIServerConfig:
        """The configuration this engine was built with."""
        return self._config

    async def start(self) -> None:
        """Connect, wait for a healthy endpoint, learn the model, warm up."""
        if self._closed:
            raise EngineUnavailableError("engine is closed; create a new one")
        cfg = self._config
        if cfg.api_key_env and not os.environ.get(cfg.api_key_env):
            _LOG.warning("api key variable is not set: api_key_env=%s (requests go without a "
                         "key)", cfg.api_key_env)
        self._starting = True
        try:
            self._ensure_running()
            t0 = time.monotonic()
            if not await self._wait_healthy(cfg.start_timeout_s):
                raise EngineUnavailableError(
                    f"no endpoint became healthy within start_timeout_s={cfg.start_timeout_s}: "
                    f"{self._describe_endpoints()}; health checks continue in the background"
                )
            await self._discover_model()
            if cfg.warmup:
                await self._warm_up()
            _LOG.info("openai engine ready: model=%s endpoints_up=%d/%d start_s=%.2f",
                      self._model, sum(1 for e in self._endpoints if e.up),
                      len(self._endpoints), time.monotonic() - t0)
        finally:
            self._starting = False

    async def stream(self, request: ChatRequest) -> AsyncIterator[Chunk]:
        """Stream one chat completion; see the module docstring for the request format."""
        # aclosing: an early exit must close the inner generators now (closing the HTTP
        # response), not whenever they are garbage-collected.
        async with contextlib.aclosing(self._stream(request, only=None)) as chunks:
            async for chunk in chunks:
                yield chunk

    async def abort(self, request_id: str) -> None:
        """Close the request's HTTP response so that the server aborts it."""
        active = self._active.get(request_id)
        if active is None:
            return
        active.cancelled = True
        if active.response is not None:
            active.response.close()

    async def health(self) -> EngineHealth:
        """READY (all endpoints up), DEGRADED (some), UNAVAILABLE (none); never raises."""
        try:
            running = sum(e.in_flight for e in self._endpoints)
            if self._closed:
                return EngineHealth(EngineState.CLOSED, self._model)
            if self._session is None:
                return EngineHealth(EngineState.STOPPED, self._model)
            up = sum(1 for e in self._endpoints if e.up)
            detail = self._describe_endpoints()
            if up == len(self._endpoints):
                state = EngineState.READY
            elif up:
                state = EngineState.DEGRADED
            elif self._starting:
                state = EngineState.STARTING
            else:
                state = EngineState.UNAVAILABLE
            return EngineHealth(state, self._model, running, detail)
        except Exception as exc:  # noqa: BLE001 - health() must never raise
            return EngineHealth(EngineState.UNAVAILABLE, self._model, 0, f"health failed: {exc}")

    async def close(self) -> None:
        """Abort every request, stop health checks, close the HTTP session; idempotent."""
        if self._closed:
            return
        self._closed = True
        for request_id in list(self._active):
            await self.abort(request_id)
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
            self._health_task = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- plumbing ----------------------------------------------------------------------------

    def _ensure_running(self) -> aiohttp.ClientSession:
        if self._closed:
            raise EngineUnavailableError("engine is closed; create a new one")
        if self._session is None:
            # No pool limit here: per-endpoint concurrency is bounded by max_in_flight.
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0),
                timeout=aiohttp.ClientTimeout(total=None),
            )
            self._health_changed = asyncio.Event()
        if self._health_task is None or self._health_task.done():
            self._health_task = asyncio.create_task(self._health_loop(), name="openai-health")
        return self._session

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        name = self._config.api_key_env
        key = os.environ.get(name, "") if name else ""
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def _redact(self, text: str) -> str:
        """Remove the API key from text that came from a server (defence in depth)."""
        name = self._config.api_key_env
        key = os.environ.get(name, "") if name else ""
        return text.replace(key, "***") if key else text

    def _describe_endpoints(self) -> str:
        parts = []
        for e in self._endpoints:
            state = {True: "up", False: "down", None: "unknown"}[e.up]
            extra = f" ({e.last_error})" if e.last_error and not e.up else ""
            parts.append(f"{e.base}={state}{extra}")
        return "; ".join(parts)

    def _set_state(self, ep: _Endpoint, up: bool, why: str = "") -> None:
        if ep.up is not up:
            if up:
                _LOG.info("endpoint up: endpoint=%s", ep.base)
            else:
                _LOG.warning("endpoint down: endpoint=%s reason=%s", ep.base, why)
        ep.up = up
        ep.last_error = "" if up else why
        if self._health_changed is not None:
            self._health_changed.set()

    async def _probe(self, ep: _Endpoint) -> None:
        assert self._session is not None
        timeout = aiohttp.ClientTimeout(total=self._config.health_timeout_s,
                                        sock_connect=self._config.connect_timeout_s)
        try:
            async with self._session.get(ep.root + "/health", timeout=timeout) as resp:
                if resp.status == 200:
                    self._set_state(ep, True)
                else:
                    self._set_state(ep, False, f"GET /health returned HTTP {resp.status}")
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            self._set_state(ep, False, f"GET /health failed: {type(exc).__name__}")

    async def _health_loop(self) -> None:
        while not self._closed:
            await asyncio.gather(*(self._probe(e) for e in self._endpoints))
            await asyncio.sleep(self._config.health_period_s)

    async def _wait_healthy(self, timeout_s: float) -> bool:
        assert self._health_changed is not None
        deadline = time.monotonic() + timeout_s
        while True:
            self._health_changed.clear()
            if any(e.up for e in self._endpoints):
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            with contextlib.suppress(asyncio.TimeoutError):
                await _within(self._health_changed.wait(), remaining)

    async def _discover_model(self) -> None:
        if self._model:
            return
        session = self._ensure_running()
        errors = []
        for ep in sorted(self._endpoints, key=lambda e: not e.up):
            timeout = aiohttp.ClientTimeout(total=self._config.health_timeout_s * 5,
                                            sock_connect=self._config.connect_timeout_s)
            try:
                async with session.get(ep.base + "/models", headers=self._headers(),
                                       timeout=timeout) as resp:
                    body = await resp.text()
                    if resp.status != 200:
                        errors.append(self._status_error(resp.status, body, ep).message)
                        continue
                    models = json.loads(body).get("data") or []
                    if models:
                        self._model = str(models[0]["id"])
                        _LOG.info("model discovered: model=%s endpoint=%s", self._model, ep.base)
                        return
                    errors.append(f"{ep.base}: GET /models listed no model")
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError,
                    KeyError, TypeError, AttributeError) as exc:
                errors.append(f"{ep.base}: GET /models failed: {type(exc).__name__}")
        raise EngineUnavailableError("could not learn the model name (set model to skip "
                                     "discovery): " + "; ".join(errors))

    async def _warm_up(self) -> None:
        """One tiny image request per healthy endpoint, so first-request costs are paid now."""
        image = np.full((_WARMUP_SIZE, _WARMUP_SIZE, 3), 128, dtype=np.uint8)
        request = ChatRequest(
            request_id="",
            messages=(Message("user", (ContentPart("image"), ContentPart("text", "Describe."))),),
            sampling=Sampling(max_tokens=1, temperature=0.0),
            images=(image,),
        )

        async def one(ep: _Endpoint) -> None:
            t0 = time.monotonic()
            req = ChatRequest(f"warmup-{uuid.uuid4().hex[:8]}", request.messages,
                              request.sampling, request.images)
            try:
                async with contextlib.aclosing(self._stream(req, only=ep)) as chunks:
                    async for _ in chunks:
                        pass
                _LOG.info("warm-up done: endpoint=%s seconds=%.2f", ep.base,
                          time.monotonic() - t0)
            except CosmosReasonError as exc:
                _LOG.warning("warm-up failed: endpoint=%s error=%s", ep.base, exc.message)

        await asyncio.gather(*(one(e) for e in self._endpoints if e.up))

    def _select(self, tried: list[_Endpoint], only: _Endpoint | None) -> _Endpoint:
        """Least busy healthy endpoint (never-probed ones after those); rotate among ties."""
        if only is not None:
            if only in tried:
                raise EngineUnavailableError(f"endpoint {only.base} failed")
            return only
        candidates = [e for e in self._endpoints if e.up is not False and e not in tried]
        if not candidates:
            detail = self._describe_endpoints()
            raise EngineUnavailableError(f"no healthy endpoint: {detail}")
        free = [e for e in candidates if e.in_flight < self._config.max_in_flight]
        if not free:
            raise OverloadedError(
                f"every healthy endpoint has max_in_flight={self._config.max_in_flight} "
                "requests running"
            )
        self._rotate += 1
        n = len(self._endpoints)
        return min(free, key=lambda e: (e.up is not True, e.in_flight,
                                        (e.index - self._rotate) % n))

    def _status_error(self, status: int, body: str, ep: _Endpoint) -> CosmosReasonError:
        """Map an HTTP error status (and the server's message) to our error classes."""
        message = self._redact(_error_text(body))
        where = f"{ep.base} returned HTTP {status}"
        if status in (401, 403):
            hint = (f"check that the environment variable {self._config.api_key_env} holds "
                    "the server's --api-key") if self._config.api_key_env else (
                    "the server needs an API key: set api_key_env to the name of an "
                    "environment variable holding it")
            return EngineUnavailableError(f"{where}: API key rejected ({message}); {hint}")
        if status in (400, 413, 422):
            if _TOO_LONG.search(message):
                return PromptTooLongError(f"{where}: {message}")
            return BadRequestError(f"{where}: {message}")
        if status == 404:
            return EngineUnavailableError(f"{where} (model {self._model!r} or route not "
                                          f"served there): {message}")
        if status == 429:
            return OverloadedError(f"{where}: {message}")
        if status == 500:
            return EngineError(f"{where}: {message}")
        if status >= 500:
            return EngineUnavailableError(f"{where}: {message}")
        return EngineError(f"{where}: {message}")

    # -- request body ------------------------------------------------------------------------

    async def _build_body(self, request: ChatRequest) -> dict[str, Any]:
        cfg = self._config
        n_image_parts = sum(
            1 for m in request.messages for p in m.content if p.kind == "image"
        )
        if n_image_parts != len(request.images):
            raise BadRequestError(
                f"messages reference {n_image_parts} image(s) but request.images has "
                f"{len(request.images)}; expected one image part per image, in order"
            )
        has_video = any(p.kind == "video" for m in request.messages for p in m.content)
        if has_video and request.video is None:
            raise BadRequestError("messages contain a video part but request.video is None")
        for m in request.messages:
            for p in m.content:
                if p.kind not in ("text", "image", "video"):
                    raise BadRequestError(f"content part kind={p.kind!r}; expected 'text', "
                                          "'image' or 'video'")

        quality = cfg.jpeg_quality
        image_urls = await asyncio.gather(*(
            asyncio.to_thread(self._jpeg_url, img, f"images[{i}]", quality)
            for i, img in enumerate(request.images)
        ))
        video_parts: list[dict[str, Any]] = []
        if has_video and request.video is not None:
            video_parts = await self._video_parts(request.video)

        messages = []
        images = iter(image_urls)
        for m in request.messages:
            content: list[dict[str, Any]] = []
            for p in m.content:
                if p.kind == "text":
                    content.append({"type": "text", "text": p.text})
                elif p.kind == "image":
                    content.append({"type": "image_url", "image_url": {"url": next(images)}})
                else:
                    content.extend(video_parts)
            if all(c["type"] == "text" for c in content):
                messages.append({"role": m.role, "content": "".join(c["text"] for c in content)})
            else:
                messages.append({"role": m.role, "content": content})

        s = request.sampling
        body: dict[str, Any] = {
            "model": self._model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": s.max_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
        }
        # vLLM takes its sampling extensions as extra top-level fields.
        for name in ("seed", "top_k", "presence_penalty", "repetition_penalty"):
            value = getattr(s, name)
            if value is not None:
                body[name] = value
        if s.ignore_eos:
            body["ignore_eos"] = True
        if request.json_schema is not None:
            if cfg.structured_outputs_field == "structured_outputs":
                body["structured_outputs"] = {"json": request.json_schema}
            else:
                name = re.sub(r"[^A-Za-z0-9_-]", "_", str(request.json_schema.get("title",
                                                                                 "answer")))
                body["response_format"] = {
                    "type": "json_schema",
                    "json_schema": {"name": name[:64] or "answer",
                                    "schema": request.json_schema},
                }
        if cfg.thinking == "off" or (cfg.thinking == "auto" and not request.wants_reasoning()):
            body["chat_template_kwargs"] = {"enable_thinking": False}
        elif cfg.thinking == "on":
            body["chat_template_kwargs"] = {"enable_thinking": True}
        return body

    @staticmethod
    def _jpeg_url(image: np.ndarray, what: str, quality: int) -> str:
        if (not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.ndim != 3
                or image.shape[2] != 3):
            raise BadRequestError(
                f"{what} shape={getattr(image, 'shape', None)} "
                f"dtype={getattr(image, 'dtype', None)}; expected HxWx3 uint8 RGB"
            )
        return _data_url("image/jpeg", _encode_jpeg(image, quality))

    async def _video_parts(self, video: Video) -> list[dict[str, Any]]:
        if not video.frames:
            raise BadRequestError("video has no frames; expected at least one")
        if self._config.video_mode == "mp4" and self._mp4_ok:
            data = await asyncio.to_thread(_encode_mp4, video)
            if data is not None:
                return [{"type": "video_url", "video_url": {"url": _data_url("video/mp4", data)}}]
            self._mp4_ok = False
            _LOG.warning("this OpenCV cannot write mp4v; sending video clips as timestamped "
                         "frames from now on")
        quality = self._config.jpeg_quality
        urls = await asyncio.gather(*(
            asyncio.to_thread(self._jpeg_url, f, f"video.frames[{i}]", quality)
            for i, f in enumerate(video.frames)
        ))
        times = list(video.timestamps_s) + [
            i / video.fps if video.fps else 0.0 for i in range(len(video.timestamps_s), len(urls))
        ]
        parts: list[dict[str, Any]] = [
            {"type": "text", "text": f"{len(urls)} video frames follow, in time order:"}
        ]
        for t, url in zip(times[: len(urls)], urls, strict=True):
            parts.append({"type": "text", "text": f"t={t:.2f}s"})
            parts.append({"type": "image_url", "image_url": {"url": url}})
        return parts

    # -- streaming ---------------------------------------------------------------------------

    async def _stream(self, request: ChatRequest, only: _Endpoint | None) -> AsyncIterator[Chunk]:
        cfg = self._config
        session = self._ensure_running()
        t0 = time.monotonic()
        deadline = t0 + cfg.request_timeout_s
        if not self._model:
            if not any(e.up for e in self._endpoints):
                self._select([], only)  # raises EngineUnavailableError when all are down
            await self._discover_model()
        body = await self._build_body(request)
        payload = json.dumps(body).encode()
        request_id = request.request_id or uuid.uuid4().hex
        active = _Active()
        self._active[request_id] = active
        tried: list[_Endpoint] = []
        errors: list[str] = []
        try:
            while True:
                try:
                    ep = self._select(tried, only)
                except CosmosReasonError as exc:
                    if not errors:
                        raise
                    raise type(exc)(f"{exc.message}; tried: " + "; ".join(errors)) from None
                ep.in_flight += 1
                try:
                    attempt = self._attempt(session, ep, payload, request_id, active, t0,
                                            deadline, request.sampling.max_tokens)
                    async with contextlib.aclosing(attempt) as chunks:
                        async for chunk in chunks:
                            yield chunk
                    ep.served += 1
                    return
                except _Failover as f:
                    tried.append(ep)
                    errors.append(f.error.message)
                    if f.mark_down:
                        self._set_state(ep, False, f.error.message)
                    last = f.error
                    _LOG.info("request failed over: request_id=%s endpoint=%s error=%s",
                              request_id, ep.base, f.error.message)
                    remaining = [e for e in self._endpoints
                                 if e.up is not False and e not in tried]
                    if only is not None or not remaining:
                        message = last.message if len(errors) == 1 else (
                            "every endpoint failed: " + "; ".join(errors))
                        raise type(last)(message) from None
                finally:
                    ep.in_flight -= 1
        finally:
            self._active.pop(request_id, None)

    async def _attempt(
        self,
        session: aiohttp.ClientSession,
        ep: _Endpoint,
        payload: bytes,
        request_id: str,
        active: _Active,
        t0: float,
        deadline: float,
        max_tokens: int,
    ) -> AsyncIterator[Chunk]:
        """One POST to one endpoint; raises ``_Failover`` only before the first token.

        Reading stops once the output passes ``output_token_limit(max_tokens)``: the stream
        is closed (the server sees a disconnect) and the request ends with ``LENGTH``.
        """
        cfg = self._config
        headers = self._headers()
        # Correlates our logs with the server's; header-safe characters only.
        headers["X-Request-Id"] = re.sub(r"[^\x21-\x7e]", "_", request_id)[:128]
        first_deadline = min(deadline, time.monotonic() + cfg.first_token_timeout_s)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=cfg.connect_timeout_s,
                                        connect=cfg.connect_timeout_s)
        resp: aiohttp.ClientResponse | None = None
        delivered = False  # has any text/reasoning reached the caller?
        try:
            try:
                resp = await _within(
                    session.post(ep.base + "/chat/completions", data=payload, headers=headers,
                                 timeout=timeout),
                    max(0.001, first_deadline - time.monotonic()),
                )
            # aiohttp's connect timeout is also an asyncio.TimeoutError: catch it first.
            except (aiohttp.ClientConnectorError, aiohttp.ServerTimeoutError,
                    aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                raise _Failover(EngineUnavailableError(
                    f"{ep.base} unreachable: {type(exc).__name__}: {self._redact(str(exc))}"
                ), mark_down=True) from None
            except aiohttp.ClientError as exc:
                raise _Failover(EngineUnavailableError(
                    f"{ep.base} request failed: {type(exc).__name__}"), mark_down=False) from None
            except asyncio.TimeoutError:
                raise DeadlineExceededError(
                    f"{ep.base} sent no response within "
                    f"{min(cfg.first_token_timeout_s, cfg.request_timeout_s):.1f}s "
                    "(first_token_timeout_s / request_timeout_s)"
                ) from None
            active.response = resp
            if active.cancelled:
                yield Chunk(finish_reason=FinishReason.CANCELLED,
                            elapsed_s=time.monotonic() - t0)
                return
            if resp.status != 200:
                try:
                    text = await _within(_read_capped(resp, _ERROR_BODY_BYTES),
                                         cfg.read_timeout_s)
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                    text = ""
                error = self._status_error(resp.status, text, ep)
                if resp.status >= 500 or resp.status in (401, 403, 404, 429):
                    raise _Failover(error, mark_down=resp.status in (502, 503, 504))
                raise error

            parser = SSEParser()
            bound = _OutputBound(max_tokens)
            overran = ""  # what passed the bound; "" while within it
            finish: FinishReason | None = None
            usage: dict[str, Any] | None = None
            in_reasoning = False
            inline = cfg.reasoning_output == "inline"
            done = False
            while not done and not overran:
                now = time.monotonic()
                if now >= deadline:
                    raise DeadlineExceededError(
                        f"request ran past request_timeout_s={cfg.request_timeout_s} "
                        f"on {ep.base}")
                if not delivered and finish is None:
                    wait = first_deadline - now
                    if wait <= 0:
                        raise DeadlineExceededError(
                            f"{ep.base} produced no token within first_token_timeout_s="
                            f"{cfg.first_token_timeout_s}")
                else:
                    wait = min(cfg.read_timeout_s, deadline - now)
                try:
                    raw = await _within(resp.content.readany(), wait)
                except asyncio.TimeoutError:
                    if active.cancelled:
                        break
                    if time.monotonic() >= deadline:
                        continue  # reported as a deadline above
                    if not delivered and finish is None:
                        continue  # reported as first-token timeout above
                    raise EngineUnavailableError(
                        f"{ep.base} stalled: no data for read_timeout_s={cfg.read_timeout_s}"
                    ) from None
                except (aiohttp.ClientError, OSError) as exc:
                    if active.cancelled:
                        break
                    error = EngineUnavailableError(
                        f"{ep.base} connection lost mid-stream: {type(exc).__name__}")
                    if not delivered and finish is None:
                        raise _Failover(error, mark_down=True) from None
                    self._set_state(ep, False, error.message)
                    raise error from None
                if not raw:  # EOF
                    if active.cancelled or finish is not None:
                        break
                    error = EngineUnavailableError(
                        f"{ep.base} closed the stream before the end (server gone?)")
                    if not delivered:
                        raise _Failover(error, mark_down=True)
                    self._set_state(ep, False, error.message)
                    raise error
                bound.bytes_read += len(raw)
                for data in parser.feed(raw):
                    if data.strip() == "[DONE]":
                        done = True
                        break
                    try:
                        event = json.loads(data)
                    except ValueError:
                        _LOG.debug("ignoring a non-JSON SSE event: endpoint=%s", ep.base)
                        continue
                    if not isinstance(event, dict):
                        continue
                    if "error" in event:
                        err = event["error"] if isinstance(event["error"], dict) else {}
                        code = err.get("code") if isinstance(err.get("code"), int) else 500
                        error = self._status_error(code, json.dumps(event), ep)
                        if not delivered and (code >= 500 or code == 429):
                            raise _Failover(error, mark_down=False)
                        if delivered and code >= 500:
                            raise EngineUnavailableError(error.message)
                        raise error
                    if isinstance(event.get("usage"), dict):
                        usage = event["usage"]
                        with contextlib.suppress(TypeError, ValueError):
                            bound.usage_tokens = max(bound.usage_tokens,
                                                     int(usage.get("completion_tokens") or 0))
                        if bound.usage_tokens > bound.limit:
                            overran = f"usage.completion_tokens={bound.usage_tokens}"
                            break
                    for choice in event.get("choices") or ():
                        delta = choice.get("delta") or {}
                        reasoning = delta.get("reasoning") or delta.get("reasoning_content") or ""
                        content = delta.get("content") or ""
                        if reasoning or content:
                            # Reasoning and answer share the request's max_tokens.
                            if bound.deltas >= bound.limit:
                                overran = f"more than {bound.limit} deltas"
                                break
                            room = bound.max_chars - bound.chars
                            if len(reasoning) + len(content) > room:
                                reasoning = reasoning[:room]
                                content = content[: room - len(reasoning)]
                                overran = f"more than {bound.max_chars} characters"
                            if reasoning or content:
                                bound.deltas += 1
                                bound.chars += len(reasoning) + len(content)
                        text = content
                        reasoning_delta = ""
                        if reasoning:
                            if inline:
                                text = ("" if in_reasoning else "<think>\n") + reasoning + text
                            else:
                                reasoning_delta = reasoning
                            in_reasoning = True
                        if content and in_reasoning and not reasoning:
                            if inline:
                                text = "\n</think>\n\n" + text
                            in_reasoning = False
                        if text or reasoning_delta:
                            delivered = True
                            yield Chunk(text_delta=text, reasoning_delta=reasoning_delta,
                                        output_tokens=bound.deltas,
                                        elapsed_s=time.monotonic() - t0)
                        if overran:
                            break
                        reason = choice.get("finish_reason")
                        if reason:
                            finish = _FINISH.get(str(reason), FinishReason.ERROR)
                    if overran:
                        break
                if not overran and bound.bytes_read > bound.max_bytes:
                    overran = f"more than {bound.max_bytes} bytes"
            if overran and not active.cancelled:
                # Close now, before the caller sees the end: the server aborts at once.
                resp.close()
                _LOG.warning("server overran max_tokens; stream closed: endpoint=%s "
                             "request_id=%s max_tokens=%d read=%s tokens_at_least=%d",
                             ep.base, request_id, max_tokens, overran, bound.tokens())
                # An answer the server had already finished stays as it ended.
                yield Chunk(finish_reason=finish or FinishReason.LENGTH,
                            output_tokens=bound.tokens(), elapsed_s=time.monotonic() - t0)
                return
            n_out = bound.deltas
            if active.cancelled:
                yield Chunk(finish_reason=FinishReason.CANCELLED, output_tokens=n_out,
                            elapsed_s=time.monotonic() - t0)
                return
            if finish is None:
                raise EngineUnavailableError(f"{ep.base} ended the stream without a finish "
                                             "reason")
            prompt_tokens = cached = None
            if usage:
                n_out = int(usage.get("completion_tokens") or n_out)
                if usage.get("prompt_tokens") is not None:
                    prompt_tokens = int(usage["prompt_tokens"])
                details = usage.get("prompt_tokens_details")
                if isinstance(details, dict) and details.get("cached_tokens") is not None:
                    cached = int(details["cached_tokens"])
            _LOG.debug("request done: request_id=%s endpoint=%s finish=%s tokens=%d "
                       "seconds=%.3f", request_id, ep.base, finish.value, n_out,
                       time.monotonic() - t0)
            yield Chunk(finish_reason=finish, output_tokens=n_out, prompt_tokens=prompt_tokens,
                        cached_prompt_tokens=cached, elapsed_s=time.monotonic() - t0)
        finally:
            # Closing (not releasing) drops the connection, which makes vLLM abort the request
            # when the caller stops early (generator closed, task cancelled, abort()).
            if resp is not None:
                resp.close()
