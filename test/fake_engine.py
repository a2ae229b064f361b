"""A scripted engine for the fast test tier: deterministic deltas, delays, errors, aborts.

It implements the real ``engines.base.Engine`` interface and runs on the real
``EngineRunner`` loop, so everything above the engine (runner, pipeline, node, action server,
DDS) is the real code. Each request is answered by ``script(request)`` -> a ``Script``.

A ``Gate`` arranges "a goal is generating when X happens" instead of racing it: a gated stream
yields its first delta(s) and then holds until the test releases the gate (the rest follows)
or fails it (the stream raises the given engine error there). ``FakeEngine.wait_generating``
waits until requests have yielded a delta and still run (a gated one holds at its gate).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from cosmos_reason_ros.core.types import (
    ChatRequest,
    Chunk,
    CosmosReasonError,
    EngineUnavailableError,
    FinishReason,
)
from cosmos_reason_ros.engines.base import Engine, EngineHealth, EngineState


class Gate:
    """Holds gated streams after their first ``after`` deltas until ``release`` or ``fail``.

    One gate may hold many requests (a script can return the same gate for each); ``release``
    and ``fail`` act on those held and on any that reach it later. Thread-safe: the test's
    thread commands it, the engine's event loop waits on it.
    """

    def __init__(self, after: int = 1) -> None:
        self.after = after  # deltas a stream yields before it holds
        self.held: list[str] = []  # ids of the requests that reached the gate, in order
        self._error: CosmosReasonError | None = None
        self._open = False
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self._cond = threading.Condition()

    def release(self) -> None:
        """Let held streams (and later ones) go on with their remaining deltas."""
        self._open_with(None)

    def fail(self, error: CosmosReasonError) -> None:
        """Make held streams (and later ones) raise ``error`` where they hold."""
        self._open_with(error)

    def _open_with(self, error: CosmosReasonError | None) -> None:
        with self._cond:
            self._error, self._open = error, True
            waiters, self._waiters = self._waiters, []
        for loop, event in waiters:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # that loop has closed: its stream is gone
                pass

    def wait_held(self, count: int = 1, timeout_s: float = 10.0) -> list[str]:
        """Wait until ``count`` requests reached the gate; return their ids."""
        with self._cond:
            ok = self._cond.wait_for(lambda: len(self.held) >= count, timeout_s)
            assert ok, f"{len(self.held)} of {count} request(s) reached the gate " \
                       f"within {timeout_s:g} s"
            return list(self.held)

    async def hold(self, request_id: str) -> None:
        """Wait (on the engine's loop) until the gate opens; raise its error if it failed."""
        event = asyncio.Event()
        with self._cond:
            self.held.append(request_id)
            self._cond.notify_all()
            if self._open:
                event.set()
            else:
                self._waiters.append((asyncio.get_running_loop(), event))
        await event.wait()  # cancelled here when the runner aborts the request
        if self._error is not None:
            raise self._error


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
    gate: Gate | None = None  # hold after the gate's first deltas until released or failed


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
        self.detail = ""  # health's detail
        self.problems: tuple[str, ...] = ()  # health's problems
        self.requests: list[ChatRequest] = []
        self.aborted: list[str] = []
        self.running: set[str] = set()
        self.generated: list[str] = []  # ids of the requests that yielded a delta, in order
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)  # requests, running, generated, aborted
        self.warm_up_session_key = ""

    @property
    def model_name(self) -> str:
        return self.model

    def route_warm_up_as(self, session_key: str) -> None:
        self.warm_up_session_key = session_key

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
            self.changed.notify_all()
        script = self.script(request)
        tokens = 0
        finished = False  # the finishing chunk is out
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
                if tokens == 1:
                    with self.lock:
                        self.generated.append(request.request_id)
                        self.changed.notify_all()
                if script.gate is not None and tokens == script.gate.after:
                    await script.gate.hold(request.request_id)
                if tokens >= request.sampling.max_tokens:
                    finished = self._finished(request.request_id)
                    yield Chunk(output_tokens=tokens, finish_reason=FinishReason.LENGTH,
                                prompt_tokens=script.prompt_tokens, elapsed_s=loop.time() - t0)
                    return
            if script.error is not None:
                raise script.error
            finished = self._finished(request.request_id)
            yield Chunk(output_tokens=tokens, finish_reason=script.finish,
                        prompt_tokens=script.prompt_tokens, elapsed_s=loop.time() - t0)
        except (asyncio.CancelledError, GeneratorExit):
            # The runner aborts by cancelling the consuming task / closing the stream. A
            # stream closed after its finishing chunk (the runner stops reading there) ended.
            with self.lock:
                if not finished and request.request_id not in self.aborted:
                    self.aborted.append(request.request_id)
                    self.changed.notify_all()
            raise
        finally:
            with self.lock:
                self.running.discard(request.request_id)
                self.changed.notify_all()

    def _finished(self, request_id: str) -> bool:
        """A stream's finishing chunk goes out: the request no longer runs (the runner stops
        reading there and leaves the stream to be closed later)."""
        with self.lock:
            self.running.discard(request_id)
            self.changed.notify_all()
        return True

    async def abort(self, request_id: str) -> None:
        with self.lock:  # the runner closes the stream and aborts by id: count once
            if request_id not in self.aborted:
                self.aborted.append(request_id)
                self.changed.notify_all()

    def wait_for(self, condition: Callable[[FakeEngine], Any], timeout_s: float,
                 what: str) -> Any:
        """Wait until ``condition(self)`` holds (read under the lock); return its value.

        Woken by every change to ``requests``, ``running``, ``generated`` and ``aborted``.
        """
        with self.changed:
            value = self.changed.wait_for(lambda: condition(self), timeout_s)
            assert value, f"{what}: not within {timeout_s:g} s"
            return value

    def wait_generating(self, count: int = 1, timeout_s: float = 10.0) -> list[str]:
        """Wait until ``count`` requests have yielded a delta and still run; return their ids
        (in the order of their first deltas)."""
        def generating(engine: FakeEngine) -> list[str] | None:
            ids = [r for r in engine.generated if r in engine.running]
            return ids[:count] if len(ids) >= count else None

        return self.wait_for(generating, timeout_s, f"{count} request(s) generating")

    def health(self) -> EngineHealth:
        with self.lock:
            running = len(self.running)
        return EngineHealth(self.state, self.model, running_requests=running, detail=self.detail,
                            problems=self.problems)

    def core_died(self, request_id: str) -> EngineUnavailableError:
        """What the local vLLM engine does when its engine core dies under ``request_id``
        (``VllmLocalEngine._map_error`` on vLLM's ``EngineDeadError``): it turns unavailable
        for good and the request raises the error returned here (for ``Gate.fail``)."""
        self.state, self.detail = EngineState.UNAVAILABLE, "vllm engine core is dead"
        return EngineUnavailableError(
            f"vllm engine core died serving {request_id!r}: EngineDeadError: EngineCore "
            f"encountered an issue. See stack trace (above) for the root cause.")

    async def close(self) -> None:
        self.state = EngineState.CLOSED
