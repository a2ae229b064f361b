"""A test browser's side of the console's WebSocket: wait for a message kind or a picture."""

from __future__ import annotations

import contextlib
import json
import struct
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from aiohttp import WSMsgType
from aiohttp.test_utils import TestClient, TestServer
from waiting import NEVER_S

# A message or picture the console should send at once: past this it never came (a starved CI
# worker took over 20 s to fill a stuck browser's socket from a 30 fps camera).
WAIT_S = NEVER_S


async def next_json(ws: Any, kind: str, timeout_s: float = WAIT_S) -> dict[str, Any]:
    """The next text message of type ``kind`` (pictures and other messages skipped)."""
    deadline = time.monotonic() + timeout_s
    while True:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"no {kind!r} message within {timeout_s} s"
        message = await ws.receive(timeout=remaining)
        assert message.type in (WSMsgType.TEXT, WSMsgType.BINARY), message
        if message.type is WSMsgType.TEXT:
            data = json.loads(message.data)
            if data["type"] == kind:
                return data


async def next_picture(ws: Any, timeout_s: float = WAIT_S) -> tuple[dict[str, Any], bytes]:
    """The next picture message: (header, JPEG bytes)."""
    deadline = time.monotonic() + timeout_s
    while True:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"no picture within {timeout_s} s"
        message = await ws.receive(timeout=remaining)
        if message.type is WSMsgType.BINARY:
            (length,) = struct.unpack(">I", message.data[:4])
            return json.loads(message.data[4:4 + length]), message.data[4 + length:]


@contextlib.asynccontextmanager
async def console_session(token: str | None = None, fps: float = 10.0
                          ) -> AsyncIterator[tuple[Any, TestClient]]:
    """A console for the node ``/cosmos_reason`` (real ROS side) under aiohttp's test server.

    Yields the ``Console`` and a test client of its HTTP and WebSocket routes.
    """
    from cosmos_reason_ros.console import server
    from cosmos_reason_ros.console.ros_bridge import ConsoleBridge

    console = server.Console(lambda events: ConsoleBridge("/cosmos_reason", events),
                             fps=fps, token=token)
    client = TestClient(TestServer(server.build_app(console)))
    await client.start_server()
    try:
        yield console, client
    finally:
        await client.close()


@contextlib.contextmanager
def publishing(publish_once: Callable[[], object], period_s: float = 0.05) -> Iterator[None]:
    """Call ``publish_once`` every ``period_s`` on a thread of its own (a live camera)."""
    stop = threading.Event()

    def publish() -> None:
        while not stop.is_set():
            publish_once()
            stop.wait(period_s)

    thread = threading.Thread(target=publish, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5.0)
