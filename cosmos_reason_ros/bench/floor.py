"""The transport floor: a bare rclpy action with the node's action type, QoS and executor.

What rclpy itself costs for one goal, with none of the package's code on either side, so the
bench can say how much of the node's time above the engine is the node's own. The server is
a process of its own, as the node is (``python -m cosmos_reason_ros.bench.floor``): the same
Fast DDS writer profile, the ``Reason`` action with the node's request and feedback QoS on a
reentrant callback group, a ``MultiThreadedExecutor`` of the node's size spun with
``spin_once(0.2)``. Its execute callback succeeds at once with a stored result: a node's
short answer, serialized by the bench (``--result-file``), so the result is the same size.
The client (``FloorClient``, in the bench process beside ``ReasonClient``) is rclpy's
``ActionClient`` with ``ReasonClient``'s QoS, on a participant of its own and a
single-threaded executor spun by one thread, which also sends the goals.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import rclpy
from action_msgs.msg import GoalStatus
from rclpy.action import ActionClient, ActionServer
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.context import Context
from rclpy.executors import MultiThreadedExecutor, SingleThreadedExecutor
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.serialization import deserialize_message
from rclpy.signals import SignalHandlerOptions

from cosmos_reason_interfaces.action import Reason
from cosmos_reason_interfaces.msg import ReasoningResult
from cosmos_reason_ros import dds
from cosmos_reason_ros.config import PARAMS_BY_NAME
from cosmos_reason_ros.ros.node import ACTION_QUEUE_DEPTH

FLOOR_NODE = "bench_floor"
FLOOR_ACTION = f"/{FLOOR_NODE}/reason"
FLOOR_READY = "floor ready:"  # the server's line once it serves (Proc.wait_line)
SPIN_TIMEOUT_S = 0.2  # the node's main loop: spin_once(timeout_sec=0.2)
CLIENT_SPIN_TIMEOUT_S = 0.1  # ReasonClient's spin thread while no goal waits for the server


def action_qos() -> QoSProfile:
    """Return the node's and ReasonClient's QoS for the action's services and feedback."""
    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=ACTION_QUEUE_DEPTH,
                      reliability=ReliabilityPolicy.RELIABLE)


class FloorServer:
    """The ``Reason`` action whose execute callback succeeds at once with ``result``."""

    def __init__(self, result: ReasoningResult, threads: int) -> None:
        """Create the server on a context of its own; nothing spins until ``serve``."""
        self.context = Context()
        rclpy.init(context=self.context, signal_handler_options=SignalHandlerOptions.NO)
        self.node = rclpy.create_node(FLOOR_NODE, context=self.context)
        self._result = Reason.Result(result=result)
        qos = action_qos()
        self._server = ActionServer(
            self.node, Reason, "~/reason", execute_callback=self._execute,
            callback_group=ReentrantCallbackGroup(), goal_service_qos_profile=qos,
            result_service_qos_profile=qos, cancel_service_qos_profile=qos,
            feedback_pub_qos_profile=qos,
            result_timeout=PARAMS_BY_NAME["limits.result_keep_s"].default)
        self.executor = MultiThreadedExecutor(num_threads=threads, context=self.context)
        self.executor.add_node(self.node)
        self.stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _execute(self, handle: Any) -> Any:
        handle.succeed()
        return self._result

    def serve(self) -> None:
        """Spin as the node's main loop does, until ``stop`` is set or the context ends."""
        while self.context.ok() and not self.stop.is_set():
            self.executor.spin_once(timeout_sec=SPIN_TIMEOUT_S)

    def serve_in_thread(self) -> FloorServer:
        """Serve from a thread of this process (tests: the fast tier starts no process)."""
        self._thread = threading.Thread(target=self.serve, name="floor", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop spinning and shut the context down."""
        self.stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        self.executor.shutdown(timeout_sec=1.0)
        self._server.destroy()
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)


class FloorClient:
    """rclpy's ``ActionClient`` for the floor, laid out as ``ReasonClient`` is."""

    def __init__(self, action_name: str = FLOOR_ACTION,
                 node_name: str = "bench_floor_client") -> None:
        """Create the client on a context of its own and start its spin thread."""
        self.context = Context()
        rclpy.init(context=self.context)
        self.node = rclpy.create_node(node_name, context=self.context)
        qos = action_qos()
        self._client = ActionClient(self.node, Reason, action_name,
                                    goal_service_qos_profile=qos,
                                    result_service_qos_profile=qos,
                                    cancel_service_qos_profile=qos,
                                    feedback_sub_qos_profile=qos)
        self._executor = SingleThreadedExecutor(context=self.context)
        self._executor.add_node(self.node)
        self._running = True
        self._thread = threading.Thread(target=self._spin, name="floor-client", daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        while self._running and self.context.ok():
            with contextlib.suppress(Exception):  # shut down under us: the loop ends
                self._executor.spin_once(timeout_sec=CLIENT_SPIN_TIMEOUT_S)

    def wait_for_server(self, timeout_s: float) -> bool:
        """Wait until the floor server is discovered."""
        return self._client.wait_for_server(timeout_sec=timeout_s)

    def submit(self, goal: Any, timeout_s: float = 60.0) -> Callable[[], dict[str, Any]]:
        """Send ``goal``; the returned function waits for its result and gives the sample.

        Sent from the spin thread, as ``ReasonClient`` sends (rclpy's ActionClient is not
        safe against a response taken while another thread is still sending); timed, like
        the node's goals, from here to the result's arrival on that thread.
        """
        done: concurrent.futures.Future[tuple[float, Any]] = concurrent.futures.Future()
        t0 = time.monotonic()

        def on_result(future: Any) -> None:
            t1 = time.monotonic()
            try:
                done.set_result((t1, future.result()))
            except Exception as e:  # noqa: BLE001 - reported by wait()
                done.set_exception(e)

        def on_goal_response(future: Any) -> None:
            try:
                handle = future.result()
                if not handle.accepted:
                    raise RuntimeError("goal rejected by the floor server")
                handle.get_result_async().add_done_callback(on_result)
            except Exception as e:  # noqa: BLE001 - reported by wait()
                done.set_exception(e)

        def send() -> None:
            self._client.send_goal_async(goal).add_done_callback(on_goal_response)

        self._executor.create_task(send)  # also wakes the spin thread

        def wait() -> dict[str, Any]:
            try:
                t1, response = done.result(timeout_s)
            except Exception as e:  # noqa: BLE001 - one failed request is a sample
                return {"ok": False, "error": f"{type(e).__name__}: {e}"}
            ok = response.status == GoalStatus.STATUS_SUCCEEDED
            return {"ok": ok, "error": None if ok else f"goal status {response.status}",
                    "ttft_s": None, "e2e_s": t1 - t0}

        return wait

    def close(self) -> None:
        """Stop the spin thread and shut the context down."""
        self._running = False
        self._executor.create_task(lambda: None)  # wake spin_once now
        self._thread.join(timeout=2.0)
        self._client.destroy()
        self._executor.shutdown(timeout_sec=1.0)
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Serve the floor action until SIGTERM or SIGINT."""
    ap = argparse.ArgumentParser(prog="python -m cosmos_reason_ros.bench.floor",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--result-file", type=Path, required=True,
                    help="a serialized ReasoningResult (a node's short answer) to return")
    ap.add_argument("--threads", type=int, required=True,
                    help="executor threads (the node's: running + queued goals + spare)")
    args = ap.parse_args(argv)
    profile = dds.use_profile()  # before the first participant, as the node does
    data = args.result_file.read_bytes()
    server = FloorServer(deserialize_message(data, ReasoningResult), args.threads)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: server.stop.set())
    print(f"{FLOOR_READY} action={FLOOR_ACTION} threads={args.threads} "
          f"result_bytes={len(data)}; {profile}", flush=True)
    server.serve()
    server.close()
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown under rclpy's threads (ros2/rclpy#1484)


if __name__ == "__main__":
    main()
