"""Bounded admission of goals: N running at once, M waiting, the rest refused.

Goals run concurrently in the engine (continuous batching), but a robot's engine has finite
memory and a planner must hear "overloaded" at once rather than wait unboundedly. Waiting
goals are served in arrival order.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

from cosmos_reason_ros.core.types import OverloadedError


class GoalSlots:
    """Thread-safe counters for admitted, running and queued goals with FIFO hand-over.

    A goal is first ``admit``-ted (refused with ``OverloadedError`` when ``max_running +
    max_queued`` goals are already in), then ``acquire``-s a running slot in arrival order,
    ``release``-s it, and finally ``leave``-s.
    """

    def __init__(self, max_running: int, max_queued: int) -> None:
        """Allow ``max_running`` goals at once and ``max_queued`` more to wait."""
        if max_running < 1 or max_queued < 0:
            raise ValueError(f"max_running={max_running} (>= 1), max_queued={max_queued} (>= 0)")
        self.max_running = max_running
        self.max_queued = max_queued
        self._cond = threading.Condition()
        self._admitted = 0
        self._running = 0
        self._waiting: collections.deque[object] = collections.deque()

    @property
    def running(self) -> int:
        """Goals holding a slot."""
        with self._cond:
            return self._running

    @property
    def queued(self) -> int:
        """Goals admitted but not running (waiting for a slot or for an image)."""
        with self._cond:
            return self._admitted - self._running

    def admit(self) -> None:
        """Count a new goal in, or raise ``OverloadedError`` when the bounds are full."""
        with self._cond:
            if self._admitted >= self.max_running + self.max_queued:
                raise OverloadedError(
                    f"{self._running} goals running and {self._admitted - self._running} "
                    f"queued (limits.max_concurrent_goals={self.max_running}, "
                    f"limits.max_queued_goals={self.max_queued}); retry later"
                )
            self._admitted += 1

    def leave(self) -> None:
        """Count an admitted goal out (it has ended)."""
        with self._cond:
            self._admitted = max(0, self._admitted - 1)
            self._cond.notify_all()

    def acquire(self, timeout_s: float, should_stop: Callable[[], bool] = lambda: False,
                poll_s: float = 0.05) -> bool:
        """Take a running slot (for an admitted goal), waiting in line if all are busy.

        Returns ``False`` when ``timeout_s`` passes or ``should_stop()`` is true (checked
        before a slot is handed over too: a goal cancelled or shut down while it waited must not
        start a generation); the caller then holds no slot.
        """
        ticket = object()
        deadline = time.monotonic() + max(0.0, timeout_s)
        with self._cond:
            if should_stop():
                return False
            if self._running < self.max_running and not self._waiting:
                self._running += 1
                return True
            self._waiting.append(ticket)
            try:
                while True:
                    if should_stop():
                        return False
                    if self._waiting[0] is ticket and self._running < self.max_running:
                        self._running += 1
                        return True
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    self._cond.wait(min(poll_s, remaining))
            finally:
                self._waiting.remove(ticket)
                self._cond.notify_all()

    def release(self) -> None:
        """Give a slot back."""
        with self._cond:
            self._running = max(0, self._running - 1)
            self._cond.notify_all()
