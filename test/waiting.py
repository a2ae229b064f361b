"""Waiting on state in tests: poll a condition until it holds, against a generous deadline.

The deadline's expiry means "never happened", not "too slow": pick it far above what a loaded
machine needs. Test modules wait through these helpers (or on events and futures) instead of
sleeping; scripts/check_test_timing.py flags a bare sleep in a test module.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

POLL_S = 0.01  # how often a condition is read: short, so a wait ends soon after it holds
# This 2-core VM, oversubscribed by CI's three legs (load average 20-30), at times does not
# run a runnable process for minutes: scripts/stall_meter.py (which .ci/run runs) saw its
# processes pinned to either CPU held 19-49 s in one loaded rehearsal and 162-187 s in an idle
# one (2026-12-07, with the kernel reporting CPU 0's workqueue stuck and 200 ext4 I/O
# completions waiting). Every "never happened" bound below is what the wait needs plus one
# such freeze.
FREEZE_S = 200.0
# Something that should happen at once in the test's own process (a frame reaching the
# in-process node, a diagnostics message, a result): a starved CI worker took 22 s for one
# in-process request and reply.
NEVER_S = 60.0 + FREEZE_S
# DDS discovery between two participants (a client finding a service or an action server):
# asynchronous, and on a loaded machine beside other suites it has taken over 30 s.
DISCOVERY_S = 120.0 + FREEZE_S


def wait_until(condition: Callable[[], Any], timeout_s: float, what: str,
               poll_s: float = POLL_S) -> Any:
    """Return ``condition()``'s first true value; fail naming ``what`` after ``timeout_s``.

    ``poll_s``: longer where reading the condition costs (a browser's script, a probe goal).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:g} s"
        time.sleep(poll_s)


async def async_wait_until(condition: Callable[[], Any | Awaitable[Any]], timeout_s: float,
                           what: str, poll_s: float = POLL_S) -> Any:
    """``wait_until`` on an event loop: ``condition`` may be a coroutine function."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:g} s"
        await asyncio.sleep(poll_s)


def ask_until_answered(ask: Callable[[], Any], timeout_s: float, again_s: float,
                       what: str) -> Any:
    """Return the result of the first answered request that ``ask()`` sends.

    ``ask`` sends one request (one that may be repeated: a read, a result request) and
    returns its future. A request or its reply can be lost between participants (rmw drops
    a reply whose reader it has not matched yet), and the future would then wait for ever:
    unanswered after ``again_s``, the request is sent again, until ``timeout_s``.
    """
    answered = threading.Event()
    futures: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while True:
        futures.append(ask())
        futures[-1].add_done_callback(lambda _future: answered.set())
        if answered.wait(max(0.0, min(again_s, deadline - time.monotonic()))):
            return next(f for f in futures if f.done()).result()
        assert time.monotonic() < deadline, f"{what}: no answer within {timeout_s:g} s"
