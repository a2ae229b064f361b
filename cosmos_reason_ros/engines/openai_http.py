"""Engine for OpenAI-compatible servers (``vllm serve``, ``vllm-router``) over aiohttp.

One URL (a router in front of many servers, or one ``vllm serve``) plus ordered fallbacks
for when it cannot be reached, e.g. the robot's onboard server when the link to the rack
drops. Load balancing belongs to the router; this engine keeps the order: a request goes to
the first URL not known to be down and moves to the next when that one fails *before* the
first token (unreachable, HTTP 5xx/429/401/403/404). A background task probes every URL
(``/readiness``, else ``/health``), so a URL marked down is first again as soon as it
answers. After the first token nothing is retried: a broken stream raises
:class:`EngineUnavailableError`. HTTP 429, 503 and 500 -- as a status or as an error event
before the first token; vLLM turns a retryable internal error (``finish_reason`` "error", e.g.
a multi-modal cache miss) into 500 -- are first retried on the same URL, at most
``busy_retries`` times with jittered backoff, within the first-token deadline (a goal's
deadline cancels the request and any wait). ``GET /v1/models`` is asked on each URL before
its first use: the configured model must be served there.

Every request about one camera carries the same routing header (``session_header``: value
``ChatRequest.session_key``), so a router with session affinity (``vllm-router --policy
consistent_hash``) keeps a camera's goals and prefills on the server holding its image in
cache. The body is ``openai_request.RequestEncoder``'s. (The ``openai`` SDK was measured side
by side and kept out: ~2 ms more per request on this path,
docs/bench/http-client-2026-12-01.md.)

Bounds (judged by ``openai_stream``): reading stops a little past the request's
``max_tokens`` (``output_token_limit``; reasoning counts too), judged by content deltas,
``usage`` and characters, and the body is bounded in bytes (an error body to 64 KiB). The
stream is then closed (vLLM aborts a request whose client went away), the request ends with
``LENGTH`` and one warning names the URL. Closing the stream early (cancel, ``abort``)
aborts the request too.

The API key is read at each request from the environment variable *named* by
``api_key_env`` and goes only into the ``Authorization`` header.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, TypeVar

import aiohttp
import numpy as np

from cosmos_reason_ros.core.routing import (
    DEFAULT_SESSION_HEADER,
    base_url_problem,
    fallback_urls_problem,
    header_name_problem,
    normalized_url,
)
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
)
from cosmos_reason_ros.engines.base import Engine, EngineHealth, EngineState
from cosmos_reason_ros.engines.openai_request import (
    STRUCTURED_FIELDS,
    THINKING,
    VIDEO_MODES,
    RequestEncoder,
)
from cosmos_reason_ros.engines.openai_stream import Deltas, SSEParser

_LOG = logging.getLogger(__name__)
_T = TypeVar("_T")
_Fields = tuple[dict[str, Any], dict[str, Any]]  # RequestEncoder.body(): OpenAI's, vLLM's

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TOO_LONG = re.compile(
    r"maximum context length|longer than|context length|too long|exceeds the model",
    re.IGNORECASE,
)
_REASONING_OUTPUT = ("split", "inline")
_WARMUP_SIZE = 64  # px; a multiple of every Qwen-VL patch unit (28 and 32)
# vllm-router (0.1.17) answers /health with 503 while ANY of its backends is down, but
# /readiness with 200 while one is up; vllm serve has no /readiness (404): its /health says
# whether its engine runs. Each URL is asked the first path it answers.
_HEALTH_PATHS = ("/readiness", "/health")
_RETRIED_STATUSES = (429, 500, 503)  # retried on the same URL, with jitter
_RETRY_BASE_S, _RETRY_CAP_S = 0.25, 2.0
_ERROR_BODY_BYTES = 64 * 1024  # enough for any error message; the rest is not read
_OTHER_BODY_BYTES = 1024 * 1024  # /v1/models


@dataclass(frozen=True)
class OpenAIServerConfig:
    """Where the server is and how to talk to it; validated on construction.

    ``url`` (a router or one server) and the ordered ``fallback_urls`` are base URLs ending
    in ``/v1``; health is probed at the URL without ``/v1`` (``_HEALTH_PATHS``). ``model`` empty
    means: the first model each server lists. ``api_key_env`` is the *name* of an
    environment variable holding the key (empty: no key). ``session_header`` names the
    routing header ("" sends none). ``read_timeout_s`` is the longest silence allowed once
    generation has begun; ``first_token_timeout_s`` bounds queueing plus prefill (and the
    busy retries); ``request_timeout_s`` bounds the whole request.
    """

    url: str = "http://127.0.0.1:8000/v1"
    fallback_urls: tuple[str, ...] = ()
    model: str = ""
    api_key_env: str = ""
    session_header: str = DEFAULT_SESSION_HEADER
    connect_timeout_s: float = 3.0
    read_timeout_s: float = 30.0
    first_token_timeout_s: float = 120.0
    request_timeout_s: float = 600.0
    start_timeout_s: float = 60.0
    health_period_s: float = 2.0
    health_timeout_s: float = 2.0
    busy_retries: int = 3
    jpeg_quality: int = 90
    thinking: str = "auto"  # auto | on | off | server (send nothing)
    reasoning_output: str = "split"  # split: Chunk.reasoning_delta; inline: <think> in text
    structured_outputs_field: str = "structured_outputs"  # or "response_format"
    video_mode: str = "mp4"  # mp4: one video_url; frames: timestamped images
    warmup: bool = True

    def __post_init__(self) -> None:
        """Normalise the URLs and check every field, naming it and what is allowed."""
        fallbacks = self.fallback_urls
        fallbacks = (fallbacks,) if isinstance(fallbacks, str) else tuple(fallbacks)
        object.__setattr__(self, "fallback_urls", fallbacks)
        problem = base_url_problem(self.url)
        if problem:
            raise ValueError(f"url={self.url!r}: {problem}")
        problem = fallback_urls_problem(fallbacks)
        if problem:
            raise ValueError(f"fallback_urls={list(fallbacks)!r}: {problem}")
        if normalized_url(self.url) in map(normalized_url, fallbacks):
            raise ValueError(f"fallback_urls={list(fallbacks)!r} repeats url={self.url!r}; "
                             "list other servers only")
        object.__setattr__(self, "url", normalized_url(self.url))
        object.__setattr__(self, "fallback_urls", tuple(map(normalized_url, fallbacks)))
        problem = header_name_problem(self.session_header)
        if problem:
            raise ValueError(f"session_header={self.session_header!r}: {problem}")
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
        if not isinstance(self.busy_retries, int) or not 0 <= self.busy_retries <= 10:
            raise ValueError(f"busy_retries={self.busy_retries!r}; expected 0..10")
        if not isinstance(self.jpeg_quality, int) or not 1 <= self.jpeg_quality <= 100:
            raise ValueError(f"jpeg_quality={self.jpeg_quality!r}; expected 1..100")
        for name, allowed in (("thinking", THINKING), ("reasoning_output", _REASONING_OUTPUT),
                              ("structured_outputs_field", STRUCTURED_FIELDS),
                              ("video_mode", VIDEO_MODES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}={getattr(self, name)!r}; expected one of {allowed}")

    @property
    def urls(self) -> tuple[str, ...]:
        """Every base URL, in the order requests try them."""
        return (self.url, *self.fallback_urls)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OpenAIServerConfig:
        """Build from a plain mapping (parameters, YAML); unknown keys are an error."""
        allowed = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(allowed))
        if unknown:
            raise ValueError(f"unknown OpenAIServerConfig key(s) {unknown}; "
                             f"allowed keys: {allowed}")
        return cls(**data)


# --- small helpers ----------------------------------------------------------------------------


_ABORTED = object()
_STATE_WORDS = {True: "up", False: "down", None: "unknown"}


async def _step(awaitable: Awaitable[_T], aborted: asyncio.Event, timeout_s: float) -> Any:
    """Await ``awaitable`` for at most ``timeout_s`` (``asyncio.TimeoutError`` after that).

    Returns ``_ABORTED`` as soon as ``aborted`` is set. Never loses a cancel of the caller
    (``asyncio.wait`` re-raises it; ``wait_for`` on Python 3.10/3.11 may swallow one, which
    would leave a stream running on the server); an HTTP stream that arrives while giving
    up is closed.
    """
    step = asyncio.ensure_future(awaitable)
    stop = asyncio.ensure_future(aborted.wait())
    try:
        await asyncio.wait((step, stop), timeout=max(0.0, timeout_s),
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
        if not step.done():
            step.cancel()
            await asyncio.wait((step,))  # let it unwind (closes its connection)
    failed = step.cancelled() or step.exception() is not None  # (marks it retrieved)
    if aborted.is_set():
        if not failed:
            await _close(step.result())
        return _ABORTED
    if step.cancelled():
        raise asyncio.TimeoutError
    return step.result()


async def _close(thing: object) -> None:
    close = getattr(thing, "close", None)
    if callable(close):
        result = close()
        if asyncio.iscoroutine(result):
            await result


def _error_text(body: str, limit: int = 300) -> str:
    """Return the server's message from an error body (its JSON ``message``, else the text)."""
    message = body
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        parsed = json.loads(body)
        error = parsed.get("error", parsed) if isinstance(parsed, dict) else parsed
        message = str(error.get("message") or body) if isinstance(error, dict) else body
    return message[:limit] + ("..." if len(message) > limit else "")


async def _read_capped(resp: aiohttp.ClientResponse, limit: int) -> str:
    """Read at most ``limit`` bytes of a body (an error page need not be read whole)."""
    data = b""
    while len(data) < limit:
        part = await resp.content.read(limit - len(data))
        if not part:
            break
        data += part
    return data.decode("utf-8", errors="replace")


# --- the engine ---------------------------------------------------------------------------------


class _InFlight:
    """One request in flight: what ``abort()`` and its timers act on (engine loop only).

    While the request is being sent, ``aborted`` ends the wait (``_step``). Once its stream
    is open, abort and the timers close the stream: the pending read raises at once and the
    reader sees why (``aborted``, ``expired``). One timer per request, re-armed only when it
    fires, keeps the cost per streamed event at a clock read.
    """

    def __init__(self) -> None:
        self.aborted = asyncio.Event()
        self.expired: CosmosReasonError | None = None
        self._close_stream: Callable[[], object] | None = None
        self._due: Callable[[], tuple[float, CosmosReasonError]] | None = None
        self._timer: asyncio.TimerHandle | None = None

    def abort(self) -> None:
        """End the request now."""
        self.aborted.set()
        self._close()

    def watch(self, close: Callable[[], object],
              due: Callable[[], tuple[float, CosmosReasonError]]) -> None:
        """Call ``close`` (the stream's) when ``due()`` says it is too slow, or on abort."""
        self._close_stream, self._due = close, due
        self._check()

    def recheck(self) -> None:
        """Re-arm the timer now: ``due()`` moved earlier."""
        if self._timer is not None:
            self._timer.cancel()
        self._check()

    def unwatch(self) -> None:
        """Stop the timer (the stream ended)."""
        if self._timer is not None:
            self._timer.cancel()
        self._close_stream = self._due = None

    def _check(self) -> None:
        if self._due is None:
            return
        when, error = self._due()
        now = time.monotonic()
        if now < when:
            self._timer = asyncio.get_running_loop().call_later(when - now, self._check)
            return
        self.expired = error
        self._close()

    def _close(self) -> None:
        if self._close_stream is not None:
            self._close_stream()


@dataclass
class _Server:
    """One base URL and what is known of it; touched only on the engine's loop."""

    url: str  # .../v1
    root: str  # where /health is
    up: bool | None = None  # None: not probed yet
    health_path: str = ""  # which of _HEALTH_PATHS it answers ("" until known)
    model: str = ""  # the model used there, once /v1/models has confirmed it
    last_error: str = ""
    down_since: float = 0.0  # monotonic, when it last went down
    served: int = 0
    # Set by an HTTP 401/403 from the URL, cleared by its next 200. Its health probe
    # (/health, /readiness) needs no key, so only requests tell that the key is refused.
    key_rejected: str = ""


class _TryNext(Exception):
    """The URL failed before the first token; the next one in order may be tried.

    ``retry_after_s`` (None: no retry) says the same URL may be asked again first, no sooner
    than that (the server's ``Retry-After``, else 0).
    """

    def __init__(self, error: CosmosReasonError, mark_down: bool,
                 retry_after_s: float | None = None) -> None:
        super().__init__(error.message)
        self.error = error
        self.mark_down = mark_down
        self.retry_after_s = retry_after_s


def _retry_delay(failed: _TryNext, retry: int, retries: int,
                 first_deadline: float) -> float | None:
    """How long to wait before asking the same URL again, or None to move on."""
    if failed.retry_after_s is None or retry >= retries:
        return None
    delay = random.uniform(0.5, 1.0) * min(_RETRY_CAP_S, _RETRY_BASE_S * 2 ** retry)
    delay = max(delay, min(_RETRY_CAP_S, failed.retry_after_s))
    return delay if time.monotonic() + delay < first_deadline else None


class OpenAIServerEngine(Engine):
    """Streams chat completions from an OpenAI-compatible server, with ordered fallbacks.

    ``start()`` waits (up to ``start_timeout_s``) for a healthy URL, checks the model on
    every healthy URL and warms each up with a tiny image request. If none comes up it raises
    ``EngineUnavailableError`` but stays usable: health probing goes on and requests succeed
    as soon as a server answers ``/health``.
    """

    def __init__(self, config: OpenAIServerConfig) -> None:
        """Keep the config; nothing is connected until ``start()`` or the first request."""
        self._config = config
        self._servers: list[_Server] = []
        self._http: aiohttp.ClientSession | None = None
        self._health_task: asyncio.Task[None] | None = None
        self._health_changed: asyncio.Event | None = None
        self._active: dict[str, _InFlight] = {}
        self._starting = False
        self._closed = False
        self._warm_up_session_key = ""
        self._encoder = RequestEncoder(config.jpeg_quality, config.thinking,
                                       config.structured_outputs_field, config.video_mode)

    def __repr__(self) -> str:
        """URLs and model only (the config holds no secret, only a variable name)."""
        return f"OpenAIServerEngine(urls={list(self._config.urls)}, model={self.model_name!r})"

    # -- Engine interface --------------------------------------------------------------------

    @property
    def start_failure_is_fatal(self) -> bool:
        """A server that is down now may come up: the node keeps serving meanwhile."""
        return False

    @property
    def model_name(self) -> str:
        """The configured model, else the one the first checked URL serves ("" until then)."""
        return self._config.model or next((s.model for s in self._servers if s.model), "")

    @property
    def config(self) -> OpenAIServerConfig:
        """The configuration this engine was built with."""
        return self._config

    async def start(self) -> None:
        """Connect, wait for a healthy URL, check the model on each, warm up."""
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
                    f"no URL became healthy within start_timeout_s={cfg.start_timeout_s}: "
                    f"{self._describe()}; health checks continue in the background")
            usable, problems = [], []
            for server in (s for s in self._servers if s.up):
                try:
                    await self._check_model(server)
                    usable.append(server)
                except CosmosReasonError as e:
                    problems.append(e.message)
                    _LOG.warning("url not usable: url=%s error=%s", server.url, e.message)
            if not usable:
                raise EngineUnavailableError("; ".join(problems))
            if cfg.warmup:
                await asyncio.gather(*(self._warm_up(s) for s in usable))
            _LOG.info("openai engine ready: model=%s urls_up=%d/%d start_s=%.2f",
                      self.model_name, sum(1 for s in self._servers if s.up),
                      len(self._servers), time.monotonic() - t0)
        finally:
            self._starting = False

    async def stream(self, request: ChatRequest) -> AsyncIterator[Chunk]:
        """Stream one chat completion; see the module docstring for the request format."""
        # aclosing: an early exit must close the inner generators now (closing the HTTP
        # stream), not whenever they are garbage-collected.
        async with contextlib.aclosing(self._stream(request, None)) as chunks:
            async for chunk in chunks:
                yield chunk

    async def abort(self, request_id: str) -> None:
        """End the request: its stream is closed, so the server aborts it."""
        flight = self._active.get(request_id)
        if flight is not None:
            flight.abort()

    def health(self) -> EngineHealth:
        """READY (every URL up), DEGRADED (some), UNAVAILABLE (none); never raises."""
        try:
            if self._closed:
                return EngineHealth(EngineState.CLOSED, self.model_name)
            if self._http is None:
                return EngineHealth(EngineState.STOPPED, self.model_name)
            up = sum(1 for s in self._servers if s.up)
            if up == len(self._servers):
                state = EngineState.READY
            elif up:
                state = EngineState.DEGRADED
            else:
                state = EngineState.STARTING if self._starting else EngineState.UNAVAILABLE
            return EngineHealth(state, self.model_name, len(self._active), self._describe(),
                                tuple(s.key_rejected for s in self._servers if s.key_rejected))
        except Exception as exc:  # noqa: BLE001 - health() must never raise
            return EngineHealth(EngineState.UNAVAILABLE, "", 0, f"health failed: {exc}")

    async def close(self) -> None:
        """Abort every request, stop health checks, close the connections; idempotent."""
        if self._closed:
            return
        self._closed = True
        for flight in self._active.values():
            flight.abort()
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
            self._health_task = None
        if self._http is not None:
            await self._http.close()
            self._http = None

    # -- connections and health ------------------------------------------------------------

    def _ensure_running(self) -> None:
        if self._closed:
            raise EngineUnavailableError("engine is closed; create a new one")
        cfg = self._config
        if self._http is None:
            # One pool for every URL (bounded; a request waits connect_timeout_s at most for
            # a connection). No read timeout here: sending is bounded by _step, streaming by
            # _InFlight's timers (first token, silence, request), each with its own limit.
            self._http = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=256),
                timeout=aiohttp.ClientTimeout(total=None, connect=cfg.connect_timeout_s,
                                              sock_connect=cfg.connect_timeout_s))
            self._servers = [_Server(url, url[: -len("/v1")]) for url in cfg.urls]
            self._health_changed = asyncio.Event()
        if self._health_task is None or self._health_task.done():
            self._health_task = asyncio.create_task(self._health_loop(), name="openai-health")

    def _headers(self, request_id: str = "", session_key: str = "") -> dict[str, str]:
        """Per-request headers: the key (read now: it may be rotated), the request id, route."""
        name = self._config.api_key_env
        key = os.environ.get(name, "") if name else ""
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        if request_id:  # correlates our logs with the server's; header-safe characters only
            headers["X-Request-Id"] = re.sub(r"[^\x21-\x7e]", "_", request_id)[:128]
        if session_key and self._config.session_header:
            headers[self._config.session_header] = session_key
        return headers

    def _redact(self, text: str) -> str:
        """Remove the API key from text that came from a server (defence in depth)."""
        name = self._config.api_key_env
        key = os.environ.get(name, "") if name else ""
        return text.replace(key, "***") if key else text

    def _describe(self) -> str:
        now = time.monotonic()
        return "; ".join(f"{s.url}={_STATE_WORDS[s.up]}"
                         + (f" for {now - s.down_since:.0f} s ({s.last_error})"
                            if s.last_error and not s.up else "")
                         for s in self._servers)

    def _set_state(self, server: _Server, up: bool, why: str = "") -> None:
        if server.up is not up:
            if up:
                _LOG.info("url up: url=%s", server.url)
            else:
                _LOG.warning("url down: url=%s reason=%s", server.url, why)
                server.down_since = time.monotonic()
        server.up = up
        server.last_error = "" if up else why
        if self._health_changed is not None:
            self._health_changed.set()

    async def _probe(self, server: _Server) -> None:
        assert self._http is not None
        cfg = self._config
        paths = (server.health_path,) if server.health_path else _HEALTH_PATHS
        for path in paths:
            try:
                async with self._http.get(server.root + path, timeout=aiohttp.ClientTimeout(
                        total=cfg.health_timeout_s, sock_connect=cfg.connect_timeout_s)) as resp:
                    status = resp.status
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                self._set_state(server, False, f"GET {path} failed: {type(exc).__name__}")
                return
            if status != 200 and status < 500 and path != paths[-1]:
                continue  # not its health route (404: no router), or closed to us: the next
            if status == 200:
                server.health_path = path
            # Only 5xx says down (a dead engine, a router without backends, a proxy without
            # upstream); a 4xx server is reachable, and its requests will say what is wrong.
            self._set_state(server, status < 500, f"GET {path} returned HTTP {status}")
            return

    async def _health_loop(self) -> None:
        while not self._closed:
            await asyncio.gather(*(self._probe(s) for s in self._servers))
            await asyncio.sleep(self._config.health_period_s)

    async def _wait_healthy(self, timeout_s: float) -> bool:
        assert self._health_changed is not None
        deadline = time.monotonic() + timeout_s
        while not any(s.up for s in self._servers):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._health_changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await _step(self._health_changed.wait(), asyncio.Event(), remaining)
        return True

    async def _check_model(self, server: _Server) -> None:
        """Learn what ``server`` serves (``GET /v1/models``); the configured model must be in it."""
        if server.model:
            return
        assert self._http is not None
        timeout = aiohttp.ClientTimeout(total=self._config.health_timeout_s * 5,
                                        sock_connect=self._config.connect_timeout_s)
        try:
            async with self._http.get(server.url + "/models", headers=self._headers(),
                                      timeout=timeout) as resp:
                body = await _read_capped(resp, _OTHER_BODY_BYTES)
                if resp.status != 200:
                    raise self._status_error(resp.status, body, server)
                server.key_rejected = ""
            served = [str(m["id"]) for m in json.loads(body)["data"]]
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError, KeyError,
                TypeError) as e:
            message = f"{server.url}: GET /models failed: {type(e).__name__}"
            if isinstance(e, (aiohttp.ClientConnectionError, asyncio.TimeoutError, OSError)):
                self._set_state(server, False, message)
            raise EngineUnavailableError(message) from None
        wanted = self._config.model
        if wanted and wanted not in served:
            raise EngineUnavailableError(
                f"{server.url} does not serve model {wanted!r} (engine.model); it serves "
                f"{served}")
        if not served:
            raise EngineUnavailableError(f"{server.url}: GET /models listed no model")
        server.model = wanted or served[0]
        _LOG.info("model checked: model=%s url=%s", server.model, server.url)

    def route_warm_up_as(self, session_key: str) -> None:
        """Route the warm-up as the node's requests.

        Without a key a router with session affinity sent it to any backend and counted it
        there as a session: sticky_least_loaded could then place the camera elsewhere.
        """
        self._warm_up_session_key = session_key

    async def _warm_up(self, server: _Server) -> None:
        """One tiny image request, so first-request costs (compile, caches) are paid now."""
        image = np.full((_WARMUP_SIZE, _WARMUP_SIZE, 3), 128, dtype=np.uint8)
        request = ChatRequest(
            f"warmup-{uuid.uuid4().hex[:8]}",
            (Message("user", (ContentPart("image"), ContentPart("text", "Describe."))),),
            Sampling(max_tokens=1, temperature=0.0), (image,),
            session_key=self._warm_up_session_key)
        t0 = time.monotonic()
        try:
            async with contextlib.aclosing(self._stream(request, server)) as chunks:
                async for _ in chunks:
                    pass
            _LOG.info("warm-up done: url=%s seconds=%.2f", server.url, time.monotonic() - t0)
        except CosmosReasonError as exc:
            _LOG.warning("warm-up failed: url=%s error=%s", server.url, exc.message)

    def _status_error(self, status: int, body: str, server: _Server) -> CosmosReasonError:
        """Map an HTTP error status (and the server's message) to our error classes."""
        message = self._redact(_error_text(body))
        where = f"{server.url} returned HTTP {status}"
        if status in (401, 403):
            hint = (f"check that the environment variable {self._config.api_key_env} holds "
                    "the server's --api-key") if self._config.api_key_env else (
                    "the server needs an API key: set api_key_env to the name of an "
                    "environment variable holding it")
            server.key_rejected = f"{where}: API key rejected; {hint}"
            return EngineUnavailableError(f"{where}: API key rejected ({message}); {hint}")
        if status in (400, 413, 422):
            cls = PromptTooLongError if _TOO_LONG.search(message) else BadRequestError
            return cls(f"{where}: {message}")
        if status == 404:
            return EngineUnavailableError(f"{where} (model {server.model!r} or route not "
                                          f"served there): {message}")
        if status == 429:
            return OverloadedError(f"{where}: {message}")
        if status > 500:
            return EngineUnavailableError(f"{where}: {message}")
        return EngineError(f"{where}: {message}")

    # -- streaming -------------------------------------------------------------------------------

    async def _stream(self, request: ChatRequest, only: _Server | None) -> AsyncIterator[Chunk]:
        """Try the URLs in order (or ``only``) until one streams the answer."""
        self._ensure_running()
        t0 = time.monotonic()
        servers = [only] if only is not None else \
            [s for s in self._servers if s.up is not False]
        if not servers:
            raise EngineUnavailableError(f"no healthy URL: {self._describe()}")
        fields = await self._encoder.body(request)
        request_id = request.request_id or uuid.uuid4().hex
        flight = self._active[request_id] = _InFlight()
        errors: list[CosmosReasonError] = []
        try:
            for server in servers:
                first_deadline = min(t0 + self._config.request_timeout_s,
                                     time.monotonic() + self._config.first_token_timeout_s)
                for retry in range(self._config.busy_retries + 1):
                    try:
                        attempt = self._attempt(server, fields, request, request_id, flight, t0)
                        async with contextlib.aclosing(attempt) as chunks:
                            async for chunk in chunks:
                                yield chunk
                        server.served += 1
                        return
                    except _TryNext as failed:
                        delay = _retry_delay(failed, retry, self._config.busy_retries,
                                             first_deadline)
                        reason = failed.error.message
                        if delay is None:
                            errors.append(failed.error)
                            if failed.mark_down:
                                self._set_state(server, False, failed.error.message)
                            _LOG.info("request moves on: request_id=%s url=%s error=%s",
                                      request_id, server.url, failed.error.message)
                            break
                    _LOG.debug("server busy, retrying: url=%s error=%s delay_s=%.2f",
                               server.url, reason, delay)
                    if await _step(asyncio.sleep(delay), flight.aborted, delay + 1) \
                            is _ABORTED:
                        yield Chunk(finish_reason=FinishReason.CANCELLED,
                                    elapsed_s=time.monotonic() - t0)
                        return
            last = errors[-1]
            raise type(last)(last.message if len(errors) == 1 else "every URL failed: "
                             + "; ".join(e.message for e in errors)) from None
        finally:
            self._active.pop(request_id, None)

    async def _open(self, server: _Server, fields: _Fields, request: ChatRequest,
                    request_id: str, flight: _InFlight, first_deadline: float) -> Any:
        """POST the request; return the response or _ABORTED (``_TryNext`` on an error)."""
        assert self._http is not None
        body, extra = fields  # the OpenAI fields, and vLLM's own (top-level in the JSON too)
        payload = json.dumps({**body, **extra, "model": server.model}).encode()
        headers = self._headers(request_id, request.session_key)
        try:
            resp = await _step(self._http.post(server.url + "/chat/completions",
                                               data=payload, headers=headers),
                               flight.aborted, first_deadline - time.monotonic())
        # aiohttp's connect timeout is also an asyncio.TimeoutError: catch it first.
        except (aiohttp.ClientConnectorError, aiohttp.ServerTimeoutError,
                aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
            raise _TryNext(EngineUnavailableError(
                f"{server.url} unreachable: {type(e).__name__}: "
                f"{self._redact(str(e))[:200]}"), mark_down=True) from None
        except aiohttp.ClientError as e:
            raise _TryNext(EngineUnavailableError(
                f"{server.url} request failed: {type(e).__name__}"), mark_down=False) from None
        except asyncio.TimeoutError:
            raise DeadlineExceededError(
                f"{server.url} sent no response within first_token_timeout_s="
                f"{self._config.first_token_timeout_s}") from None
        if resp is _ABORTED or resp.status == 200:
            if resp is not _ABORTED:
                server.key_rejected = ""
            return resp
        try:
            text = await _step(_read_capped(resp, _ERROR_BODY_BYTES), asyncio.Event(),
                               self._config.read_timeout_s)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            text = ""
        finally:
            resp.close()
        status, error = resp.status, self._status_error(resp.status, text, server)
        if status >= 500 or status in (401, 403, 404, 429):
            retry_after_s = None
            if status in _RETRIED_STATUSES:
                retry_after_s = 0.0
                with contextlib.suppress(KeyError, TypeError, ValueError):  # the server's hint
                    retry_after_s = float(resp.headers["Retry-After"])
            raise _TryNext(error, mark_down=status in (502, 503, 504),
                           retry_after_s=retry_after_s)
        raise error

    async def _attempt(self, server: _Server, fields: _Fields, request: ChatRequest,
                       request_id: str, flight: _InFlight, t0: float) -> AsyncIterator[Chunk]:
        """One URL: open the stream and pass its chunks on; ``_TryNext`` only before the first."""
        cfg = self._config
        deadline = t0 + cfg.request_timeout_s
        first_deadline = min(deadline, time.monotonic() + cfg.first_token_timeout_s)
        try:
            await self._check_model(server)
        except CosmosReasonError as e:
            raise _TryNext(e, mark_down=False) from None
        resp = await self._open(server, fields, request, request_id, flight, first_deadline)
        if resp is _ABORTED:
            yield Chunk(finish_reason=FinishReason.CANCELLED, elapsed_s=time.monotonic() - t0)
            return
        deltas = Deltas(request.sampling.max_tokens, cfg.reasoning_output == "inline")

        def too_slow() -> tuple[float, CosmosReasonError]:
            """When the stream is due to end, and the error it then ends with."""
            if not deltas.started:
                return first_deadline, DeadlineExceededError(
                    f"{server.url} produced no token within first_token_timeout_s="
                    f"{cfg.first_token_timeout_s}")
            if deadline <= deltas.last_event + cfg.read_timeout_s:
                return deadline, DeadlineExceededError(
                    f"request ran past request_timeout_s={cfg.request_timeout_s} on {server.url}")
            return deltas.last_event + cfg.read_timeout_s, EngineUnavailableError(
                f"{server.url} stalled: no data for read_timeout_s={cfg.read_timeout_s}")

        flight.watch(resp.close, too_slow)
        parser, bytes_read, done = SSEParser(), 0, False
        try:
            try:
                while not done and not deltas.overran:
                    raw = await resp.content.readany()
                    if not raw:
                        break  # the end of the body
                    bytes_read += len(raw)
                    if bytes_read > deltas.bound.max_bytes:
                        deltas.overran = f"more than {deltas.bound.max_bytes} bytes"
                        break
                    started = deltas.started
                    for data in parser.feed(raw):
                        if data.strip() == "[DONE]":
                            done = True
                            break
                        try:
                            event = json.loads(data)
                        except ValueError:
                            continue  # a comment-like line some proxies send
                        if isinstance(event, dict) and "error" in event:
                            raise self._stream_error(event, server, deltas.started)
                        for chunk in deltas.add(event, t0):
                            yield chunk
                        if deltas.overran:
                            break
                    if not started and deltas.started:
                        flight.recheck()  # from now on silence counts, not the first token
            except (aiohttp.ClientError, OSError) as e:
                if not flight.aborted.is_set() and flight.expired is None:
                    error = EngineUnavailableError(f"{server.url} connection lost mid-stream: "
                                                   f"{type(e).__name__}")
                    if not deltas.started:
                        raise _TryNext(error, mark_down=True) from None
                    # Not marked down: behind a router, one backend failing mid-stream says
                    # nothing of the router; the health probe decides.
                    raise error from None
            if flight.aborted.is_set():
                yield Chunk(finish_reason=FinishReason.CANCELLED,
                            output_tokens=deltas.bound.deltas, elapsed_s=time.monotonic() - t0)
                return
            if flight.expired is not None:
                raise flight.expired
            if deltas.overran:
                # Close now, before the caller sees the end: the server aborts at once.
                resp.close()
                _LOG.warning("server overran max_tokens; stream closed: url=%s request_id=%s "
                             "max_tokens=%d read=%s tokens_at_least=%d", server.url, request_id,
                             request.sampling.max_tokens, deltas.overran, deltas.bound.tokens())
                # An answer the server had already finished stays as it ended.
                yield Chunk(finish_reason=deltas.finish or FinishReason.LENGTH,
                            output_tokens=deltas.bound.tokens(), elapsed_s=time.monotonic() - t0)
                return
            if deltas.finish is None:
                error = EngineUnavailableError(f"{server.url} closed the stream before the end "
                                               "(server gone?)")
                if not deltas.started:
                    raise _TryNext(error, mark_down=True)
                raise error
            _LOG.debug("request done: request_id=%s url=%s finish=%s seconds=%.3f", request_id,
                       server.url, deltas.finish.value, time.monotonic() - t0)
            yield deltas.final(t0)
        finally:
            # Closing (not releasing) drops the connection, which makes vLLM abort the request
            # when the caller stops early (generator closed, task cancelled, abort()).
            flight.unwatch()
            resp.close()

    def _stream_error(self, event: dict[str, Any], server: _Server,
                      started: bool) -> Exception:
        """Return the error that an error event inside a stream ends the request with."""
        err = event["error"] if isinstance(event["error"], dict) else {}
        code = err.get("code") if isinstance(err.get("code"), int) else 500
        error = self._status_error(code, json.dumps(event), server)
        if not started and (code >= 500 or code == 429):
            return _TryNext(error, mark_down=False,
                            retry_after_s=0.0 if code in _RETRIED_STATUSES else None)
        return EngineUnavailableError(error.message) if code >= 500 else error
