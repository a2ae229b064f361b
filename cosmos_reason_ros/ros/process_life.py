"""Process life of the node: stop signals at any moment, and no process outliving the node.

vLLM runs its engine core (and, with its multiprocessing executor, a worker) in processes it
starts with multiprocessing ``spawn``. Before this module, those processes lived on with
parent PID 1 (gigabytes of RAM, still using CPU) when the node was killed or stopped during
start-up, and a terminal's Ctrl-C, which reaches the whole foreground process group, made them
print ``KeyboardInterrupt`` tracebacks. Three mechanisms, each for one way a node ends:

- ``guard_spawned_child`` (called by the node module at import): a spawned child imports its
  parent's ``__main__`` module as ``__mp_main__``, so every process the node spawns, and every
  process those spawn, runs it first -- whatever the entry point: ``main`` names the node
  module as the main module of spawned children (``spawn_children_from``), so an installed
  console script (``ros2 run``, ``ros2 launch``) gives them what ``python -m`` does. There
  the guard asks the kernel for SIGKILL when its parent
  dies (``PR_SET_PDEATHSIG``; forked children arm it through ``os.register_at_fork``), then
  checks that the parent is still the one it started from. This holds even when the node is
  SIGKILLed. Linux sends the signal when the parent *thread* that started the child exits:
  vLLM starts its engine core from the engine runner's loop thread, which lives as long as
  the engine, and the core starts its workers from its main thread.
- ``StopSignals``: SIGINT/SIGTERM raise ``StartupInterrupted`` in the main thread while the
  node starts (the main thread waits for the engine in short slices, so the exception comes
  within a fraction of a second), and only set ``stop`` once it serves: ``main`` then ends the
  goals in order. An activate a lifecycle manager asked for runs on an executor thread: the
  main loop sees the stop and ends that engine start the same way.
- ``end_descendants``: kills whatever still runs below the node (an interrupted engine start,
  or anything an engine shutdown left) and releases the shared memory those processes held.

The vLLM engine blocks SIGINT in the thread it spawns its processes from, and so they do too
(the mask is inherited; ``engines/vllm_local.py``): a terminal's Ctrl-C reaches the whole
process group but stops only the node, which stops its engine itself.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable
from multiprocessing import resource_tracker
from pathlib import Path
from types import FrameType
from typing import NamedTuple

PARENT_ENV = "COSMOS_REASON_PARENT_PID"  # the pid a process spawned from here must die with
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_WATCH_PERIOD_S = 0.5  # parent check period where prctl is unavailable
# Files in /dev/shm that multiprocessing creates and registers with its resource tracker:
# prefix -> (resource type, registered name from the file name).
_TRACKED_FILES = {
    "psm_": ("shared_memory", lambda file: "/" + file),  # shared_memory.SharedMemory
    "sem.mp-": ("semaphore", lambda file: "/" + file[len("sem."):]),  # Lock, Semaphore...
}
_LOG = logging.getLogger(__name__)


class StartupInterrupted(BaseException):  # noqa: N818 - an interruption, like KeyboardInterrupt
    """A stop signal arrived while the node was starting (raised in the main thread).

    A ``BaseException``, like ``KeyboardInterrupt``, so that the ``except Exception`` blocks of
    start-up code do not take it for a failure of their own.
    """

    def __init__(self, signum: int) -> None:
        """Remember which signal interrupted the start."""
        super().__init__(signum)
        self.signum = signum

    @property
    def signal_name(self) -> str:
        """``SIGINT``, ``SIGTERM``..."""
        return signal.Signals(self.signum).name


class StopSignals:
    """SIGINT and SIGTERM for the node's main thread: interrupt the start, then request a stop.

    Until ``started()`` the first signal raises ``StartupInterrupted`` (once); afterwards any
    signal sets ``stop``, and a repeated one is counted (``repeats``) but changes nothing: the
    shutdown it would hurry is bounded already.
    """

    def __init__(self, signals: Iterable[int] = (signal.SIGINT, signal.SIGTERM)) -> None:
        """Install the handlers (main thread only)."""
        self.stop = threading.Event()
        self.signum: int | None = None
        self.repeats = 0
        self._starting = True
        for sig in signals:
            signal.signal(sig, self._on_signal)

    def started(self) -> None:
        """From now on a signal only sets ``stop``."""
        self._starting = False

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self.stop.is_set():
            self.repeats += 1
            return
        self.signum = signum
        self.stop.set()
        if self._starting:
            self._starting = False
            raise StartupInterrupted(signum)


# --- children: die with the parent -----------------------------------------------------------


def own_spawned_processes() -> None:
    """Make every process started from this one from now on die with it (see the module doc).

    Called by the node's ``main`` before the engine starts; the marker travels to children in
    the environment, and forked children arm themselves in an ``os.register_at_fork`` hook.
    """
    os.environ[PARENT_ENV] = str(os.getpid())
    os.register_at_fork(after_in_child=_arm)


# ros2 verbs that start the node and wait on it: when they die, nothing else stops the node.
_LAUNCHER_VERBS = ("launch", "run")


def stop_with_launcher() -> bool:
    """Under ``ros2 launch`` or ``ros2 run``: be sent SIGTERM when that process dies.

    ``ros2 launch`` ends on SIGTERM without stopping what it started ("using SIGTERM can result
    in orphaned processes", launch says), and neither it nor ``ros2 run`` can pass anything on
    when SIGKILLed: ``systemctl stop`` or ``docker stop`` of a launched robot left the node, and
    its engine's gigabytes, running with parent PID 1. SIGTERM stops the node as a stop signal
    does, goals and engine included. A node started any other way (a shell, ``nohup``, a
    supervisor) is left alone: outliving its parent may be what was meant. Returns whether armed.
    """
    parent = os.getppid()
    try:
        argv = Path(f"/proc/{parent}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    words = [Path(a.decode(errors="replace")).name for a in argv]
    pairs = zip(words, words[1:], strict=False)
    if not any(word == "ros2" and verb in _LAUNCHER_VERBS for word, verb in pairs):
        return False
    armed = _set_parent_death_signal(signal.SIGTERM)
    if armed and os.getppid() != parent:  # the launcher died before the signal was armed
        os.kill(os.getpid(), signal.SIGTERM)
    return armed


def spawn_children_from(module: str) -> None:
    """Make every process spawned from this one run ``module`` as its main (``__mp_main__``).

    multiprocessing's spawn tells the child which main module to run before anything else:
    the parent's ``__main__.__spec__.name`` when it has one (``python -m``), else its file
    path (``multiprocessing.spawn.get_preparation_data``; ``prepare`` in the child runs it as
    ``__mp_main__``). The guard lives in the node module, and an installed console script
    (what ``ros2 run`` and ``ros2 launch`` start) is a wrapper that imports the node only under
    ``if __name__ == "__main__"``: its spawned children ran the wrapper, never armed, and
    outlived a SIGKILLed node. The wrapper is written by setuptools, pip or the distro's build,
    not by us. Naming the node module in ``__main__.__spec__`` -- the value ``-m`` sets --
    gives every child exactly what ``python -m`` does, through the data multiprocessing reads
    rather than a patch of its private functions, and only to the node's children, unlike an
    interpreter start-up hook (``.pth``, ``sitecustomize``) that every Python process in the
    environment would run. What it costs: functions of the wrapper cannot be spawn targets;
    a wrapper defines none, and vLLM's targets live in vLLM's modules.
    """
    main = sys.modules.get("__main__")
    if main is None or getattr(main.__spec__, "name", None) == module:
        return
    main.__spec__ = importlib.util.find_spec(module)


def guard_spawned_child() -> None:
    """In a process spawned from a node (vLLM's engine core, its workers): die with the parent.

    Does nothing elsewhere: in the node itself, in tests and tools that import the node module,
    and in spawned children of programs that are not the node.
    """
    marker = os.environ.get(PARENT_ENV, "")
    if not marker.isdigit() or int(marker) == os.getpid() \
            or multiprocessing.current_process().name == "MainProcess":
        return
    _arm()
    os.register_at_fork(after_in_child=_arm)


def _arm() -> None:
    """Die with the parent: kernel parent-death signal, else a watchdog thread."""
    marker = os.environ.get(PARENT_ENV, "")
    if not marker.isdigit():
        return
    parent = int(marker)
    armed = _set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)
    os.environ[PARENT_ENV] = str(os.getpid())  # for the processes this one starts
    if not armed:
        threading.Thread(target=_watch_parent, args=(parent,), name="parent-watch",
                         daemon=True).start()


def _set_parent_death_signal(signum: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux
        return False


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(_WATCH_PERIOD_S)
    os.kill(os.getpid(), signal.SIGKILL)


# --- the node: end what is left below it ------------------------------------------------------


class ProcessEntry(NamedTuple):
    """One process as /proc/<pid>/stat gives it."""

    pid: int
    ended: bool  # a zombie: it has ended and waits for its parent to reap it
    parent: int
    started: int  # start time in clock ticks after boot: tells a reused pid apart


def processes() -> Iterable[ProcessEntry]:
    """Yield every process (Linux /proc), one read of its stat file each."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # ended meanwhile
            continue
        # "pid (comm) state ppid ... starttime ...": comm may hold spaces and parentheses.
        fields = text[text.rindex(")") + 2:].split()
        yield ProcessEntry(int(text.split(" ", 1)[0]), fields[0] == "Z", int(fields[1]),
                           int(fields[19]))


def descendants(pid: int | None = None) -> list[int]:
    """Live processes below ``pid`` (default: this process), parents first (Linux /proc)."""
    root = os.getpid() if pid is None else pid
    children: dict[int, list[int]] = {}
    for p in processes():
        if not p.ended:
            children.setdefault(p.parent, []).append(p.pid)
    found: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def shared_memory_below(keep: Iterable[int] = ()) -> set[str]:
    """Return the multiprocessing shared memory and semaphores mapped below this process.

    File names in ``/dev/shm``, for ``release_shared_memory``; processes in ``keep`` left out.
    """
    left_out = {_resource_tracker_pid(), *keep}
    return _mapped_files(pid for pid in descendants() if pid not in left_out)


def release_shared_memory(files: Iterable[str]) -> list[str]:
    """Unlink those of ``files`` (in ``/dev/shm``) that still exist; return them.

    For what a child created and could not release: vLLM's engine core is killed by its own
    shutdown when its worker is slow to exit, before it unlinks its message queue's segment.
    Children register these with their parent's resource tracker, which would unlink them when
    the node exits and warn "There appear to be N leaked shared_memory objects"; they are
    unregistered there too.
    """
    released = []
    for file in sorted(files):
        try:
            (Path("/dev/shm") / file).unlink()
        except FileNotFoundError:  # its owner released it
            continue
        except OSError as exc:
            _LOG.warning("could not unlink /dev/shm/%s: %s", file, exc)
            continue
        released.append(file)
        kind = next((v for k, v in _TRACKED_FILES.items() if file.startswith(k)), None)
        if kind is not None and _resource_tracker_pid() is not None:
            rtype, registered = kind
            try:
                resource_tracker.unregister(registered(file), rtype)
            except Exception as exc:  # noqa: BLE001 - the tracker then only warns
                _LOG.debug("resource tracker unregister %s failed: %s", file, exc)
    return released


def end_descendants(grace_s: float = 0.0, keep: Iterable[int] = ()) -> list[str]:
    """Kill every process below this one but the resource tracker; return their names.

    Processes in ``keep`` (there before the engine started) are left alone. The children
    that ended are reaped: an engine core that vLLM killed, or that was killed here, would
    otherwise stay a ``<defunct>`` entry until the next multiprocessing start.

    ``grace_s`` lets processes that are ending anyway go first (vLLM has just SIGKILLed its
    engine core: freeing a few GB takes the kernel a moment).

    They are stopped first, and the tree listed again until nothing new appears (a process
    started meanwhile would be orphaned by its parent's death, and no longer below this one),
    then the segments they hold are listed, they are killed, and the segments released. The
    resource tracker is left to exit by itself once nothing holds its pipe.
    """
    left_out = {_resource_tracker_pid(), *keep}
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(p not in left_out for p in descendants()):
        time.sleep(0.05)
    pids: list[int] = []
    for _ in range(10):  # until no process is starting below the stopped ones
        new = [p for p in descendants() if p not in left_out and p not in pids]
        if not new:
            break
        for pid in new:
            _signal(pid, signal.SIGSTOP)
        pids += new
    names = [_process_name(pid) for pid in pids]
    segments = _mapped_files(pids)
    for pid in pids:
        _signal(pid, signal.SIGKILL)
    release_shared_memory(segments)
    _reap(pids)
    _reap_ended([pid for pid in _ended_children() if pid not in left_out])
    return names


def _reap_ended(pids: list[int], timeout_s: float = 5.0) -> None:
    """Reap children whose main thread has ended (a zombie entry, not listed as descendants).

    vLLM's engine core ends by itself during the engine's close, but its main thread can end
    before its other threads: until they do, the process cannot be reaped, and it would stay
    a ``<defunct>`` entry after this returns. The rest of it is killed (it is ending anyway)
    and it is waited for, bounded.
    """
    for pid in pids:
        _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    pending = list(pids)
    while pending and time.monotonic() < deadline:
        for pid in list(pending):
            try:
                if os.waitpid(pid, os.WNOHANG)[0]:
                    pending.remove(pid)
            except ChildProcessError:  # reaped elsewhere (multiprocessing's own join)
                pending.remove(pid)
        if pending:
            time.sleep(0.02)


def _ended_children() -> list[int]:
    """Return the children of this process that have ended and wait to be reaped."""
    me = os.getpid()
    return [p.pid for p in processes() if p.ended and p.parent == me]


def _reap(killed: Iterable[int], timeout_s: float = 5.0) -> None:
    """Wait (bounded) until ``killed`` have died, then reap this process's ended children.

    ``multiprocessing.active_children`` joins the ended ones it started (vLLM's engine core),
    keeping its own bookkeeping right; killing frees gigabytes, which takes the kernel a moment.
    """
    pending = set(killed)
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        pending &= set(descendants())  # a zombie is no longer listed
        if pending:
            time.sleep(0.02)
    multiprocessing.active_children()


def end_interrupted_start() -> list[str]:
    """End an engine start cut short by a signal: kill its processes, quietly.

    Python logging is switched off first: the engine's loop thread sees its processes die and
    would report a failed start that is no failure (the process exits right after this).
    """
    logging.disable(logging.CRITICAL)
    return end_descendants()


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except OSError:  # ended meanwhile
        pass


def _process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() or str(pid)
    except OSError:
        return str(pid)


def _mapped_files(pids: Iterable[int]) -> set[str]:
    """Return the tracked ``/dev/shm`` files that ``pids`` map and that are not unlinked yet.

    Matched by inode: a semaphore is mapped under the temporary name glibc created it with
    (since unlinked), then linked to its real name.
    """
    inodes = set()
    for pid in pids:
        try:
            lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            fields = line.split(None, 5)  # address perms offset dev inode [path]
            if len(fields) == 6 and fields[5].startswith("/dev/shm/"):
                inodes.add(int(fields[4]))
    if not inodes:
        return set()
    try:
        entries = list(os.scandir("/dev/shm"))
    except OSError:
        return set()
    return {e.name for e in entries
            if e.name.startswith(tuple(_TRACKED_FILES)) and e.inode() in inodes}


def _resource_tracker_pid() -> int | None:
    # Started by the first spawn (of vLLM's engine core); children share it through its fd.
    tracker = getattr(resource_tracker, "_resource_tracker", None)
    pid = getattr(tracker, "_pid", None)
    return pid if isinstance(pid, int) else None
