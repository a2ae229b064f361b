"""Run an ``Engine`` on its own asyncio loop thread and serve it to plain threads.

ROS callbacks run in executor threads and must never block the engine's event loop (nor run
coroutines themselves). ``EngineRunner`` owns one loop in a daemon thread and one engine;
``submit`` returns a ``RequestHandle`` whose chunks arrive through a bounded, thread-safe
buffer. A slow consumer never stalls the loop and never loses text: when the buffer is full,
new chunks are merged into the newest buffered one (text concatenated, counters updated).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import logging
import threading
import time
from collections.abc import Iterator

from cosmos_reason_ros.core.types import (
    ChatRequest,
    Chunk,
    CosmosReasonError,
    DeadlineExceededError,
    EngineError,
    EngineUnavailableError,
    FinishReason,
)
from cosmos_reason_ros.engines.base import Engine, EngineHealth, EngineState

_LOG = logging.getLogger(__name__)
_START_WAIT_SLICE_S = 0.1  # a signal waits at most this long for the main thread's handler


def _merge(older: Chunk, newer: Chunk) -> Chunk:
    """One chunk carrying both: concatenated deltas, the newer counters and finish reason."""
    return Chunk(
        text_delta=older.text_delta + newer.text_delta,
        reasoning_delta=older.reasoning_delta + newer.reasoning_delta,
        output_tokens=newer.output_tokens,
        finish_reason=newer.finish_reason or older.finish_reason,
        prompt_tokens=(newer.prompt_tokens if newer.prompt_tokens is not None
                       else older.prompt_tokens),
        cached_prompt_tokens=(newer.cached_prompt_tokens
                              if newer.cached_prompt_tokens is not None
                              else older.cached_prompt_tokens),
        elapsed_s=newer.elapsed_s,
    )


def _wait_in_slices(future: concurrent.futures.Future[object], timeout_s: float | None) -> None:
    """``future.result(timeout_s)`` in short waits, so the main thread handles signals meanwhile.

    A signal may be delivered to any thread of the process (DDS threads included) while Python
    runs its handler only in the main thread: one long wait there would hold the handler (and
    a Ctrl-C during an engine start) back until the wait ends.
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        remaining = None if deadline is None else deadline - time.monotonic()
        try:
            future.result(_START_WAIT_SLICE_S if remaining is None
                          else max(0.0, min(_START_WAIT_SLICE_S, remaining)))
            return
        except concurrent.futures.TimeoutError:
            if remaining is not None and remaining <= _START_WAIT_SLICE_S:
                raise


def as_package_error(exc: BaseException) -> CosmosReasonError:
    """Return ``exc`` if it is one of ours, else an ``EngineError`` with the original message."""
    if isinstance(exc, CosmosReasonError):
        return exc
    err = EngineError(f"{type(exc).__name__}: {exc}")
    err.__cause__ = exc
    return err


class RequestHandle:
    """The consumer side of one submitted request; all methods are thread-safe.

    Chunks arrive in order; the last one has ``finish_reason`` set (``CANCELLED`` after
    ``cancel()``). A failed request raises its ``CosmosReasonError`` from ``next_chunk`` /
    iteration instead of delivering a final chunk.
    """

    def __init__(self, request_id: str, max_buffered: int) -> None:
        self.request_id = request_id
        self._max_buffered = max(1, max_buffered)
        self._buffer: collections.deque[Chunk] = collections.deque()
        self._cond = threading.Condition()
        self._producer_done = False  # the final chunk or error has been buffered
        self._final_taken = False
        self._error: CosmosReasonError | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None  # touched only on the loop thread
        self._running_on_loop = False  # the driving coroutine has begun
        self._cancel_sent = False
        self._cancel_requested = False
        self._close_error: CosmosReasonError | None = None  # set when the runner closes
        self._coalesced = 0
        self._last: Chunk = Chunk()
        self._text_taken = False  # the first text chunk was returned (it times the first token)

    # --- producer side (event loop thread) ------------------------------------------------

    def _put(self, chunk: Chunk) -> None:
        with self._cond:
            if self._producer_done:
                return
            if len(self._buffer) >= self._max_buffered:
                self._buffer[-1] = _merge(self._buffer[-1], chunk)
                self._coalesced += 1
            else:
                self._buffer.append(chunk)
            self._last = chunk
            if chunk.finish_reason is not None:
                self._producer_done = True
            self._cond.notify_all()

    def _fail(self, error: CosmosReasonError) -> None:
        with self._cond:
            if self._producer_done:
                return
            self._error = error
            self._producer_done = True
            self._cond.notify_all()

    # --- consumer side (any thread) -------------------------------------------------------

    @property
    def done(self) -> bool:
        """True once the request has ended (final chunk or error produced), read or not."""
        with self._cond:
            return self._producer_done

    def wait_done(self, timeout_s: float | None = None) -> bool:
        """Wait until the request has ended (without consuming chunks); return ``done``."""
        with self._cond:
            return self._cond.wait_for(lambda: self._producer_done, timeout_s)

    @property
    def cancel_requested(self) -> bool:
        """True once ``cancel()`` was called."""
        return self._cancel_requested

    @property
    def coalesced_chunks(self) -> int:
        """How many chunks were merged into earlier ones because the consumer lagged."""
        return self._coalesced

    def next_chunk(self, timeout_s: float | None = None) -> Chunk | None:
        """Return the next chunk, waiting at most ``timeout_s`` (``None``: forever).

        Returns ``None`` when nothing arrived in time (the request is still running), and
        immediately once the final chunk has been returned. Raises the request's
        ``CosmosReasonError`` if it failed.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while True:
                if self._buffer:
                    chunk = self._buffer.popleft()
                    # A consumer that fell behind takes the rest in one step: with 50 streams
                    # on a starved machine, a wake-up per token kept the goal threads busy
                    # behind the cancels. The first text stays apart: it times the first token.
                    if self._text_taken:
                        while self._buffer:
                            chunk = _merge(chunk, self._buffer.popleft())
                    self._text_taken |= bool(chunk.text_delta or chunk.reasoning_delta)
                    if chunk.finish_reason is not None:
                        self._final_taken = True
                    return chunk
                if self._error is not None:
                    raise self._error
                if self._final_taken:
                    return None
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._cond.wait(remaining)

    def iter_chunks(self, timeout_s: float | None = None) -> Iterator[Chunk]:
        """Yield chunks up to and including the final one.

        ``timeout_s`` bounds the wait for each chunk; past it the request is cancelled and
        ``DeadlineExceededError`` is raised.
        """
        while True:
            chunk = self.next_chunk(timeout_s)
            if chunk is None:
                if self._final_taken:
                    return
                self.cancel()
                raise DeadlineExceededError(
                    f"request {self.request_id!r}: no output for {timeout_s:.1f} s; cancelled"
                )
            yield chunk
            if chunk.finish_reason is not None:
                return

    def __iter__(self) -> Iterator[Chunk]:
        """Iterate over chunks without a time limit (see ``iter_chunks``)."""
        return self.iter_chunks(None)

    def collect(self, timeout_s: float | None = None) -> tuple[str, Chunk]:
        """Wait for the end; return the whole text and the final chunk.

        ``timeout_s`` bounds the total wait; past it the request is cancelled and
        ``DeadlineExceededError`` is raised.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        parts: list[str] = []
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            chunk = self.next_chunk(remaining)
            if chunk is None:
                if self._final_taken:
                    raise RuntimeError(f"request {self.request_id!r} was already consumed")
                self.cancel()
                raise DeadlineExceededError(
                    f"request {self.request_id!r} did not finish within {timeout_s:.1f} s; "
                    f"cancelled"
                )
            parts.append(chunk.text_delta)
            if chunk.finish_reason is not None:
                return "".join(parts), chunk

    def cancel(self) -> None:
        """Abort the request in the engine; the stream then ends with a CANCELLED chunk.

        Idempotent, non-blocking, and a no-op once the request has ended.
        """
        self._cancel_requested = True
        loop = self._loop
        if loop is not None and not self.done and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._cancel_on_loop)
            except RuntimeError:  # loop closed meanwhile: the runner ended the request
                pass

    def _cancel_on_loop(self) -> None:
        # Cancelling the task closes the engine's stream, which aborts the request there.
        # A task that has not begun would be cancelled before its first line; it checks
        # the flag on entry instead.
        task = self._task
        if task is not None and self._running_on_loop and not task.done() \
                and not self._cancel_sent:
            self._cancel_sent = True  # once: a second cancel would interrupt the abort
            task.cancel()

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        # Safety net: the consumer must always get an ending, whatever happened to the task.
        if self.done:
            return
        if self._close_error is not None:
            self._fail(self._close_error)
        elif self._cancel_requested:
            self._put(Chunk(output_tokens=self._last.output_tokens,
                            finish_reason=FinishReason.CANCELLED,
                            elapsed_s=self._last.elapsed_s))
        else:
            self._fail(EngineError(f"request {self.request_id!r} ended without a result"))


class EngineRunner:
    """Owns an engine and the asyncio loop thread it runs on; thread-safe facade.

    ``max_buffered_chunks`` bounds each request's chunk buffer; beyond it chunks are merged,
    never dropped and never blocking the loop.
    """

    def __init__(self, engine: Engine, max_buffered_chunks: int = 64) -> None:
        self._engine = engine
        self._max_buffered = max_buffered_chunks
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._handles: dict[int, RequestHandle] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # touched only on the loop thread
        self._started = False
        self._closed = False
        self._last_health = EngineHealth(EngineState.STOPPED, engine.model_name)

    @property
    def engine(self) -> Engine:
        """The engine (its coroutines must only run on this runner's loop)."""
        return self._engine

    @property
    def model_name(self) -> str:
        """The engine's model name."""
        return self._engine.model_name

    @property
    def running_requests(self) -> int:
        """Submitted requests that have not ended yet."""
        with self._lock:
            return sum(1 for h in self._handles.values() if not h.done)

    # --- lifecycle ------------------------------------------------------------------------

    def start(self, timeout_s: float | None = None, *,
              usable_if_unavailable: bool = False) -> None:
        """Start the loop thread and the engine; raise the engine's start error.

        On timeout the start is cancelled and ``EngineUnavailableError`` is raised. With
        ``usable_if_unavailable`` an engine that reports itself unavailable (a remote server
        that is down; it keeps checking in the background) still gets health queries and
        requests, so it is used as soon as it comes up; its requests fail fast until then.
        """
        with self._lock:
            if self._closed:
                raise EngineUnavailableError("engine runner is closed")
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(
                    target=self._run_loop, name=f"engine-{self.model_name}", daemon=True
                )
                self._thread.start()
        self._last_health = EngineHealth(EngineState.STARTING, self.model_name)
        future = asyncio.run_coroutine_threadsafe(self._engine.start(), self._loop)
        try:
            _wait_in_slices(future, timeout_s)
        except concurrent.futures.TimeoutError as exc:
            future.cancel()
            self._last_health = EngineHealth(EngineState.UNAVAILABLE, self.model_name,
                                             detail="start timed out")
            raise EngineUnavailableError(
                f"engine {self.model_name!r} did not start within {timeout_s} s"
            ) from exc
        except concurrent.futures.CancelledError as exc:
            raise EngineUnavailableError(f"engine {self.model_name!r} start was cancelled") \
                from exc
        except Exception as exc:  # noqa: BLE001 - re-raised as the package's error
            self._last_health = EngineHealth(EngineState.UNAVAILABLE, self.model_name,
                                             detail=str(exc))
            error = as_package_error(exc)
            if usable_if_unavailable and isinstance(error, EngineUnavailableError):
                self._started = True
            if error is exc:
                raise
            raise error from exc
        self._started = True
        self._last_health = EngineHealth(EngineState.READY, self.model_name)
        _LOG.info("engine runner started model=%s", self.model_name)

    def _run_loop(self) -> None:
        loop = self._loop
        assert loop is not None
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            try:
                pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
                for task in pending:
                    task.cancel()
                if pending:
                    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()

    def close(self, timeout_s: float = 30.0) -> None:
        """Cancel every request, close the engine, stop the loop and join its thread.

        Idempotent; requests still running end with ``EngineUnavailableError``.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            loop, thread = self._loop, self._thread
            handles = list(self._handles.values())
        deadline = time.monotonic() + timeout_s
        closed_error = EngineUnavailableError("engine runner closed while the request ran")
        for handle in handles:
            handle._close_error = closed_error
            handle.cancel()
        if loop is not None and loop.is_running():
            future = asyncio.run_coroutine_threadsafe(self._close_engine(), loop)
            try:
                future.result(max(0.0, deadline - time.monotonic()))
            except Exception as exc:  # noqa: BLE001 - closing anyway; log and go on
                _LOG.warning("engine close failed model=%s: %s", self.model_name, exc)
            loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                _LOG.warning("engine loop thread did not stop within %.1f s", timeout_s)
        for handle in handles:  # any stream that never got to run still ends
            handle._fail(closed_error)
        self._last_health = EngineHealth(EngineState.CLOSED, self.model_name)
        _LOG.info("engine runner closed model=%s", self.model_name)

    async def _close_engine(self) -> None:
        tasks = [t for t in self._tasks if not t.done()]
        if tasks:  # close() cancelled them; let their aborts finish first
            await asyncio.wait(tasks, timeout=5.0)
        await self._engine.close()

    def __enter__(self) -> EngineRunner:
        """Use as a context manager: ``close()`` on exit (``start()`` is explicit)."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the runner."""
        self.close()

    # --- requests -------------------------------------------------------------------------

    def submit(self, request: ChatRequest) -> RequestHandle:
        """Start streaming ``request`` on the engine; returns at once with its handle."""
        with self._lock:
            if self._closed:
                raise EngineUnavailableError(
                    f"engine runner is closed; cannot run request {request.request_id!r}"
                )
            if not self._started or self._loop is None:
                raise EngineUnavailableError(
                    f"engine not started; cannot run request {request.request_id!r}"
                )
            handle = RequestHandle(request.request_id, self._max_buffered)
            handle._loop = self._loop
            self._handles[id(handle)] = handle
            self._loop.call_soon_threadsafe(self._spawn, request, handle)
        return handle

    def _spawn(self, request: ChatRequest, handle: RequestHandle) -> None:
        """Create the driving task (runs on the loop, in submission order)."""
        task = asyncio.get_running_loop().create_task(self._drive(request, handle))
        handle._task = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(handle._on_task_done)

    async def _drive(self, request: ChatRequest, handle: RequestHandle) -> None:
        """Pump the engine's stream into the handle's buffer (runs on the loop)."""
        handle._running_on_loop = True
        try:
            if handle._cancel_requested or handle._close_error is not None:
                return  # cancelled before it began; _on_task_done ends the stream
            stream = self._engine.stream(request)
            try:
                async for chunk in stream:
                    handle._put(chunk)
                    if chunk.finish_reason is not None:
                        break
                else:
                    handle._fail(EngineError(
                        f"engine {self.model_name!r} ended request {request.request_id!r} "
                        f"without a finish reason"
                    ))
            except asyncio.CancelledError:
                await self._abort_quietly(stream, request.request_id)
            except Exception as exc:  # noqa: BLE001 - delivered to the consumer thread
                handle._fail(as_package_error(exc))
        finally:
            with self._lock:
                self._handles.pop(id(handle), None)

    async def _abort_quietly(self, stream: object, request_id: str) -> None:
        """Close the stream (its contract aborts the request) and abort by id as well."""
        aclose = getattr(stream, "aclose", None)
        try:
            if aclose is not None:
                await aclose()
            await self._engine.abort(request_id)
        except Exception as exc:  # noqa: BLE001 - best effort; the engine logs its own
            _LOG.debug("abort request_id=%s failed: %s", request_id, exc)

    # --- health ---------------------------------------------------------------------------

    def health(self, timeout_s: float = 1.0) -> EngineHealth:
        """Return a snapshot for diagnostics; never raises.

        Taken on the engine's loop, after the work queued there: a request whose last chunk
        was delivered is no longer counted. While the loop is busy (e.g. loading the model)
        the last known state is returned with a note in ``detail``.
        """
        loop = self._loop
        if self._closed or loop is None or not self._started or not loop.is_running():
            return self._with_running(self._last_health)

        async def on_loop() -> EngineHealth:
            return self._engine.health()

        future = asyncio.run_coroutine_threadsafe(on_loop(), loop)
        try:
            health = future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            last = self._last_health
            return self._with_running(EngineHealth(
                last.state, last.model, detail=f"engine loop busy for > {timeout_s} s"))
        except Exception as exc:  # noqa: BLE001 - health never raises
            return self._with_running(EngineHealth(
                EngineState.UNAVAILABLE, self.model_name, detail=f"health failed: {exc}"))
        self._last_health = health
        return self._with_running(health)

    def health_now(self) -> EngineHealth:
        """Return the engine's state for a goal's admission, read on this thread; never raises.

        Not ordered after the loop's work (its request counts may lag by a step), so it never
        waits: through the loop, admission waited behind the loop's work (streaming other
        goals) for every goal -- 14 ms p50, 57 ms p95 with the loop working in 2 ms steps
        (docs/PERFORMANCE.md, "Profiles and what they show").
        """
        loop = self._loop
        if self._closed or loop is None or not self._started or not loop.is_running():
            return self._last_health
        try:
            return self._engine.health()
        except Exception as exc:  # noqa: BLE001 - health never raises
            return EngineHealth(EngineState.UNAVAILABLE, self.model_name,
                                detail=f"health failed: {exc}")

    def _with_running(self, health: EngineHealth) -> EngineHealth:
        return dataclasses.replace(health, running_requests=max(self.running_requests,
                                                                health.running_requests))
