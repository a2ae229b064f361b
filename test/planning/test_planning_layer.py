"""``planning/`` sits on top of the client: it imports the client and core, and nothing below it
imports planning (py-trees stays out of the node, the engines and core).

Read from the source (``ast``, no import), so it runs without py-trees or ROS.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "cosmos_reason_ros"
# What planning/ may import from this repository: the client and the layers below it.
PLANNING_MAY_IMPORT = ("cosmos_reason_ros.client", "cosmos_reason_ros.core",
                       "cosmos_reason_ros.planning", "cosmos_reason_interfaces")


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def ours(name: str) -> bool:
    return name.split(".")[0] in ("cosmos_reason_ros", "cosmos_reason_interfaces")


def test_planning_imports_only_the_client_and_the_layers_below():
    modules = sorted((PACKAGE / "planning").glob("*.py"))
    assert {p.name for p in modules} >= {"behaviours.py", "patrol.py"}
    for path in modules:
        for name in imported_modules(path):
            if ours(name):
                assert name.startswith(PLANNING_MAY_IMPORT), \
                    f"{path.relative_to(PACKAGE)} imports {name}"


def test_nothing_below_planning_imports_it():
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] == "planning":
            continue
        for name in imported_modules(path):
            assert not (name.startswith("cosmos_reason_ros.planning") or name == "py_trees"
                        or name.startswith("py_trees.")), \
                f"{path.relative_to(PACKAGE)} imports {name}: only planning/ may"
