#!/usr/bin/env python3
"""Keep sleeps and durations out of the fast and real test tiers.

Timing claims belong to the drills (``test/drills/``, measured alone and reported) and to the
benchmarks (``test/bench/``). Anywhere else under ``test/``, a test module fails this check
when it

* sleeps (``time.sleep``, ``asyncio.sleep``, a bare ``sleep``) without a ``# paces: <why>``
  comment on the same line. A sleep may pace something (a simulated camera's frame rate, a
  fake engine's per-token delay); it may not wait for something to happen, which passes on
  an idle machine and fails on a loaded one. ``asyncio.sleep(0)`` yields to the event loop
  without waiting for time, so it is allowed;
* asserts that a duration (a name like ``took``, ``elapsed``, ``duration``, ``late``,
  ``latency``, ``seconds``, ``*_s``) is below a number (a literal or a module-level numeric
  constant), or that time elapsed since a clock read (``time.monotonic() - t0``) is below
  anything;
* waits for an outcome (``wait_until``, ``asyncio.wait_for``, an event's ``wait``, a future's
  ``result``, a thread's ``join``, a process's ``wait`` or ``communicate``, a client's ``run``,
  ``timeout=``) with a literal bound of 1 to 200 s. This machine has held every process for
  minutes (docs/RELIABILITY.md, "Machine freezes"): such a bound is a speed claim in disguise.
  Use ``test/waiting.py``'s ``NEVER_S`` or ``DISCOVERY_S``; a bound that is part of what the
  test arranges carries a ``# bound: <why>`` comment on its line.

And every test module, the drills' and the benchmarks' too, fails it when it imports vLLM,
torch or transformers at module level (an import statement or ``pytest.importorskip``):
every pytest worker collects every module, deselected or not, and these imports took 5-37 s
of each worker's start. Import them in the test or fixture that needs them; skip on
``importlib.util.find_spec``.

Shared support modules (``test/*.py`` that are not ``test_*.py``) hold the waiting helpers
that poll state against a generous deadline, and are not checked.

    python3 scripts/check_test_timing.py [ROOT]    # exit status 1 when something is flagged
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# Directories (under test/) where durations are the point: measured and reported.
EXEMPT_DIRS = ("drills", "bench")
# Findings not yet converted, per module: a ratchet. A module may hold exactly this many (more
# is a relapse; fewer means one was fixed: lower the count, and drop the entry at zero).
PENDING: dict[str, int] = {}
PACES = re.compile(r"#\s*paces:\s*\S")
BOUND = re.compile(r"#\s*bound:\s*\S")
# Calls that wait for an outcome, and the position of their bound when it is positional.
WAITS = {"wait_until": 1, "async_wait_until": 1, "wait_for": 1, "wait": 0, "result": 0,
         "join": 0, "communicate": 0, "wait_ready": 0, "wait_for_server": 0,
         "wait_for_service": 0, "run": 1, "stop": 0, "stop_cleanly": 0}
WAIT_KEYWORDS = ("timeout", "timeout_sec")
SHORT_WAIT_S = (1.0, 200.0)  # below 1 s: a wait that is meant to run out, not an outcome
DURATION_NAME = re.compile(r"(took|elapsed|duration|late|latency|seconds|_s)$|^(took|late)_",
                           re.IGNORECASE)
CLOCKS = {"monotonic", "monotonic_ns", "time", "time_ns", "perf_counter", "perf_counter_ns"}
HEAVY_IMPORTS = ("vllm", "torch", "transformers")


@dataclass(frozen=True)
class Finding:
    """One flagged line: where, and which rule."""

    path: Path
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


def test_modules(root: Path) -> Iterator[Path]:
    """The test modules the rules apply to, in a stable order."""
    test_dir = root / "test"
    for path in sorted(test_dir.rglob("test_*.py")):
        if path.relative_to(test_dir).parts[0] not in EXEMPT_DIRS:
            yield path


def _numeric_constants(tree: ast.Module) -> set[str]:
    """Module-level names bound to a number (``BOUND_S = 1.5``): a literal by another name."""
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and _is_number(node.value):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and node.value is not None \
                and _is_number(node.value) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def _is_number(node: ast.AST, constants: frozenset[str] | set[str] = frozenset()) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return _is_number(node.operand, constants)
    if isinstance(node, ast.BinOp):  # 2 * KEEP_S, 1 / 60
        return _is_number(node.left, constants) and _is_number(node.right, constants)
    if isinstance(node, ast.Name):
        return node.id in constants
    return (isinstance(node, ast.Constant) and isinstance(node.value, (int, float))
            and not isinstance(node.value, bool))


def _reads_clock(node: ast.AST) -> bool:
    """Whether ``node`` reads the clock (``time.monotonic()`` and the like)."""
    return any(isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute)
               and sub.func.attr in CLOCKS and isinstance(sub.func.value, ast.Name)
               and sub.func.value.id == "time" for sub in ast.walk(node))


def _is_duration(node: ast.AST) -> bool:
    """Whether ``node`` reads as a duration: a duration-like name or a clock read in it."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and DURATION_NAME.search(sub.id):
            return True
        if isinstance(sub, ast.Attribute) and DURATION_NAME.search(sub.attr):
            return True
    return _reads_clock(node)


def _is_sleep(call: ast.Call) -> bool:
    func = call.func
    if isinstance(func, ast.Attribute):
        named = func.attr == "sleep" and isinstance(func.value, ast.Name) \
            and func.value.id in ("time", "asyncio")
    else:
        named = isinstance(func, ast.Name) and func.id == "sleep"
    if not named:
        return False
    # asyncio.sleep(0) hands the loop to the other tasks once; it waits for no time.
    zero = call.args and isinstance(call.args[0], ast.Constant) and call.args[0].value == 0
    return not zero


def _short_wait_bound(call: ast.Call, negated: bool) -> ast.Constant | None:
    """Return the literal bound of a wait for an outcome if it is short (``SHORT_WAIT_S``).

    A negated wait (``assert not event.wait(0.5)``) waits for something not to happen, and
    ``subprocess.run``'s first argument is the command, not a bound.
    """
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if negated or name is None:
        return None
    position = WAITS.get(name)
    # ``timeout_s``: the tests' own helpers' bound (``node.wait_ready(timeout_s=120)``); not on
    # every call, where it is a goal's or a behaviour's time limit, a value under test.
    keywords = WAIT_KEYWORDS + ("timeout_s",) if position is not None else WAIT_KEYWORDS
    bounds = [kw.value for kw in call.keywords if kw.arg in keywords]
    if position is not None and len(call.args) > position:
        bounds.append(call.args[position])
    for bound in bounds:
        if isinstance(bound, ast.Constant) and isinstance(bound.value, (int, float)) \
                and not isinstance(bound.value, bool) \
                and SHORT_WAIT_S[0] <= bound.value < SHORT_WAIT_S[1]:
            return bound
    return None


def check_source(path: Path, source: str) -> list[Finding]:
    """Return the findings in one module's source."""
    tree = ast.parse(source, filename=str(path))
    lines = source.splitlines()
    constants = _numeric_constants(tree)
    negated = {id(n.operand) for n in ast.walk(tree)
               if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not)}
    findings = []
    for node in ast.walk(tree):
        bound = _short_wait_bound(node, id(node) in negated) \
            if isinstance(node, ast.Call) else None
        if bound is not None and not BOUND.search(lines[bound.lineno - 1]):
            findings.append(Finding(path, bound.lineno, f"wait bounded by {bound.value!r} s: "
                                    "use NEVER_S or DISCOVERY_S (test/waiting.py), or say "
                                    "'# bound: <why>'"))
        if isinstance(node, ast.Call) and _is_sleep(node):
            end = node.end_lineno or node.lineno
            if not any(PACES.search(lines[i - 1]) for i in range(node.lineno, end + 1)):
                findings.append(Finding(path, node.lineno, "sleep without '# paces: <why>': "
                                        "wait on an event, a future or state instead"))
        elif isinstance(node, ast.Assert):
            for compare in (n for n in ast.walk(node.test) if isinstance(n, ast.Compare)):
                operands = [compare.left, *compare.comparators]
                for op, left, right in zip(compare.ops, operands, operands[1:], strict=False):
                    if isinstance(op, (ast.Gt, ast.GtE)):
                        left, right = right, left
                    elif not isinstance(op, (ast.Lt, ast.LtE)):
                        continue
                    # Time elapsed since a clock read, held under any bound
                    # (``max(10.0, 0.5 * left)`` too), is a speed claim whatever the bound is
                    # made of; a bare clock read under a deadline is a wait's "never" bound.
                    elapsed = not isinstance(left, ast.Call) and _reads_clock(left)
                    if elapsed or (_is_duration(left) and _is_number(right, constants)):
                        findings.append(Finding(
                            path, node.lineno, f"duration bound '{ast.unparse(compare)}': "
                            "assert the outcome here, the time in test/drills/"))
                        break
    return sorted(findings, key=lambda f: f.line)


def _top_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """Return the statements run at import: the body, and what its ifs, trys and withs hold."""
    found = []
    for node in body:
        found.append(node)
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            inner = [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])]
            for handler in getattr(node, "handlers", []):
                inner.extend(handler.body)
            found.extend(_top_level(inner))
    return found


def heavy_imports(path: Path, source: str) -> list[Finding]:
    """Module-level imports of ``HEAVY_IMPORTS`` (statements or ``importorskip`` calls)."""
    findings = []
    for node in _top_level(ast.parse(source, filename=str(path)).body):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        else:
            for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
                if isinstance(call.func, ast.Attribute) and call.func.attr == "importorskip" \
                        and call.args and isinstance(call.args[0], ast.Constant):
                    names.append(str(call.args[0].value))
        for name in names:
            if name.split(".")[0] in HEAVY_IMPORTS:
                findings.append(Finding(path, node.lineno, f"'{name}' imported at module level: "
                                        "every worker pays it at collection; import it in the "
                                        "test or fixture"))
    return findings


def check(root: Path, pending: dict[str, int] | None = None) -> list[Finding]:
    """Return every finding under ``root``'s test/ directory, less the ``pending`` ones.

    A module with exactly its pending count passes; any other count reports all its findings
    (and, when it fell, a line asking to lower the count).
    """
    pending = {} if pending is None else pending
    findings = []
    for path in test_modules(root):
        rel = path.relative_to(root)
        found = check_source(rel, path.read_text())
        allowed = pending.get(rel.as_posix(), 0)
        if len(found) == allowed:
            continue
        findings.extend(found)
        if len(found) < allowed:
            findings.append(Finding(rel, 0, f"{len(found)} finding(s), {allowed} pending: "
                                    "lower its count in PENDING (scripts/check_test_timing.py)"))
    for path in sorted((root / "test").rglob("test_*.py")):
        findings.extend(heavy_imports(path.relative_to(root), path.read_text()))
    return findings


def main(argv: list[str]) -> int:
    """Print the findings; exit 1 if there are any."""
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent
    findings = check(root, PENDING)
    for finding in findings:
        print(finding)
    if findings:
        print(f"check_test_timing: {len(findings)} finding(s); durations belong in "
              "test/drills/ (docs/DEVELOPING.md, 'Tests')", file=sys.stderr)
        return 1
    print(f"check_test_timing: clean ({sum(PENDING.values())} pending in "
          f"{len(PENDING)} modules)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
