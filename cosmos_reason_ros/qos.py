"""Subscription reliability that follows a topic's publishers (the node's cameras, the console).

As ``ros2 topic echo`` and rosbag2 choose: reliable, unless a publisher is best effort (a
reliable reader does not match a best-effort writer). Reliable with no publisher known yet:
RealSense, ZED, OAK-D (depthai-ros) and Orbbec drivers publish reliable by default, and a
best-effort reader of a reliable writer gets no retransmission, so a large frame that lost one
of its UDP fragments on the way is lost whole (a 640x480 rgb8 frame is ~60 fragments, a 16UC1
depth frame ~40): measured between processes, a best-effort reader got 0.5-6 of a reliable
camera's 10 Hz.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy

try:  # Iron and later; Humble has it in rclpy.qos_event (deprecated there since Iron)
    from rclpy.event_handler import SubscriptionEventCallbacks
except ImportError:  # pragma: no cover - Humble
    from rclpy.qos_event import SubscriptionEventCallbacks


def following_reliability(offered: Iterable[Any]) -> ReliabilityPolicy:
    """Return the reliability to subscribe with to publishers offering ``offered``."""
    return ReliabilityPolicy.BEST_EFFORT \
        if any(r == ReliabilityPolicy.BEST_EFFORT for r in offered) \
        else ReliabilityPolicy.RELIABLE


def keep_last(depth: int, reliability: ReliabilityPolicy) -> QoSProfile:
    """Return a keep-last ``depth`` profile of ``reliability`` (volatile, as drivers offer)."""
    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=depth, reliability=reliability)


def publishers_qos(node: Any, topic: str, depth: int,
                   when_none: ReliabilityPolicy = ReliabilityPolicy.RELIABLE) -> QoSProfile:
    """Keep-last ``depth``, with the reliability ``topic``'s publishers known now call for.

    ``when_none``: the reliability while no publisher is known.
    """
    offered = [info.qos_profile.reliability
               for info in node.get_publishers_info_by_topic(topic)]
    return keep_last(depth, following_reliability(offered) if offered else when_none)


def on_best_effort_publisher(
        qos: QoSProfile, resubscribe: Callable[[], None]) -> SubscriptionEventCallbacks | None:
    """Return the events of a subscription with ``qos`` that calls ``resubscribe`` on need.

    For a reliable one: when a best-effort publisher appears, which a reliable reader never
    matches (``resubscribe`` then subscribes best effort). None for a best-effort one.
    """
    if qos.reliability != ReliabilityPolicy.RELIABLE:
        return None
    return SubscriptionEventCallbacks(incompatible_qos=lambda _event: resubscribe())


def resubscribe_best_effort(node: Any, subscriptions: list[Any], index: int,
                            create: Callable[[QoSProfile], Any]) -> bool:
    """Replace reliable ``subscriptions[index]`` by ``create`` (best effort, its depth).

    ``node`` owns the subscription. Returns False when it was best effort already.
    """
    old = subscriptions[index]
    if old.qos_profile.reliability == ReliabilityPolicy.BEST_EFFORT:
        return False
    node.destroy_subscription(old)
    subscriptions[index] = create(keep_last(old.qos_profile.depth,
                                            ReliabilityPolicy.BEST_EFFORT))
    return True
