"""The drills tier: every test here is marked ``drill`` and records its timings.

``make test`` leaves the drills out (``-m 'not drill'``, scripts/run_tests.sh); ``make drills``
runs them alone, after CI's legs, so that what they measure is the mechanism, not the load of
other legs. The ``record`` fixture reports each figure (build/drills/report.{json,md}) and
fails the drill only when a figure exceeds its hard bound.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from drill_report import Figure, Report

HERE = Path(__file__).resolve().parent
REPORT_DIR = Path(os.environ.get("COSMOS_DRILLS_REPORT_DIR",
                                 HERE.parent.parent / "build" / "drills"))


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


@pytest.fixture
def record(drill_report: Report, request: pytest.FixtureRequest) -> Callable[..., Figure]:
    """``record(name, value, unit, target, hard_bound)``: report a figure; fail above the bound.

    The figure is reported before the check, so a drill that fails on its bound still shows
    the figure in the report.
    """

    def record_figure(name: str, value: float, unit: str, target: float,
                      hard_bound: float) -> Figure:
        figure = Figure(request.node.name, name, float(value), unit, target, hard_bound)
        drill_report.add(figure)
        print(f"drill figure: {name} = {value:.3f} {unit} (target {target:g}: "
              f"{'met' if figure.met else 'missed'}; hard bound {hard_bound:g})")
        assert figure.within_bound, (f"{name} = {value:.2f} {unit}, above its hard bound "
                                     f"{hard_bound:g} {unit} (target {target:g} {unit})")
        return figure

    return record_figure
