"""What a lifecycle manager (nav2_lifecycle_manager, a launch file's) does, from a test.

It calls the node's lifecycle services on a node of the test's own and waits for the answers,
asking reads again when a reply is lost on the way (see ``Manager._call``).
"""

from __future__ import annotations

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

    def set_string(self, name: str, value: str) -> tuple[bool, str]:
        reply = self._call(self.params, SetParameters.Request(parameters=[Parameter(
            name=name, value=ParameterValue(type=ParameterType.PARAMETER_STRING,
                                            string_value=value))]))
        return reply.results[0].successful, reply.results[0].reason
