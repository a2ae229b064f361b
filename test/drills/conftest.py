"""The drills tier: every test here is marked ``drill`` and records its timings.

``make test`` leaves the drills out (``-m 'not drill'``, scripts/run_tests.sh); ``make drills``
runs them alone, after CI's legs, so that what they measure is the mechanism, not the load of
other legs. The ``record`` fixture reports each figure (build/drills/report.{json,md}) and
fails the drill only when a figure exceeds its hard bound. A figure's span that the machine
froze (scripts/stall_meter.py runs beside the drills) is credited against that bound.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from drill_report import Figure, Report
from repo_scripts import load_script

HERE = Path(__file__).resolve().parent
REPORT_DIR = Path(os.environ.get("COSMOS_DRILLS_REPORT_DIR",
                                 HERE.parent.parent / "build" / "drills"))
stall_meter = load_script("stall_meter")


@pytest.hookimpl(tryfirst=True)  # before -m deselects: the mark must be there by then
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test under test/drills/ ``drill`` (this hook sees the whole session)."""
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.drill)


@pytest.fixture(scope="session")
def drill_report() -> Iterator[Report]:
    """The session's figures, written to build/drills/ when the session ends."""
    report = Report()
    yield report
    if report.figures:
        report.write(REPORT_DIR)


@pytest.fixture(scope="session")
def freezes_log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The log of a stall meter that runs while the drills do."""
    log = tmp_path_factory.mktemp("stalls") / "stalls.log"
    meter = subprocess.Popen([sys.executable, stall_meter.__file__, str(log)])
    yield log
    meter.terminate()  # its watchers die with it (PR_SET_PDEATHSIG)
    meter.wait(timeout=30)


@pytest.fixture
def record(drill_report: Report, freezes_log: Path,
           request: pytest.FixtureRequest) -> Callable[..., Figure]:
    """``record(name, value, unit, target, hard_bound, since=None)``: report a figure; fail
    above the bound.

    ``since``: for a duration, the wall-clock time (``time.time()``) its span began; the
    seconds the machine froze inside that span are credited against the hard bound. The
    figure is reported before the check, so a drill that fails on its bound still shows the
    figure in the report.
    """

    def record_figure(name: str, value: float, unit: str, target: float,
                      hard_bound: float, since: float | None = None) -> Figure:
        held = 0.0 if since is None else stall_meter.held_s(str(freezes_log), since,
                                                            since + value)
        figure = Figure(request.node.name, name, float(value), unit, target, hard_bound,
                        round(held, 2))
        drill_report.add(figure)
        of_it = "" if since is None else f" ({held:.1f} s of it the machine held a process)"
        print(f"drill figure: {name} = {value:.3f} {unit}{of_it} (target {target:g}: "
              f"{'met' if figure.met else 'missed'}; hard bound {hard_bound:g})")
        assert figure.within_bound, (f"{name} = {value:.2f} {unit}{of_it}, above its hard "
                                     f"bound {hard_bound:g} {unit} (target {target:g} {unit})")
        return figure

    return record_figure
