"""EngineRunner: thread-safe streaming, cancel, errors, back-pressure and shutdown.

A small fake Engine keeps these tests fast and deterministic; the same runner drives the real
vLLM engine in test_vllm_local.py.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import pytest
from waiting import NEVER_S, async_wait_until

from cosmos_reason_ros.core.types import (
    BadRequestError,
    ChatRequest,
    Chunk,
    ContentPart,
    DeadlineExceededError,
    EngineError,
    EngineUnavailableError,
    FinishReason,
    Message,
    PromptTooLongError,
    Sampling,
)
from cosmos_reason_ros.engines.base import Engine, EngineHealth, EngineState
from cosmos_reason_ros.engines.runner import EngineRunner

WAIT_S = NEVER_S  # a wait that runs out means the event never happened


class FakeEngine(Engine):
    """Streams the words of the prompt; behaviour is steered by the prompt text.

    ``hold`` makes a stream wait (after its first chunk) until ``release()``; ``fail:<kind>``
    raises; ``many:<n>`` streams n one-character chunks as fast as possible.
    """

    def __init__(self, start_error: BaseException | None = None,
                 start_gate: threading.Event | None = None) -> None:
        self.start_error = start_error
        self.start_gate = start_gate
        self.loop_threads: set[int] = set()
        self.started = False
        self.closed = 0
        self.aborted: list[str] = []
        self.stream_closed: list[str] = []  # streams whose generator exited unfinished
        self.running: set[str] = set()
        self._release: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.first_chunk_sent = threading.Event()

    @property
    def model_name(self) -> str:
        return "fake"

    async def start(self) -> None:
        self.loop_threads.add(threading.get_ident())
        self._loop = asyncio.get_running_loop()
        self._release = asyncio.Event()
        if self.start_gate is not None:
            # "Loading" until the test opens the gate, the loop free for other calls meanwhile.
            await async_wait_until(self.start_gate.is_set, WAIT_S, "the start gate opened")
        if self.start_error is not None:
            raise self.start_error
        self.started = True

    def release(self) -> None:
        assert self._loop is not None and self._release is not None
        self._loop.call_soon_threadsafe(self._release.set)

    async def stream(self, request: ChatRequest) -> AsyncIterator[Chunk]:
        self.loop_threads.add(threading.get_ident())
        text = request.messages[-1].content[-1].text
        rid = request.request_id
        self.running.add(rid)
        finished = False
        try:
            if text.startswith("fail:"):
                kind = text.split(":", 1)[1]
                yield Chunk(text_delta="partial ", output_tokens=1)
                if kind == "too_long":
                    raise PromptTooLongError("prompt is 5000 tokens, max_model_len is 4096")
                if kind == "bad":
                    raise BadRequestError("json_schema is not an object")
                raise RuntimeError("CUDA error: device-side assert triggered")
            if text.startswith("many:"):
                n = int(text.split(":", 1)[1])
                for i in range(n):
                    yield Chunk(text_delta=str(i % 10), output_tokens=i + 1)
                finished = True
                yield Chunk(output_tokens=n, finish_reason=FinishReason.STOP, prompt_tokens=3)
                return
            if text == "no_finish":
                yield Chunk(text_delta="x", output_tokens=1)
                finished = True
                return
            words = text.split()
            for i, word in enumerate(words):
                yield Chunk(text_delta=word + " ", output_tokens=i + 1, elapsed_s=0.01 * i)
                self.first_chunk_sent.set()
                if "hold" in words:
                    assert self._release is not None
                    await self._release.wait()
            finished = True
            yield Chunk(output_tokens=len(words), finish_reason=FinishReason.STOP,
                        prompt_tokens=7, cached_prompt_tokens=2)
        finally:
            self.running.discard(rid)
            if not finished:
                self.stream_closed.append(rid)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def health(self) -> EngineHealth:
        state = EngineState.READY if self.started else EngineState.STOPPED
        return EngineHealth(state, "fake", running_requests=len(self.running))

    async def close(self) -> None:
        self.closed += 1


def request(text: str, rid: str = "r1") -> ChatRequest:
    return ChatRequest(request_id=rid,
                       messages=(Message("user", (ContentPart("text", text),)),),
                       sampling=Sampling(max_tokens=16))


@pytest.fixture
def fake() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def runner(fake: FakeEngine):
    r = EngineRunner(fake, max_buffered_chunks=8)
    r.start(timeout_s=WAIT_S)
    yield r
    r.close(timeout_s=WAIT_S)


def test_streams_chunks_in_order_and_runs_engine_on_its_own_thread(runner, fake):
    handle = runner.submit(request("is the aisle blocked"))
    chunks = list(handle.iter_chunks(timeout_s=WAIT_S))
    assert "".join(c.text_delta for c in chunks) == "is the aisle blocked "
    # In order; chunks that arrived while the consumer was busy come merged (never the first).
    counts = [c.output_tokens for c in chunks]
    assert counts[0] == 1 and counts[-1] == 4 and counts == sorted(counts)
    final = chunks[-1]
    assert final.finish_reason is FinishReason.STOP
    assert (final.prompt_tokens, final.cached_prompt_tokens) == (7, 2)
    assert handle.done
    assert handle.next_chunk(timeout_s=0) is None  # after the end: None at once
    assert fake.loop_threads and threading.get_ident() not in fake.loop_threads
    assert len(fake.loop_threads) == 1


def test_a_lagging_consumer_gets_the_first_text_alone_then_the_rest_in_one_chunk(runner):
    handle = runner.submit(request("is the aisle blocked"))
    assert handle.wait_done(WAIT_S)  # everything is buffered: the consumer lags
    first, rest = handle.next_chunk(0), handle.next_chunk(0)
    assert (first.text_delta, first.output_tokens) == ("is ", 1)  # times the first token
    assert (rest.text_delta, rest.output_tokens) == ("the aisle blocked ", 4)
    assert rest.finish_reason is FinishReason.STOP and handle.next_chunk(0) is None


def test_collect_returns_text_and_final_chunk(runner):
    text, final = runner.submit(request("pick the red cup")).collect(timeout_s=WAIT_S)
    assert text == "pick the red cup "
    assert final.finish_reason is FinishReason.STOP


def test_next_chunk_times_out_with_none_while_running(runner, fake):
    handle = runner.submit(request("hold on please"))
    assert handle.next_chunk(timeout_s=WAIT_S).text_delta == "hold "
    assert handle.next_chunk(timeout_s=0.05) is None  # still running, nothing new
    assert not handle.done
    assert runner.running_requests == 1
    fake.release()
    text, final = handle.collect(timeout_s=WAIT_S)
    assert text == "on please " and final.finish_reason is FinishReason.STOP
    assert runner.running_requests == 0


def test_cancel_mid_stream_aborts_engine_request(runner, fake):
    handle = runner.submit(request("hold this thought", rid="goal-7"))
    assert handle.next_chunk(timeout_s=WAIT_S).text_delta == "hold "
    handle.cancel()
    handle.cancel()  # idempotent
    final = handle.next_chunk(timeout_s=WAIT_S)
    assert final is not None and final.finish_reason is FinishReason.CANCELLED
    assert final.output_tokens == 1  # tokens generated before the cancel are reported
    assert handle.done and handle.cancel_requested
    assert fake.stream_closed == ["goal-7"]  # the engine's generator was closed early
    assert "goal-7" in fake.aborted
    assert not fake.running
    assert runner.running_requests == 0


def test_cancel_right_after_submit_still_ends_the_stream(runner, fake):
    handles = []
    for i in range(20):
        h = runner.submit(request("hold it", rid=f"c{i}"))
        h.cancel()
        handles.append(h)
    for h in handles:
        chunks = list(h.iter_chunks(timeout_s=WAIT_S))
        assert chunks[-1].finish_reason is FinishReason.CANCELLED
    assert not fake.running
    assert runner.running_requests == 0


@pytest.mark.parametrize(
    ("kind", "error", "message"),
    [
        ("too_long", PromptTooLongError, "max_model_len is 4096"),
        ("bad", BadRequestError, "json_schema"),
        ("crash", EngineError, "RuntimeError: CUDA error: device-side assert triggered"),
    ],
)
def test_engine_errors_reach_consumer_thread_as_package_errors(runner, kind, error, message):
    handle = runner.submit(request(f"fail:{kind}"))
    assert handle.next_chunk(timeout_s=WAIT_S).text_delta == "partial "
    with pytest.raises(error, match=message) as info:
        handle.next_chunk(timeout_s=WAIT_S)
    assert type(info.value) is error
    with pytest.raises(error):  # keeps raising: no silent end
        list(handle)
    assert handle.done


def test_stream_without_finish_reason_is_an_engine_error(runner):
    handle = runner.submit(request("no_finish"))
    with pytest.raises(EngineError, match="without a finish reason"):
        handle.collect(timeout_s=WAIT_S)


def test_slow_consumer_gets_all_text_through_bounded_buffer(runner):
    n = 2000
    handle = runner.submit(request(f"many:{n}"))
    # The producer must finish although nobody reads: the loop is never blocked.
    assert handle.wait_done(WAIT_S)
    chunks = list(handle.iter_chunks(timeout_s=WAIT_S))
    assert len(chunks) <= 8  # bounded
    assert handle.coalesced_chunks >= n - 8
    assert "".join(c.text_delta for c in chunks) == "".join(str(i % 10) for i in range(n))
    assert chunks[-1].finish_reason is FinishReason.STOP
    assert chunks[-1].output_tokens == n and chunks[-1].prompt_tokens == 3


def test_iter_chunks_deadline_cancels_request(runner, fake):
    handle = runner.submit(request("hold forever", rid="slow"))
    with pytest.raises(DeadlineExceededError, match="slow"):
        list(handle.iter_chunks(timeout_s=0.2))
    final = handle.next_chunk(timeout_s=WAIT_S)
    assert final is not None and final.finish_reason is FinishReason.CANCELLED
    assert "slow" in fake.aborted


def test_submissions_from_many_threads_all_finish(runner):
    results: dict[int, str] = {}
    errors: list[BaseException] = []

    def goal(i: int) -> None:
        try:
            text, _ = runner.submit(request(f"goal number {i}", rid=f"g{i}")).collect(WAIT_S)
            results[i] = text
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=goal, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert not errors
    assert results == {i: f"goal number {i} " for i in range(16)}


def test_health_reports_state_and_running_requests(runner, fake):
    h = runner.health()
    assert (h.state, h.model, h.running_requests) == (EngineState.READY, "fake", 0)
    handle = runner.submit(request("hold still"))
    handle.next_chunk(timeout_s=WAIT_S)
    assert runner.health().running_requests == 1
    fake.release()
    handle.collect(WAIT_S)
    runner.close()
    assert runner.health().state is EngineState.CLOSED


def test_admission_reads_health_without_waiting_for_a_busy_loop(runner, fake):
    # The loop is held inside a callback (as by a long step of output processing): health()
    # cannot be taken on it and says so with the last state it knew; health_now() reads the
    # engine's state as it is now.
    entered, held = threading.Event(), threading.Event()

    def hold_the_loop() -> None:
        entered.set()
        held.wait(WAIT_S)

    runner._loop.call_soon_threadsafe(hold_the_loop)
    try:
        assert entered.wait(WAIT_S)
        fake.started = False  # the engine's state changes while the loop is held
        assert runner.health_now().state is EngineState.STOPPED
        busy = runner.health(timeout_s=0.2)
        assert busy.state is EngineState.READY and "engine loop busy" in busy.detail
    finally:
        held.set()


def test_close_ends_running_requests_and_is_idempotent(fake):
    runner = EngineRunner(fake)
    runner.start(timeout_s=WAIT_S)
    handle = runner.submit(request("hold until closed", rid="late"))
    assert handle.next_chunk(timeout_s=WAIT_S) is not None
    thread = runner._thread
    runner.close(timeout_s=WAIT_S)
    runner.close(timeout_s=WAIT_S)
    assert fake.closed == 1
    assert thread is not None and not thread.is_alive()
    with pytest.raises(EngineUnavailableError, match="closed"):
        handle.collect(timeout_s=WAIT_S)
    assert "late" in fake.aborted and not fake.running
    with pytest.raises(EngineUnavailableError, match="closed"):
        runner.submit(request("too late"))


def test_submit_before_start_is_refused(fake):
    runner = EngineRunner(fake)
    with pytest.raises(EngineUnavailableError, match="not started"):
        runner.submit(request("hello"))
    assert runner.health().state is EngineState.STOPPED
    runner.close()


@pytest.mark.parametrize(
    ("raised", "expected", "message"),
    [
        (EngineUnavailableError("model dir missing"), EngineUnavailableError,
         "model dir missing"),
        (OSError("No such file: /models/x"), EngineError, "OSError: No such file"),
    ],
)
def test_start_raises_engine_error_in_caller(raised, expected, message):
    runner = EngineRunner(FakeEngine(start_error=raised))
    with pytest.raises(expected, match=message) as info:
        runner.start(timeout_s=WAIT_S)
    assert type(info.value) is expected
    assert runner.health().state is EngineState.UNAVAILABLE
    runner.close(timeout_s=WAIT_S)


def test_start_timeout_is_engine_unavailable_and_health_stays_answerable():
    gate = threading.Event()
    runner = EngineRunner(FakeEngine(start_gate=gate))
    with pytest.raises(EngineUnavailableError, match="did not start within"):
        runner.start(timeout_s=0.2)
    assert runner.health(timeout_s=0.5).state is EngineState.UNAVAILABLE
    gate.set()
    runner.close(timeout_s=WAIT_S)
    assert runner._thread is not None and not runner._thread.is_alive()
