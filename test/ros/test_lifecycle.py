"""Managed (lifecycle) mode driven the way Nav2's lifecycle manager drives it (issue 21).

Transitions go through the real ``lifecycle_msgs`` services (``~/change_state``,
``~/get_state``, ``~/get_available_transitions``) from another DDS participant; parameters are
fixed through the node's ``~/set_parameters`` service. One real-engine test walks the whole
sequence (engine starts cost ~20 s each here): a failing activation first, then configure,
activate, goals, deactivate while a goal runs, activate again, cleanup, configure again. What
only it proves: the engine really starts on activate, stays loaded while inactive, and its
processes are gone after cleanup (looked for with psutil). Each transition's wall time is
printed (``-s``); docs/INTERFACES.md reports the medians.
"""

from __future__ import annotations

import threading
import time

import pytest

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
psutil = pytest.importorskip("psutil")
from action_msgs.msg import GoalStatus  # noqa: E402
from fake_engine import Script  # noqa: E402
from inprocess_node import InProcessNode  # noqa: E402
from lifecycle_msgs.msg import Transition  # noqa: E402
from lifecycle_msgs.srv import ChangeState, GetAvailableTransitions, GetState  # noqa: E402
from node_process import NodeProcess, rgb_image_msg, scene, text_schema  # noqa: E402
from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue  # noqa: E402
from rcl_interfaces.srv import SetParameters  # noqa: E402
from rclpy.lifecycle import TransitionCallbackReturn  # noqa: E402
from rclpy.parameter import Parameter as NodeParameter  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402
from spun_node import SpunNode  # noqa: E402
from waiting import wait_until  # noqa: E402

from cosmos_reason_interfaces.msg import ReasoningResult  # noqa: E402
from cosmos_reason_ros.client import ReasonClient  # noqa: E402
from cosmos_reason_ros.core.types import ErrorCode  # noqa: E402

pytestmark = [pytest.mark.ros]

NODE = "/cosmos_reason"
SUCCESS = TransitionCallbackReturn.SUCCESS
ENDLESS = Script(deltas=["x "], delay_s=0.01, endless=True)


class Manager:
    """What a lifecycle manager does: call the node's lifecycle services, wait for answers."""

    def __init__(self, side: SpunNode) -> None:
        node = side.node
        self.change = node.create_client(ChangeState, f"{NODE}/change_state")
        self.get = node.create_client(GetState, f"{NODE}/get_state")
        self.transitions = node.create_client(GetAvailableTransitions,
                                              f"{NODE}/get_available_transitions")
        self.params = node.create_client(SetParameters, f"{NODE}/set_parameters")
        for client in (self.change, self.get, self.transitions, self.params):
            assert client.wait_for_service(timeout_sec=30.0), client.srv_name

    @staticmethod
    def _call(client, request, timeout_s: float = 300.0):
        done = threading.Event()
        future = client.call_async(request)
        future.add_done_callback(lambda _: done.set())
        assert done.wait(timeout_s), f"{client.srv_name} did not answer in {timeout_s} s"
        return future.result()

    def state(self) -> str:
        return self._call(self.get, GetState.Request()).current_state.label

    def available(self) -> set[str]:
        reply = self._call(self.transitions, GetAvailableTransitions.Request())
        return {t.transition.label for t in reply.available_transitions}

    def transition(self, transition_id: int) -> tuple[bool, float]:
        t0 = time.monotonic()
        ok = self._call(self.change, ChangeState.Request(
            transition=Transition(id=transition_id))).success
        return ok, time.monotonic() - t0

    def set_string(self, name: str, value: str) -> tuple[bool, str]:
        reply = self._call(self.params, SetParameters.Request(parameters=[Parameter(
            name=name, value=ParameterValue(type=ParameterType.PARAMETER_STRING,
                                            string_value=value))]))
        return reply.results[0].successful, reply.results[0].reason


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
def test_managed_node_walks_the_lifecycle_with_the_real_engine(tiny_qwen3_vl, tmp_path):
    not_a_model = tmp_path / "qwen3_vl_without_weights"
    not_a_model.mkdir()
    proc = NodeProcess("cpu_demo", {"lifecycle.enabled": True,
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
        assert proc.wait_for_line("activate failed: engine did not start", 10.0)
        assert manager.state() == "inactive"
        # Parameters other than the runtime ones are fixed while configured...
        ok, reason = manager.set_string("engine.model", str(tiny_qwen3_vl))
        assert not ok and "only while unconfigured" in reason
        ok, _ = manager.transition(Transition.TRANSITION_CLEANUP)
        assert ok and manager.state() == "unconfigured"
        # ... and settable once unconfigured: the node is configured again with the fix.
        ok, reason = manager.set_string("engine.model", str(tiny_qwen3_vl))
        assert ok, reason

        ok, times["configure"] = manager.transition(Transition.TRANSITION_CONFIGURE)
        assert ok and manager.state() == "inactive", proc.output[-3000:]
        ok, times["activate"] = manager.transition(Transition.TRANSITION_ACTIVATE)
        assert ok and manager.state() == "active", proc.output[-3000:]
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
        assert client.wait_for_server(30.0)
        first = client.ask("What do you see?", max_tokens=8)
        assert first.ok, first.error_message

        # Deactivate while a goal runs: it finishes (deactivate_goals=finish); a goal sent
        # meanwhile is refused with the state in the reason.
        publish_frames()
        started = threading.Event()
        long_goal = client.submit(
            client.goal("Describe it.", max_tokens=1500, response_schema=text_schema(1200)),
            on_feedback=lambda fb: started.set() if fb.stage == "generating" else None)
        assert started.wait(60.0), proc.output[-3000:]
        deactivated: dict[str, object] = {}
        deactivating = threading.Thread(target=lambda: deactivated.update(zip(
            ("ok", "s"), manager.transition(Transition.TRANSITION_DEACTIVATE), strict=True)))
        deactivating.start()
        assert proc.wait_for_line("lifecycle: deactivate from", 30.0)
        refused = client.ask("Anything?", max_tokens=8)
        assert refused.status == "rejected"
        deactivating.join(120.0)
        assert deactivated["ok"], proc.output[-3000:]
        times["deactivate (goal running)"] = float(deactivated["s"])  # type: ignore[arg-type]
        finished = long_goal.result(60.0)
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
        wait_until(lambda: not _alive(engine_processes), 60,
                   "engine processes alive after cleanup")

        ok, times["configure again"] = manager.transition(Transition.TRANSITION_CONFIGURE)
        assert ok and manager.state() == "inactive"
        print("\nlifecycle transition times (s): " + ", ".join(
            f"{name}={took:.2f}" for name, took in times.items()))
    finally:
        client.close()
        side.close()
        code = proc.stop(30.0)
    assert code == 0, proc.output[-3000:]


# --- the transitions' goal rules, on the scripted engine (fast tier) -------------------------


@pytest.fixture
def managed():
    nodes: list[InProcessNode] = []

    def make(**params) -> InProcessNode:
        node = InProcessNode({"lifecycle.enabled": True, **params},
                             script=lambda _r: ENDLESS, managed=True)
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
    wait_until(lambda: any(fb.stage == "generating" for fb in feedback), 60,
               "the goal never generated")
    return handle


def test_deactivate_with_cancel_stops_running_goals_refuses_new_ones_and_activates_again(
        managed):
    # An hour's deactivate_timeout_s: a deactivate that waited for it instead of stopping the
    # goal at once would not return within the generous minute below.
    n = managed(**{"lifecycle.deactivate_goals": "cancel",
                   "lifecycle.deactivate_timeout_s": 3600.0})
    n.publish()
    n.wait_frames(1)
    running = generating(n, "Describe at length.")
    returned: list = []
    deactivate = threading.Thread(target=lambda: returned.append(n.node.trigger_deactivate()),
                                  daemon=True)
    deactivate.start()
    deactivate.join(60.0)
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


def test_deactivate_with_finish_stops_a_goal_still_running_after_the_timeout(managed):
    n = managed(**{"lifecycle.deactivate_goals": "finish",
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


def test_only_runtime_parameters_change_while_configured(managed):
    n = managed()
    fixed, runtime = n.node.set_parameters([NodeParameter("engine.model", value="other")])[0], \
        n.node.set_parameters([NodeParameter("prefill.enabled", value=True)])[0]
    assert not fixed.successful and "only while unconfigured" in fixed.reason
    assert runtime.successful, runtime.reason
    assert n.node.trigger_deactivate() == SUCCESS
    assert n.node.trigger_cleanup() == SUCCESS
    changed = n.node.set_parameters([NodeParameter("engine.model", value="other")])[0]
    assert changed.successful, changed.reason
    enable = n.node.set_parameters([NodeParameter("lifecycle.enabled", value=False)])[0]
    assert not enable.successful and "read once at process start" in enable.reason
