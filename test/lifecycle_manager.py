"""What a lifecycle manager (nav2_lifecycle_manager, a launch file's) does, from a test.

It calls the node's lifecycle services on a node of the test's own and waits for the answers,
asking reads again when a reply is lost on the way (see ``Manager._call``).
"""

from __future__ import annotations

import subprocess
import threading
import time

from lifecycle_msgs.msg import Transition
from lifecycle_msgs.srv import ChangeState, GetAvailableTransitions, GetState
from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue
from rcl_interfaces.srv import SetParameters
from spun_node import SpunNode
from waiting import DISCOVERY_S, ask_until_answered, wait_until

NODE = "/cosmos_reason"
TRANSITION_S = 300.0  # a transition (an engine start) or a call: past it, it never ended
REPLY_TRY_S = 10.0  # a reply missing this long may have been dropped: ask (or read) again
# A ``ros2 lifecycle set`` whose transition has not begun this long after the command started
# (its Python start and discovery take seconds on a loaded machine) lost a request or reply of
# its own; and once the node is there, the command's success line is waited for this long.
CLI_START_S = 60.0
CLI_END_S = 30.0
CLI_TRIES = 3
# What ``get_state`` answers while a transition runs, if it answers then at all.
UNDER_WAY = {"configuring", "cleaningup", "shuttingdown", "activating", "deactivating",
             "errorprocessing"}
# The state each transition leads to when it succeeds.
GOAL_STATE = {Transition.TRANSITION_CONFIGURE: "inactive",
              Transition.TRANSITION_CLEANUP: "unconfigured",
              Transition.TRANSITION_ACTIVATE: "active",
              Transition.TRANSITION_DEACTIVATE: "inactive",
              Transition.TRANSITION_UNCONFIGURED_SHUTDOWN: "finalized",
              Transition.TRANSITION_INACTIVE_SHUTDOWN: "finalized",
              Transition.TRANSITION_ACTIVE_SHUTDOWN: "finalized"}


class Manager:
    """What a lifecycle manager does: call the node's lifecycle services, wait for answers."""

    def __init__(self, side: SpunNode, name: str = NODE) -> None:
        node = side.node
        self.name = name
        self.change = node.create_client(ChangeState, f"{name}/change_state")
        self.get = node.create_client(GetState, f"{name}/get_state")
        self.transitions = node.create_client(GetAvailableTransitions,
                                              f"{name}/get_available_transitions")
        self.params = node.create_client(SetParameters, f"{name}/set_parameters")
        for client in (self.change, self.get, self.transitions, self.params):
            wait_until(client.service_is_ready, DISCOVERY_S, client.srv_name)

    @staticmethod
    def _call(client, request, timeout_s: float = TRANSITION_S):
        """Ask until answered (only for requests that may be repeated: reads, a parameter).

        rmw drops a reply whose response writer has not matched this client yet ("client
        will not receive response"), and the client would wait for it for ever: unanswered
        after ``REPLY_TRY_S``, the request is sent again.
        """
        return ask_until_answered(lambda: client.call_async(request), timeout_s,
                                  REPLY_TRY_S, client.srv_name)

    def state(self) -> str:
        return self._call(self.get, GetState.Request()).current_state.label

    def available(self) -> set[str]:
        reply = self._call(self.transitions, GetAvailableTransitions.Request())
        return {t.transition.label for t in reply.available_transitions}

    def transition(self, transition_id: int) -> tuple[bool, float]:
        """Request a transition; return whether it succeeded and how long it took.

        Sent once (a repeated transition request would be refused from the state it led to).
        Its reply can be lost as any service reply can: while it is missing, the state read
        back decides once it is the transition's goal (the lifecycle services are served one at
        a time, so the read waits until a transition under way has ended).
        """
        t0 = time.monotonic()
        done = threading.Event()
        future = self.change.call_async(ChangeState.Request(
            transition=Transition(id=transition_id)))
        future.add_done_callback(lambda _: done.set())
        goal = GOAL_STATE.get(transition_id)
        while not done.wait(REPLY_TRY_S):
            assert time.monotonic() < t0 + TRANSITION_S, \
                f"transition {transition_id}: no reply and no goal state in {TRANSITION_S} s"
            if goal is not None and self.state() == goal:
                return True, time.monotonic() - t0
        return future.result().success, time.monotonic() - t0

    def transition_by_cli(self, label: str, transition_id: int) -> list[str]:
        """``ros2 lifecycle set <name> <label>`` as a user types it; the node's state decides.

        The command line sends each of its requests (the available transitions, then the
        change) once and waits for the reply without a bound, and a reply can be lost between
        processes (rmw_fastrtps drops one whose reader it has not matched yet:
        ros2/rmw_fastrtps#842). So this client watches the node's state meanwhile: a command
        whose transition never began is ended and typed again; one still waiting after the
        node got there is ended. If no command got the node there, this client asks the node
        itself: the node must make the transition either way. Returns what went wrong on the
        way, for the test to report as a warning.
        """
        goal = GOAL_STATE[transition_id]
        before = self.state()
        trouble: list[str] = []
        lost = 0
        # Without the daemon the command line looks for the node for half a second and says
        # "Node not found" when discovery is slower: typed again until DISCOVERY_S has passed.
        discovery_deadline = time.monotonic() + DISCOVERY_S
        while lost < CLI_TRIES:
            cli = subprocess.Popen(["ros2", "lifecycle", "set", self.name, label, "--no-daemon"],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            started = time.monotonic()
            try:
                while True:
                    exited = cli.poll() is not None
                    state = self.state()  # read after the exit: it shows what the command did
                    if state in UNDER_WAY:
                        assert time.monotonic() < started + TRANSITION_S, \
                            f"{self.name}: {label} still {state!r} after {TRANSITION_S} s"
                    elif state != before or exited or time.monotonic() > started + CLI_START_S:
                        break
                    _wait_for_exit(cli, REPLY_TRY_S)
                if state != before:
                    assert state == goal, f"{self.name}: {label} led to {state!r}, not {goal!r}"
                    if _wait_for_exit(cli, CLI_END_S) is None:
                        trouble.append(f"ros2 lifecycle set {label}: the node got there, the "
                                       f"command line never heard (its reply was lost)")
                    else:
                        assert cli.returncode == 0, \
                            f"ros2 lifecycle set {label}: {_output(cli)}"
                    return trouble
            finally:
                if cli.poll() is None:
                    cli.kill()
                printed = _output(cli)
            if "Node not found" in printed and time.monotonic() < discovery_deadline:
                continue
            lost += 1
            trouble.append(f"ros2 lifecycle set {label}: the node stayed {before!r}; the "
                           f"command line printed {printed!r}")
        ok, _ = self.transition(transition_id)
        reached = self.state()
        assert ok and reached == goal, (
            f"{self.name}: {label} reached {reached!r}, not {goal!r}, asked by the command line "
            f"({trouble}) and by a client of the test's own")
        return trouble

    def set_string(self, name: str, value: str) -> tuple[bool, str]:
        reply = self._call(self.params, SetParameters.Request(parameters=[Parameter(
            name=name, value=ParameterValue(type=ParameterType.PARAMETER_STRING,
                                            string_value=value))]))
        return reply.results[0].successful, reply.results[0].reason


def _wait_for_exit(process: subprocess.Popen, timeout_s: float) -> int | None:
    try:
        return process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        return None


def _output(process: subprocess.Popen) -> str:
    """What an ended process printed (stdout and stderr together); its pipe is closed."""
    return process.communicate()[0] or ""
