"""pytest plugin: a test hung in native code holding the GIL ends its process, not the run.

A deadlock inside rclpy's destroy (Fast DDS at participant destruction, docs/RELIABILITY.md)
holds the GIL, so pytest-timeout's handler never runs and a CI leg would hang until its hard
limit. faulthandler's watchdog is a C thread that needs no GIL: past the test's timeout and
``HUNG_MARGIN_S`` it prints every thread's Python stack on the process's own stderr and ends
the process, so the test fails (pytest-xdist reports its worker crashed) and the rest of the
run goes on. Loaded by test/conftest.py (``pytest_plugins``).
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

HUNG_MARGIN_S = float(os.environ.get("TEST_HUNG_MARGIN_S", "120"))
_report: list[Any] = []  # the process's own stderr, not pytest's capture of it


def pytest_configure(config: pytest.Config) -> None:
    capture = config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        _report.append(os.fdopen(os.dup(sys.stderr.fileno()), "w"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Armed for the test's setup, call and teardown: what pytest-timeout bounds."""
    marker = item.get_closest_marker("timeout")  # a test's own bound, as pytest-timeout reads it
    own = marker.args[0] if marker and marker.args else None
    timeout_s = float(own if own is not None else item.config.getoption("timeout", None) or 0)
    if timeout_s > 0:
        faulthandler.dump_traceback_later(timeout_s + HUNG_MARGIN_S, exit=True, file=_report[0])
    try:
        yield
    finally:
        if timeout_s > 0:
            faulthandler.cancel_dump_traceback_later()
