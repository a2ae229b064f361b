"""The node's background work: periodic runs and speculative prefill, each on its own thread.

Both use the engine only when no goal needs it (goals take priority), and both go through the
node's one goal pipeline, so a periodic run is built exactly like a goal and a prefill
prepares a frame exactly as a goal about that frame will.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from cosmos_reason_interfaces.msg import ReasoningResult
from cosmos_reason_ros.core.admission import GoalSlots
from cosmos_reason_ros.core.frames import FrameHistory, StoredFrame
from cosmos_reason_ros.core.params import NodeParams
from cosmos_reason_ros.core.pipeline import GoalFields, GoalPipeline, Source, Stop
from cosmos_reason_ros.core.prefill import PrefillPolicy
from cosmos_reason_ros.core.types import CosmosReasonError, EngineError, FinishReason
from cosmos_reason_ros.engines.runner import EngineRunner
from cosmos_reason_ros.ros import messages
from cosmos_reason_ros.ros.outputs import Outputs


class WorkerHost(Protocol):
    """What the workers read of the node (``ReasonNode`` is one): nothing else of it."""

    params: NodeParams
    runner: EngineRunner
    pipeline: GoalPipeline[Any]
    outputs: Outputs
    prefill: PrefillPolicy
    history: FrameHistory[Any]  # the default camera's
    slots: GoalSlots
    context: Any  # rclpy Context: ok() is False once shut down

    @property
    def stopping(self) -> bool:
        """True once the node has begun shutting down (or cleaning up)."""

    @property
    def stopping_event(self) -> threading.Event:
        """Set when the node begins shutting down."""

    def now_ns(self) -> int:
        """Return the node clock in nanoseconds."""

    def get_logger(self) -> Any:
        """Return the node's logger."""


class PeriodicRuns:
    """``periodic.*``: ask a fixed question about the latest frame every period, if idle."""

    def __init__(self, node: WorkerHost) -> None:
        """Attach to ``node``; the node's timer calls :meth:`on_timer`."""
        self.node = node
        self.busy = threading.Event()
        self.counts = {"run": 0, "skipped": 0, "failed": 0, "unpublished": 0}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def _count(self, what: str) -> None:
        with self._lock:
            self.counts[what] += 1

    def snapshot(self) -> dict[str, int]:
        """Return the counters, copied under the lock, and ``busy`` (1 while a run goes on).

        ``busy`` is read first: a run counts itself after publishing its result and clears
        ``busy`` after counting, so ``busy == 0`` means every run started so far is both
        counted and published (``bench/soak.py`` relies on it for an exact final count).
        """
        busy = int(self.busy.is_set())
        with self._lock:
            return {**self.counts, "busy": busy}

    def on_timer(self) -> None:
        """Start a run unless a goal is running or queued or the previous run goes on."""
        node = self.node
        if self.busy.is_set() or node.slots.running or node.slots.queued or node.stopping:
            self._count("skipped")
            return
        self.busy.set()
        self._thread = threading.Thread(target=self._run, name="periodic", daemon=True)
        self._thread.start()

    def join(self, timeout_s: float) -> None:
        """Wait (bounded) for a run in progress to publish its result."""
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        node = self.node
        p = node.params
        t0 = time.monotonic()
        targets = tuple(t.strip() for t in p.periodic.targets.split(",") if t.strip())
        fields = GoalFields(task=p.periodic.task, prompt=p.periodic.prompt,
                            targets=targets,
                            max_tokens=min(p.periodic.max_tokens, p.limits.max_tokens),
                            source=Source.LATEST, wait_for_image_s=0.001)
        msg = ReasoningResult(origin="periodic", model=node.runner.model_name,
                              task=p.periodic.task, prompt=p.periodic.prompt)
        outcome = "failed"
        try:
            valid = node.pipeline.validate(fields)
            msg.task = valid.spec.task.value
            run = node.pipeline.run(
                valid, t_start=t0, accepted_ns=node.now_ns(), priority=1, is_goal=False,
                should_stop=lambda: Stop.SHUTDOWN if node.stopping else None)
            messages.fill_run(msg, run)
            if run.error is not None:
                raise run.error
            node.outputs.publish_extras(msg, run.media)
            outcome = "run"
        except CosmosReasonError as e:
            messages.fill_error(msg, e)
            node.get_logger().warning(f"periodic run failed: code={e.code.name} "
                                      f"message={e.message}", throttle_duration_sec=30.0)
        except Exception as e:  # noqa: BLE001 - keep the timer alive whatever happens
            messages.fill_error(msg, EngineError(f"internal error: {e!r}"))
            node.get_logger().error(f"periodic run: internal error: {e!r}")
        finally:
            msg.total_s = time.monotonic() - t0
            self._publish(msg, outcome)

    def _publish(self, msg: ReasoningResult, outcome: str) -> None:
        # Publish, then count, then clear busy: /diagnostics never counts a result that is not
        # on ~/results yet (run + failed <= published at every instant), and a result that
        # could not go out (the context already shut down) is counted as "unpublished".
        node = self.node
        published = False
        try:
            if node.context.ok():
                node.outputs.publish_result(msg)
                published = True
        except Exception as e:  # noqa: BLE001 - busy must be cleared whatever happens
            node.get_logger().error(f"periodic run: result not published: {e!r}")
        finally:
            self._count(outcome if published else "unpublished")
            self.busy.clear()


class PrefillWorker:
    """``prefill.*``: compute each new frame's image prefix in the engine before a goal asks.

    Woken by each new frame, so a prefill starts as soon as the frame arrives (a goal that
    comes while it runs waits for the rest of that engine step, then hits the cache); at most
    one per ``prefill.period_s``, one at a time, on this one thread. A frame skipped while
    busy is retried every period until it is prefilled or replaced. The policy (which frame,
    when to give way to a goal) is ``core/prefill.PrefillPolicy``.
    """

    def __init__(self, node: WorkerHost, busy: Callable[[], bool]) -> None:
        """``busy`` says whether goals or periodic runs hold the engine."""
        self.node = node
        self.busy = busy
        self.wake = threading.Event()
        # This configuration's stop: a managed node builds a new worker on each configure.
        self._stop = node.stopping_event
        self._thread = threading.Thread(target=self._loop, name="prefill", daemon=True)

    def start(self) -> None:
        """Start the thread (always: ``prefill.enabled`` can be switched on at runtime)."""
        self._thread.start()

    def stop(self) -> None:
        """Wake the thread so it sees the node stopping."""
        self.wake.set()

    def _loop(self) -> None:
        node = self.node
        period = node.params.prefill.period_s
        last_start = -math.inf
        retry = False
        while not self._stop.is_set():
            if not self.wake.wait(period if retry else 1.0) and not retry:
                continue
            self.wake.clear()
            wait = last_start + period - time.monotonic()
            if wait > 0 and self._stop.wait(wait):
                return
            latest = node.history.latest()
            stamp = None if latest is None else latest.stamp_ns
            if not node.params.prefill.enabled:
                retry = False
                continue
            if not node.prefill.try_start(stamp, self.busy()):
                retry = node.prefill.wants(stamp)
                continue
            retry = False
            last_start = time.monotonic()
            self._run(latest)

    def _run(self, frame: StoredFrame[Any]) -> None:
        node = self.node
        outcome = "failed"
        try:
            media = node.pipeline.prepare_frame(frame)
            # Routed like the goals about this camera: over HTTP the prefill must warm the
            # server those goals will reach (engine.session_header).
            request = node.pipeline.build_prefill_request(
                media, reasoning=node.params.prefill.reasoning)
            if node.prefill.abort_requested:
                outcome = "aborted"
                return
            handle = node.runner.submit(request)
            if not node.prefill.attach(handle.cancel):
                handle.cancel()  # a goal asked for the engine while this was being submitted
            _, final = handle.collect(timeout_s=node.params.limits.goal_timeout_s)
            outcome = "aborted" if final.finish_reason is FinishReason.CANCELLED else "run"
        except CosmosReasonError as e:
            node.get_logger().warning(f"prefill failed: code={e.code.name} message={e.message}",
                                      throttle_duration_sec=30.0)
        except Exception as e:  # noqa: BLE001 - a prefill must never take the node down
            node.get_logger().error(f"prefill: internal error: {e!r}",
                                    throttle_duration_sec=30.0)
        finally:
            node.prefill.finished(frame.stamp_ns, outcome)
