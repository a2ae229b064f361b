"""The drills' figures: each timing a drill measures, its target and its hard bound.

A drill fails on outcomes (a goal without a result, an orphan process, the engine still busy)
and on a figure above its hard bound, which sits well above the target (5-10x): a loaded
machine misses a target, a broken mechanism misses the bound. The target is reported as met
or missed, never asserted. ``make drills`` writes ``build/drills/report.json`` and a Markdown
table ``build/drills/report.md``, the way ``cosmos_reason_ros.bench`` reports its runs.

A duration that spans a freeze of the machine (this VM has held every process for up to 187 s,
scripts/stall_meter.py) measures the machine, not the mechanism: the seconds the meter saw the
machine hold a process inside the figure's span are reported beside it and taken off before the
hard bound is checked. The target is judged on the figure as measured.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Figure:
    """One measured timing: lower is better; ``target`` is the aim, ``hard_bound`` the limit."""

    test: str
    name: str
    value: float
    unit: str
    target: float
    hard_bound: float
    machine_held_s: float = 0.0  # of the figure's span, the machine held a process this long

    @property
    def met(self) -> bool:
        """Whether the figure met its target."""
        return self.value <= self.target

    @property
    def within_bound(self) -> bool:
        """Whether the figure stayed under its hard bound (above it, the drill fails)."""
        return self.value - self.machine_held_s <= self.hard_bound


class Report:
    """The figures of one drills session, written as JSON and as a Markdown table."""

    def __init__(self) -> None:
        self.figures: list[Figure] = []
        self.started = time.time()

    def add(self, figure: Figure) -> None:
        """Record ``figure``; a target above its hard bound is a mistake in the drill."""
        if figure.target > figure.hard_bound:
            raise ValueError(f"figure {figure.name!r}: target {figure.target} is above its "
                             f"hard bound {figure.hard_bound}")
        self.figures.append(figure)

    def as_json(self) -> dict:
        """The report's data: the machine, and each figure with its verdicts."""
        return {"started": self.started, "host": platform.node(), "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "figures": [{**asdict(f), "met": f.met, "within_bound": f.within_bound}
                            for f in self.figures]}

    def markdown(self) -> str:
        """The figures as a table: figure, value, target (met/missed), machine held, bound."""
        lines = ["# Drills", "",
                 f"{len(self.figures)} figures, {sum(f.met for f in self.figures)} met their "
                 f"target, {sum(not f.within_bound for f in self.figures)} above their hard "
                 f"bound (host {platform.node()}, {os.cpu_count()} CPUs).", "",
                 "| drill | figure | value | target | | machine held | hard bound | |",
                 "|---|---|---:|---:|---|---:|---:|---|"]
        for f in self.figures:
            held = f"{f.machine_held_s:.1f} s" if f.machine_held_s else ""
            lines.append(f"| {f.test} | {f.name} | {f.value:.2f} {f.unit} | {f.target:g} "
                         f"{f.unit} | {'met' if f.met else 'missed'} | {held} | "
                         f"{f.hard_bound:g} {f.unit} | "
                         f"{'ok' if f.within_bound else 'EXCEEDED'} |")
        return "\n".join(lines) + "\n"

    def write(self, folder: Path) -> None:
        """Write ``report.json`` and ``report.md`` into ``folder``."""
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in (("report.json", json.dumps(self.as_json(), indent=2)),
                           ("report.md", self.markdown())):
            tmp = folder / (name + ".tmp")  # readers never see half a file
            tmp.write_text(text)
            os.replace(tmp, folder / name)
