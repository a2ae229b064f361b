"""The console finds the camera the node takes, when the node's ``image`` is remapped.

Fast tier, like ``test_console_api.py``. What only this proves: a console started with no
camera topic (``console`` beside a node launched with ``image:=/front/image_raw``) shows that
camera, taking its topic from the node's ``/diagnostics`` (``image_topic``, remaps applied),
instead of waiting on ``/image`` forever; and, where the node follows its camera's
publishers' reliability (``image.qos_reliability: auto``), the console does too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
from console_client import (  # noqa: E402
    WAIT_S,
    console_session,
    next_json,
    next_picture,
    publishing,
)
from fake_engine import answers_the_task  # noqa: E402
from inprocess_node import InProcessNode, image_msg  # noqa: E402
from rclpy.qos import ReliabilityPolicy  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402
from waiting import DISCOVERY_S, wait_until  # noqa: E402

from cosmos_reason_ros.qos import keep_last  # noqa: E402

pytestmark = [pytest.mark.ros]

REMAPPED = "/front/image_raw"


def subscribed_knowing_the_camera(bridge) -> None:
    """Arrange a console following the node (``auto``) that has subscribed knowing the camera.

    A console that subscribed before its participant had discovered the camera took best
    effort (it matches whichever camera comes); once the camera is known it subscribes again,
    as a console started then would.
    """
    wait_until(lambda: bridge._reliability_subscribed == "auto", WAIT_S,
               "the console read the node's image.qos_reliability")
    wait_until(lambda: bridge.node.get_publishers_info_by_topic("/image"), DISCOVERY_S,
               "the console's participant knows the camera")
    bridge._subscribe_cameras(list(bridge.topics))


def test_a_console_without_a_topic_shows_the_nodes_remapped_camera() -> None:
    node = InProcessNode({"image.max_age_s": 0.0, "diagnostics.period_s": 0.2},
                         script=answers_the_task, image_topic=REMAPPED)
    stamps: list[int] = []  # the remapped camera's, published at 20 Hz

    async def test() -> None:
        async with console_session(fps=20.0) as (console, client):
            ws = await client.ws_connect("/ws")
            assert (await next_json(ws, "hello"))["cameras"] == ["default"]
            header, _ = await next_picture(ws)  # only the remapped topic carries pictures
            assert header["camera"] == "default" and int(header["stamp"]) in stamps
            assert console.bridge.topics[0].stream_topic == REMAPPED
            await ws.close()

    try:
        with publishing(lambda: stamps.append(node.publish())):
            asyncio.run(test())
    finally:
        node.close()


def test_a_console_follows_the_cameras_publishers_when_the_node_does() -> None:
    # The node's image.qos_reliability auto: the console subscribes as the camera publishes
    # (reliable here), not best effort, which loses most large frames between processes.
    node = InProcessNode({"image.qos_reliability": "auto", "diagnostics.period_s": 0.2},
                         script=answers_the_task)
    stamps: list[int] = []  # the node's reliable camera's, published at 20 Hz

    async def test() -> None:
        async with console_session(fps=20.0) as (console, client):
            bridge = console.bridge
            subscribed_knowing_the_camera(bridge)
            streams = bridge.stream_reliabilities()
            assert streams["/image"] == ReliabilityPolicy.RELIABLE, streams
            ws = await client.ws_connect("/ws")
            await next_json(ws, "hello")
            header, _ = await next_picture(ws)
            assert int(header["stamp"]) in stamps
            await ws.close()

    try:
        with publishing(lambda: stamps.append(node.publish())):
            asyncio.run(test())
    finally:
        node.close()


def test_a_best_effort_camera_replacing_a_reliable_one_still_reaches_the_console() -> None:
    # Subscribed reliable (the camera published reliable), the console would never match a
    # best-effort publisher that comes later: it resubscribes best effort, as the node does.
    node = InProcessNode({"image.qos_reliability": "auto", "diagnostics.period_s": 0.2},
                         script=answers_the_task)
    stamps: list[int] = []  # the best-effort camera's
    camera = [node.publish]  # the reliable camera first

    def best_effort_camera() -> Callable[[], int]:
        publisher = node.side.node.create_publisher(
            Image, "/image", keep_last(2, ReliabilityPolicy.BEST_EFFORT))

        def publish() -> int:
            stamp = node.side.now_ns()
            publisher.publish(image_msg(stamp))
            stamps.append(stamp)
            return stamp
        return publish

    async def test() -> None:
        async with console_session(fps=20.0) as (console, client):
            bridge = console.bridge
            subscribed_knowing_the_camera(bridge)
            assert bridge.stream_reliabilities()["/image"] == ReliabilityPolicy.RELIABLE
            camera[0] = best_effort_camera()  # appears after the subscription
            # The console learns of the new publisher by DDS discovery.
            wait_until(lambda: bridge.stream_reliabilities().get("/image")
                       == ReliabilityPolicy.BEST_EFFORT, DISCOVERY_S,
                       "the console resubscribed best effort")
            ws = await client.ws_connect("/ws")
            await next_json(ws, "hello")
            header, _ = await next_picture(ws)
            while int(header["stamp"]) not in stamps:  # pictures of the reliable camera first
                header, _ = await next_picture(ws)
            await ws.close()

    try:
        with publishing(lambda: camera[0]()):
            asyncio.run(test())
    finally:
        node.close()
