"""The run's results (rewritten to disk as they grow) and its time budget."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cosmos_reason_ros.bench import report as benchreport
from cosmos_reason_ros.bench import stats as benchstats
from cosmos_reason_ros.bench.workload import PHASE_WEIGHTS


class Results:
    """Every sample, batch, series and error of the run; rewritten to disk as it grows."""

    def __init__(self, out: Path, meta: dict[str, Any]) -> None:
        """Create the output folder and write the first (empty) files."""
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.data: dict[str, Any] = {"meta": meta, "samples": [], "batches": [], "series": {},
                                     "modes": {}, "extra": {}}
        self._lock = threading.Lock()
        self._last_write = 0.0
        self.write(force=True)

    def sample(self, **fields: Any) -> dict[str, Any]:
        """Record one request's measurements."""
        fields.setdefault("t", time.time())
        with self._lock:
            self.data["samples"].append(fields)
        self.write()
        return fields

    def batch(self, **fields: Any) -> None:
        """Record one concurrent batch."""
        fields.setdefault("t", time.time())
        with self._lock:
            self.data["batches"].append(fields)
        self.write()

    def series(self, name: str, point: dict[str, Any]) -> None:
        """Append a point to a named time series (e.g. RSS)."""
        with self._lock:
            self.data["series"].setdefault(name, []).append(point)
        self.write()

    def mode(self, name: str, **status: Any) -> None:
        """Set a mode's status: ran, skipped (with the reason) or error (with the traceback)."""
        with self._lock:
            self.data["modes"].setdefault(name, {}).update(status)
        self.write(force=True)

    def extra(self, name: str, value: Any) -> None:
        """Store a named figure (ingest, memory growth, start times ...)."""
        with self._lock:
            self.data["extra"][name] = value
        self.write(force=True)

    def write(self, force: bool = False) -> None:
        """Write bench.json and results.md atomically (at most every 2 s unless forced)."""
        now = time.monotonic()
        if not force and now - self._last_write < 2.0:
            return
        with self._lock:
            self._last_write = now
            text = json.dumps(self.data, indent=1, default=str)
            report = benchreport.render_report(self.data)
        atomic_write(self.out / "bench.json", text)
        atomic_write(self.out / "results.md", report)


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file, so readers never see half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class Budget:
    """The run's deadline and the per-phase slices of what is left after the starts."""

    def __init__(self, total_s: float) -> None:
        """Start the clock."""
        self.t0 = time.monotonic()
        self.deadline = self.t0 + total_s
        self.slices: dict[str, float] = {}
        self.reserve_s = min(20.0, 0.05 * total_s)  # shutting down and writing the report

    def left(self) -> float:
        """Seconds left before the reserve for shutting down."""
        return self.deadline - self.reserve_s - time.monotonic()

    def plan(self, phases: Sequence[str]) -> None:
        """Split what is left among the phases that will run."""
        chosen = [p for p in PHASE_WEIGHTS if p.name in phases]
        self.slices = benchstats.plan_slices(self.left(), chosen)

    def phase_deadline(self, name: str) -> float:
        """When the phase must stop (never past the run's deadline)."""
        return min(time.monotonic() + self.slices.get(name, 0.0),
                   self.deadline - self.reserve_s)


def record_batch(results: Results, outs: list[dict[str, Any]], bad: list[dict[str, Any]],
                 wall_s: float, r: int, **fields: Any) -> None:
    """Record a finished batch: its wall time, summed output tokens and per-request figures."""
    results.batch(**fields, round=r, warmup=r < 0, ok=not bad and r >= 0,
                  error=bad[0].get("error") if bad else None, wall_s=wall_s,
                  output_tokens=sum(o.get("output_tokens") or 0 for o in outs),
                  e2e_s=[o.get("e2e_s") for o in outs],
                  ttft_s=[o.get("ttft_s") for o in outs],
                  cached_prompt_tokens=[o.get("cached_prompt_tokens") for o in outs])
