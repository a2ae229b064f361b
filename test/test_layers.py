"""The layer map holds: the import-linter contracts in pyproject.toml (``[tool.importlinter]``).

``make lint`` runs the same check (``lint-imports``); CI runs the tests, so the map is enforced
here too. import-linter reads the sources (no module is imported) and takes about a second, so
this runs in the fast tier, in this process.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from importlinter.cli import lint_imports

REPO = Path(__file__).resolve().parent.parent


def test_every_layer_contract_is_kept(monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sys, "path", list(sys.path))  # lint_imports puts the cwd first
    status = lint_imports(config_filename=str(REPO / "pyproject.toml"), no_cache=True,
                          no_logo=True)
    out = capsys.readouterr().out
    assert status == 0, out
    assert "0 broken" in out, out
