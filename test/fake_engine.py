"""A scripted engine for the fast test tier: deterministic deltas, delays, errors, aborts.

It implements the real ``engines.base.Engine`` interface and runs on the real
``EngineRunner`` loop, so everything above the engine (runner, pipeline, node, action server,
DDS) is the real code. Each request is answered by ``script(request)`` -> a ``Script``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from cosmos_reason_ros.core.types import (
    ChatRequest,
    Chunk,
    CosmosReasonError,
    FinishReason,
)
from cosmos_reason_ros.engines.base import Engine, EngineHealth, EngineState


@dataclass
class Script:
    """How the engine answers one request."""

    deltas: list[str] = field(default_factory=lambda: ["ok"])
    delay_s: float = 0.0  # before each delta
    first_delay_s: float = 0.0  # before the first delta (time to first token)
    error: CosmosReasonError | None = None  # raised after the deltas
    finish: FinishReason = FinishReason.STOP
    endless: bool = False  # repeat the last delta until aborted
    prompt_tokens: int = 10
    reasoning: bool = False  # deltas in the reasoning channel (a server's reasoning parser)


# Answers of the shape each task's prompt asks for (what the real model gives under
# constrained decoding), keyed by a phrase of the task's template in core/tasks.py.
TASK_ANSWERS: tuple[tuple[str, str], ...] = (
    ("Locate the bounding box", '[{"bbox_2d": [100, 150, 400, 700], "label": "red cup"}]'),
    ("Point to", '[{"point_2d": [250, 400], "label": "red cup"}]'),
    ("2D trajectory", '[{"point_2d": [100, 200], "label": "gripper trajectory"}, '
                      '{"point_2d": [300, 400], "label": "gripper trajectory"}]'),
    ("Answer yes or no", '{"answer": "yes", "reason": "The part is in the gripper."}'),
    ("How many", '{"count": 1}'),
)


def request_text(request: ChatRequest) -> str:
    """All text of a request's messages."""
    return "\n".join(part.text for message in request.messages for part in message.content)


def task_answer(request: ChatRequest, text: str = "A table with a cup.") -> str:
    """The answer a well-behaved model gives ``request``'s task (``text`` for free text)."""
    asked = request_text(request)
    return next((answer for phrase, answer in TASK_ANSWERS if phrase in asked), text)


def answers_the_task(request: ChatRequest) -> Script:
    """A script answering each task in its own shape (see ``task_answer``)."""
    return Script(deltas=[task_answer(request)])


class FakeEngine(Engine):
    """Answers each request per ``script``; records requests and aborts."""

    def __init__(self, script: Callable[[ChatRequest], Script] | None = None,
                 model: str = "fake-model", start_error: CosmosReasonError | None = None,
                 fatal: bool = True) -> None:
        self.script = script or (lambda _r: Script())
        self.model = model
        self.start_error = start_error
        self.fatal = fatal
        self.state = EngineState.STOPPED
        self.requests: list[ChatRequest] = []
        self.aborted: list[str] = []
        self.running: set[str] = set()
        self.lock = threading.Lock()

    @property
    def model_name(self) -> str:
        return self.model

    @property
    def start_failure_is_fatal(self) -> bool:
        return self.fatal

    async def start(self) -> None:
        if self.start_error is not None:
            self.state = EngineState.UNAVAILABLE
            raise self.start_error
        self.state = EngineState.READY

    async def stream(self, request: ChatRequest) -> AsyncIterator[Chunk]:
        with self.lock:
            self.requests.append(request)
            self.running.add(request.request_id)
        script = self.script(request)
        tokens = 0
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        try:
            if script.first_delay_s:
                await asyncio.sleep(script.first_delay_s)
            deltas = list(script.deltas)
            i = 0
            while i < len(deltas) or script.endless:
                delta = deltas[min(i, len(deltas) - 1)] if deltas else "x"
                if script.delay_s:
                    await asyncio.sleep(script.delay_s)
                else:
                    await asyncio.sleep(0)
                tokens += 1
                i += 1
                channel = "reasoning_delta" if script.reasoning else "text_delta"
                yield Chunk(**{channel: delta}, output_tokens=tokens,
                            elapsed_s=loop.time() - t0)
                if tokens >= request.sampling.max_tokens:
                    yield Chunk(output_tokens=tokens, finish_reason=FinishReason.LENGTH,
                                prompt_tokens=script.prompt_tokens, elapsed_s=loop.time() - t0)
                    return
            if script.error is not None:
                raise script.error
            yield Chunk(output_tokens=tokens, finish_reason=script.finish,
                        prompt_tokens=script.prompt_tokens, elapsed_s=loop.time() - t0)
        except (asyncio.CancelledError, GeneratorExit):
            # The runner aborts by cancelling the consuming task / closing the stream.
            with self.lock:
                if request.request_id not in self.aborted:
                    self.aborted.append(request.request_id)
            raise
        finally:
            with self.lock:
                self.running.discard(request.request_id)

    async def abort(self, request_id: str) -> None:
        with self.lock:  # the runner closes the stream and aborts by id: count once
            if request_id not in self.aborted:
                self.aborted.append(request_id)

    async def health(self) -> EngineHealth:
        with self.lock:
            running = len(self.running)
        return EngineHealth(self.state, self.model, running_requests=running)

    async def close(self) -> None:
        self.state = EngineState.CLOSED
