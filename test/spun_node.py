"""The test side of the live ROS tests: an rclpy node on a context of its own, spinning."""

from __future__ import annotations

import threading
import time
from typing import Any

import rclpy
from rclpy.context import Context
from rclpy.executors import MultiThreadedExecutor


class SpunNode:
    """A node on its own context (so its own DDS participant), spun by a background executor.

    Tests hang their camera publishers, result/diagnostics subscriptions and service clients
    on ``node``; ``close`` tears all of it down.
    """

    def __init__(self, name: str) -> None:
        self.context = Context()
        rclpy.init(context=self.context)
        self.node = rclpy.create_node(name, context=self.context)
        self.executor = MultiThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self._spinning = threading.Thread(target=self.executor.spin, daemon=True)
        self._spinning.start()

    def now_ns(self) -> int:
        """The node's clock, in nanoseconds."""
        return self.node.get_clock().now().nanoseconds

    @staticmethod
    def wait_matched(publisher: Any, timeout_s: float = 30.0) -> bool:
        """Wait until ``publisher`` reaches a subscription (DDS discovery takes a moment)."""
        deadline = time.monotonic() + timeout_s
        while publisher.get_subscription_count() == 0:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def stop(self) -> None:
        """Stop spinning; after this, entities the node does not own (action clients) can be
        destroyed without the spin thread adding a freed handle to its wait set."""
        self.executor.shutdown()
        self._spinning.join(timeout=5.0)

    def close(self) -> None:
        """Stop spinning, destroy the node and shut its context down."""
        self.stop()
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)
