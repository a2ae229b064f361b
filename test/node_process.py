"""Run the real node as its own process for integration tests, and talk to it over DDS."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from doc_blocks import doc_blocks
from waiting import FREEZE_S, NEVER_S

from cosmos_reason_ros.ros import process_life

REPO_ROOT = Path(__file__).resolve().parent.parent


def readme_python_example() -> str:
    """The README's Python example (its first block after the client's lead-in), as printed."""
    readme = REPO_ROOT / "README.md"
    lead_in = readme.read_text(encoding="utf-8").splitlines().index(
        "From Python (planners, behaviour trees):") + 1
    return next(b.source for b in doc_blocks({"python"}, [readme]) if b.line > lead_in)


def text_schema(chars: int) -> str:
    """A response schema of one string of exactly ``chars`` characters.

    Under constrained decoding it forces a long answer: random weights stop only when made to.
    """
    return json.dumps({"type": "object", "properties": {"text": {
        "type": "string", "minLength": chars, "maxLength": chars}}, "required": ["text"],
        "additionalProperties": False})


# Goals that run until cancelled (or max_tokens): no answer of ENDLESS_TOKENS tokens can
# finish the string, and the tiny model writes 1500 characters in under a second, so shorter
# "busy" goals can end before a test's cancel or check. A node serving them needs
# ENDLESS_LIMITS.
ENDLESS_SCHEMA = text_schema(30000)
ENDLESS_TOKENS = 3000
ENDLESS_LIMITS = {"limits.max_tokens": ENDLESS_TOKENS}


CLI_S = 120.0 + FREEZE_S  # bound for one ros2 command (its start and discovery on 2 cores)
READ_TRY_S = 60.0  # one try of a repeatable ros2 command, asked again within its bound


def ros2(*args: str, within_s: float = CLI_S) -> str:
    """Run a ``ros2`` verb without the daemon (it would outlive the test); return its output.

    Without the daemon each command discovers the graph afresh, for half a second: on a loaded
    machine that can miss the node ("Node not found", nothing sent), so it is asked again. A
    read (``get``, ``list``, ``describe``) is asked again too when its reply never came (the
    CLI waits for a service reply without a bound, and rmw_fastrtps drops a reply whose
    reader it has not matched yet: docs/RELIABILITY.md, "the lost hops") or its command line
    crashed (ros2cli has died of SIGSEGV tearing down its own rclpy on a loaded machine); so
    is ``param set``, which sets the same value again. A lifecycle transition is not: it may
    have been made (``lifecycle_manager.Manager.transition_by_cli`` watches the node's state
    instead). A repeatable command is asked until ``within_s`` has passed.
    """
    repeatable = len(args) > 1 and (args[1] in ("get", "list", "describe")
                                    or tuple(args[:2]) == ("param", "set"))
    deadline = time.monotonic() + within_s
    while True:
        try:
            done = subprocess.run(["ros2", *args, "--no-daemon"], capture_output=True, text=True,
                                  timeout=READ_TRY_S if repeatable else CLI_S, check=False)
        except subprocess.TimeoutExpired as e:
            if not repeatable or time.monotonic() > deadline:
                printed = f"{_text(e.stdout)!r} {_text(e.stderr)!r}"
                raise AssertionError(f"ros2 {' '.join(args)}: no end within {e.timeout} s; "
                                     f"it printed: {printed}") from None
            continue
        again = "Node not found" in done.stderr or (repeatable and done.returncode < 0)
        if not again or time.monotonic() > deadline:
            break
    assert done.returncode == 0, f"ros2 {' '.join(args)}: {done.returncode}\n{done.stdout}" \
        f"\n{done.stderr}"
    return done.stdout


def _text(output: str | bytes | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


_LOG_STAMP = re.compile(r"\[[A-Z]+\] \[(\d+\.\d+)\] ")


class NodeProcess:
    """``python -m cosmos_reason_ros.ros.node`` with a preset and overrides, in its own group.

    Output is collected in ``self.lines``; ``wait_for_line`` waits on it without sleeping
    blind. ``stop()`` sends SIGTERM and, as a last resort, kills the whole process group.
    """

    def __init__(self, preset: str = "cpu_demo", params: dict[str, object] | None = None,
                 remaps: Sequence[str] = (), env: dict[str, str] | None = None) -> None:
        args = self.command(preset, params or {}, remaps)
        self.lines: list[str] = []
        self._eof = False
        self._cond = threading.Condition()
        self.proc = subprocess.Popen(
            args, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}, start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()

    def command(self, preset: str, params: dict[str, object],
                remaps: Sequence[str]) -> list[str]:
        """The command line: the node module, with the preset and overrides as ROS arguments.

        A subclass starts the node another way (an installed executable, ``ros2 launch``).
        """
        return [sys.executable, "-m", "cosmos_reason_ros.ros.node",
                *ros_arguments(preset, params, remaps)]

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def logged_at(self, needle: str, since: float, count: int, timeout_s: float) -> list[float]:
        """Wall-clock stamps (s) of log lines holding ``needle`` stamped at ``since`` or later.

        Waits (bounded) until there are ``count`` of them: the node's output reaches this
        process through a pipe and a reader thread, later than the node wrote it. ROS 2's
        default console format: ``[LEVEL] [seconds.nanoseconds] [logger]: message``.
        """
        def stamps() -> list[float]:
            found = (_LOG_STAMP.match(line) for line in self.lines if needle in line)
            return [t for t in (float(m.group(1)) for m in found if m) if t >= since]

        with self._cond:
            self._cond.wait_for(lambda: len(stamps()) >= count or self._eof, timeout_s)
            return stamps()

    @property
    def output(self) -> str:
        """Everything the node printed so far (all of it, once the process has exited)."""
        with self._cond:
            if self.proc.poll() is not None:
                # The reader thread takes the pipe's last lines after the exit: a CI run read
                # an empty output right after wait() returned. (Bounded: a surviving child
                # holding the pipe open keeps EOF away.)
                self._cond.wait_for(lambda: self._eof, NEVER_S)
            return "\n".join(self.lines)

    def wait_for_line(self, needle: str, timeout_s: float) -> bool:
        """Wait until a line contains ``needle``; False on timeout or process exit."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                if any(needle in line for line in self.lines):
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._eof:  # output ends when the process exits
                    return any(needle in line for line in self.lines)
                self._cond.wait(min(remaining, 0.5))

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        """Block until the node logs that it is ready; raise with its output otherwise."""
        if not self.wait_for_line("]: ready: ", timeout_s):
            self.stop()
            raise RuntimeError(f"node not ready within {timeout_s} s:\n{self.output[-4000:]}")

    def stop_cleanly(self, timeout_s: float = NEVER_S) -> None:
        """Stop the node; fail with the end of its output unless it exited with code 0."""
        code = self.stop(timeout_s)
        assert code == 0, f"node exited with {code}:\n{self.output[-3000:]}"

    def stop(self, timeout_s: float = NEVER_S) -> int | None:
        """SIGTERM, wait, then SIGKILL the group; return the exit code (None if killed).

        A node that exits cleanly does so however long a frozen machine holds it: the bound
        says "never", not "too slow" (callers assert the exit code).
        """
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(NEVER_S)
        except subprocess.TimeoutExpired:
            return None
        return self.proc.returncode


def ros_arguments(preset: str, params: dict[str, object], remaps: Sequence[str]) -> list[str]:
    """``--ros-args --params-file <preset> -p name:=value ... -r remap ...``."""
    args = ["--ros-args", "--params-file", str(REPO_ROOT / "config" / f"{preset}.yaml")]
    for name, value in params.items():
        args += ["-p", f"{name}:={_ros_value(value)}"]
    for remap in remaps:
        args += ["-r", remap]
    return args


def _ros_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(f"'{v}'" for v in value) + "]"
    return str(value)


def rgb_image_msg(rgb: np.ndarray, stamp_ns: int, frame_id: str = "camera"):
    """A ``sensor_msgs/Image`` (rgb8) with the given stamp."""
    from std_msgs.msg import Header

    from cosmos_reason_ros.ros.messages import ns_to_stamp, rgb_image

    return rgb_image(rgb, Header(stamp=ns_to_stamp(stamp_ns), frame_id=frame_id))


def scene(width: int, height: int, seed: int = 0) -> np.ndarray:
    """A deterministic test picture (a gradient with a few coloured rectangles)."""
    rng = np.random.default_rng(seed)
    img = np.zeros((height, width, 3), np.uint8)
    img[..., 0] = np.linspace(0, 255, width, dtype=np.uint8)[None, :]
    img[..., 1] = np.linspace(0, 255, height, dtype=np.uint8)[:, None]
    for _ in range(4):
        x, y = rng.integers(0, width - 40), rng.integers(0, height - 40)
        img[y:y + 40, x:x + 40] = rng.integers(0, 255, 3)
    return img


class ProcessTree:
    """Every process seen below ``pid`` while it runs (polled), to check none outlives it.

    vLLM's engine processes come and go during start-up, so the tree is watched from the
    start: a process that was only seen once still counts. Children of a process seen are
    watched after it lost its parent too (an orphaned engine core may still spawn its worker).
    """

    def __init__(self, pid: int, period_s: float = 0.05) -> None:
        import psutil

        self._psutil = psutil
        self._root = psutil.Process(pid)
        self._seen: dict[int, psutil.Process] = {}
        self._parents: dict[int, int] = {}
        self._started: dict[int, int] = {}  # start time (clock ticks after boot), as first seen
        self._titles: dict[int, str] = {}  # as first seen
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._period_s = period_s
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        # One pass over /proc per period (the parent of every process), then the tree walked
        # down from the root and from every process seen (one whose parent ended included).
        # Not through psutil: its per-process objects cost 3x as much a pass, in the test's
        # own process, beside its DDS callbacks.
        while not self._stop.is_set():
            started_at: dict[int, int] = {}
            children: dict[int, list[int]] = {}
            for entry in process_life.processes():
                started_at[entry.pid] = entry.started
                children.setdefault(entry.parent, []).append(entry.pid)
            with self._cond:
                # a pid seen before is walked only while it is the same process (not reused)
                below = [self._root.pid] + [pid for pid, started in self._started.items()
                                            if started_at.get(pid) == started]
                while below:
                    parent = below.pop()
                    for pid in children.get(parent, ()):
                        if pid in self._seen:
                            continue
                        try:
                            process = self._psutil.Process(pid)
                        except self._psutil.Error:  # ended already
                            continue
                        self._parents[pid], self._seen[pid] = parent, process
                        self._started[pid] = started_at[pid]
                        self._titles[pid] = _describe(process)
                        below.append(pid)
                self._cond.notify_all()
            self._stop.wait(self._period_s)

    def seen(self) -> list:
        """The ``psutil.Process`` of every descendant seen so far."""
        with self._cond:
            return list(self._seen.values())

    def names(self) -> list[str]:
        """What each descendant seen is (or was when first seen), for messages."""
        with self._cond:
            seen = list(self._seen.items())
        return [_describe(p, self._titles.get(pid, str(pid))) for pid, p in seen]

    def spawned(self, depth: int) -> list:
        """Spawned descendants ``depth`` levels down: 1 the engine core, 2 its workers."""
        with self._cond:
            procs = dict(self._seen)
            parents = dict(self._parents)
        found = []
        for pid, process in procs.items():
            level, up = 1, parents.get(pid)
            while up is not None and up != self._root.pid:
                level, up = level + 1, parents.get(up)
            if level == depth and up == self._root.pid and is_spawned(process):
                found.append(process)
        return found

    def wait_for(self, predicate, timeout_s: float) -> bool:
        """Wait until ``predicate(self)`` holds; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not predicate(self):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(min(remaining, 0.5))
            return True

    def alive(self) -> list:
        """Descendants seen that still run (zombies waiting to be reaped have ended)."""
        alive = []
        for p in self.seen():
            try:
                if p.is_running() and p.status() != self._psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except self._psutil.Error:
                pass
        return alive

    def survivors_after(self, grace_s: float) -> list:
        """Descendants still alive ``grace_s`` after now (returns early once none is)."""
        deadline = time.monotonic() + grace_s
        while True:
            alive = self.alive()
            if not alive or time.monotonic() >= deadline:
                return alive
            time.sleep(0.1)

    def close(self) -> None:
        """Stop watching and kill whatever is left (a failed test must not leave them)."""
        self._stop.set()
        for p in self.alive():
            try:
                p.kill()
            except self._psutil.Error:
                pass


def _describe(process, fallback: str = "") -> str:
    try:
        return f"{process.pid} {' '.join(process.cmdline())[:100]}"
    except Exception:  # noqa: BLE001 - ended meanwhile
        return fallback or str(process.pid)


def signal_state(pid: int) -> str:
    """A process's signal and wait state, for a failure message about one that did not end:
    whether a stop signal is pending (delivered, not yet handled), blocked or caught, and
    where each thread waits in the kernel. Its parent's pipe may be gone with its log."""
    proc = Path(f"/proc/{pid}")
    try:
        fields = dict(line.split(":\t", 1) for line in
                      (proc / "status").read_text().splitlines() if ":\t" in line)
        waits = sorted({(t / "wchan").read_text() or "running" for t in (proc / "task").iterdir()})
    except OSError as e:
        return f"{pid}: {e}"
    keys = ("State", "PPid", "Threads", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")
    return f"{pid}: " + " ".join(f"{k}={fields.get(k, '?').strip()}" for k in keys) + \
        f" waits={waits}"


def is_spawned(process) -> bool:
    """True for a multiprocessing 'spawn' child (vLLM's engine core and workers).

    Their command line is the spawn bootstrap until vLLM retitles them ``VLLM::...``.
    """
    try:
        title = " ".join(process.cmdline())
    except Exception:  # noqa: BLE001 - ended meanwhile
        return False
    return "VLLM::" in title or "multiprocessing.spawn" in title
