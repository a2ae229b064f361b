"""The lifecycle node driven the way Nav2's lifecycle manager drives it (``lifecycle.autostart``
false), and the transitions' rules.

Transitions go through the real ``lifecycle_msgs`` services (``~/change_state``,
``~/get_state``, ``~/get_available_transitions``) from another DDS participant; parameters are
fixed through the node's ``~/set_parameters`` service. One real-engine test walks the whole
sequence (engine starts cost ~20 s each here): a failing activation first, then configure,
activate, goals, deactivate while a goal runs, activate again, cleanup, configure again. What
only it proves: the engine really starts on activate, stays loaded while inactive, and its
processes are gone after cleanup (looked for with psutil). Each transition's wall time is
printed (``-s``); docs/INTERFACES.md reports the medians. The fast tests drive the node on
the scripted engine: in this process through a manager client, or as a process (``serve``)
through the real ``ros2 lifecycle`` command line and signals.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
import warnings
from pathlib import Path

import pytest

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
psutil = pytest.importorskip("psutil")
from action_msgs.msg import GoalStatus  # noqa: E402
from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402
from fake_engine import FakeEngine, Script, answers_the_task  # noqa: E402
from inprocess_node import BASE_PARAMS, InProcessNode, image_msg  # noqa: E402
from lifecycle_manager import NODE, Manager  # noqa: E402
from lifecycle_msgs.msg import Transition  # noqa: E402
from lifecycle_msgs.srv import ChangeState  # noqa: E402
from node_process import (  # noqa: E402
    NodeProcess,
    ProcessTree,
    rgb_image_msg,
    ros2,
    scene,
    text_schema,
)
from rclpy.context import Context  # noqa: E402
from rclpy.executors import MultiThreadedExecutor  # noqa: E402
from rclpy.lifecycle import TransitionCallbackReturn  # noqa: E402
from rclpy.parameter import Parameter as NodeParameter  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402
from spun_node import SpinThread, SpunNode  # noqa: E402
from waiting import DISCOVERY_S, NEVER_S, wait_until  # noqa: E402

from cosmos_reason_interfaces.action import Reason  # noqa: E402
from cosmos_reason_interfaces.msg import ReasoningResult  # noqa: E402
from cosmos_reason_ros.client import ReasonClient  # noqa: E402
from cosmos_reason_ros.core.types import ErrorCode  # noqa: E402
from cosmos_reason_ros.ros.node import ReasonNode  # noqa: E402

pytestmark = [pytest.mark.ros]

SUCCESS = TransitionCallbackReturn.SUCCESS
ENDLESS = Script(deltas=["x "], delay_s=0.01, endless=True)
def _alive(processes: list) -> list:
    """Those still running (a zombie has ended: only its exit status is left to collect)."""
    alive = []
    for p in processes:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    return alive


@pytest.mark.engine
@pytest.mark.slow
def test_node_under_a_manager_walks_the_lifecycle_with_the_real_engine(tiny_qwen3_vl, tmp_path):
    not_a_model = tmp_path / "qwen3_vl_without_weights"
    not_a_model.mkdir()
    proc = NodeProcess("cpu_demo", {"lifecycle.autostart": False,
                                    "engine.model": str(not_a_model),
                                    "model.family": "qwen3_vl",
                                    "lifecycle.deactivate_goals": "finish",
                                    "lifecycle.deactivate_timeout_s": 60.0,
                                    "limits.max_tokens": 2000,
                                    "image.qos_reliability": "reliable",
                                    "image.qos_depth": 5})
    side = SpunNode("lifecycle_manager")
    client = ReasonClient()
    times: dict[str, float] = {}
    try:
        assert proc.wait_for_line("lifecycle: unconfigured, waiting", 120.0), proc.output
        manager = Manager(side)
        assert manager.state() == "unconfigured"
        assert "configure" in manager.available()

        # A failing activation: the directory exists (configure passes) but holds no model.
        ok, _ = manager.transition(Transition.TRANSITION_CONFIGURE)
        assert ok and manager.state() == "inactive", proc.output[-3000:]
        ok, _ = manager.transition(Transition.TRANSITION_ACTIVATE)
        assert not ok, proc.output[-3000:]
        assert manager.state() == "inactive"
        # Parameters other than the runtime ones are fixed while configured...
        ok, reason = manager.set_string("engine.model", str(tiny_qwen3_vl))
        assert not ok and "only while unconfigured" in reason
        ok, _ = manager.transition(Transition.TRANSITION_CLEANUP)
        assert ok and manager.state() == "unconfigured"
        # ... and settable once unconfigured: the node is configured again with the fix.
        ok, reason = manager.set_string("engine.model", str(tiny_qwen3_vl))
        assert ok, reason

        node_process = psutil.Process(proc.proc.pid)
        rss_mb = {"before activate": node_process.memory_info().rss / 2**20}
        ok, times["configure"] = manager.transition(Transition.TRANSITION_CONFIGURE)
        assert ok and manager.state() == "inactive", proc.output[-3000:]
        ok, times["activate"] = manager.transition(Transition.TRANSITION_ACTIVATE)
        assert ok and manager.state() == "active", proc.output[-3000:]
        rss_mb["active"] = node_process.memory_info().rss / 2**20
        assert proc.wait_for_line("]: ready: ", 5.0)
        # Below the node: the engine core (and its worker), and multiprocessing's resource
        # tracker, which is the process's and stays.
        engine_processes = [p for p in psutil.Process(proc.proc.pid).children(recursive=True)
                            if "resource_tracker" not in " ".join(p.cmdline())]
        assert engine_processes, "the engine's processes were not found below the node"

        camera = side.node.create_publisher(Image, "/image", 5)
        results: list[ReasoningResult] = []
        side.node.create_subscription(ReasoningResult, f"{NODE}/results", results.append, 50)
        assert side.wait_matched(camera)

        def publish_frames() -> None:
            for i in range(3):
                camera.publish(rgb_image_msg(scene(320, 240, i), side.now_ns()))
                time.sleep(0.05)  # paces: a 20 Hz camera

        publish_frames()
        assert client.wait_for_server(DISCOVERY_S)
        first = client.ask("What do you see?", max_tokens=8)
        assert first.ok, first.error_message

        # Deactivate while a goal runs: it finishes (deactivate_goals=finish); a goal sent
        # meanwhile is refused with the state in the reason.
        publish_frames()
        started = threading.Event()
        long_goal = client.submit(
            client.goal("Describe it.", max_tokens=1500, response_schema=text_schema(1200)),
            on_feedback=lambda fb: started.set() if fb.stage == "generating" else None)
        assert started.wait(NEVER_S), proc.output[-3000:]
        deactivated: dict[str, object] = {}
        deactivating = threading.Thread(target=lambda: deactivated.update(zip(
            ("ok", "s"), manager.transition(Transition.TRANSITION_DEACTIVATE), strict=True)))
        deactivating.start()
        assert proc.wait_for_line("lifecycle: deactivate from", 30.0)
        refused = client.ask("Anything?", max_tokens=8)
        assert refused.status == "rejected"
        deactivating.join(NEVER_S)
        assert deactivated["ok"], proc.output[-3000:]
        times["deactivate (goal running)"] = float(deactivated["s"])  # type: ignore[arg-type]
        finished = long_goal.result(NEVER_S)
        assert finished.ok, finished.error_message
        assert manager.state() == "inactive"
        refusals = [r for r in results if r.error_code == ErrorCode.ENGINE_UNAVAILABLE
                    and "lifecycle state" in r.error_message]
        assert refusals, [r.error_message for r in results]
        assert len(_alive(engine_processes)) == len(engine_processes)  # kept loaded

        ok, times["re-activate"] = manager.transition(Transition.TRANSITION_ACTIVATE)
        assert ok and manager.state() == "active"
        publish_frames()
        again = client.ask("And now?", max_tokens=8)
        assert again.ok, again.error_message

        ok, _ = manager.transition(Transition.TRANSITION_DEACTIVATE)
        assert ok
        ok, times["cleanup"] = manager.transition(Transition.TRANSITION_CLEANUP)
        assert ok and manager.state() == "unconfigured"
        wait_until(lambda: not _alive(engine_processes), NEVER_S,
                   "engine processes alive after cleanup")
        # Reaped by the cleanup itself: no <defunct> child is left waiting for a later start.
        zombies = [(p.pid, p.name()) for p in node_process.children()
                   if p.status() == psutil.STATUS_ZOMBIE]
        assert not zombies, zombies
        rss_mb["after cleanup"] = node_process.memory_info().rss / 2**20

        ok, times["configure again"] = manager.transition(Transition.TRANSITION_CONFIGURE)
        assert ok and manager.state() == "inactive"
        print("\nlifecycle transition times (s): " + ", ".join(
            f"{name}={took:.2f}" for name, took in times.items()))
        print("node RSS (MB): " + ", ".join(f"{k}={v:.0f}" for k, v in rss_mb.items()))
    finally:
        client.close()
        side.close()
        code = proc.stop()
    assert code == 0, proc.output[-3000:]


# --- the transitions' goal rules, on the scripted engine (fast tier) -------------------------


@pytest.fixture
def started():
    nodes: list[InProcessNode] = []

    def make(**params) -> InProcessNode:
        node = InProcessNode(params, script=lambda _r: ENDLESS)
        nodes.append(node)
        return node

    yield make
    for node in nodes:
        node.close()


def generating(n: InProcessNode, prompt: str):
    """Send a goal on the latest frame; return its handle once the engine streams for it."""
    feedback: list = []
    handle = n.send(feedback, prompt=prompt)
    assert handle.accepted
    wait_until(lambda: any(fb.stage == "generating" for fb in feedback), NEVER_S,
               "the goal never generated")
    return handle


def test_deactivate_with_cancel_stops_running_goals_refuses_new_ones_and_activates_again(
        started):
    # An hour's deactivate_timeout_s: a deactivate that waited for it instead of stopping the
    # goal at once would not return within the generous minute below.
    n = started(**{"lifecycle.deactivate_goals": "cancel",
                   "lifecycle.deactivate_timeout_s": 3600.0})
    n.publish()
    n.wait_frames(1)
    running = generating(n, "Describe at length.")
    returned: list = []
    deactivate = threading.Thread(target=lambda: returned.append(n.node.trigger_deactivate()),
                                  daemon=True)
    deactivate.start()
    deactivate.join(NEVER_S)
    assert returned == [SUCCESS], "deactivate waited for the goal instead of stopping it"
    status, result = n.result(running)
    assert status == GoalStatus.STATUS_ABORTED
    assert result.error_code == ErrorCode.ENGINE_UNAVAILABLE
    assert "node deactivating during generation" in result.error_message
    assert n.engine.aborted == [n.engine.requests[0].request_id] and not n.engine.running

    refused = n.send(prompt="Anything?")
    assert not refused.accepted
    reason = n.wait_result(lambda r: r.error_code == ErrorCode.ENGINE_UNAVAILABLE
                           and "lifecycle state 'inactive'" in r.error_message)
    assert reason.prompt == "Anything?"

    assert n.node.trigger_activate() == SUCCESS
    n.publish()
    n.wait_frames(2)
    again = generating(n, "And now?")
    again.cancel_goal_async()
    assert n.result(again)[0] == GoalStatus.STATUS_CANCELED


def test_deactivate_with_finish_stops_a_goal_still_running_after_the_timeout(started):
    n = started(**{"lifecycle.deactivate_goals": "finish",
                   "lifecycle.deactivate_timeout_s": 0.5})
    n.publish()
    n.wait_frames(1)
    running = generating(n, "Describe at length.")
    assert n.node.trigger_deactivate() == SUCCESS
    status, result = n.result(running)
    assert status == GoalStatus.STATUS_ABORTED
    assert result.error_code == ErrorCode.ENGINE_UNAVAILABLE
    assert "node deactivating" in result.error_message
    assert result.output_tokens > 0  # it ran until the timeout, then was stopped


def test_shutdown_from_active_ends_a_running_goal_as_a_shutdown(started):
    n = started()
    n.publish()
    n.wait_frames(1)
    running = generating(n, "Describe at length.")
    returned: list = []
    # The result is asked for while the shutdown runs: it serves result requests before its
    # action server goes (a client asking later finds none).
    shutdown = threading.Thread(target=lambda: returned.append(n.node.trigger_shutdown()))
    shutdown.start()
    status, result = n.result(running)
    shutdown.join(NEVER_S)
    assert returned == [SUCCESS]
    assert status == GoalStatus.STATUS_ABORTED
    assert result.error_code == ErrorCode.ENGINE_UNAVAILABLE
    assert result.error_message.startswith("node shutting down"), result.error_message


def test_only_runtime_parameters_change_while_configured(started):
    n = started(**{"lifecycle.autostart": False})
    fixed, runtime = n.node.set_parameters([NodeParameter("engine.model", value="other")])[0], \
        n.node.set_parameters([NodeParameter("prefill.enabled", value=True)])[0]
    assert not fixed.successful and "only while unconfigured" in fixed.reason
    assert runtime.successful, runtime.reason
    assert n.node.trigger_deactivate() == SUCCESS
    assert n.node.trigger_cleanup() == SUCCESS
    changed = n.node.set_parameters([NodeParameter("engine.model", value="other")])[0]
    assert changed.successful, changed.reason


def test_ros_own_use_sim_time_is_settable(started):
    n = started()
    for value in (True, False):
        result = n.node.set_parameters([NodeParameter("use_sim_time", value=value)])[0]
        assert result.successful, result.reason
        assert n.node.get_parameter("use_sim_time").value is value


def test_diagnostics_report_the_state_while_inactive(started):
    n = started()
    assert n.node.trigger_deactivate() == SUCCESS
    status = wait_until(lambda: _state(n.next_diagnostics()) == "inactive" and n.diagnostics[-1],
                        NEVER_S, "no /diagnostics with lifecycle_state inactive")
    assert "lifecycle state inactive" in status.message


def _state(status) -> str | None:
    return next((v.value for v in status.values if v.key == "lifecycle_state"), None)


class _SpawningEngine(FakeEngine):
    """Starts a process of its own, as vLLM's engine core; its close leaves it unreaped."""

    async def start(self) -> None:
        self.process = multiprocessing.get_context("spawn").Process(target=time.sleep,
                                                                     args=(600,))
        self.process.start()
        await super().start()

    async def close(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)  # vLLM's shutdown kills its core, no join
        await super().close()


@pytest.mark.slow  # starts a process
def test_cleanup_ends_and_reaps_the_engine_processes(started):
    engine = _SpawningEngine()
    n = InProcessNode(engine=engine)
    try:
        pid = engine.process.pid
        assert n.node.trigger_deactivate() == SUCCESS
        assert n.node.trigger_cleanup() == SUCCESS
        # Reaped: no /proc entry left, not even a <defunct> one (state Z).
        assert not Path(f"/proc/{pid}").exists(), Path(f"/proc/{pid}/stat").read_text()
        # The node can be configured and activated again after a cleanup.
        assert n.node.trigger_configure() == SUCCESS
        assert n.node.trigger_activate() == SUCCESS
        assert engine.process.pid != pid and engine.process.is_alive()
    finally:
        n.close()


# --- driven from outside: a manager client, the ros2 command line, signals -------------------


def test_a_manager_walks_the_node_through_every_state_with_diagnostics_throughout():
    context = Context()
    rclpy.init(context=context)
    node = ReasonNode(engine=FakeEngine(answers_the_task), context=context,
                      parameter_overrides=[NodeParameter(k, value=v) for k, v in {
                          **BASE_PARAMS, "lifecycle.autostart": False}.items()])
    node.start()
    executor = MultiThreadedExecutor(num_threads=node.executor_threads(), context=context)
    executor.add_node(node)
    spinning = SpinThread(executor)
    side = SpunNode("lifecycle_manager")
    states: list[str | None] = []
    side.node.create_subscription(DiagnosticArray, "/diagnostics", lambda m: states.extend(
        _state(s) for s in m.status if s.name.lstrip("/").startswith("cosmos_reason:")),
        10)
    client = ReasonClient()
    try:
        manager = Manager(side)

        def reported(state: str) -> None:
            seen = len(states)
            wait_until(lambda: state in states[seen:], NEVER_S, f"/diagnostics never said {state}")

        assert manager.state() == "unconfigured"
        reported("unconfigured")
        steps = [(Transition.TRANSITION_CONFIGURE, "inactive"),
                 (Transition.TRANSITION_ACTIVATE, "active"),
                 (Transition.TRANSITION_DEACTIVATE, "inactive"),
                 (Transition.TRANSITION_ACTIVATE, "active")]
        for transition, state in steps:
            ok, _ = manager.transition(transition)
            assert ok and manager.state() == state, node.failure
            reported(state)
            if state == "active":
                assert client.wait_for_server(DISCOVERY_S)
                answer = client.ask("What is there?", source=Reason.Goal.SOURCE_GOAL_IMAGE,
                                    image=image_msg(side.now_ns()))
                assert answer.ok, answer.error_message
        for transition, state in ((Transition.TRANSITION_DEACTIVATE, "inactive"),
                                  (Transition.TRANSITION_CLEANUP, "unconfigured"),
                                  (Transition.TRANSITION_CONFIGURE, "inactive"),
                                  (Transition.TRANSITION_INACTIVE_SHUTDOWN, "finalized")):
            ok, _ = manager.transition(transition)
            assert ok and manager.state() == state, node.failure
        reported("finalized")
    finally:
        client.close()
        side.close()
        spinning.stop()
        node.release()
        node.destroy_node()
        rclpy.try_shutdown(context=context)


# The node process as users run it (serve), on a scripted engine: one that answers, or one
# whose start spawns a process and then holds the engine's loop, as vLLM's model load does,
# and never ends (an activate in progress).
SERVED = textwrap.dedent("""
    import multiprocessing, sys, time
    from fake_engine import FakeEngine, answers_the_task
    from cosmos_reason_ros.ros.serve import serve

    class EndlessStart(FakeEngine):
        async def start(self):
            multiprocessing.get_context("spawn").Process(target=time.sleep, args=(600,)).start()
            time.sleep(600)

    if __name__ == "__main__":
        serve(sys.argv[2:], EndlessStart() if sys.argv[1] == "endless" else
              FakeEngine(answers_the_task))
""")


def served(tmp_path: Path, engine: str, name: str) -> tuple[subprocess.Popen, ProcessTree]:
    script = tmp_path / "served.py"
    script.write_text(SERVED)
    here = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(here), str(here.parent), os.environ.get("PYTHONPATH", "")])}
    # A shutdown that waited for the engine's start to end would take its 10 minutes: only
    # ending the start itself lets the process exit within the tests' bounds.
    params = {**BASE_PARAMS, "lifecycle.autostart": False, "engine.shutdown_timeout_s": 600.0}
    args = ["--ros-args", "-r", f"__node:={name}"]
    for key, value in params.items():
        args += ["-p", f"{key}:={str(value).lower() if isinstance(value, bool) else value}"]
    proc = subprocess.Popen([sys.executable, str(script), engine, *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    return proc, ProcessTree(proc.pid)


# Seven typed transitions and four typed parameter calls, each bounded on its own for lost
# replies and a slow start of the command line (lifecycle_manager, node_process.ros2), add up to
# more than the suite's 600 s: a loaded CI run (Jazzy, two busy loops beside) ran past it.
WALK_TIMEOUT_S = 1500


@pytest.mark.slow
@pytest.mark.timeout(WALK_TIMEOUT_S)
def test_ros2_lifecycle_set_walks_the_served_node_and_ros2_param_sets_use_sim_time(tmp_path):
    if shutil.which("ros2") is None:
        pytest.skip("no ros2 command line: make setup builds it from ../shared/ros-src")
    name = f"cosmos_reason_{uuid.uuid4().hex[:8]}"
    proc, tree = served(tmp_path, "answers", name)
    side = SpunNode("lifecycle_cli_watch")
    try:
        manager = Manager(side, f"/{name}")
        # Each time it is active, use_sim_time is set through ros2 param (the value after it).
        for label, transition, use_sim_time in (
                ("configure", Transition.TRANSITION_CONFIGURE, None),
                ("activate", Transition.TRANSITION_ACTIVATE, "true"),
                ("deactivate", Transition.TRANSITION_DEACTIVATE, None),
                ("activate", Transition.TRANSITION_ACTIVATE, "false"),
                ("deactivate", Transition.TRANSITION_DEACTIVATE, None),
                ("cleanup", Transition.TRANSITION_CLEANUP, None),
                ("shutdown", Transition.TRANSITION_UNCONFIGURED_SHUTDOWN, None)):
            trouble = manager.transition_by_cli(label, transition)
            if trouble:
                warnings.warn(str(trouble), stacklevel=1)
            if use_sim_time is not None:
                ros2("param", "set", f"/{name}", "use_sim_time", use_sim_time)
                assert use_sim_time.capitalize() in ros2("param", "get", f"/{name}",
                                                         "use_sim_time")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(NEVER_S) == 0
    finally:
        # The served node first: whatever happens to this process next, none outlives it.
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        side.close()
        tree.close()


@pytest.mark.slow
def test_sigterm_during_activate_ends_the_engine_start_and_its_processes(tmp_path):
    name = f"cosmos_reason_{uuid.uuid4().hex[:8]}"
    proc, tree = served(tmp_path, "endless", name)
    side = SpunNode("lifecycle_manager")
    try:
        manager = Manager(side, f"/{name}")
        ok, _ = manager.transition(Transition.TRANSITION_CONFIGURE)
        assert ok
        manager.change.call_async(ChangeState.Request(
            transition=Transition(id=Transition.TRANSITION_ACTIVATE)))  # never answered
        assert tree.wait_for(lambda t: t.spawned(1), NEVER_S), tree.names()  # activate under way
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(NEVER_S) == 0
        survivors = tree.survivors_after(10.0)
        assert not survivors, [p.pid for p in survivors]
    finally:
        side.close()
        tree.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
