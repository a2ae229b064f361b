"""The console with a node of several named cameras: one pane per camera, from its parameters.

Fast tier, like ``test_console_api.py`` (the real node in this process on the scripted
engine, the real console under aiohttp's test server). What only this proves: the console
reads the node's ``cameras.names`` through its parameter service and shows one pane per
camera, fed by that camera's topic, and an answer about two cameras keeps each camera's own
frame.
"""

from __future__ import annotations

import asyncio
import time

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
from inprocess_node import InProcessNode  # noqa: E402

pytestmark = [pytest.mark.ros]

CAMERAS = ["front", "wrist"]


@pytest.fixture(scope="module")
def node():
    n = InProcessNode({"cameras.names": CAMERAS, "image.max_age_s": 0.0},
                      script=answers_the_task)
    yield n
    n.close()


def test_one_pane_per_named_camera_and_answers_keep_each_frame(node) -> None:
    stamps: dict[str, list[int]] = {name: [] for name in CAMERAS}

    def publish() -> None:  # both cameras (at 20 Hz), each its own size
        for name, (width, height) in zip(CAMERAS, ((64, 48), (32, 24)), strict=True):
            stamps[name].append(node.publish(camera=name, width=width, height=height))

    async def test() -> None:
        async with console_session(fps=20.0) as (_, client):
            ws = await client.ws_connect("/ws")
            deadline = time.monotonic() + WAIT_S
            hello = await next_json(ws, "hello")
            while hello["cameras"] != CAMERAS:  # until the node's parameters are read
                assert time.monotonic() < deadline, f"the panes stayed {hello['cameras']}"
                hello = await next_json(ws, "hello")
            seen: dict[str, int] = {}  # a picture of the pane shown before may come first
            while not set(CAMERAS) <= set(seen):
                assert time.monotonic() < deadline, f"pictures only of {sorted(seen)}"
                header, _ = await next_picture(ws)
                seen[header["camera"]] = int(header["stamp"])
            assert all(seen[name] in stamps[name] for name in CAMERAS)
            await ws.send_json({"type": "ask", "task": "vqa", "prompt": "Same scene?",
                                "cameras": CAMERAS})
            result = (await next_json(ws, "answer"))["result"]
            assert result["status"] == "succeeded", result["error_message"]
            frames = {f["camera"]: f for f in result["camera_frames"]}
            assert list(frames) == CAMERAS
            assert (frames["wrist"]["image_width"], frames["wrist"]["image_height"]) == (32, 24)
            assert result["frames"] == {name: {"source": "camera"} for name in CAMERAS}
            for name in CAMERAS:
                assert int(frames[name]["stamp"]) in stamps[name]
                response = await client.get(f"/frame/{result['goal_id']}/{name}")
                assert response.status == 200
            await ws.close()

    with publishing(publish):
        asyncio.run(test())
