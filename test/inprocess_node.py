"""The fast tier's node: the real ``ReasonNode`` in this process, with a scripted engine.

Everything but the engine is real: parameters, the action server and DDS (the client side is
a node on a context of its own, as a planner would be), the camera ingest node, results,
diagnostics. Start-up takes milliseconds instead of an engine load.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import rclpy
from fake_engine import FakeEngine, Script
from rclpy.action import ActionClient
from rclpy.context import Context
from rclpy.executors import MultiThreadedExecutor
from rclpy.parameter import Parameter
from sensor_msgs.msg import Image
from spun_node import SpunNode

from cosmos_reason_interfaces.action import Reason
from cosmos_reason_interfaces.msg import ReasoningResult
from cosmos_reason_ros.ros.node import ReasonNode

# A profile that needs no checkpoint on disk (the fake engine has no tokenizer).
BASE_PARAMS: dict[str, Any] = {"engine.model": "fake-model", "model.family": "cosmos_reason2",
                               "engine.freeze_heap": False, "diagnostics.period_s": 0.1,
                               "image.wait_s": 0.3,
                               # Reliable with depth: bursts of test frames all arrive.
                               "image.qos_reliability": "reliable", "image.qos_depth": 30}


def image_msg(stamp_ns: int, width: int = 64, height: int = 48, value: int = 90,
              frame_id: str = "camera") -> Image:
    """A small rgb8 frame stamped ``stamp_ns``."""
    msg = Image(height=height, width=width, encoding="rgb8", step=width * 3,
                data=np.full((height, width, 3), value, np.uint8).tobytes())
    msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(int(stamp_ns), 1_000_000_000)
    msg.header.frame_id = frame_id
    return msg


class InProcessNode:
    """A started ``ReasonNode`` on a fake engine, plus a client side on another context."""

    def __init__(self, params: dict[str, Any] | None = None,
                 script: Callable[[Any], Script] | None = None,
                 engine: FakeEngine | None = None) -> None:
        self.engine = engine or FakeEngine(script)
        self.context = Context()
        rclpy.init(context=self.context)
        overrides = [Parameter(k, value=v) for k, v in {**BASE_PARAMS, **(params or {})}.items()]
        self.node = ReasonNode(engine=self.engine, context=self.context,
                               parameter_overrides=overrides)
        self.node.start()
        self.executor = MultiThreadedExecutor(num_threads=self.node.executor_threads(),
                                              context=self.context)
        self.executor.add_node(self.node)
        self._spin = threading.Thread(target=self.executor.spin, daemon=True)
        self._spin.start()
        self.side = SpunNode("inprocess_client")
        self.client = ActionClient(self.side.node, Reason, "/cosmos_reason/reason")
        # The default camera: /image, or the first named camera's /<name>/image.
        names = list({**BASE_PARAMS, **(params or {})}.get("cameras.names", []))
        self.camera = self.side.node.create_publisher(
            Image, f"/{names[0]}/image" if names else "/image", 30)
        self._named_cameras: dict[str, Any] = {names[0]: self.camera} if names else {}
        self.results: list[ReasoningResult] = []
        self._results_cond = threading.Condition()
        self.side.node.create_subscription(ReasoningResult, "/cosmos_reason/results",
                                           self._on_result, 50)
        assert self.client.wait_for_server(timeout_sec=10.0), "action server not discovered"
        assert SpunNode.wait_matched(self.camera, 10.0), "camera not matched"

    def _on_result(self, msg: ReasoningResult) -> None:
        with self._results_cond:
            self.results.append(msg)
            self._results_cond.notify_all()

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

    def wait_frames(self, count: int, timeout_s: float = 5.0, camera: str | None = None) -> None:
        """Wait until the node has received ``count`` frames (on ``camera``: that camera's)."""
        history = self.node.history if camera is None \
            else self.node.cameras.by_name[camera].history
        deadline = time.monotonic() + timeout_s
        while history.stats().received < count:
            assert time.monotonic() < deadline, "frames did not arrive"
            time.sleep(0.01)

    def send(self, feedback: list[Any] | None = None, **fields: Any) -> Any:
        """Send a goal; return its goal handle (accepted or not)."""
        goal = Reason.Goal(**fields)
        future = self.client.send_goal_async(
            goal, feedback_callback=(lambda fb: feedback.append(fb.feedback))
            if feedback is not None else None)
        return _wait_future(future, 30.0)

    def result(self, handle: Any, timeout_s: float = 30.0) -> tuple[int, ReasoningResult]:
        """Wait for a goal's result: (action status, result message)."""
        response = _wait_future(handle.get_result_async(), timeout_s)
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

    def close(self) -> None:
        """Tear down both sides."""
        self.client.destroy()
        self.side.close()
        self.node.close()
        self.executor.shutdown(timeout_sec=2.0)
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)


def _wait_future(future: Any, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while not future.done():
        assert time.monotonic() < deadline, "timed out waiting for the action server"
        time.sleep(0.005)
    return future.result()
