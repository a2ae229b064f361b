"""The test side of the live ROS tests: an rclpy node on a context of its own, spinning."""

from __future__ import annotations

import threading
import time
from typing import Any

import rclpy
from rclpy.context import Context
from rclpy.executors import MultiThreadedExecutor, SingleThreadedExecutor
from waiting import DISCOVERY_S


class SpinThread:
    """Spins an executor in a daemon thread until ``stop``.

    ``stop`` ends the loop, joins the thread, then shuts the executor down. (Shutting it down
    while its thread spins races: the executor frees its guard condition under the thread,
    and a thread still inside rcl's wait at interpreter exit aborts it, ros2/rclpy#1484.)
    """

    def __init__(self, executor: Any) -> None:
        self.executor = executor
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        while not self._stop.is_set():
            try:
                self.executor.spin_once(timeout_sec=0.05)
            except AttributeError:
                # An ActionClient being constructed by another thread is in the node's
                # waitables before its lock exists (ros2/rclpy#1589); it was fatal to the
                # spin thread, and a test's goals then never got a response. Next pass.
                time.sleep(0.001)

    def stop(self, timeout_s: float = 10.0) -> None:
        """End the loop and the thread (bounded), then shut the executor down."""
        self._stop.set()
        self._thread.join(timeout_s)
        self.executor.shutdown(timeout_sec=2.0)


class SpunNode:
    """A node spun by a background executor, on a context of its own (its own DDS participant).

    Tests hang their camera publishers, result/diagnostics subscriptions and service clients
    on ``node``; ``close`` tears all of it down. Given ``context``, the node joins that one
    (its owner shuts it down): one participant for several nodes of one test process.
    """

    def __init__(self, name: str, single_threaded: bool = False,
                 context: Context | None = None) -> None:
        self._own_context = context is None
        self.context = context or Context()
        if self._own_context:
            rclpy.init(context=self.context)
        self.node = rclpy.create_node(name, context=self.context)
        self.executor = (SingleThreadedExecutor if single_threaded
                         else MultiThreadedExecutor)(context=self.context)
        self.executor.add_node(self.node)
        self.spinning = SpinThread(self.executor)

    def now_ns(self) -> int:
        """The node's clock, in nanoseconds."""
        return self.node.get_clock().now().nanoseconds

    @staticmethod
    def wait_matched(publisher: Any, timeout_s: float = DISCOVERY_S) -> bool:
        """Wait until ``publisher`` reaches a subscription (DDS discovery takes a moment)."""
        deadline = time.monotonic() + timeout_s
        while publisher.get_subscription_count() == 0:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def close(self) -> None:
        """Stop spinning, destroy the node and shut its own context down."""
        self.spinning.stop()
        self.node.destroy_node()
        if self._own_context:
            rclpy.try_shutdown(context=self.context)
