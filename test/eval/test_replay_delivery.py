"""Node-mode replay publishes every recorded message or reports it: never a silent loss."""

from __future__ import annotations

import pytest

pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
from cosmos_reason_ros.eval import replay_node  # noqa: E402


class Writer:
    """A publisher whose acknowledgements and writes the test decides."""

    def __init__(self, acked: bool = True, failures: int = 0) -> None:
        self.acked, self.failures = acked, failures
        self.sent: list[bytes] = []
        self.waits: list[int] = []  # how many messages were sent when each wait began

    def wait_for_all_acked(self, _timeout) -> bool:
        self.waits.append(len(self.sent))
        return self.acked

    def publish(self, data: bytes) -> None:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("Failed to publish: cannot publish data")
        self.sent.append(data)


def test_a_writer_never_holds_more_unacknowledged_messages_than_its_history():
    writer = Writer()
    delivery = replay_node._Delivery({"/camera/image_raw": writer})
    for i in range(3 * replay_node.WRITER_DEPTH):
        delivery.publish("/camera/image_raw", bytes([i]))
    assert writer.sent == [bytes([i]) for i in range(3 * replay_node.WRITER_DEPTH)]
    # Each wait comes before the history would hold a message not yet acknowledged.
    gaps = [b - a for a, b in zip([0, *writer.waits], writer.waits, strict=False)]
    assert gaps and all(0 < gap < replay_node.WRITER_DEPTH for gap in gaps), writer.waits
    assert delivery.report() == {}


def test_a_refused_write_is_tried_again_after_the_acknowledgements():
    writer = Writer(failures=1)
    delivery = replay_node._Delivery({"/wrist/image_raw/compressed": writer})
    delivery.publish("/wrist/image_raw/compressed", b"frame")
    assert writer.sent == [b"frame"] and writer.waits == [0]
    assert delivery.report() == {}


def test_what_is_late_or_not_published_is_counted_for_the_report():
    late = Writer(acked=False)
    refused = Writer(failures=2)
    delivery = replay_node._Delivery({"/late": late, "/refused": refused})
    for i in range(replay_node.WRITER_DEPTH):
        delivery.publish("/late", bytes([i]))
    delivery.publish("/refused", b"frame")
    assert len(late.sent) == replay_node.WRITER_DEPTH  # late, still published
    assert refused.sent == []
    assert delivery.report() == {"/late": {"unacknowledged": 1, "failed": 0},
                                 "/refused": {"unacknowledged": 0, "failed": 1}}
