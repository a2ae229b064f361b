"""Python garbage-collector pauses: measure them, and keep the startup heap out of them.

A collection holds the interpreter lock, so it stops every thread of the process: the
executor that accepts goals, the camera callback and the engine client alike. The heap an
in-process vLLM engine leaves behind (config, tokenizer, processor, hundreds of thousands of
objects) makes every full collection walk all of it. ``freeze_heap`` moves what exists after
startup into the collector's permanent generation, so later full collections walk only what
goals create; ``GcPauses`` measures the pauses so the effect shows in diagnostics.
"""

from __future__ import annotations

import gc
import threading
import time
from dataclasses import dataclass
from typing import Any

SLOW_PAUSE_S = 0.05  # a pause this long is visible in a goal's latency


@dataclass(frozen=True)
class GcStats:
    """Collections and their pauses since ``GcPauses.install`` or the last ``reset``."""

    collections: int = 0
    full_collections: int = 0  # generation 2: the ones that walk the whole heap
    pause_max_ms: float = 0.0
    pause_total_s: float = 0.0
    slow_pauses: int = 0  # pauses of SLOW_PAUSE_S or longer


class GcPauses:
    """Times every collection through ``gc.callbacks`` (a few microseconds each)."""

    def __init__(self, slow_s: float = SLOW_PAUSE_S) -> None:
        """Create an uninstalled watcher; pauses of ``slow_s`` or longer count as slow."""
        self.slow_s = slow_s
        self._lock = threading.Lock()
        self._started: float | None = None
        self._stats = GcStats()

    def install(self) -> GcPauses:
        """Start timing collections (idempotent)."""
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)
        return self

    def uninstall(self) -> None:
        """Stop timing collections."""
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def reset(self) -> None:
        """Start counting afresh (e.g. once startup is over)."""
        with self._lock:
            self._stats = GcStats()

    def stats(self) -> GcStats:
        """Return the counts and pauses so far."""
        with self._lock:
            return self._stats

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        # Collections run with the interpreter lock held, one at a time, so start and stop
        # pair up; the lock only guards against a reader in another thread.
        if phase == "start":
            self._started = time.perf_counter()
            return
        if self._started is None:
            return
        pause = time.perf_counter() - self._started
        self._started = None
        with self._lock:
            s = self._stats
            self._stats = GcStats(
                collections=s.collections + 1,
                full_collections=s.full_collections + (info.get("generation") == 2),
                pause_max_ms=max(s.pause_max_ms, pause * 1e3),
                pause_total_s=s.pause_total_s + pause,
                slow_pauses=s.slow_pauses + (pause >= self.slow_s))


def freeze_heap() -> tuple[int, float]:
    """Collect once, then freeze every live object; return (objects frozen, seconds taken)."""
    t0 = time.perf_counter()
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count(), time.perf_counter() - t0
