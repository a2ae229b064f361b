"""MCP server: the node's questions and cameras as tools for an LLM agent.

    reason_mcp                                   # stdio, for an agent that starts it
    reason_mcp --transport http --port 8765      # streamable HTTP on 127.0.0.1
    reason_mcp --transport http --host 0.0.0.0   # on the LAN: prints a URL with a token

Tools: ``ask``, ``ground``, ``point``, ``verify``, ``count`` (each call is one action goal
through ``ReasonClient``; a cancelled call cancels its goal), ``cameras`` (the node's camera
names) and ``snapshot`` (the newest frame of a camera as image content, so the agent sees
what the robot sees). Structured outputs carry pixels and, where the node lifted them, 3D
positions in metres. A goal the node refuses or fails is a tool error whose text is the
node's error code and message (``BAD_REQUEST: ...``), as the action gives them.

HTTP binds to loopback unless --host says otherwise; bound elsewhere it needs a bearer token
(--token, or one is generated and printed), as the console does.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import secrets
import sys
import threading
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.types import Image
from pydantic import BaseModel, Field

from cosmos_reason_ros.client import SOURCES, ReasonClient, ReasonResult
from cosmos_reason_ros.core.imaging import ImageMessage, encode_jpeg, message_to_rgb
from cosmos_reason_ros.core.parsing import read_count, read_verdict
from cosmos_reason_ros.core.types import ParsedAnswer

DEFAULT_TIMEOUT_S = 60.0
Source = Literal["latest", "next"]
# 0: the task's own limit; the node caps every goal at its limits.max_tokens and refuses a
# negative or larger value (BAD_REQUEST), as it does for any goal.
MaxTokens = Annotated[int, Field(description="most tokens to generate; 0: the task's default")]


class Position(BaseModel):
    """A 3D position in metres, in ``frame``."""

    x: float
    y: float
    z: float
    frame: str


class BoxOut(BaseModel):
    """A box in original-image pixels of ``camera``, with its 3D centre where lifted."""

    label: str
    camera: str
    x_min: float
    y_min: float
    x_max: float
    y_max: float
    position: Position | None = None


class PointOut(BaseModel):
    """A point in original-image pixels of ``camera``, with its 3D position where lifted."""

    label: str
    camera: str
    x: float
    y: float
    position: Position | None = None


class AskOut(BaseModel):
    """A free-form answer."""

    answer: str
    reasoning: str = ""
    goal_id: str


class GroundOut(BaseModel):
    """Boxes of the targets (pixels; 3D where lifted)."""

    boxes: list[BoxOut]
    goal_id: str


class PointsOut(BaseModel):
    """Points on the targets (pixels; 3D where lifted)."""

    points: list[PointOut]
    goal_id: str


class VerifyOut(BaseModel):
    """A yes/no check of a statement."""

    verdict: Literal["yes", "no", "unsure"]
    reason: str
    goal_id: str


class CountOut(BaseModel):
    """How many of the targets are visible, all together (None: no count in the answer)."""

    count: int | None
    goal_id: str


class CamerasOut(BaseModel):
    """The cameras a goal can name, and those ``snapshot`` can show."""

    names: list[str] = Field(description="the node's cameras.names; empty: one unnamed camera")
    snapshot: list[str] = Field(description="cameras with a frame to show ('' the default)")


class ToolFailure(Exception):
    """A goal that did not succeed: the node's error code and message."""


def _position(p3: Any, frame: str) -> Position | None:
    if p3 is None or not p3.valid:
        return None
    return Position(x=p3.position.x, y=p3.position.y, z=p3.position.z, frame=frame)


class CameraFeed:
    """The newest raw frame of each camera topic, on a node and spin thread of its own."""

    def __init__(self, topics: dict[str, str], node_path: str = "/cosmos_reason") -> None:
        """``topics``: camera name ('' the default camera) -> ``sensor_msgs/Image`` topic.

        ``node_path``: the node whose ``cameras.names`` ``node_cameras`` reads.
        """
        import rclpy
        from rcl_interfaces.srv import GetParameters
        from rclpy.context import Context
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.qos import qos_profile_sensor_data
        from sensor_msgs.msg import Image

        self._latest: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._context = Context()
        rclpy.init(context=self._context)
        self._node = rclpy.create_node("cosmos_reason_mcp_cameras", context=self._context)
        for name, topic in topics.items():
            self._node.create_subscription(Image, topic, self._storer(name),
                                           qos_profile_sensor_data)
        self._parameters = self._node.create_client(GetParameters,
                                                    f"{node_path}/get_parameters")
        self._executor = SingleThreadedExecutor(context=self._context)
        self._executor.add_node(self._node)
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()

    def _storer(self, name: str) -> Any:
        def store(msg: Any) -> None:
            with self._lock:
                self._latest[name] = msg
        return store

    def _spin(self) -> None:
        while self._context.ok():
            try:
                self._executor.spin_once(timeout_sec=0.1)
            except Exception:  # noqa: BLE001 - shut down under the spin: stop spinning
                break

    def node_cameras(self, timeout_s: float = 5.0) -> list[str]:
        """Return the node's ``cameras.names`` (blocks up to ``timeout_s``; run off the loop)."""
        from rcl_interfaces.srv import GetParameters
        from rclpy.parameter import parameter_value_to_python

        if not self._parameters.wait_for_service(timeout_sec=timeout_s):
            raise ToolFailure(f"ENGINE_UNAVAILABLE: {self._parameters.srv_name} not "
                              f"available after {timeout_s:g} s (is the node running?)")
        done = threading.Event()
        future = self._parameters.call_async(GetParameters.Request(names=["cameras.names"]))
        future.add_done_callback(lambda _f: done.set())
        if not done.wait(timeout_s) or future.result() is None:
            raise ToolFailure(f"NOT_DELIVERED: no answer from {self._parameters.srv_name} "
                              f"within {timeout_s:g} s")
        [value] = future.result().values
        return list(parameter_value_to_python(value) or [])

    def names(self) -> list[str]:
        """Return the cameras with a frame."""
        with self._lock:
            return sorted(self._latest)

    def jpeg(self, name: str) -> bytes | None:
        """Return the newest frame of camera ``name`` as JPEG (None: no frame yet)."""
        with self._lock:
            msg = self._latest.get(name)
        if msg is None:
            return None
        stamp = msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec
        image = ImageMessage(stamp_ns=stamp, frame_id=msg.header.frame_id, width=msg.width,
                             height=msg.height, encoding=msg.encoding,
                             is_bigendian=bool(msg.is_bigendian), step=msg.step,
                             data=bytes(msg.data))
        return encode_jpeg(message_to_rgb(image), 85)

    def close(self) -> None:
        """Stop the spin thread and the node."""
        import rclpy

        rclpy.try_shutdown(context=self._context)
        self._thread.join(timeout=2.0)
        self._node.destroy_node()


class Tools:
    """What each tool does, apart from MCP (so it is testable without a transport)."""

    def __init__(self, client: ReasonClient, feed: CameraFeed) -> None:
        """Send goals through ``client``; read cameras and frames through ``feed``."""
        self.client = client
        self.feed = feed

    async def run(self, prompt: str, task: str, targets: list[str], cameras: list[str],
                  source: Source, timeout_s: float, **fields: Any) -> ReasonResult:
        """Send one goal and await its result; a cancelled call cancels the goal."""
        if source not in ("latest", "next"):
            raise ToolFailure(f"BAD_REQUEST: source={source!r}: expected latest or next")
        goal = ReasonClient.goal(prompt, task, targets, cameras, source=SOURCES[source],
                                 timeout_s=float(timeout_s), **fields)
        handle = self.client.submit(goal, server_timeout_s=timeout_s)
        # The node ends the goal at timeout_s; the extra wait covers a reply lost on the way.
        limit = timeout_s + self.client.delivery_timeout_s
        try:
            result = await asyncio.wait_for(asyncio.wrap_future(handle.future), limit)
        except asyncio.TimeoutError:
            handle.cancel()
            raise ToolFailure(f"TIMEOUT: no result within {limit:g} s; the goal was "
                              "cancelled") from None
        except BaseException:
            handle.cancel()  # the call was cancelled: so is its goal
            raise
        if not result.ok:
            raise ToolFailure(f"{result.error_code.name}: {result.error_message}")
        return result

    async def ask(self, question: str, cameras: list[str], source: Source, reasoning: bool,
                  timeout_s: float, max_tokens: int = 0) -> AskOut:
        """Answer a free-form question."""
        r = await self.run(question, "vqa", [], cameras, source, timeout_s, reasoning=reasoning,
                           max_tokens=max_tokens)
        return AskOut(answer=r.answer, reasoning=r.reasoning, goal_id=r.message.goal_id)

    async def ground(self, targets: list[str], cameras: list[str], source: Source,
                     timeout_s: float, max_tokens: int = 0) -> GroundOut:
        """Find boxes of the targets."""
        r = await self.run("", "ground", targets, cameras, source, timeout_s,
                           max_tokens=max_tokens)
        frame = r.message.frame_3d
        return GroundOut(goal_id=r.message.goal_id, boxes=[
            BoxOut(label=b.label, camera=b.camera, x_min=b.x_min, y_min=b.y_min, x_max=b.x_max,
                   y_max=b.y_max, position=_position(b.position_3d, frame)) for b in r.boxes])

    async def point(self, targets: list[str], cameras: list[str], source: Source,
                    timeout_s: float, max_tokens: int = 0) -> PointsOut:
        """Point at the targets."""
        r = await self.run("", "point", targets, cameras, source, timeout_s,
                           max_tokens=max_tokens)
        frame = r.message.frame_3d
        return PointsOut(goal_id=r.message.goal_id, points=[
            PointOut(label=p.label, camera=p.camera, x=p.x, y=p.y,
                     position=_position(p.position_3d, frame)) for p in r.points])

    async def verify(self, statement: str, cameras: list[str], source: Source,
                     timeout_s: float, max_tokens: int = 0) -> VerifyOut:
        """Check a statement yes/no."""
        r = await self.run(statement, "verify", [], cameras, source, timeout_s,
                           max_tokens=max_tokens)
        parsed = ParsedAnswer(raw_text=r.answer, reasoning="", answer=r.answer,
                              answer_json=r.answer_json or None)
        verdict = {True: "yes", False: "no", None: "unsure"}[read_verdict(parsed)]
        try:
            value = json.loads(r.answer_json) if r.answer_json else {}
        except ValueError:
            value = {}
        reason = value.get("reason") if isinstance(value, dict) else None
        return VerifyOut(verdict=verdict, reason=reason if isinstance(reason, str) else r.answer,
                         goal_id=r.message.goal_id)

    async def count(self, targets: list[str], cameras: list[str], source: Source,
                    timeout_s: float, max_tokens: int = 0) -> CountOut:
        """Count the targets together."""
        r = await self.run("", "count", targets, cameras, source, timeout_s,
                           max_tokens=max_tokens)
        parsed = ParsedAnswer(raw_text=r.answer, reasoning="", answer=r.answer,
                              answer_json=r.answer_json or None)
        return CountOut(count=read_count(parsed), goal_id=r.message.goal_id)

    async def cameras(self) -> CamerasOut:
        """Return the node's camera names and those with a frame to show."""
        names = await asyncio.to_thread(self.feed.node_cameras)
        return CamerasOut(names=names, snapshot=self.feed.names())

    def snapshot(self, camera: str) -> bytes:
        """Return the newest frame of ``camera`` ('' the default camera) as JPEG."""
        jpeg = self.feed.jpeg(camera)
        if jpeg is None:
            raise ToolFailure(f"NO_IMAGE: no frame of camera {camera!r} yet (cameras with a "
                              f"frame: {self.feed.names()})")
        return jpeg


def build_server(tools: Tools) -> MCPServer:
    """Return the ``MCPServer`` with the tools."""
    server = MCPServer("cosmos_reason_ros", log_level="WARNING", instructions=(
        "Ask about what the robot's cameras see. Pixels are of the original camera image; "
        "3D positions are metres in the named frame, present where the node has depth."))

    async def guarded(call: Any) -> Any:
        try:
            return await call
        except ToolFailure as e:
            raise ToolError(str(e)) from None

    @server.tool()
    async def ask(question: str, cameras: list[str] | None = None, source: Source = "latest",
                  reasoning: bool = False, timeout_s: float = DEFAULT_TIMEOUT_S,
                  max_tokens: MaxTokens = 0) -> AskOut:
        """Ask a free-form question about the camera image."""
        return await guarded(tools.ask(question, cameras or [], source, reasoning, timeout_s,
                                       max_tokens))

    @server.tool()
    async def ground(targets: list[str], cameras: list[str] | None = None,
                     source: Source = "latest", timeout_s: float = DEFAULT_TIMEOUT_S,
                     max_tokens: MaxTokens = 0) -> GroundOut:
        """Find boxes of the targets (pixels, and 3D where lifted)."""
        return await guarded(tools.ground(targets, cameras or [], source, timeout_s,
                                           max_tokens))

    @server.tool()
    async def point(targets: list[str], cameras: list[str] | None = None,
                    source: Source = "latest", timeout_s: float = DEFAULT_TIMEOUT_S,
                    max_tokens: MaxTokens = 0) -> PointsOut:
        """Point at the targets (pixels, and 3D where lifted)."""
        return await guarded(tools.point(targets, cameras or [], source, timeout_s,
                                           max_tokens))

    @server.tool()
    async def verify(statement: str, cameras: list[str] | None = None,
                     source: Source = "latest", timeout_s: float = DEFAULT_TIMEOUT_S,
                     max_tokens: MaxTokens = 0) -> VerifyOut:
        """Check whether a statement about the scene holds: yes, no or unsure, with a reason."""
        return await guarded(tools.verify(statement, cameras or [], source, timeout_s,
                                           max_tokens))

    @server.tool()
    async def count(targets: list[str], cameras: list[str] | None = None,
                    source: Source = "latest", timeout_s: float = DEFAULT_TIMEOUT_S,
                    max_tokens: MaxTokens = 0) -> CountOut:
        """Count how many of the targets are visible, all together."""
        return await guarded(tools.count(targets, cameras or [], source, timeout_s,
                                           max_tokens))

    @server.tool(name="cameras")
    async def cameras_tool() -> CamerasOut:
        """List the cameras a question can name, and those snapshot can show."""
        return await guarded(tools.cameras())

    @server.tool()
    def snapshot(camera: str = "") -> Image:
        """Return the newest frame of a camera ('' the default camera) as a JPEG image."""
        try:
            return Image(data=tools.snapshot(camera), format="jpeg")
        except ToolFailure as e:
            raise ToolError(str(e)) from None

    return server


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def build_parser() -> argparse.ArgumentParser:
    """Build the command-line parser."""
    ap = argparse.ArgumentParser(prog="reason_mcp", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--transport", choices=("stdio", "http"), default="stdio")
    ap.add_argument("--host", default="127.0.0.1", help="HTTP: address to bind")
    ap.add_argument("--port", type=int, default=8765, help="HTTP: port")
    ap.add_argument("--token", default="", help="HTTP: bearer token (generated when the "
                    "host is not loopback and none is given)")
    ap.add_argument("--action", default="/cosmos_reason/reason", help="action name")
    ap.add_argument("--image-topic", default="/image",
                    help="the default camera's sensor_msgs/Image topic, for snapshot")
    ap.add_argument("--camera", action="append", default=[], metavar="NAME=TOPIC",
                    help="a named camera's Image topic, for snapshot (repeat)")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Serve the tools until the agent disconnects (stdio) or Ctrl-C (HTTP)."""
    args = build_parser().parse_args(argv)
    topics = {"": args.image_topic}
    for spec in args.camera:
        name, sep, topic = spec.partition("=")
        if not (sep and name and topic):
            print(f"reason_mcp: --camera {spec!r}: expected NAME=TOPIC", file=sys.stderr)
            return 2
        topics[name] = topic
    token = args.token
    if args.transport == "http" and not _loopback(args.host) and not token:
        token = secrets.token_urlsafe(24)
    feed = CameraFeed(topics, args.action.rsplit("/", 1)[0] or "/")
    try:
        with ReasonClient(args.action) as client:
            server = build_server(Tools(client, feed))
            if args.transport == "stdio":
                server.run("stdio")
            else:
                _serve_http(server, args.host, args.port, token)
    except KeyboardInterrupt:
        pass
    finally:
        feed.close()
    return 0


def _serve_http(server: Any, host: str, port: int, token: str) -> None:
    import uvicorn

    app = server.streamable_http_app()
    if token:
        app = _RequireToken(app, token)
        print(f"reason_mcp: http://{host}:{port}/mcp  (Authorization: Bearer {token})",
              file=sys.stderr, flush=True)
    else:
        print(f"reason_mcp: http://{host}:{port}/mcp", file=sys.stderr, flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")


class _RequireToken:
    """ASGI wrapper: HTTP requests need ``Authorization: Bearer <token>`` (else 401)."""

    def __init__(self, app: Any, token: str) -> None:
        self.app, self.expected = app, f"Bearer {token}".encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not secrets.compare_digest(given, self.expected):
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"text/plain")]})
                await send({"type": "http.response.body", "body": b"token required\n"})
                return
        await self.app(scope, receive, send)


if __name__ == "__main__":
    sys.exit(main())
