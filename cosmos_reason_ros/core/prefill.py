"""When to prefill the newest camera frame, and what it achieved (no ROS, no engine).

Cosmos-Reason puts the media before the question, so the system prompt and the image tokens
are a prefix shared by every question about a frame. Prefilling that prefix for the newest
frame, before any goal asks, lets vLLM's prefix and multimodal caches hold it: a goal about
that frame then only computes its own question. ``PrefillPolicy`` decides when a prefill may
start (rate-limited by its caller's timer, one in flight, never while goals are busy unless
configured), when a running one must give way to a goal, and counts the outcomes.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class PrefillCounts:
    """Counters published in diagnostics."""

    run: int = 0  # prefills that completed (the frame is in the engine's caches)
    skipped: int = 0  # new frames not prefilled when they came (busy, or one in flight)
    aborted: int = 0  # prefills cancelled because a goal on another frame needed the engine
    failed: int = 0  # prefills that ended with an engine error
    goals_on_prefilled_frame: int = 0  # goals whose frame had been prefilled
    goals_on_ready_frame: int = 0  # 'latest' goals given an older, prefilled frame instead
    # Prompt tokens the engine served from its caches: for the last goal, and how many goals
    # had any. Prefill and (behind a router) session affinity working show here; 0 on a
    # server means its caches missed (another backend, an evicted prefix).
    goals_last_cached_prompt_tokens: int = 0
    goals_with_cached_prompt: int = 0


class PrefillPolicy:
    """Thread-safe decisions for speculative frame prefill; all methods are cheap."""

    def __init__(self, skip_while_busy: bool = True, remember_frames: int = 16) -> None:
        """``remember_frames`` bounds the record of prefilled stamps used to count hits."""
        self.skip_while_busy = skip_while_busy
        self._lock = threading.Lock()
        self._in_flight: int | None = None  # stamp of the frame being prefilled
        self._cancel: Callable[[], None] | None = None  # cancels the in-flight engine request
        self._abort_requested = False  # a goal needs the engine: the in-flight one must go
        self._last_started: int | None = None
        self._last_skipped: int | None = None
        self._done: collections.deque[int] = collections.deque(maxlen=remember_frames)
        self._counts = collections.Counter[str]()

    def try_start(self, newest_stamp_ns: int | None, busy: bool) -> bool:
        """Return True (and mark it in flight) if the newest frame should be prefilled now.

        Nothing happens for a frame already prefilled or attempted; a new frame is skipped
        (counted once per frame, however often it is retried) while another prefill runs or,
        with ``skip_while_busy``, while goals are running or queued.
        """
        with self._lock:
            if newest_stamp_ns is None or newest_stamp_ns == self._last_started:
                return False
            if self._in_flight is not None or (busy and self.skip_while_busy):
                if newest_stamp_ns != self._last_skipped:
                    self._last_skipped = newest_stamp_ns
                    self._counts["skipped"] += 1
                return False
            self._in_flight = self._last_started = newest_stamp_ns
            self._cancel, self._abort_requested = None, False
            return True

    def wants(self, stamp_ns: int | None) -> bool:
        """Whether ``stamp_ns`` is a frame no prefill has started on yet (worth a retry)."""
        with self._lock:
            return stamp_ns is not None and stamp_ns != self._last_started

    @property
    def abort_requested(self) -> bool:
        """Whether a goal asked the in-flight prefill to give way (checked before submitting)."""
        with self._lock:
            return self._abort_requested

    def attach(self, cancel: Callable[[], None]) -> bool:
        """Register how to cancel the in-flight prefill's engine request.

        Returns False when a goal asked it to give way meanwhile: the caller cancels it itself.
        """
        with self._lock:
            if self._in_flight is None or self._abort_requested:
                return False
            self._cancel = cancel
            return True

    def make_way_for(self, goal_stamp_ns: int) -> Callable[[], None] | None:
        """Ask the in-flight prefill to give way to a goal about ``goal_stamp_ns``.

        A prefill of the goal's own frame is kept: the goal needs exactly that work, and
        aborting it would only redo it. Returns the cancel function to call (outside any
        lock), or None: nothing to abort, or the request is not submitted yet (the worker then
        sees :attr:`abort_requested` or a refused :meth:`attach`).
        """
        with self._lock:
            if self._in_flight is None or self._in_flight == goal_stamp_ns:
                return None
            self._abort_requested = True
            return self._cancel

    def finished(self, stamp_ns: int, outcome: str) -> None:
        """Record the end of the prefill of ``stamp_ns``: 'run', 'aborted' or 'failed'."""
        if outcome not in ("run", "aborted", "failed"):
            raise ValueError(f"unknown prefill outcome {outcome!r}")
        with self._lock:
            if self._in_flight == stamp_ns:
                self._in_flight, self._cancel, self._abort_requested = None, None, False
            self._counts[outcome] += 1
            if outcome == "run":
                self._done.append(stamp_ns)

    def goal_frame(self, stamp_ns: int) -> bool:
        """Count and return whether a goal's frame had been prefilled."""
        with self._lock:
            hit = stamp_ns in self._done
            if hit:
                self._counts["goals_on_prefilled_frame"] += 1
            return hit

    def goal_served(self, cached_prompt_tokens: int) -> None:
        """Record how many of a finished goal's prompt tokens came from the engine's caches."""
        with self._lock:
            self._counts["goals_last_cached_prompt_tokens"] = max(0, cached_prompt_tokens)
            if cached_prompt_tokens > 0:
                self._counts["goals_with_cached_prompt"] += 1

    def ready_frame(self, stamps_newest_first: list[int]) -> int | None:
        """For a goal on the latest frame: the newest prefilled frame when the newest is not.

        ``stamps_newest_first`` are the candidate frames (the caller bounds how much older
        they may be). Returns ``None`` when the newest frame is prefilled itself or none is;
        otherwise the stamp to use instead (counted), whose prefix the engine already holds.
        """
        with self._lock:
            if not stamps_newest_first or stamps_newest_first[0] in self._done:
                return None
            for stamp in stamps_newest_first[1:]:
                if stamp in self._done:
                    self._counts["goals_on_ready_frame"] += 1
                    return stamp
            return None

    @property
    def in_flight(self) -> bool:
        """True while a prefill is running."""
        with self._lock:
            return self._in_flight is not None

    def counts(self) -> PrefillCounts:
        """Return a snapshot of the counters."""
        with self._lock:
            return PrefillCounts(**{k: self._counts[k] for k in PrefillCounts.__annotations__})
