"""``console``: the operator web console, a small aiohttp server and one static page.

    console                                   # http://127.0.0.1:8080/ for /cosmos_reason
    console --node /robot1/cosmos_reason --image-topic /camera/color/image_raw
    console --host 0.0.0.0 --port 8080        # LAN: prints http://<host>:8080/?token=...

Why aiohttp and a hand-written page: aiohttp is already a dependency (the HTTP engine), so
the console adds no install size and starts in well under a second; the page is three static
files (HTML, CSS, plain JavaScript on the browser's own APIs: WebSocket, canvas, the Page
Visibility API), so there is no JavaScript toolchain, no CDN and nothing to build. A UI
toolkit (Gradio, NiceGUI) would bring a web framework, its assets and a slower start for one
page.

The server is a ROS client of the node (``ros_bridge.ConsoleBridge``: ``ReasonClient`` and the
node's topics) and never talks to the engine. Every browser gets one WebSocket:

- pictures: per camera, the newest frame at most ``--fps`` times a second, as JPEG, only while
  the page is visible (it says so through the Page Visibility API). A browser that reads
  slowly never slows the node or the other browsers: each client has one slot per camera,
  overwritten by the next frame (frames are dropped, never queued);
- its goal: the answer streaming in from the action feedback (coalesced while the browser
  is behind), then the result; cancel;
- the last ``MAX_RESULTS`` results of ``~/results`` (each with its own frame, found by the
  stamp the result names: ``frames.py``) and the node's ``/diagnostics`` status.

Input is bounded like any goal: the node validates every field (its BAD_REQUEST message
reaches the page verbatim); the console bounds only what it must hold -- the size of one
request (from the package's own limits: ``core/prompts.py`` and the node's
``limits.max_prompt_chars``), one goal per browser, ``MAX_CONSOLE_GOALS`` at once,
``MAX_CLIENTS`` browsers, ``MAX_RESULTS`` results.

Access: bound to 127.0.0.1 unless ``--host`` says otherwise; on any other address a token is
required (``--token``, ``COSMOS_REASON_CONSOLE_TOKEN``, or one generated and printed at start),
and every HTTP and WebSocket request must carry it (the ``?token=`` of the printed URL, kept
in a same-site cookie, or ``Authorization: Bearer``). WebSockets from a page of another origin
are refused either way.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import hmac
import ipaddress
import json
import logging
import math
import os
import secrets
import signal
import socket
import ssl
import struct
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from aiohttp import WSMsgType, web

from cosmos_reason_ros.client import SOURCES
from cosmos_reason_ros.core import prompts
from cosmos_reason_ros.core.plain import to_plain
from cosmos_reason_ros.core.tasks import TASKS
from cosmos_reason_ros.core.types import CosmosReasonError, ErrorCode

STATIC_DIR = Path(__file__).resolve().parent / "static"
TOKEN_ENV = "COSMOS_REASON_CONSOLE_TOKEN"
TOKEN_COOKIE = "cosmos_reason_console"
DEFAULT_HOST, DEFAULT_PORT, DEFAULT_NODE, DEFAULT_FPS = "127.0.0.1", 8080, "/cosmos_reason", 5.0
MAX_FPS = 30.0
MAX_CLIENTS = 8
MAX_CONSOLE_GOALS = 4  # goals from all browsers together (the node has its own admission)
MAX_RESULTS = 20
MAX_TEXT_CHARS = 32768  # of an answer or reasoning shown on the page
MAX_EVENTS_PER_CLIENT = 32  # answers, errors, notices not yet sent to one browser
CLOSE_WAIT_S = 3.0  # for the pages to acknowledge the close at shutdown
ANNOTATED_WAIT_S = 1.5  # an answer's frame may arrive as the node's annotated image, just after
_LOG = logging.getLogger("cosmos_reason_ros.console")


def request_bytes_bound(max_prompt_chars: int = prompts.MAX_PROMPT_CHARS) -> int:
    """Return the largest WebSocket request the console reads: a goal at the package's limits.

    Prompt, targets and a response schema at their limits, each character at JSON's worst
    escaping (6 bytes for a control character), plus the other fields.
    """
    chars = max_prompt_chars + prompts.MAX_TARGETS * prompts.MAX_TARGET_CHARS
    return 6 * chars + prompts.MAX_SCHEMA_BYTES + 4096


# --- access ---------------------------------------------------------------------------------

def is_loopback(host: str) -> bool:
    """Tell whether only this machine reaches the address (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def resolve_token(host: str, token: str | None) -> tuple[str | None, bool]:
    """Return the token every request must carry (None: none) and whether it was generated.

    Given (flag or environment): always required. Not given: none on a loopback address; on
    any other, one is generated (the printed URL carries it).
    """
    if token:
        return token, False
    if is_loopback(host):
        return None, False
    return secrets.token_urlsafe(18), True


def _presented_token(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    if header.startswith("Bearer "):
        return header[7:].strip()
    return request.query.get("token") or request.cookies.get(TOKEN_COOKIE)


def access_middleware(token: str | None) -> Callable[..., Any]:
    """Refuse requests without the token (when one is set) and cross-origin WebSockets."""
    @web.middleware
    async def check(request: web.Request, handler: Callable[..., Any]) -> web.StreamResponse:
        if token is not None:
            presented = _presented_token(request) or ""
            if not hmac.compare_digest(presented.encode(), token.encode()):
                raise web.HTTPUnauthorized(text="console: this console needs its token: open the "
                                           "URL it printed at start (.../?token=...)")
        elif not is_loopback(request.url.host or ""):
            # No token means a loopback console: a page reaching it under another host name
            # (DNS rebinding) is not the operator's.
            raise web.HTTPForbidden(text="console: only http://127.0.0.1 or localhost")
        origin = request.headers.get("Origin")
        if origin and request.headers.get("Upgrade", "").lower() == "websocket" \
                and urlsplit(origin).netloc != request.host:
            raise web.HTTPForbidden(text=f"console: WebSocket from another origin ({origin})")
        response = await handler(request)
        if token is not None and request.query.get("token"):
            response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="Strict")
        return response
    return check


# --- one browser ----------------------------------------------------------------------------

@dataclass
class GoalProgress:
    """One browser's running goal: feedback coalesced until the browser takes it."""

    handle: Any  # client.GoalHandle
    stage: str = ""
    text: str = ""  # not yet sent
    output_tokens: int = 0
    elapsed_s: float = 0.0
    dirty: bool = False


@dataclass(eq=False)  # identity: a set member
class Browser:
    """One connected page: its WebSocket and what waits to be sent to it (all bounded).

    Pictures and status are latest-only slots: a newer one replaces one not yet sent. Events
    (answers, errors) are few and small, kept in a bounded deque.
    """

    ws: web.WebSocketResponse
    visible: bool = True
    pictures: dict[str, Any] = field(default_factory=dict)  # camera -> frames.Picture
    status: dict[str, Any] | None = None
    results_changed: bool = False
    events: collections.deque[dict[str, Any]] = field(
        default_factory=lambda: collections.deque(maxlen=MAX_EVENTS_PER_CLIENT))
    goal: GoalProgress | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    frames_sent: int = 0
    frames_dropped: int = 0

    def offer_picture(self, camera: str, picture: Any) -> None:
        """Put a picture in the camera's slot; one not yet sent is dropped."""
        if camera in self.pictures:
            self.frames_dropped += 1
        self.pictures[camera] = picture
        self.wake.set()

    def send_event(self, event: dict[str, Any]) -> None:
        """Queue a small message (an answer, an error) for this browser."""
        self.events.append(event)
        self.wake.set()

    @property
    def held_bytes(self) -> int:
        """Bytes of pictures waiting for this browser (at most one per camera)."""
        return sum(len(p.jpeg) for p in self.pictures.values())


# --- results --------------------------------------------------------------------------------

@dataclass
class ResultEntry:
    """A result the page can show and re-open: its data and, per camera, its frame."""

    key: str
    data: dict[str, Any]
    pictures: dict[str, Any] = field(default_factory=dict)  # camera -> frames.Picture

    def summary(self) -> dict[str, Any]:
        """Return what the results list shows of it."""
        d = self.data
        return {"key": self.key, "origin": d["origin"], "task": d["task"], "prompt":
                d["prompt"][:200], "answer": d["answer"][:200], "error_code":
                d["error_code_name"], "status": d["status"], "stamp": d["stamp"]}


def stamp_ns(stamp: dict[str, int]) -> int:
    """``builtin_interfaces/Time`` (as a dict) -> integer nanoseconds."""
    return int(stamp["sec"]) * 1_000_000_000 + int(stamp["nanosec"])


def result_data(msg: Any, status: str) -> dict[str, Any]:
    """Convert a ``ReasoningResult`` for the page (JSON; stamps as strings: ns exceed 2^53)."""
    data = to_plain(msg)
    data.pop("raw_text", None)  # answer + reasoning again
    for name in ("answer", "reasoning"):
        if len(data[name]) > MAX_TEXT_CHARS:
            data[name] = data[name][:MAX_TEXT_CHARS] + " [...]"
    try:
        data["error_code_name"] = ErrorCode(msg.error_code).name
    except ValueError:
        data["error_code_name"] = str(msg.error_code)
    data["status"] = status
    data["stamp"] = str(stamp_ns(data["header"]["stamp"]))
    data["frame_stamps"] = [str(stamp_ns(s)) for s in data["frame_stamps"]]
    for frame in data["camera_frames"]:
        frame["stamp"] = str(stamp_ns(frame["header"]["stamp"]))
    return data


def _status_of(msg: Any) -> str:
    """Return the goal status a ``~/results`` message implies (the action's, for ours)."""
    if msg.error_code == ErrorCode.OK:
        return "succeeded"
    return "canceled" if msg.error_code == ErrorCode.CANCELLED else "aborted"


# --- the hub --------------------------------------------------------------------------------

class Console:
    """Everything on the web side: browsers, results, status, the live picture ticker.

    Runs on one asyncio loop; the ROS side reaches it only through ``call_soon_threadsafe``
    (the ``ConsoleEvents`` methods below). JPEG encoding runs on one worker thread, so the
    loop never blocks on pixels and at most one frame is encoded at a time.
    """

    def __init__(self, bridge_factory: Callable[[Console], Any], *, node: str = DEFAULT_NODE,
                 fps: float = DEFAULT_FPS, token: str | None = None) -> None:
        """``bridge_factory(self)`` builds the ROS side (``ros_bridge.ConsoleBridge``)."""
        self.node = node
        self.fps = min(max(fps, 0.1), MAX_FPS)
        self.token = token
        self.loop: asyncio.AbstractEventLoop | None = None
        self.browsers: set[Browser] = set()
        self.results: collections.OrderedDict[str, ResultEntry] = collections.OrderedDict()
        self.status: dict[str, Any] | None = None
        self.max_request_bytes = request_bytes_bound()
        self._periodic_seq = 0
        self._annotated = asyncio.Event()
        self._encoder = concurrent.futures.ThreadPoolExecutor(1, "console-jpeg")
        self._ticker: asyncio.Task[None] | None = None
        self._last_live: dict[str, tuple[int, str]] = {}
        self._bridge_factory = bridge_factory
        self.bridge: Any = None

    # --- life ---

    async def start(self) -> None:
        """Build the ROS side and start the picture ticker (on the server's loop)."""
        self.loop = asyncio.get_running_loop()
        self.bridge = self._bridge_factory(self)
        self._ticker = asyncio.create_task(self._tick())

    async def close(self) -> None:
        """Cancel running goals, close every browser, stop the ROS side (idempotent)."""
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        browsers = list(self.browsers)
        for browser in browsers:
            if browser.goal is not None:
                browser.goal.handle.cancel()
        if browsers:  # a page that stopped reading does not answer the close: bounded
            await asyncio.wait([asyncio.ensure_future(b.ws.close()) for b in browsers],
                               timeout=CLOSE_WAIT_S)
        if self.bridge is not None:
            bridge, self.bridge = self.bridge, None
            await asyncio.get_running_loop().run_in_executor(None, bridge.close)
        self._encoder.shutdown(wait=True)

    # --- ConsoleEvents: called on the ROS thread ---

    def _from_ros(self, callback: Callable[..., Any], *args: Any) -> None:
        loop = self.loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(callback, *args)
            except RuntimeError:  # the loop closed meanwhile: shutting down
                pass

    def on_result(self, msg: Any) -> None:
        """Take a ``~/results`` message (ROS thread)."""
        self._from_ros(self._add_result, msg, _status_of(msg), None)

    def on_status(self, status: dict[str, Any]) -> None:
        """Take the node's ``/diagnostics`` status (ROS thread)."""
        self._from_ros(self._set_status, status)

    def on_node_parameters(self, cameras: list[str], max_prompt_chars: int | None) -> None:
        """Take the node's cameras and prompt limit (ROS thread)."""
        self._from_ros(self._set_node_parameters, cameras, max_prompt_chars)

    def on_annotated(self, camera: str) -> None:
        """Wake answers waiting for an annotated image (ROS thread)."""
        self._from_ros(self._annotated.set)

    # --- state changes, on the loop ---

    def _set_status(self, status: dict[str, Any]) -> None:
        self.status = status
        for browser in self.browsers:
            browser.status = status
            browser.wake.set()

    def _set_node_parameters(self, cameras: list[str], max_prompt_chars: int | None) -> None:
        if max_prompt_chars:
            self.max_request_bytes = request_bytes_bound(max_prompt_chars)
        for browser in self.browsers:
            browser.pictures.clear()
            browser.send_event(self.hello())

    def hello(self) -> dict[str, Any]:
        """Return what a page builds itself from: panes, tasks (the package's table), limits."""
        tasks = [{"name": spec.name.value, "needs_prompt": spec.needs_prompt,
                  "prompt_means": spec.prompt_means, "needs_targets": spec.needs_targets,
                  "needs_video": spec.needs_video, "answer": spec.answer.value}
                 for spec in TASKS.values()]
        return {"type": "hello", "node": self.node, "fps": self.fps,
                "cameras": self.bridge.camera_names() if self.bridge else [],
                "tasks": tasks, "sources": list(SOURCES),
                "max_targets": prompts.MAX_TARGETS, "max_request_bytes": self.max_request_bytes,
                "results": [e.summary() for e in reversed(self.results.values())]}

    def _add_result(self, msg: Any, status: str, browser: Browser | None) -> None:
        """Store a result (once per goal: the action's and ``~/results``' copies are one)."""
        key = msg.goal_id
        if not key:
            self._periodic_seq += 1
            key = f"{msg.origin or 'result'}-{self._periodic_seq}"
        entry = self.results.get(key)
        if entry is None:
            entry = ResultEntry(key, result_data(msg, status))
            self.results[key] = entry
            while len(self.results) > MAX_RESULTS:
                self.results.popitem(last=False)
            asyncio.ensure_future(self._attach_pictures(entry, browser))
        elif browser is not None:
            entry.data["status"] = status  # the action's status is the authoritative one
            asyncio.ensure_future(self._attach_pictures(entry, browser))

    async def _attach_pictures(self, entry: ResultEntry, browser: Browser | None) -> None:
        """Find each camera frame the result names (waiting briefly for the annotated one)."""
        deadline = time.monotonic() + ANNOTATED_WAIT_S
        for frame in entry.data["camera_frames"]:
            camera, stamp = frame["camera"], int(frame["stamp"])
            while camera not in entry.pictures:
                frames = self.bridge.camera(camera) if self.bridge else None
                found = frames.at_stamp(stamp) if frames is not None else None
                if found is not None:
                    picture = await self._encode(*found)
                    if picture is not None:
                        entry.pictures[camera] = picture
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._annotated.clear()
                try:
                    await asyncio.wait_for(self._annotated.wait(), remaining)
                except asyncio.TimeoutError:
                    pass
        entry.data["frames"] = {c: {"source": p.source} for c, p in entry.pictures.items()}
        if browser is not None:
            browser.send_event({"type": "answer", "result": entry.data, "key": entry.key})
        for b in self.browsers:
            b.results_changed = True
            b.wake.set()

    async def _encode(self, frame: Any, source: str) -> Any:
        from cosmos_reason_ros.console.frames import picture

        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._encoder, picture, frame, source)
        except CosmosReasonError as e:
            _LOG.warning("console: frame not shown: %s", e.message)
            return None

    # --- live pictures ---

    async def _tick(self) -> None:
        """At most ``fps`` times a second: encode each camera's newest frame for the watchers."""
        period = 1.0 / self.fps
        next_tick = time.monotonic()
        while True:
            watching = [b for b in self.browsers if b.visible]
            if watching and self.bridge is not None:
                for camera in self.bridge.camera_names():
                    frames = self.bridge.camera(camera)
                    live = frames.live() if frames is not None else None
                    if live is None or self._last_live.get(camera) == (live[0].seq, live[1]):
                        continue
                    self._last_live[camera] = (live[0].seq, live[1])
                    picture = await self._encode(*live)
                    if picture is None:
                        continue
                    for browser in self.browsers:
                        if browser.visible:
                            browser.offer_picture(camera, picture)
            else:
                self._last_live.clear()  # a browser that comes back gets the current frame
            # On a fixed schedule (late wake-ups do not add up), never catching up in a burst.
            now = time.monotonic()
            next_tick = max(next_tick + period, now)
            await asyncio.sleep(next_tick - now)

    # --- a browser's requests ---

    def ask(self, browser: Browser, request: dict[str, Any]) -> None:
        """Send the browser's goal to the node (the node validates; refusals come back)."""
        if browser.goal is not None:
            raise ConsoleRequestError("a goal from this page is still running: cancel it or "
                                      "wait for its answer")
        running = sum(1 for b in self.browsers if b.goal is not None)
        if running >= MAX_CONSOLE_GOALS:
            raise ConsoleRequestError(f"{running} goals from the console are running (at most "
                                      f"{MAX_CONSOLE_GOALS}); wait for one to end")
        goal = build_goal(request)
        loop = asyncio.get_running_loop()

        def on_feedback(fb: Any) -> None:  # ReasonClient's thread
            values = (fb.stage, fb.text_delta, int(fb.output_tokens), float(fb.elapsed_s))
            loop.call_soon_threadsafe(self._feedback, browser, progress, values)

        progress = GoalProgress(handle=None)
        browser.goal = progress
        progress.handle = self.bridge.submit(goal, on_feedback)
        progress.handle.future.add_done_callback(
            lambda future: loop.call_soon_threadsafe(self._goal_done, browser, progress, future))
        browser.send_event({"type": "accepted"})

    def _feedback(self, browser: Browser, progress: GoalProgress,
                  values: tuple[str, str, int, float]) -> None:
        if browser.goal is not progress:
            return
        stage, delta, tokens, elapsed = values
        progress.stage, progress.output_tokens, progress.elapsed_s = stage, tokens, elapsed
        if len(progress.text) < MAX_TEXT_CHARS:  # the result carries the whole answer
            progress.text += delta
        progress.dirty = True
        browser.wake.set()

    def _goal_done(self, browser: Browser, progress: GoalProgress,
                   future: concurrent.futures.Future[Any]) -> None:
        if browser.goal is progress:
            browser.goal = None
        try:
            result = future.result()
        except Exception as e:  # noqa: BLE001 - any failure of the goal is shown on the page
            browser.send_event({"type": "error", "message": str(e)})
            return
        if browser not in self.browsers:
            return
        self._add_result(result.message, result.status, browser)

    def cancel(self, browser: Browser) -> None:
        """Cancel the browser's running goal (its result then says canceled)."""
        if browser.goal is not None and browser.goal.handle is not None:
            browser.goal.handle.cancel()


class ConsoleRequestError(Exception):
    """A browser request the console cannot pass on (shown on the page as it is)."""


def build_goal(request: dict[str, Any]) -> Any:
    """Build a ``Reason.Goal`` from the page's form; the node validates the values.

    Only the JSON types are checked here: a goal field of the wrong type cannot even be built.
    """
    from cosmos_reason_ros.client import ReasonClient

    def text(name: str) -> str:
        value = request.get(name, "")
        if not isinstance(value, str):
            raise ConsoleRequestError(f"{name} must be text, got {type(value).__name__}")
        return value

    def strings(name: str) -> list[str]:
        value = request.get(name, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConsoleRequestError(f"{name} must be a list of text")
        return value

    def number(name: str, kind: type) -> Any:
        value = request.get(name, 0)
        # json.loads takes Infinity and NaN: no goal field holds them (int(inf) overflows).
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or (kind is int and int(value) != value):
            raise ConsoleRequestError(f"{name} must be a{'n integer' if kind is int else ' number'}"
                                      f", got {value!r}")
        if kind is int and not -2**31 <= value < 2**31:
            raise ConsoleRequestError(f"{name}={value} is out of range")
        return kind(value)

    source = text("source") or "latest"
    if source not in SOURCES:
        raise ConsoleRequestError(f"source {source!r}: one of {', '.join(SOURCES)}")
    return ReasonClient.goal(
        text("prompt"), text("task"), strings("targets"), strings("cameras"),
        reasoning=bool(request.get("reasoning", False)), source=SOURCES[source],
        response_schema=text("response_schema"), max_tokens=number("max_tokens", int),
        greedy=bool(request.get("greedy", False)),
        clip_duration_s=number("clip_duration_s", float))


# --- HTTP and WebSocket ---------------------------------------------------------------------

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob:; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def build_app(console: Console) -> web.Application:
    """Build the web application: the page, its static files, results' frames, the WebSocket."""
    app = web.Application(middlewares=[access_middleware(console.token)])

    async def index(request: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC_DIR / "index.html",
                                headers={"Content-Security-Policy": CSP,
                                         "Cache-Control": "no-store"})

    async def result_frame(request: web.Request) -> web.StreamResponse:
        entry = console.results.get(request.match_info["key"])
        picture = entry.pictures.get(request.match_info["camera"]) if entry else None
        if picture is None:
            raise web.HTTPNotFound(text="console: that frame is no longer held")
        return web.Response(body=picture.jpeg, content_type="image/jpeg",
                            headers={"Cache-Control": "private, max-age=3600"})

    async def result_json(request: web.Request) -> web.StreamResponse:
        entry = console.results.get(request.match_info["key"])
        if entry is None:
            raise web.HTTPNotFound(text="console: that result is no longer held")
        return web.json_response(entry.data)

    app.router.add_get("/", index)
    async def browser_socket(request: web.Request) -> web.StreamResponse:
        return await websocket(console, request)

    app.router.add_get("/ws", browser_socket)
    app.router.add_get("/result/{key}", result_json)
    app.router.add_get("/frame/{key}/{camera}", result_frame)
    app.router.add_static("/static", STATIC_DIR, follow_symlinks=False)

    async def on_startup(app: web.Application) -> None:
        await console.start()

    async def on_shutdown(app: web.Application) -> None:
        await console.close()

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)
    return app


async def websocket(console: Console, request: web.Request) -> web.StreamResponse:
    """One browser: requests in, pictures/progress/events out (its own sender task)."""
    if len(console.browsers) >= MAX_CLIENTS:
        raise web.HTTPServiceUnavailable(text=f"console: {MAX_CLIENTS} pages are open already")
    ws = web.WebSocketResponse(max_msg_size=console.max_request_bytes, heartbeat=20.0)
    await ws.prepare(request)
    browser = Browser(ws)
    console.browsers.add(browser)
    browser.send_event(console.hello())
    if console.status is not None:
        browser.status = console.status
    sender = asyncio.create_task(_send_loop(console, browser))
    try:
        async for message in ws:
            if message.type is not WSMsgType.TEXT:
                if message.type is WSMsgType.ERROR:
                    break
                continue
            try:
                request_data = json.loads(message.data)
                if not isinstance(request_data, dict):
                    raise ConsoleRequestError("a request is a JSON object")
                _handle(console, browser, request_data)
            except (ConsoleRequestError, ValueError, TypeError, AssertionError) as e:
                browser.send_event({"type": "error", "message": str(e) or type(e).__name__})
    finally:
        console.browsers.discard(browser)
        if browser.goal is not None and browser.goal.handle is not None:
            browser.goal.handle.cancel()  # nobody is left to read its answer
        sender.cancel()
    return ws


def _handle(console: Console, browser: Browser, request: dict[str, Any]) -> None:
    kind = request.get("type")
    if kind == "visibility":
        browser.visible = bool(request.get("visible"))
        if not browser.visible:
            browser.pictures.clear()
        browser.wake.set()
    elif kind == "ask":
        console.ask(browser, request)
    elif kind == "cancel":
        console.cancel(browser)
    else:
        raise ConsoleRequestError(f"unknown request type {kind!r}")


def picture_message(camera: str, picture: Any) -> bytes:
    """Pack a picture as a binary WebSocket message: header length (4 bytes), JSON, JPEG."""
    header = json.dumps({"camera": camera, "stamp": str(picture.stamp_ns),
                         "source": picture.source}).encode()
    return struct.pack(">I", len(header)) + header + picture.jpeg


async def _send_loop(console: Console, browser: Browser) -> None:
    """Send what waits for one browser; each send waits for that browser's socket only."""
    ws = browser.ws
    try:
        while not ws.closed:
            await browser.wake.wait()
            browser.wake.clear()
            while browser.events:
                await ws.send_str(json.dumps(browser.events.popleft()))
            progress = browser.goal
            if progress is not None and progress.dirty:
                progress.dirty = False
                text, progress.text = progress.text, ""
                await ws.send_str(json.dumps({
                    "type": "progress", "stage": progress.stage, "text": text,
                    "output_tokens": progress.output_tokens, "elapsed_s": progress.elapsed_s}))
            if browser.status is not None:
                status, browser.status = browser.status, None
                await ws.send_str(json.dumps({"type": "status", **status}))
            if browser.results_changed:
                browser.results_changed = False
                await ws.send_str(json.dumps({"type": "results", "results": [
                    e.summary() for e in reversed(console.results.values())]}))
            for camera in list(browser.pictures):
                picture = browser.pictures.pop(camera, None)
                if picture is not None and browser.visible:
                    await ws.send_bytes(picture_message(camera, picture))
                    browser.frames_sent += 1
    except (ConnectionResetError, RuntimeError):
        pass  # the browser went away; the handler cleans up


# --- command line ---------------------------------------------------------------------------

def parse_cameras(text: str) -> list[tuple[str, str]]:
    """``front,wrist`` or ``front=/front/image_raw,wrist=/wrist/image_raw`` -> (name, topic)."""
    cameras = []
    for entry in (e.strip() for e in text.split(",")):
        name, _, topic = (part.strip() for part in entry.partition("="))
        if not name:
            raise argparse.ArgumentTypeError(
                f"--cameras {text!r}: an empty name; give NAME or NAME=TOPIC entries separated "
                f"by commas, e.g. front,wrist")
        cameras.append((name, topic))
    return cameras


def build_parser() -> argparse.ArgumentParser:
    """Build the command-line parser."""
    ap = argparse.ArgumentParser(prog="console", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default=DEFAULT_HOST,
                    help="address to listen on (default 127.0.0.1; any other needs a token)")
    ap.add_argument("--port", type=int, default=DEFAULT_PORT, help="port (default 8080; 0: any)")
    ap.add_argument("--node", default=DEFAULT_NODE,
                    help="the node's full name: its action is <node>/reason, its results "
                    "<node>/results (default /cosmos_reason)")
    ap.add_argument("--image-topic", default="",
                    help="camera stream for the default camera (sensor_msgs/Image, or a "
                    "CompressedImage topic ending in /compressed); default: the node's own "
                    "'image' (<namespace>/image)")
    ap.add_argument("--cameras", type=parse_cameras, default=[],
                    help="panes: the node's camera names, each optionally =TOPIC "
                    "(front=/front/image_raw,wrist=/wrist/image_raw); default: the node's "
                    "cameras.names, read from its parameters")
    ap.add_argument("--camera-reliability", default="auto",
                    choices=("auto", "best_effort", "reliable"),
                    help="QoS reliability of the camera subscriptions (default auto: as the "
                    "node's own, image.qos_reliability)")
    ap.add_argument("--fps", type=float, default=DEFAULT_FPS,
                    help=f"most pictures per second per camera sent to a page (default "
                    f"{DEFAULT_FPS:g}, at most {MAX_FPS:g})")
    ap.add_argument("--token", default=os.environ.get(TOKEN_ENV, ""),
                    help=f"token every request must carry (default ${TOKEN_ENV}; required, and "
                    "generated when not given, on a non-loopback --host)")
    ap.add_argument("--tls-cert", type=Path, metavar="FILE",
                    help="serve HTTPS with this certificate chain (PEM; with --tls-key): the "
                    "token and the pictures are then encrypted on the network")
    ap.add_argument("--tls-key", type=Path, metavar="FILE",
                    help="the certificate's private key (PEM; with --tls-cert)")
    return ap


def tls_context(cert: Path | None, key: Path | None) -> ssl.SSLContext | None:
    """Return the server's TLS context for ``--tls-cert``/``--tls-key`` (None: plain HTTP).

    Raises ``ValueError`` naming the option and the file when they cannot be used.
    """
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise ValueError("--tls-cert and --tls-key go together: give both, or neither for "
                         "plain HTTP")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"--tls-cert {cert} / --tls-key {key}: cannot be used: {e}") from None
    return context


def reachable_host(host: str) -> str:
    """Return a name for ``host`` that a browser elsewhere can use in the printed URL.

    A wildcard (0.0.0.0, ::) is no address to browse to: it is replaced by this machine's
    address on its default route (found without sending anything), else its host name.
    """
    if host not in ("0.0.0.0", "::", ""):
        return f"[{host}]" if ":" in host else host
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # UDP: chooses the route, sends nothing
            return probe.getsockname()[0]
    except OSError:
        return socket.gethostname()


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the console until SIGINT or SIGTERM."""
    argv = list(sys.argv if argv is None else [sys.argv[0], *argv])
    ros_args: list[str] = []
    if "--ros-args" in argv:  # started by ros2 run / launch_ros
        from rclpy.utilities import remove_ros_args

        ros_args, argv = argv, remove_ros_args(args=argv)
    args = build_parser().parse_args(argv[1:])
    if not 0 <= args.port <= 65535:
        print(f"console: --port {args.port}: 0..65535", file=sys.stderr)
        return 2
    if not args.fps > 0:
        print(f"console: --fps {args.fps:g}: must be > 0", file=sys.stderr)
        return 2
    try:
        args.tls = tls_context(args.tls_cert, args.tls_key)
    except ValueError as e:
        print(f"console: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    token, generated = resolve_token(args.host, args.token or None)
    return asyncio.run(_serve(args, token, generated, ros_args))


async def _serve(args: argparse.Namespace, token: str | None, generated: bool,
                 ros_args: list[str]) -> int:
    from cosmos_reason_ros.console.ros_bridge import ConsoleBridge

    console = Console(lambda events: ConsoleBridge(
        args.node, events, cameras=args.cameras, image_topic=args.image_topic,
        camera_reliability=args.camera_reliability, ros_args=ros_args or None),
        node=args.node, fps=args.fps, token=token)
    runner = web.AppRunner(build_app(console), handle_signals=False, access_log=None)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        site = web.TCPSite(runner, args.host, args.port, ssl_context=args.tls)
        await site.start()
    except OSError as e:
        print(f"console: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        await runner.cleanup()
        return 1
    port = runner.addresses[0][1]
    scheme = "https" if args.tls else "http"
    url = f"{scheme}://{reachable_host(args.host)}:{port}/" + (f"?token={token}" if token else "")
    note = " (token generated: pass --token or $" + TOKEN_ENV + " to fix it)" if generated else ""
    print(f"console: serving {url} for {args.node}{note}", flush=True)
    await stop.wait()
    print("console: stopping", flush=True)
    await runner.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
