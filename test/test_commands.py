"""Every command line quoted in README.md and docs/ (all of it) runs a real command with real flags.

A quoted line counts when it runs one of the package's console scripts (``NAME ...``,
``ros2 run cosmos_reason_ros NAME ...`` or ``python -m cosmos_reason_ros.MODULE ...``),
``ros2 launch cosmos_reason_ros FILE name:=value ...`` or ``make TARGET``. Lines come from
shell code blocks (continuations joined) and from inline code spans. Each command's ``--help``
runs once, in a subprocess as a user would run it, and every flag a line uses must be in it.
After ``source env-<distro>.sh`` the console scripts are on PATH (checked when the tests run
in that environment, as scripts/run_tests.sh runs them).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from doc_blocks import DOCS
from node_process import CLI_S

REPO_ROOT = Path(__file__).resolve().parent.parent
SHELL_FENCES = {"", "bash", "sh", "shell", "console"}
NODE_SCRIPT = "cosmos_reason_node"  # a ROS node: takes --ros-args only, has no --help


def _console_scripts() -> dict[str, str]:
    """``name -> module:function`` from setup.py's console_scripts."""
    tree = ast.parse((REPO_ROOT / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "console_scripts":
                    entries = ast.literal_eval(value)
                    return dict(tuple(p.strip() for p in e.split("=", 1)) for e in entries)
    raise AssertionError("setup.py declares no console_scripts")


SCRIPTS = _console_scripts()


@dataclass(frozen=True)
class DocCommand:
    """One quoted command: where it is, what it runs, and its arguments."""

    where: str  # "README.md:49"
    kind: str  # "script", "module", "launch" or "make"
    name: str  # script name, module, launch file or make target
    args: tuple[str, ...]


def _candidates(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of every shell line in code blocks and every inline code span."""
    out: list[tuple[int, str]] = []
    fence: str | None = None
    pending: tuple[int, str] | None = None
    for number, line in enumerate(path.read_text().splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            fence = None if fence is not None else stripped[3:].strip().lower()
            continue
        if fence is not None:
            if fence not in SHELL_FENCES:
                continue
            start, text = pending or (number, "")
            text += " " + stripped.removeprefix("$ ")
            if text.endswith("\\"):
                pending = (start, text[:-1])
                continue
            pending = None
            out.append((start, text.strip()))
        else:
            out += [(number, span) for span in re.findall(r"`([^`\n]+)`", line)]
    return out


def _segments(text: str) -> list[list[str]]:
    """Shell words of each simple command in ``text`` (``&&``, ``|``, ``;`` split them)."""
    text = re.sub(r"\$\([^)]*\)", "SUBST", text)  # "$(pgrep ...)" is an argument, not a command
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    try:
        words = list(lexer)
    except ValueError:  # unbalanced quotes: prose in a code span, not a command
        return []
    segments, current = [], []
    for word in words:
        if word and set(word) <= set(";&|"):
            segments.append(current)
            current = []
        else:
            current.append(word)
    return [s for s in [*segments, current] if s]


def _command(words: list[str], where: str) -> DocCommand | None:
    while words and (re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]) or words[0] == "sudo"):
        words = words[1:]
    if not words:
        return None
    if words[0] in SCRIPTS:
        return DocCommand(where, "script", words[0], tuple(words[1:]))
    if words[:3] == ["ros2", "run", "cosmos_reason_ros"] and len(words) > 3:
        return DocCommand(where, "script", words[3], tuple(words[4:]))
    if words[:3] == ["ros2", "launch", "cosmos_reason_ros"] and len(words) > 3:
        return DocCommand(where, "launch", words[3], tuple(words[4:]))
    if re.fullmatch(r"python3?", words[0]) and words[1:2] == ["-m"] and len(words) > 2 \
            and words[2].startswith("cosmos_reason_ros"):
        return DocCommand(where, "module", words[2], tuple(words[3:]))
    if words[0] == "make" and len(words) > 1:
        return DocCommand(where, "make", words[1], tuple(words[2:]))
    return None


def doc_commands() -> list[DocCommand]:
    """Every command of ours quoted in the docs."""
    found = []
    for path in DOCS:
        for number, text in _candidates(path):
            for words in _segments(text):
                cmd = _command(words, f"{path.relative_to(REPO_ROOT)}:{number}")
                if cmd is not None:
                    found.append(cmd)
    return found


COMMANDS = doc_commands()


def _flags(args: tuple[str, ...]) -> list[str]:
    """The options a line passes (up to ``--ros-args``, after which ROS takes over)."""
    flags = []
    for arg in args:
        if arg == "--ros-args":
            break
        if re.fullmatch(r"--[A-Za-z][\w-]*(=.*)?", arg):
            flags.append(arg.split("=", 1)[0])
        elif re.fullmatch(r"-[A-Za-z]", arg):
            flags.append(arg)
    return flags


@functools.cache
def help_text(kind: str, name: str) -> str:
    """``--help`` of a console script (its entry point) or of a ``python -m`` module."""
    if kind == "script":
        module, function = SCRIPTS[name].split(":")
        code = (f"import sys; from {module} import {function} as main; sys.argv[0] = {name!r}; "
                f"sys.exit(main())")
        argv = [sys.executable, "-c", code, "--help"]
    else:
        argv = [sys.executable, "-m", name, "--help"]
    proc = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=CLI_S)
    assert proc.returncode == 0, f"{' '.join(argv[-2:])} failed:\n{proc.stderr[-2000:]}"
    assert "usage:" in proc.stdout, proc.stdout[:500]
    return proc.stdout


def _launch_arguments(launch_file: Path) -> set[str]:
    tree = ast.parse(launch_file.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "ARGUMENTS":
            return {name for name, _, _ in ast.literal_eval(node.value)}
    raise AssertionError(f"{launch_file.name} has no ARGUMENTS table")


def _make_targets() -> set[str]:
    text = (REPO_ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z][\w-]*):(?!=)", text, re.M))


def test_the_docs_quote_each_user_command() -> None:
    # Guards the extraction itself: these are quoted today and must be found.
    named = {c.name for c in COMMANDS if c.kind == "script"}
    assert {"query", "replay", "bench", "soak", "demo_recording"} <= named
    assert any(c.kind == "launch" for c in COMMANDS) and any(c.kind == "make" for c in COMMANDS)


@pytest.mark.slow  # starts processes or waits on real time: the real tier
@pytest.mark.parametrize("cmd", COMMANDS, ids=[f"{c.where}:{c.name}" for c in COMMANDS])
def test_quoted_command_and_its_flags_exist(cmd: DocCommand) -> None:
    flags = _flags(cmd.args)
    if cmd.kind == "make":
        assert cmd.name in _make_targets(), f"{cmd.where}: no make target {cmd.name!r}"
        return
    if cmd.kind == "launch":
        launch_file = REPO_ROOT / "launch" / cmd.name
        assert launch_file.is_file(), f"{cmd.where}: no launch/{cmd.name}"
        declared = _launch_arguments(launch_file)
        for arg in cmd.args:
            name, sep, value = arg.partition(":=")
            assert sep and name in declared, f"{cmd.where}: {cmd.name} has no argument {name!r}"
            if name == "config" and "/" not in value and not value.startswith("<"):
                assert (REPO_ROOT / "config" / f"{value}.yaml").is_file(), \
                    f"{cmd.where}: no preset {value!r}"
        return
    if cmd.kind == "script":
        assert cmd.name in SCRIPTS, f"{cmd.where}: {cmd.name!r} is not a console script"
        module = SCRIPTS[cmd.name].split(":")[0]
    else:
        module = cmd.name
    assert importlib.util.find_spec(module) is not None, f"{cmd.where}: no module {module}"
    if module == SCRIPTS[NODE_SCRIPT].split(":")[0]:
        assert not flags, f"{cmd.where}: the node takes only --ros-args, not {flags}"
        return
    if not flags:
        return  # the command's existence is all the line claims
    text = help_text(cmd.kind, cmd.name)
    for flag in flags:
        assert re.search(rf"(^|[\s,\[]){re.escape(flag)}([\s=,\]]|$)", text, re.M), \
            f"{cmd.where}: {cmd.name} has no option {flag} (see its --help)"


@pytest.mark.slow  # starts processes or waits on real time: the real tier
@pytest.mark.skipif("COSMOS_REASON_ROS_DISTRO" not in os.environ,
                    reason="needs the environment of env-<distro>.sh (scripts/run_tests.sh)")
@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_console_script_is_on_path_after_sourcing_the_env_file(name: str) -> None:
    # The setup target names the build folder (jazzy-py310 builds Jazzy into its own).
    distro = os.environ.get("COSMOS_REASON_SETUP") or os.environ["COSMOS_REASON_ROS_DISTRO"]
    lib = REPO_ROOT / "build" / distro / "install" / "cosmos_reason_ros" / "lib" / \
        "cosmos_reason_ros"
    found = shutil.which(name)
    assert found is not None, f"{name} is not on PATH ({lib} should be, from env-{distro}.sh)"
    assert Path(found).resolve().parent == lib.resolve()
    if name != NODE_SCRIPT:  # the installed wrapper reaches the same entry point
        proc = subprocess.run([found, "--help"], capture_output=True, text=True, timeout=CLI_S)
        assert proc.returncode == 0 and proc.stdout == help_text("script", name), \
            proc.stderr[-2000:]
