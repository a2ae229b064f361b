"""The MCP server driven by the official SDK's own client over stdio, against the real node.

The server runs as an agent starts it (a child process speaking MCP on stdin/stdout); the node
is the real one in this process on the scripted engine, reached by the real names. What is
proven: the tools are listed with schemas; each tool answers with structured output; a
snapshot is image content; a bad argument comes back as the node's code and message; a tool
call cancelled by the client cancels its goal and the engine request is aborted.
"""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
mcp = pytest.importorskip("mcp", reason="needs the mcp SDK (make setup)")
from fake_engine import Gate, Script, answers_the_task  # noqa: E402
from inprocess_node import InProcessNode  # noqa: E402
from waiting import NEVER_S, async_wait_until, wait_until  # noqa: E402

from cosmos_reason_ros.core.types import ErrorCode  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]  # starts processes: the real tier
REPO_ROOT = Path(__file__).resolve().parents[2]
TOOLS = {"ask", "ground", "point", "verify", "count", "cameras", "snapshot"}


@pytest.fixture(scope="module")
def node():
    n = InProcessNode(script=answers_the_task)
    n.publish(width=64, height=48)
    n.wait_frames(1)
    yield n
    n.close()


def server_params():
    return mcp.StdioServerParameters(
        command=sys.executable, args=["-m", "cosmos_reason_ros.planning.mcp_server"],
        cwd=str(REPO_ROOT), env=dict(os.environ))


def with_client(body):
    async def run():
        async with mcp.Client(server_params()) as client:
            return await body(client)
    return asyncio.run(run())


def test_tools_are_listed_and_each_answers_with_structured_output(node):
    async def body(client):
        listed = (await client.list_tools()).tools
        assert {t.name for t in listed} == TOOLS
        assert all(t.input_schema and t.description for t in listed)
        assert all(t.output_schema for t in listed if t.name != "snapshot")
        calls = {
            "ask": {"question": "What is on the table?"},
            "ground": {"targets": ["red cup"]},
            "point": {"targets": ["red cup"]},
            "verify": {"statement": "The part is in the gripper."},
            "count": {"targets": ["red cup"]},
            "cameras": {},
        }
        return {name: await client.call_tool(name, args) for name, args in calls.items()}

    results = with_client(body)
    for name, result in results.items():
        assert not result.is_error, (name, result.content)
    out = {name: r.structured_content for name, r in results.items()}
    assert out["ask"]["answer"] == "A table with a cup."
    [box] = out["ground"]["boxes"]
    assert (box["label"], box["position"]) == ("red cup", None)
    assert (box["x_min"], box["y_min"]) == pytest.approx((6.4, 7.2), abs=1e-3)
    [point] = out["point"]["points"]
    assert (point["x"], point["y"]) == pytest.approx((16.0, 19.2), abs=1e-3)
    assert out["verify"]["verdict"] == "yes"
    assert out["verify"]["reason"] == "The part is in the gripper."
    assert out["count"]["count"] == 1
    assert out["cameras"]["names"] == []
    goal_ids = {out[name]["goal_id"] for name in ("ask", "ground", "point", "verify", "count")}
    assert goal_ids <= {m.goal_id for m in node.results} and len(goal_ids) == 5


def test_snapshot_is_the_cameras_frame_as_an_image(node):
    async def body(client):
        # The server's camera subscription matches after it starts: the camera keeps going.
        async def shown():
            node.publish(width=64, height=48)
            result = await client.call_tool("snapshot", {})
            return None if result.is_error else result
        return await async_wait_until(shown, NEVER_S, "a snapshot", poll_s=0.2)

    result = with_client(body)
    [image] = result.content
    assert image.type == "image" and image.mime_type == "image/jpeg"
    assert base64.b64decode(image.data)[:2] == b"\xff\xd8"


def test_a_bad_argument_gives_the_nodes_code_and_message(node):
    async def body(client):
        return await client.call_tool("ground", {"targets": ["cup"], "cameras": ["nope"]})

    result = with_client(body)
    assert result.is_error
    text = result.content[0].text  # the SDK puts "Error executing tool ground: " before it
    bad = [m for m in node.results if m.error_code == ErrorCode.BAD_REQUEST]
    assert bad and text.endswith(f": BAD_REQUEST: {bad[-1].error_message}"), text
    assert "cameras[0]='nope'" in bad[-1].error_message  # the node named the bad field


def test_a_cancelled_tool_call_cancels_its_goal_and_the_engine_request(node):
    gate = Gate()
    node.engine.script = lambda r: Script(deltas=["word ", "more."], gate=gate)
    try:
        async def body(client):
            call = asyncio.create_task(client.call_tool("ask", {"question": "Long?"}))
            [request_id] = await asyncio.to_thread(node.engine.wait_generating, 1, NEVER_S)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            await asyncio.to_thread(node.engine.wait_for, lambda e: request_id in e.aborted,
                                    NEVER_S, "the cancelled call's engine request aborted")
            return request_id

        assert with_client(body) in node.engine.aborted
    finally:
        gate.release()
        node.engine.script = answers_the_task


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_server(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cosmos_reason_ros.planning.mcp_server",
                             "--transport", "http", *args], cwd=REPO_ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.communicate(timeout=NEVER_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()


def http_status(url: str, headers: dict[str, str]) -> int | None:
    request = urllib.request.Request(url, data=b"{}", headers={
        "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
        **headers}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:  # bound: one probe
            return response.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None  # not listening yet


def test_streamable_http_on_loopback_serves_the_sdk_client(node):
    port = free_port()
    proc = http_server("--port", str(port))
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        wait_until(lambda: http_status(url, {}) is not None, NEVER_S, "the server listening")

        async def body():
            async with mcp.Client(url) as client:
                return await client.call_tool("verify", {"statement": "The part is in the "
                                                                      "gripper."})
        result = asyncio.run(body())
        assert not result.is_error and result.structured_content["verdict"] == "yes"
    finally:
        stop(proc)


def test_streamable_http_off_loopback_needs_the_token(node):
    port = free_port()
    proc = http_server("--host", "0.0.0.0", "--port", str(port))  # no --token: one is made
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        wait_until(lambda: http_status(url, {}) is not None, NEVER_S, "the server listening")
        assert http_status(url, {}) == 401
        assert http_status(url, {"Authorization": "Bearer wrong"}) == 401
        line = wait_until(lambda: next((x for x in proc.stderr.readline().splitlines()
                                        if "Bearer" in x), None), NEVER_S, "the token line")
        token = line.rsplit("Bearer ", 1)[1].rstrip(")")
        assert http_status(url, {"Authorization": f"Bearer {token}"}) not in (None, 401)
    finally:
        stop(proc)
