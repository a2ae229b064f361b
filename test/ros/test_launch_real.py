"""The real node started the way users start it, and what a SIGKILL of it leaves: nothing.

What only this module proves: the other real-tier modules start ``python -m
cosmos_reason_ros.ros.node``, whose spawned children (vLLM's engine core and worker) run that
module as their main. Users start the installed ``cosmos_reason_node`` executable, directly
(``ros2 run``) or through ``ros2 launch``: there the main module is the console-script wrapper,
a different path through multiprocessing's spawn. Here the engine processes of a node started
either way must end with it when it is SIGKILLed, and the real ``ros2 lifecycle`` and
``ros2 param`` command lines drive and read the launched node. ``ros2 launch`` itself ended
by SIGTERM (``systemctl stop``, ``docker stop``) or SIGKILL must take the node and its engine
with it (launch orphans what it started on SIGTERM). A fast test first shows, on a
wrapper of the same shape, which main module spawned children run with and without
``process_life.spawn_children_from``.

The ``ros2`` command line (launch, launch_ros, ros2cli) has no PyPI wheel: ``make setup``
builds it from ``../shared/ros-src`` where that folder exists (``scripts/build_ros_src.sh``);
without it the launch test skips, and the direct executable test still runs.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Sequence
from pathlib import Path

import pytest

pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
from lifecycle_manager import Manager  # noqa: E402
from lifecycle_msgs.msg import Transition  # noqa: E402
from node_process import (  # noqa: E402
    NodeProcess,
    ProcessTree,
    ros2,
    ros_arguments,
    signal_state,
)
from spun_node import SpunNode  # noqa: E402
from waiting import NEVER_S  # noqa: E402

pytestmark = [pytest.mark.ros]

# vLLM's own multiprocessing (the default outside tests): the engine core is a child of the
# node and its worker a grandchild, the processes a SIGKILLed node used to leave running.
ENGINE_PROCESSES = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
GONE_S = 30.0  # bound for the engine processes to end after the node: expiry = "never"


def installed_executable() -> Path | None:
    """``cosmos_reason_node`` where ``ros2 run`` finds it: lib/<package>/ of its prefix."""
    try:
        from ament_index_python.packages import PackageNotFoundError, get_package_prefix
    except ImportError:
        return None
    try:
        path = Path(get_package_prefix("cosmos_reason_ros")) / "lib" / "cosmos_reason_ros" \
            / "cosmos_reason_node"
    except PackageNotFoundError:
        return None
    return path if os.access(path, os.X_OK) else None


class InstalledNode(NodeProcess):
    """The installed executable, as ``ros2 run cosmos_reason_ros cosmos_reason_node`` runs it."""

    def command(self, preset: str, params: dict[str, object],
                remaps: Sequence[str]) -> list[str]:
        executable = installed_executable()
        assert executable is not None
        return [str(executable), *ros_arguments(preset, params, remaps)]


class LaunchedNode(NodeProcess):
    """``ros2 launch cosmos_reason_ros cosmos_reason.launch.py`` with the preset, no autostart."""

    autostart = False

    def command(self, preset: str, params: dict[str, object],
                remaps: Sequence[str]) -> list[str]:
        return ["ros2", "launch", "cosmos_reason_ros", "cosmos_reason.launch.py",
                f"config:={preset}", f"model:={params['engine.model']}",
                f"autostart:={str(self.autostart).lower()}"]


class PlainLaunchedNode(LaunchedNode):
    """A plain ``ros2 launch`` (autostart: configured and activated at start)."""

    autostart = True


def transition(node: NodeProcess, label: str, transition_id: int) -> None:
    """``ros2 lifecycle set /cosmos_reason <label>``; the node's state decides.

    See ``Manager.transition_by_cli``: a lost request or reply of the command line is reported
    as a warning with the node's lifecycle lines, not taken for the node's failure.
    """
    side = SpunNode("launch_test_lifecycle_manager")
    try:
        trouble = Manager(side).transition_by_cli(label, transition_id)
    except AssertionError as e:
        raise AssertionError(f"{e}\nthe node printed:\n{node.output[-3000:]}") from None
    finally:
        side.close()
    if trouble:
        lines = [line for line in node.output.splitlines() if "lifecycle" in line]
        warnings.warn(f"{trouble}; the node's lifecycle lines: {lines}", stacklevel=2)


def skip_without_ros2() -> None:
    if shutil.which("ros2") is None:
        pytest.skip("no ros2 command line: make setup builds it from ../shared/ros-src "
                    "(scripts/build_ros_src.sh) where that folder exists")


def node_below(tree: ProcessTree) -> object:
    """The node's process among those seen below ``ros2 launch``."""
    ok = tree.wait_for(lambda t: any(_is_node(p) for p in t.seen()), GONE_S)
    assert ok, f"no cosmos_reason_node process below ros2 launch: {tree.names()}"
    return next(p for p in tree.seen() if _is_node(p))


def _is_node(process) -> bool:
    try:
        return any(arg.endswith("/cosmos_reason_node") for arg in process.cmdline()[:2])
    except Exception:  # noqa: BLE001 - ended meanwhile
        return False


def kill_node_and_check_nothing_remains(node: NodeProcess, tree: ProcessTree,
                                        node_pid: int) -> None:
    """SIGKILL the node; every process seen below it (the engine core, its worker) must end."""
    engine = [p for p in tree.seen() if p.pid != node_pid]
    assert engine, f"no engine process seen below the node: {tree.names()}"
    os.kill(node_pid, signal.SIGKILL)
    survivors = [p for p in tree.survivors_after(GONE_S) if p.pid != node.proc.pid]
    assert not survivors, (
        f"still alive {GONE_S:g} s after the node was SIGKILLed: "
        f"{[(p.pid, p.name()) for p in survivors]}; seen: {tree.names()}\n"
        f"{node.output[-3000:]}")


# --- fast: what spawned children of a console-script wrapper run as their main ---------------

# A module standing for the node: its main() spawns a child, which reports its main module.
ENTRY_MODULE = textwrap.dedent("""
    import multiprocessing, sys
    from cosmos_reason_ros.ros import process_life

    def report(queue):
        queue.put(getattr(sys.modules["__main__"].__spec__, "name", None))

    def main(fix):
        if fix:
            process_life.spawn_children_from("entry_module")
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        child = context.Process(target=report, args=(queue,))
        child.start()
        print("child main:", queue.get(timeout=120))
        child.join(120)
""")
# The shape of setuptools' console script (what colcon and the distros' builds install): the
# entry module is imported only under __main__, so a spawned child running this file as
# __mp_main__ never imports it.
WRAPPER = textwrap.dedent("""
    import sys
    if __name__ == "__main__":
        from entry_module import main
        sys.exit(main(sys.argv[1] == "fix"))
""")


@pytest.mark.slow  # starts processes
@pytest.mark.parametrize("fix", [False, True], ids=["as-is", "spawn_children_from"])
def test_children_spawned_under_a_console_script_run_the_entry_module(tmp_path, fix):
    (tmp_path / "entry_module.py").write_text(ENTRY_MODULE)
    (tmp_path / "wrapper").write_text(WRAPPER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), str(Path(__file__).resolve().parents[2]),
         os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(tmp_path / "wrapper"), "fix" if fix else "-"],
                          capture_output=True, text=True, env=env, timeout=NEVER_S, check=False)
    assert done.returncode == 0, done.stderr
    # Without it the child runs the wrapper (no spec): the node's guard would never be armed.
    expected = "entry_module" if fix else "None"
    assert f"child main: {expected}" in done.stdout, done.stdout + done.stderr


# --- real: the installed executable and ros2 launch, SIGKILLed -----------------------------


@pytest.mark.engine
@pytest.mark.slow
def test_sigkilled_installed_executable_leaves_no_engine_process(tiny_qwen3_vl):
    if installed_executable() is None:
        pytest.skip("cosmos_reason_node is not installed (make setup builds it with colcon)")
    node = InstalledNode("cpu_demo", {"engine.model": str(tiny_qwen3_vl)},
                         env=ENGINE_PROCESSES)
    tree = ProcessTree(node.proc.pid)
    try:
        node.wait_ready()
        kill_node_and_check_nothing_remains(node, tree, node.proc.pid)
    finally:
        node.stop()
        tree.close()


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.every_distro  # launch, launch_ros and ros2cli are each distro's own
def test_launched_node_answers_ros2_lifecycle_and_param_and_dies_whole(tiny_qwen3_vl):
    skip_without_ros2()
    node = LaunchedNode("cpu_demo", {"engine.model": str(tiny_qwen3_vl)}, env=ENGINE_PROCESSES)
    tree = ProcessTree(node.proc.pid)
    try:
        assert node.wait_for_line("waiting for configure and activate", 120.0), \
            node.output[-3000:]
        transition(node, "configure", Transition.TRANSITION_CONFIGURE)
        transition(node, "activate", Transition.TRANSITION_ACTIVATE)
        node.wait_ready()
        assert "Integer value is: 512" in ros2("param", "get", "/cosmos_reason",
                                              "limits.max_tokens")
        kill_node_and_check_nothing_remains(node, tree, node_below(tree).pid)
    finally:
        node.stop()
        tree.close()


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.parametrize("moment", ["engine start", "ready"])
def test_ctrl_c_of_ros2_launch_leaves_no_process(tiny_qwen3_vl, moment):
    """Ctrl-C in the terminal of a plain ``ros2 launch`` (SIGINT to its whole process group).

    While activate loads the engine (its core process just spawned), or once ready. launch
    passes the stop on to the node and escalates to SIGTERM and SIGKILL if the node is slow:
    whichever ends it, the engine's processes must end too.
    """
    skip_without_ros2()
    node = PlainLaunchedNode("cpu_demo", {"engine.model": str(tiny_qwen3_vl)},
                             env=ENGINE_PROCESSES)
    tree = ProcessTree(node.proc.pid)
    try:
        if moment == "ready":
            node.wait_ready()
        else:  # launch -> node -> engine core: activate is loading the engine
            assert tree.wait_for(lambda t: t.spawned(2), 300.0), \
                f"no engine core below the launched node: {tree.names()}\n{node.output[-3000:]}"
        os.killpg(node.proc.pid, signal.SIGINT)
        node.proc.wait(GONE_S)
        survivors = tree.survivors_after(GONE_S)
        assert not survivors, (
            f"still alive after Ctrl-C of ros2 launch at {moment}: "
            f"{[(p.pid, p.name()) for p in survivors]}; seen: {tree.names()}\n"
            f"{node.output[-3000:]}")
    finally:
        node.stop()
        tree.close()


@pytest.mark.engine
@pytest.mark.slow
def test_kill_9_of_the_launched_node_during_activate_leaves_no_process(tiny_qwen3_vl):
    """An OOM kill of the node while activate starts the engine (its core just spawned).

    The engine core must notice its parent is gone and end, worker included, whether or not
    it had spawned its worker yet.
    """
    skip_without_ros2()
    node = PlainLaunchedNode("cpu_demo", {"engine.model": str(tiny_qwen3_vl)},
                             env=ENGINE_PROCESSES)
    tree = ProcessTree(node.proc.pid)
    try:
        assert tree.wait_for(lambda t: t.spawned(2), 300.0), \
            f"no engine core below the launched node: {tree.names()}\n{node.output[-3000:]}"
        kill_node_and_check_nothing_remains(node, tree, node_below(tree).pid)
    finally:
        node.stop()
        tree.close()


# --- real: ros2 launch itself ended by a signal ----------------------------------------------


def launcher_ended_leaves_no_process(node: NodeProcess, tree: ProcessTree, signum: int,
                                     moment: str) -> None:
    """Send ``signum`` to ``ros2 launch`` alone; the node below it and its engine must end."""
    assert node_below(tree) is not None
    node.proc.send_signal(signum)
    node.proc.wait(GONE_S)
    survivors = tree.survivors_after(GONE_S)
    assert not survivors, (
        f"still alive after {signal.Signals(signum).name} of ros2 launch ({moment}): "
        f"{[(p.pid, p.name()) for p in survivors]}; seen: {tree.names()}; "
        f"{[signal_state(p.pid) for p in survivors]}\n{node.output[-3000:]}")


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_ros2_launch_ended_alone_takes_the_unconfigured_node_with_it(signum):
    """``systemctl stop`` / ``docker stop`` (SIGTERM) or an OOM kill (SIGKILL) of launch alone.

    launch ends on SIGTERM without stopping what it started, and can do nothing on SIGKILL:
    the node must notice its launcher is gone and stop (it used to run on with parent PID 1).
    The node is left unconfigured: no engine is needed to show it.
    """
    skip_without_ros2()
    node = LaunchedNode("cpu_demo", {"engine.model": "never-loaded-while-unconfigured"})
    tree = ProcessTree(node.proc.pid)
    try:
        assert node.wait_for_line("waiting for configure and activate", 120.0), \
            node.output[-3000:]
        launcher_ended_leaves_no_process(node, tree, signum, "unconfigured")
    finally:
        node.stop()
        tree.close()


@pytest.mark.engine
@pytest.mark.slow
def test_sigterm_of_ros2_launch_alone_stops_the_serving_node_and_its_engine(tiny_qwen3_vl):
    skip_without_ros2()
    node = PlainLaunchedNode("cpu_demo", {"engine.model": str(tiny_qwen3_vl)},
                             env=ENGINE_PROCESSES)
    tree = ProcessTree(node.proc.pid)
    try:
        node.wait_ready()
        launcher_ended_leaves_no_process(node, tree, signal.SIGTERM, "ready")
    finally:
        node.stop()
        tree.close()
