#!/usr/bin/env python3
"""How long the machine left a runnable process unscheduled: .ci/run's evidence of freezes.

    python3 scripts/stall_meter.py LOG            # measure until SIGTERM/SIGINT
    python3 scripts/stall_meter.py --summary LOG  # what LOG holds, in a few lines

``held_s(LOG, start, end)``: for how many seconds of a span the machine held a process (the
drills credit it against their hard bounds: a figure that spans a freeze measures the machine).

One process per CPU, pinned to it, and one free to move wake every 10 ms and log each wake that
came more than THRESHOLD_S late (time of day, CPU, seconds late, the wake's wall-clock
time). A loaded fresh-clone CI run
on this 2-core VM left such a process unscheduled for 19-49 s on both CPUs at once: any wait in
a test, a DDS delivery or a process start in that window takes that much longer, whatever
the code under test does. Standard library only: it starts before the venvs exist.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

PERIOD_S = 0.01
THRESHOLD_S = 1.0  # smaller delays are ordinary scheduling on a loaded machine
SHOWN = 10  # the longest freezes listed by --summary
PR_SET_PDEATHSIG = 1


def _watch(log_path: str, cpu: int | None) -> None:
    """Log this process's late wakes, pinned to ``cpu`` (None: free to move).

    A process of its own: threads of one process wait for each other's GIL, so one frozen
    CPU would look like all of them.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # never outlives the meter's parent
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(0)
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    name = "any" if cpu is None else str(cpu)
    with open(log_path, "a", buffering=1) as log:
        while True:
            t = time.monotonic()
            time.sleep(PERIOD_S)
            late = time.monotonic() - t - PERIOD_S
            if late > THRESHOLD_S:
                log.write(f"{time.strftime('%H:%M:%S')} cpu={name} late_s={late:.2f} "
                          f"at={time.time():.2f}\n")


def measure(log_path: str) -> None:
    """Log late wakes to ``log_path`` until SIGTERM or SIGINT."""
    cpus = sorted(os.sched_getaffinity(0))
    with open(log_path, "a") as log:
        log.write(f"{time.strftime('%H:%M:%S')} start cpus={len(cpus)}\n")
    children = []
    for cpu in [*cpus, None]:
        pid = os.fork()
        if pid == 0:
            try:
                _watch(log_path, cpu)
            finally:
                os._exit(0)
        children.append(pid)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    # Ends with what started it: a run killed with SIGKILL leaves no meter behind.
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() == 1:  # the parent died before prctl took effect
        stop.set()
    stop.wait()
    for pid in children:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def _wakes(log_path: str) -> list[dict[str, str]]:
    """Each late wake in ``log_path``: time of day, ``cpu``, ``late_s`` and (if written) ``at``.

    Raises FileNotFoundError when there is no log.
    """
    with open(log_path) as log:
        return [{"time": line.split()[0],
                 **dict(word.split("=", 1) for word in line.split()[1:] if "=" in word)}
                for line in log if "late_s=" in line]


def summary(log_path: str) -> str:
    """One line: how many late wakes ``log_path`` holds and the longest ones."""
    try:
        wakes = _wakes(log_path)
    except FileNotFoundError:
        return "stall meter: no log"
    events = [(float(w["late_s"]), w["time"], w["cpu"]) for w in wakes]
    if not events:
        return f"stall meter: no process was held more than {THRESHOLD_S:g} s"
    worst = sorted(events, reverse=True)[:SHOWN]
    return (f"stall meter: {len(events)} wakes more than {THRESHOLD_S:g} s late, "
            f"{sum(e[0] >= 10 for e in events)} of them 10 s or more; the longest: "
            + ", ".join(f"{late:.1f} s at {at} (cpu={cpu})" for late, at, cpu in worst))


def held_s(log_path: str, start: float, end: float) -> float:
    """Seconds of the wall-clock span [start, end] in which some CPU held a runnable process.

    The union over CPUs: a process whose thread sits on a frozen CPU is held however free the
    other one is. Freezes logged before ``at=`` was written (no wall-clock time) count nothing.
    """
    try:
        spans = [(max(start, float(w["at"]) - float(w["late_s"])), min(end, float(w["at"])))
                 for w in _wakes(log_path) if "at" in w]
    except FileNotFoundError:
        return 0.0
    held, reached = 0.0, start
    for lo, hi in sorted(s for s in spans if s[0] < s[1]):
        if hi > reached:
            held += hi - max(lo, reached)
            reached = hi
    return held


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--summary":
        print(summary(sys.argv[2]))
    elif len(sys.argv) == 2:
        measure(sys.argv[1])
    else:
        sys.exit(__doc__)
