"""The fast tier's node: the real ``ReasonNode`` in this process, with a scripted engine.

Everything but the engine is real: parameters, the action server and DDS (the client side is
a node on a context of its own, as a planner would be), the camera ingest node, results,
diagnostics. Start-up takes milliseconds instead of an engine load.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from fake_engine import FakeEngine, Script, answers_the_task
from rclpy.action import ActionClient
from rclpy.action.client import ClientGoalHandle
from rclpy.context import Context
from rclpy.executors import MultiThreadedExecutor
from rclpy.parameter import Parameter
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import CompressedImage, Image
from spun_node import SpinThread, SpunNode
from unique_identifier_msgs.msg import UUID
from waiting import DISCOVERY_S, NEVER_S, ask_until_answered, wait_until

from cosmos_reason_interfaces.action import Reason
from cosmos_reason_interfaces.msg import ReasoningResult
from cosmos_reason_ros.ros.node import SUCCESS, ReasonNode
from cosmos_reason_ros.ros.outputs import RESULTS_QUEUE_DEPTH

# A profile that needs no checkpoint on disk (the fake engine has no tokenizer).
BASE_PARAMS: dict[str, Any] = {"engine.model": "fake-model", "model.family": "cosmos_reason2",
                               "engine.freeze_heap": False, "diagnostics.period_s": 0.1,
                               "image.wait_s": 0.3,
                               # Any age: on a loaded machine seconds can pass between a
                               # test's one frame and its goals; the age tests set a limit.
                               "image.max_age_s": 0.0,
                               # Reliable with depth: bursts of test frames all arrive.
                               "image.qos_reliability": "reliable", "image.qos_depth": 30}
# Deep action queues, like the package's ReasonClient: all goals share one feedback topic, and
# with the default depth (10) a loaded client loses a goal's one-off stages behind other
# goals' token feedback.
ACTION_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=256,
                        reliability=ReliabilityPolicy.RELIABLE)
# Asking the action server's services until one answers: how long a request may take, and
# how often (a request lost before discovery ends is asked again).
SERVICE_ANSWER_TRY_S = 2.0
SERVICE_ANSWER_TRIES = 30


def image_msg(stamp_ns: int, width: int = 64, height: int = 48, value: int = 90,
              frame_id: str = "camera") -> Image:
    """A small rgb8 frame stamped ``stamp_ns``."""
    msg = Image(height=height, width=width, encoding="rgb8", step=width * 3,
                data=np.full((height, width, 3), value, np.uint8).tobytes())
    msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(int(stamp_ns), 1_000_000_000)
    msg.header.frame_id = frame_id
    return msg


class InProcessNode:
    """A started ``ReasonNode`` on a fake engine, plus a client side on another context.

    The node serves the real names (``/cosmos_reason/reason``, ``/cosmos_reason/results``,
    ``/diagnostics``), so the package's ``ReasonClient()`` with its defaults reaches it too.
    The client side collects ``~/results`` (``results``) and ``/diagnostics``
    (``diagnostics``), publishes raw frames (``publish``) and compressed ones
    (``publish_compressed``, for ``image.input`` compressed or both).
    """

    def __init__(self, params: dict[str, Any] | None = None,
                 script: Callable[[Any], Script] | None = None,
                 engine: FakeEngine | None = None, image_topic: str = "") -> None:
        """Start the node: configured and activated (as a manager would, without autostart).

        ``image_topic``: the node's ``image`` remapped there, as a launch file does.
        """
        self.engine = engine or FakeEngine(script)
        self.context = Context()
        rclpy.init(context=self.context)
        overrides = [Parameter(k, value=v) for k, v in {**BASE_PARAMS, **(params or {})}.items()]
        remaps = ["--ros-args", "-r", f"image:={image_topic}"] if image_topic else None
        self.node = ReasonNode(engine=self.engine, context=self.context,
                               parameter_overrides=overrides, cli_args=remaps)
        self.node.start()
        if not self.node.autostart:
            assert self.node.trigger_configure() == SUCCESS, self.node.failure
            assert self.node.trigger_activate() == SUCCESS, self.node.failure
        self.executor = MultiThreadedExecutor(num_threads=self.node.executor_threads(),
                                              context=self.context)
        self.executor.add_node(self.node)
        self.spinning = SpinThread(self.executor)
        # The test's side shares the node's context, so the process has one DDS participant:
        # Fast DDS 3.2 can deadlock destroying a participant while another participant of the
        # same process delivers discovery data to it (docs/RELIABILITY.md, "Making the live
        # tests deterministic"), and discovery between processes is not what these tests prove.
        self.side = SpunNode("inprocess_client", context=self.context)
        # The action client has a single-threaded executor of its own, and its requests go out
        # from that executor's thread (on_client_thread), as ReasonClient's do: before rclpy 9
        # (Humble, Jazzy) ActionClient records a request's sequence number after sending it,
        # without a lock, so a response taken at once on another executor thread was dropped
        # ("Ignoring unexpected goal response") and the goal never ended.
        self.client_side = SpunNode("inprocess_action_client", single_threaded=True,
                                    context=self.context)
        self.client = ActionClient(self.client_side.node, Reason, "/cosmos_reason/reason",
                                   goal_service_qos_profile=ACTION_QOS,
                                   result_service_qos_profile=ACTION_QOS,
                                   cancel_service_qos_profile=ACTION_QOS,
                                   feedback_sub_qos_profile=ACTION_QOS)
        # The default camera: /image, or the first named camera's /<name>/image.
        names = list({**BASE_PARAMS, **(params or {})}.get("cameras.names", []))
        self.camera = self.side.node.create_publisher(
            Image, image_topic or (f"/{names[0]}/image" if names else "/image"), 30)
        self._named_cameras: dict[str, Any] = {names[0]: self.camera} if names else {}
        self._compressed: dict[str | None, Any] = {}
        self.results: list[ReasoningResult] = []
        self.diagnostics: list[DiagnosticStatus] = []  # this node's /diagnostics statuses
        self._results_cond = threading.Condition()
        self._feedback_log: dict[str, list[Any]] | None = None  # watch_feedback()
        # As deep as the node's writer history: a starved side thread must not drop results.
        self.side.node.create_subscription(ReasoningResult, "/cosmos_reason/results",
                                           self._on_result, RESULTS_QUEUE_DEPTH)
        self.side.node.create_subscription(DiagnosticArray, "/diagnostics",
                                           self._on_diagnostics, 10)
        # Read every 10 ms (rclpy's wait_for_server sleeps 0.25 s between reads).
        wait_until(self.client.server_is_ready, DISCOVERY_S, "action server discovered")
        self._answered_by_each_service()
        assert SpunNode.wait_matched(self.camera, 10.0), "camera not matched"

    def _answered_by_each_service(self) -> None:
        """Get one answer from the result and the cancel service before a test asks them.

        ``wait_for_server`` sees the server from the client's side only: the server's response
        writer matches the client's reader on its own discovery schedule, and until it has,
        Fast DDS drops a response ("client will not receive response") and rclpy's client
        waits for ever. A request about an unknown goal is answered at once, so one answered
        request of each kind arranges what every test assumes; a lost one is asked again.
        """
        unknown = ClientGoalHandle(self.client, UUID(uuid=list(os.urandom(16))), None)
        for ask in (unknown.get_result_async, unknown.cancel_goal_async):
            for _ in range(SERVICE_ANSWER_TRIES):
                future = self.on_client_thread(ask)
                deadline = time.monotonic() + SERVICE_ANSWER_TRY_S
                while not future.done() and time.monotonic() < deadline:
                    time.sleep(0.005)
                if future.done():
                    break
            else:
                raise AssertionError(f"the action server never answered {ask.__name__}")

    def _on_result(self, msg: ReasoningResult) -> None:
        with self._results_cond:
            self.results.append(msg)
            self._results_cond.notify_all()

    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        with self._results_cond:
            self.diagnostics += [s for s in msg.status
                                 if s.name.lstrip("/").startswith("cosmos_reason:")]
            self._results_cond.notify_all()

    def next_diagnostics(self, timeout_s: float = NEVER_S) -> DiagnosticStatus:
        """Wait for a ``/diagnostics`` status published after this call; return it."""
        with self._results_cond:
            seen = len(self.diagnostics)
            ok = self._results_cond.wait_for(lambda: len(self.diagnostics) > seen, timeout_s)
            assert ok, "no /diagnostics message"
            return self.diagnostics[-1]

    def publish(self, stamp_ns: int | None = None, camera: str | None = None,
                **kwargs: Any) -> int:
        """Publish a frame (stamped now by default); return its stamp.

        ``camera`` names one of the node's ``cameras.names``: the frame goes to
        ``/<camera>/image`` (the node's relative ``<camera>/image``) instead of ``/image``.
        """
        stamp = self.side.now_ns() if stamp_ns is None else stamp_ns
        self._camera_publisher(camera).publish(image_msg(stamp, **kwargs))
        return stamp

    def _camera_publisher(self, camera: str | None) -> Any:
        if camera is None:
            return self.camera
        if camera not in self._named_cameras:
            publisher = self.side.node.create_publisher(Image, f"/{camera}/image", 30)
            assert SpunNode.wait_matched(publisher, 10.0), f"camera {camera} not matched"
            self._named_cameras[camera] = publisher
        return self._named_cameras[camera]

    def publish_compressed(self, data: bytes, stamp_ns: int | None = None,
                           frame_id: str = "camera", fmt: str = "jpeg",
                           camera: str | None = None) -> int:
        """Publish compressed image bytes on ``/image/compressed`` (or the named camera's)."""
        if camera not in self._compressed:
            topic = f"/{camera}/image/compressed" if camera else "/image/compressed"
            publisher = self.side.node.create_publisher(CompressedImage, topic, 30)
            assert SpunNode.wait_matched(publisher, 10.0), f"{topic} not matched"
            self._compressed[camera] = publisher
        stamp = self.side.now_ns() if stamp_ns is None else stamp_ns
        msg = CompressedImage(format=fmt, data=data)
        msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(int(stamp), 1_000_000_000)
        msg.header.frame_id = frame_id
        self._compressed[camera].publish(msg)
        return stamp

    def wait_frames(self, count: int, timeout_s: float = NEVER_S,
                    camera: str | None = None) -> None:
        """Wait until the node has received ``count`` frames (on ``camera``: that camera's)."""
        history = self.node.history if camera is None \
            else self.node.cameras.by_name[camera].history
        deadline = time.monotonic() + timeout_s
        while history.stats().received < count:
            assert time.monotonic() < deadline, "frames did not arrive"
            time.sleep(0.01)

    def watch_feedback(self, timeout_s: float = NEVER_S) -> dict[str, list[Any]]:
        """Record every goal's feedback as a second subscriber sees it: goal id (hex) -> list.

        Unlike a goal's feedback callback, which rclpy's ActionClient drops once the goal's
        result has arrived, this sees feedback that trails the result (``feedback_of``).
        Returns once a marker goal's feedback has reached the log, so the log's subscription
        reaches the node's writer before the goals it is to watch are sent: otherwise a goal
        that must get no feedback would pass whether or not it got some.
        """
        if self._feedback_log is None:
            self._feedback_log = {}
            self.side.node.create_subscription(Reason.Impl.FeedbackMessage,
                                               "/cosmos_reason/reason/_action/feedback",
                                               self._on_feedback, ACTION_QOS)
            self._marker(timeout_s)
        return self._feedback_log

    def _on_feedback(self, msg: Any) -> None:
        with self._results_cond:
            self._feedback_log.setdefault(bytes(msg.goal_id.uuid).hex(), []).append(
                msg.feedback)
            self._results_cond.notify_all()

    def _marker(self, timeout_s: float) -> None:
        """Send a goal that gets stage feedback and ends without reaching the engine (the
        next frame, which does not come while the test publishes none: NO_IMAGE); wait until
        its feedback is in the log and its result is back."""
        marker = self.send(prompt="Marker.", source=Reason.Goal.SOURCE_NEXT,
                           wait_for_image_s=0.05, feedback=Reason.Goal.FEEDBACK_STAGES)
        assert marker.accepted, "marker goal rejected"
        marker_id = bytes(marker.goal_id.uuid).hex()
        with self._results_cond:
            ok = self._results_cond.wait_for(lambda: marker_id in self._feedback_log,
                                             timeout_s)
            assert ok, "the marker goal's feedback never reached the feedback log"
        self.result(marker, timeout_s)

    def feedback_of(self, handle: Any, timeout_s: float = NEVER_S) -> list[Any]:
        """All feedback of the ended goal ``handle``, none left on the way (``watch_feedback``
        before the goal was sent).

        The node publishes all feedback on one topic in order, so a marker goal's feedback,
        sent after ``handle``'s goal ended, follows every message of that goal.
        """
        assert self._feedback_log is not None, "watch_feedback() before sending the goal"
        self._marker(timeout_s)
        with self._results_cond:
            return list(self._feedback_log.get(bytes(handle.goal_id.uuid).hex(), []))

    def on_client_thread(self, call: Callable[[], Any]) -> Any:
        """Run ``call`` on the action client's executor thread; return what it returned."""
        return _wait_future(self.client_side.executor.create_task(call), 10.0)

    def send_async(self, goal: Reason.Goal,
                   feedback_callback: Callable[[Any], Any] | None = None) -> Any:
        """Send a goal from the client's thread; return the future of its goal handle."""
        return self.on_client_thread(
            lambda: self.client.send_goal_async(goal, feedback_callback=feedback_callback))

    def send(self, received: list[Any] | None = None, **fields: Any) -> Any:
        """Send a goal; return its goal handle (accepted or not); feedback into ``received``."""
        future = self.send_async(Reason.Goal(**fields), (lambda fb: received.append(
            fb.feedback)) if received is not None else None)
        return _wait_future(future, 30.0)

    def result(self, handle: Any, timeout_s: float = 30.0,
               ask_again_s: float | None = None) -> tuple[int, ReasoningResult]:
        """Wait for a goal's result: (action status, result message).

        ``ask_again_s``: while no answer has come, ask again at this period, as a recovering
        client (``ReasonClient``) does: a result request or its reply can be lost between
        participants like any service's, and a node that is stopping serves result requests
        only a short while after the last one.
        """
        response = ask_until_answered(
            lambda: self.on_client_thread(handle.get_result_async), timeout_s,
            timeout_s if ask_again_s is None else ask_again_s, "the action server's result")
        return response.status, response.result.result

    def ask(self, feedback: list[Any] | None = None, **fields: Any) -> tuple[int,
                                                                              ReasoningResult]:
        """Send a goal and wait for its result."""
        handle = self.send(feedback, **fields)
        assert handle.accepted, "goal rejected"
        return self.result(handle)

    def wait_result(self, predicate: Callable[[ReasoningResult], bool],
                    timeout_s: float = 5.0) -> ReasoningResult:
        """Wait for a ``~/results`` message matching ``predicate``."""
        with self._results_cond:
            ok = self._results_cond.wait_for(
                lambda: any(predicate(r) for r in self.results), timeout_s)
            assert ok, "no matching ~/results message"
            return next(r for r in self.results if predicate(r))

    def stop_node(self) -> Callable[[float], None]:
        """Begin the node's own stop (``ReasonNode.release``, what a shutdown runs) on a thread.

        The executor keeps spinning and the client side stays up, so the results of the goals
        the stop ends can still be asked for (the stop serves them before its action server
        goes). Returns ``join(timeout_s)``, which fails if the stop has not ended by then.
        ``close()`` afterwards tears the rest down (``release`` is idempotent).
        """
        errors: list[BaseException] = []

        def stop() -> None:
            try:
                self.node.release()
            except BaseException as exc:  # noqa: BLE001 - handed to join()
                errors.append(exc)

        thread = threading.Thread(target=stop, name="node_stop", daemon=True)
        thread.start()

        def join(timeout_s: float) -> None:
            thread.join(timeout_s)
            assert not thread.is_alive(), f"the node's stop did not end within {timeout_s:g} s"
            if errors:
                raise errors[0]

        return join

    def close(self) -> None:
        """Tear down both sides."""
        self.client_side.spinning.stop()  # before the client goes: it leaves the wait set
        self.client.destroy()
        self.client_side.close()
        self.side.close()
        self.node.release()
        self.spinning.stop()
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)


def _wait_future(future: Any, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while not future.done():
        assert time.monotonic() < deadline, "timed out waiting for the action server"
        time.sleep(0.005)
    return future.result()


class ServedNode:
    """The same node on the scripted engine (``answers_the_task``), in a child process.

    For tests of DDS discovery between processes: inside one process Fast DDS delivers
    between participants without the network transport, so a client in the test process
    would not meet the node as a planner in another process does. Goals reach it by the real
    names (``ReasonClient()``); ``stop()`` ends it (closing its stdin).
    """

    def __init__(self, params: dict[str, Any] | None = None, timeout_s: float = 60.0) -> None:
        here = Path(__file__).resolve().parent
        path = os.pathsep.join([str(here.parent), str(here), os.environ.get("PYTHONPATH", "")])
        self.proc = subprocess.Popen(
            [sys.executable, str(here / "inprocess_node.py"), json.dumps(params or {})],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"},
            start_new_session=True)
        self.lines: list[str] = []
        ready = threading.Event()

        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.lines.append(line.rstrip("\n"))
                if line.startswith("served node ready"):
                    ready.set()
            ready.set()  # exited: do not wait out the timeout

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(timeout_s) or self.proc.poll() is not None:
            self.stop()
            raise RuntimeError("served node did not start:\n" + "\n".join(self.lines[-40:]))

    def stop(self, timeout_s: float = NEVER_S) -> int | None:
        """Close its stdin (it shuts down cleanly); kill its group if it does not exit."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(NEVER_S)


if __name__ == "__main__":  # ServedNode's child: serve until stdin closes
    served = InProcessNode(json.loads(sys.argv[1]) if len(sys.argv) > 1 else None,
                           answers_the_task)
    print("served node ready", flush=True)
    sys.stdin.read()
    served.close()
