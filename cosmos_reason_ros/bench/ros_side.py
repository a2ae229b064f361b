"""The bench's ROS side: camera publishers, the action client, the baseline trigger."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from cosmos_reason_ros.bench.workload import (
    BASELINE_NS,
    BASELINE_TOPIC,
    NODE_ACTION,
    NODE_TOPIC,
    WRIST_TOPIC,
)

_NS = 1_000_000_000


def client_ttft(e2e_s: float, result: Any) -> float | None:
    """Client-side time to first token when no text feedback came before the result.

    A short answer can arrive in one engine chunk, so its only feedback may trail the result;
    the node's own accept-to-first-token time plus the transport the client saw (e2e minus
    the node's total) is the same quantity. Dropping such samples would drop the fastest goals.
    """
    if not result.total_s or not result.time_to_first_token_s:
        return None
    return e2e_s - result.total_s + result.time_to_first_token_s


def latency_goal(prompt: str, max_tokens: int, cameras: Sequence[str] = ()) -> Any:
    """Build the goal the bench asks the node (and the transport floor): a question, greedy."""
    from cosmos_reason_ros.client import ReasonClient

    return ReasonClient.goal(prompt, "vqa", cameras=cameras, max_tokens=max_tokens, greedy=True)


def submit_goal(client: Any, prompt: str, max_tokens: int, cameras: Sequence[str] = ()
                ) -> Callable[[], dict[str, Any]]:
    """Send one goal on the latest frame through ``client`` (a ReasonClient).

    ``cameras`` names the node's cameras to ask about (empty: its default camera). The
    returned function waits for its result and returns the sample's figures.
    """
    goal = latency_goal(prompt, max_tokens, cameras)
    first: list[float] = []
    t0 = time.monotonic()

    def on_feedback(fb: Any) -> None:
        if fb.text_delta and not first:
            first.append(time.monotonic() - t0)

    handle = client.submit(goal, on_feedback)
    done: list[float] = []
    handle.future.add_done_callback(lambda _f: done.append(time.monotonic()))

    def wait() -> dict[str, Any]:
        result = handle.result(600.0)
        t1 = done[0] if done else time.monotonic()
        m = result.message
        return {"ok": result.ok, "error": None if result.ok else
                f"{result.status} {result.error_code.name}: {result.error_message}",
                "ttft_s": first[0] if first else client_ttft(t1 - t0, m), "e2e_s": t1 - t0,
                "node_ttft_s": m.time_to_first_token_s, "node_total_s": m.total_s,
                "node_preprocess_s": m.preprocess_s, "node_queue_s": m.queue_s,
                "output_tokens": m.output_tokens, "prompt_tokens": m.prompt_tokens,
                "cached_prompt_tokens": m.cached_prompt_tokens, "finish": m.finish_reason,
                "images": len(m.frame_stamps),
                "stamp_ns": m.header.stamp.sec * _NS + m.header.stamp.nanosec}

    return wait


class RosSide:
    """The bench's ROS side: cameras, the action client, the baseline trigger, diagnostics."""

    def __init__(self) -> None:
        """Create the node, publishers, subscriptions and spin threads."""
        import rclpy
        from diagnostic_msgs.msg import DiagnosticArray
        from rcl_interfaces.srv import GetParameters, SetParameters
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        from sensor_msgs.msg import Image
        from std_msgs.msg import String

        from cosmos_reason_ros.client import ReasonClient

        if not rclpy.ok():
            rclpy.init()
        self.rclpy = rclpy
        self.node = rclpy.create_node("bench")
        reliable = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE)
        deep = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)
        self.cameras = {topic: self.node.create_publisher(Image, topic, reliable)
                        for topic in (NODE_TOPIC, WRIST_TOPIC, BASELINE_TOPIC)}
        self.ask_pub = self.node.create_publisher(String, f"{BASELINE_NS}/ask", deep)
        self._cond = threading.Condition()
        self.answers: dict[str, tuple[float, dict[str, Any]]] = {}
        self.first_tokens: dict[str, float] = {}
        self.diagnostics: dict[str, str] = {}
        self.node.create_subscription(String, f"{BASELINE_NS}/answer", self._on_answer, deep)
        self.node.create_subscription(String, f"{BASELINE_NS}/first_token", self._on_first, deep)
        from cosmos_reason_ros.client import status_name
        self._status_name = status_name(NODE_ACTION.rsplit("/", 1)[0])
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, 10)
        self.get_params = self.node.create_client(GetParameters, "/cosmos_reason/get_parameters")
        self.set_params = self.node.create_client(SetParameters, "/cosmos_reason/set_parameters")
        self._executor = SingleThreadedExecutor()
        self._executor.add_node(self.node)
        self._running = True
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()
        self.client = ReasonClient(NODE_ACTION, node_name="bench_client")
        self._Image = Image
        self._String = String

    def _spin(self) -> None:
        while self._running and self.rclpy.ok():
            with contextlib.suppress(Exception):
                self._executor.spin_once(timeout_sec=0.1)

    def _on_answer(self, msg: Any) -> None:
        now = time.monotonic()
        data = json.loads(msg.data)
        with self._cond:
            self.answers[str(data.get("id"))] = (now, data)
            self._cond.notify_all()

    def _on_first(self, msg: Any) -> None:
        now = time.monotonic()
        with self._cond:
            self.first_tokens.setdefault(msg.data, now)

    def _on_diag(self, msg: Any) -> None:
        for status in msg.status:
            if status.name == self._status_name:
                with self._cond:
                    self.diagnostics = {kv.key: kv.value for kv in status.values}
                    self.diagnostics["_received"] = str(time.monotonic())

    def image_msg(self, rgb: np.ndarray, stamp_ns: int) -> Any:
        """Build an rgb8 Image with the given stamp."""
        from std_msgs.msg import Header

        from cosmos_reason_ros.ros.messages import ns_to_stamp, rgb_image

        return rgb_image(rgb, Header(stamp=ns_to_stamp(stamp_ns), frame_id="bench"))

    def now_ns(self) -> int:
        """Return the ROS clock time (what the node compares frame ages against)."""
        return self.node.get_clock().now().nanoseconds

    def publish(self, topic: str, msg: Any, timeout_s: float = 10.0) -> None:
        """Publish reliably and wait until every subscriber has the frame."""
        pub = self.cameras[topic]
        pub.publish(msg)
        wait = getattr(pub, "wait_for_all_acked", None)
        if wait is not None:
            from rclpy.duration import Duration

            wait(Duration(seconds=timeout_s))
        time.sleep(0.005)  # acked by DDS; let the subscriber's executor run its callback

    def wait_subscribers(self, topic: str, timeout_s: float) -> bool:
        """Wait until the camera topic has a subscriber."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.cameras[topic].get_subscription_count() > 0:
                return True
            time.sleep(0.05)
        return False

    def wait_baseline(self, timeout_s: float) -> bool:
        """Wait until the baseline listens to the trigger and the camera."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.ask_pub.get_subscription_count() > 0 \
                    and self.cameras[BASELINE_TOPIC].get_subscription_count() > 0 \
                    and self.node.count_publishers(f"{BASELINE_NS}/answer") > 0:
                return True
            time.sleep(0.05)
        return False

    # --- requests --------------------------------------------------------------------------

    def node_submit(self, prompt: str, max_tokens: int, cameras: Sequence[str] = ()
                    ) -> Callable[[], dict[str, Any]]:
        """Send one goal on the latest frame(s); the returned function waits for its result."""
        return submit_goal(self.client, prompt, max_tokens, cameras)

    def baseline_request(self, prompt: str, max_tokens: int, seed: int,
                         timeout_s: float = 600.0) -> dict[str, Any]:
        """Ask the baseline about its latest frame; wait for the answer."""
        ask_id = uuid.uuid4().hex
        ask = {"id": ask_id, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
               "seed": seed, "on": "latest"}
        t0 = time.monotonic()
        self.ask_pub.publish(self._String(data=json.dumps(ask)))
        with self._cond:
            if not self._cond.wait_for(lambda: ask_id in self.answers, timeout_s):
                return {"ok": False, "error": f"no baseline answer within {timeout_s} s"}
            t1, data = self.answers.pop(ask_id)
            first = self.first_tokens.pop(ask_id, None)
        return {"ok": bool(data.get("ok")), "error": data.get("error"),
                "ttft_s": None if first is None else first - t0, "e2e_s": t1 - t0,
                "encode_s": data.get("encode_s"), "http_ttft_s": data.get("http_ttft_s"),
                "http_total_s": data.get("http_total_s"), "jpeg_bytes": data.get("jpeg_bytes"),
                "output_tokens": data.get("output_tokens"),
                "prompt_tokens": data.get("prompt_tokens"),
                "cached_prompt_tokens": data.get("cached_prompt_tokens"),
                "stamp_ns": data.get("stamp_ns")}

    # --- parameters ------------------------------------------------------------------------

    def get_param(self, name: str, timeout_s: float = 5.0) -> Any:
        """Return the node's parameter value, or None when it is not declared."""
        from rcl_interfaces.srv import GetParameters
        from rclpy.parameter import parameter_value_to_python

        if not self.get_params.wait_for_service(timeout_sec=timeout_s):
            raise RuntimeError("the node's get_parameters service is not available")
        future = self.get_params.call_async(GetParameters.Request(names=[name]))
        response = _wait_future(future, timeout_s)
        return parameter_value_to_python(response.values[0]) if response.values else None

    def set_param(self, name: str, value: Any, timeout_s: float = 5.0) -> None:
        """Set a node parameter through its standard service; raise if refused."""
        from rcl_interfaces.srv import SetParameters
        from rclpy.parameter import Parameter

        if not self.set_params.wait_for_service(timeout_sec=timeout_s):
            raise RuntimeError("the node's set_parameters service is not available")
        request = SetParameters.Request(parameters=[Parameter(name, value=value)
                                                    .to_parameter_msg()])
        result = _wait_future(self.set_params.call_async(request), timeout_s).results[0]
        if not result.successful:
            raise RuntimeError(f"setting {name}={value!r} refused: {result.reason}")

    def diag(self) -> dict[str, str]:
        """Return the node's latest /diagnostics values."""
        with self._cond:
            return dict(self.diagnostics)

    def fresh_diag(self, timeout_s: float = 10.0) -> dict[str, str]:
        """Return the first /diagnostics values received after this call (or the latest)."""
        after = time.monotonic()
        deadline = after + timeout_s
        while time.monotonic() < deadline:
            values = self.diag()
            if float(values.get("_received", 0)) > after:
                return values
            time.sleep(0.05)
        return self.diag()

    def close(self) -> None:
        """Stop spinning and shut rclpy down."""
        with contextlib.suppress(Exception):
            self.client.close()
        self._running = False
        self._thread.join(2.0)
        with contextlib.suppress(Exception):
            self._executor.shutdown(timeout_sec=1.0)
            self.node.destroy_node()
        self.rclpy.try_shutdown()


def _wait_future(future: Any, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while not future.done():
        if time.monotonic() > deadline:
            raise TimeoutError("service call timed out")
        time.sleep(0.01)
    return future.result()
