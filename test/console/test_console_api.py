"""The console's HTTP/WebSocket API against the real node in this process (scripted engine).

Fast tier: the node is the real ``ReasonNode`` on the scripted engine (``test/inprocess_node.py``)
serving the real names; the console is the real server (``console/server.py``) with its real
ROS side (``ConsoleBridge``: ``ReasonClient`` and subscriptions on a context of its own), run
under aiohttp's test server. What only these tests prove: the token rule, the node's
BAD_REQUEST message reaching the page verbatim, answers drawn on their own frame (found by the
result's stamp), cancel, and that a browser which never reads costs one dropped frame slot,
never a queue, and never slows another browser. The page itself runs in a real browser in
``test_console_browser.py``.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
from aiohttp import WSMsgType  # noqa: E402
from aiohttp.test_utils import TestClient  # noqa: E402
from console_client import WAIT_S, console_session, next_json, next_picture  # noqa: E402
from console_process import ConsoleProcess  # noqa: E402
from fake_engine import Script, answers_the_task, request_text  # noqa: E402
from inprocess_node import InProcessNode, image_msg  # noqa: E402
from waiting import NEVER_S, async_wait_until  # noqa: E402

from cosmos_reason_ros.console import server  # noqa: E402
from cosmos_reason_ros.core import prompts  # noqa: E402
from cosmos_reason_ros.core.imaging import compressed_to_rgb  # noqa: E402
from cosmos_reason_ros.core.types import BadRequestError, Task  # noqa: E402

pytestmark = [pytest.mark.ros]

ENDLESS = "keep talking"  # a prompt the scripted engine answers until cancelled


def script(request: Any) -> Script:
    if ENDLESS in request_text(request):
        return Script(deltas=["more "], delay_s=0.02, endless=True)
    return answers_the_task(request)


@pytest.fixture(scope="module")
def node():
    n = InProcessNode({"image.max_age_s": 0.0}, script=script)
    yield n
    n.close()


class Camera:
    """Publishes frames to the node's /image from a thread while a test needs a stream."""

    def __init__(self, node: InProcessNode, width: int = 64, height: int = 48,
                 hz: float = 20.0, noisy: bool = False) -> None:
        self.node, self.width, self.height, self.period = node, width, height, 1.0 / hz
        self.noisy = noisy
        self.stamps: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        rng = np.random.default_rng(0)
        while not self._stop.is_set():
            stamp = self.node.side.now_ns()
            msg = image_msg(stamp, self.width, self.height, value=len(self.stamps) % 200)
            if self.noisy:  # incompressible: big JPEGs fill a socket quickly
                msg.data = rng.integers(0, 255, self.width * self.height * 3,
                                        dtype=np.uint8).tobytes()
            self.node.camera.publish(msg)
            self.stamps.append(stamp)
            self._stop.wait(self.period)

    def __enter__(self) -> Camera:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(NEVER_S)


async def with_console(test: Callable[[server.Console, TestClient], Awaitable[None]],
                       token: str | None = None, fps: float = 10.0) -> None:
    """Run ``test`` against a console (real ROS side) under aiohttp's test server."""
    async with console_session(token, fps) as (console, client):
        await test(console, client)


def run(test: Callable[..., Awaitable[None]], **kwargs: Any) -> None:
    asyncio.run(with_console(test, **kwargs))


async def wait_until(condition: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    """Yield to the console's loop until ``condition()`` holds."""
    await async_wait_until(condition, timeout_s, "condition")


def node_message(task: str, prompt: str = "", targets: tuple[str, ...] = ()) -> str:
    """The node's own BAD_REQUEST wording for these goal fields (the package's validator)."""
    with pytest.raises(BadRequestError) as error:
        prompts.validate_goal_text(task, prompt, targets)
    return error.value.message


# --- access -------------------------------------------------------------------------------

def test_token_is_required_off_loopback_and_generated_when_not_given() -> None:
    assert server.resolve_token("127.0.0.1", None) == (None, False)
    assert server.resolve_token("localhost", None) == (None, False)
    assert server.resolve_token("::1", None) == (None, False)
    token, generated = server.resolve_token("0.0.0.0", None)
    assert generated and token and len(token) >= 20
    assert server.resolve_token("192.168.1.20", "")[1] is True
    assert server.resolve_token("192.168.1.20", "mine") == ("mine", False)
    assert server.resolve_token("127.0.0.1", "mine") == ("mine", False)  # given: always needed


def test_every_request_needs_the_token_when_one_is_set(node) -> None:
    async def test(console: server.Console, client: TestClient) -> None:
        for path in ("/", "/static/console.js", "/result/x", "/frame/x/default"):
            response = await client.get(path)
            assert response.status == 401, path
            assert "token" in await response.text()
        response = await client.get("/", headers={"Authorization": "Bearer wrong"})
        assert response.status == 401
        response = await client.get("/ws")
        assert response.status == 401
        # The printed URL's ?token= opens the page and leaves a same-site cookie for the rest.
        response = await client.get("/?token=s3cret")
        assert response.status == 200
        assert "s3cret" in response.headers["Set-Cookie"]
        assert "SameSite=Strict" in response.headers["Set-Cookie"]
        assert (await client.get("/static/console.js")).status == 200
        ws = await client.ws_connect("/ws")
        assert (await next_json(ws, "hello"))["node"] == "/cosmos_reason"
        await ws.close()
        client.session.cookie_jar.clear()
        response = await client.get("/static/console.css",
                                    headers={"Authorization": "Bearer s3cret"})
        assert response.status == 200

    run(test, token="s3cret")


def test_websocket_from_another_origin_is_refused(node) -> None:
    async def test(console: server.Console, client: TestClient) -> None:
        response = await client.get("/ws", headers={
            "Origin": "http://evil.example", "Connection": "Upgrade", "Upgrade": "websocket",
            "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="})
        assert response.status == 403

    run(test)


# --- the page -----------------------------------------------------------------------------

def test_page_is_offline_and_hello_lists_the_package_tasks(node) -> None:
    async def test(console: server.Console, client: TestClient) -> None:
        response = await client.get("/")
        assert response.status == 200
        assert "default-src 'none'" in response.headers["Content-Security-Policy"]
        html = await response.text()
        for path in ("static/console.js", "static/console.css"):
            assert path in html
            asset = await client.get("/" + path)
            assert asset.status == 200
            assert "http://" not in await asset.text() and "https://" not in await asset.text()
        assert "http://" not in html and "https://" not in html
        ws = await client.ws_connect("/ws")
        hello = await next_json(ws, "hello")
        assert [t["name"] for t in hello["tasks"]] == [t.value for t in Task]
        assert hello["sources"] == ["latest", "next", "clip"]
        assert hello["cameras"] == ["default"]
        assert hello["max_request_bytes"] == server.request_bytes_bound()
        status = await next_json(ws, "status")  # the node's /diagnostics
        assert status["values"]["engine_state"] == "ready"
        await ws.close()

    run(test)


def test_answer_streams_and_is_drawn_on_its_own_frame(node) -> None:
    async def test(console: server.Console, client: TestClient) -> None:
        ws = await client.ws_connect("/ws")
        await next_json(ws, "hello")
        with Camera(node) as camera:
            header, jpeg = await next_picture(ws)
            assert header["camera"] == "default" and header["source"] == "camera"
            assert int(header["stamp"]) in camera.stamps
            assert compressed_to_rgb("jpeg", jpeg).shape == (48, 64, 3)
            await ws.send_json({"type": "ask", "task": "ground", "targets": ["red cup"]})
            await next_json(ws, "accepted")
            progress = await next_json(ws, "progress")
            assert progress["stage"]
            answer = await next_json(ws, "answer")
        result = answer["result"]
        assert result["status"] == "succeeded" and result["error_code_name"] == "OK"
        (box,) = result["boxes"]
        # The scripted answer's 0-1000 box in pixels of the 64x48 frame.
        assert (box["x_min"], box["y_min"], box["x_max"], box["y_max"]) == pytest.approx(
            (6.4, 7.2, 25.6, 33.6), abs=0.01)
        (frame,) = result["camera_frames"]
        assert int(frame["stamp"]) in camera.stamps  # the frame the node used...
        assert result["frames"] == {"default": {"source": "camera"}}
        response = await client.get(f"/frame/{answer['key']}/default")  # ...is the one served
        assert response.status == 200
        assert compressed_to_rgb("jpeg", await response.read()).shape == (48, 64, 3)
        stored = await (await client.get(f"/result/{answer['key']}")).json()
        assert stored["boxes"] == result["boxes"]
        # The results list (every ~/results message) names it, for re-opening.
        results = await next_json(ws, "results")
        assert answer["key"] in [r["key"] for r in results["results"]]
        await ws.close()

    run(test)


def test_hidden_page_gets_no_pictures(node) -> None:
    async def test(console: server.Console, client: TestClient) -> None:
        ws = await client.ws_connect("/ws")
        await next_json(ws, "hello")
        (browser,) = console.browsers
        frames = console.bridge.camera("default").stream
        with Camera(node):
            await next_picture(ws)
            await ws.send_json({"type": "visibility", "visible": False})
            await wait_until(lambda: not browser.visible)
            sent = browser.frames_sent
            received = frames.stats().received
            # Ten new camera frames reach the console (a second of its ticks at 10 fps)...
            await wait_until(lambda: frames.stats().received >= received + 10)
            # ...and none goes to the hidden page (one send may have been under way).
            assert browser.frames_sent <= sent + 1 and not browser.pictures
            await ws.send_json({"type": "visibility", "visible": True})
            await next_picture(ws)
        await ws.close()

    run(test)


# --- goals: bad input, cancel -------------------------------------------------------------

def test_bad_input_comes_back_with_the_nodes_message(node) -> None:
    async def test(console: server.Console, client: TestClient) -> None:
        node.publish()
        ws = await client.ws_connect("/ws")
        await next_json(ws, "hello")
        too_many = tuple(f"thing {i}" for i in range(prompts.MAX_TARGETS + 1))
        for request, expected in (
                ({"task": "vqa", "prompt": ""}, node_message("vqa")),
                ({"task": "ground", "targets": list(too_many)},
                 node_message("ground", "", too_many))):
            await ws.send_json({"type": "ask", **request})
            answer = await next_json(ws, "answer")
            result = answer["result"]
            assert result["status"] == "aborted"
            assert result["error_code_name"] == "BAD_REQUEST"
            assert result["error_message"] == expected  # verbatim
        # A field the goal cannot even hold is refused by the console, naming it.
        await ws.send_json({"type": "ask", "task": "ground", "targets": "red cup"})
        assert "targets must be a list of text" in (await next_json(ws, "error"))["message"]
        await ws.send_json({"type": "ask", "max_tokens": 1.5})
        assert "max_tokens must be an integer" in (await next_json(ws, "error"))["message"]
        for literal in ("Infinity", "-Infinity", "NaN"):  # JSON as Python and browsers write it
            await ws.send_str(f'{{"type": "ask", "max_tokens": {literal}}}')
            assert f"max_tokens must be an integer, got {float(literal)!r}" in (
                await next_json(ws, "error"))["message"]
        await ws.send_str('{"type": "ask", "clip_duration_s": Infinity}')
        assert "clip_duration_s must be a number" in (await next_json(ws, "error"))["message"]
        # A request beyond any goal's size closes the socket (message too big), nothing held.
        await ws.send_str(json.dumps({"type": "ask", "prompt": "x" * (
            console.max_request_bytes + 1)}))
        message = await ws.receive(timeout=WAIT_S)
        while message.type in (WSMsgType.TEXT, WSMsgType.BINARY):
            message = await ws.receive(timeout=WAIT_S)
        assert message.type in (WSMsgType.CLOSE, WSMsgType.CLOSED, WSMsgType.CLOSING)
        assert ws.close_code == 1009  # "message too big"

    run(test)


def test_cancel_from_the_page_ends_the_goal_canceled(node) -> None:
    async def test(console: server.Console, client: TestClient) -> None:
        node.publish()
        ws = await client.ws_connect("/ws")
        await next_json(ws, "hello")
        await ws.send_json({"type": "ask", "task": "vqa", "prompt": ENDLESS})
        await next_json(ws, "accepted")
        await ws.send_json({"type": "ask", "task": "vqa", "prompt": "and another"})
        assert "still running" in (await next_json(ws, "error"))["message"]
        progress = await next_json(ws, "progress")
        while "more" not in progress["text"]:
            progress = await next_json(ws, "progress")
        await ws.send_json({"type": "cancel"})
        result = (await next_json(ws, "answer"))["result"]
        assert result["status"] == "canceled" and result["error_code_name"] == "CANCELLED"
        assert "more" in result["answer"]
        await ws.close()

    run(test)


# --- a slow browser -----------------------------------------------------------------------

def test_browser_that_never_reads_drops_frames_and_does_not_slow_another(node) -> None:
    async def test(console: server.Console, client: TestClient) -> None:
        # The stuck browser: its WebSocket is open but nothing reads it, so once the socket
        # buffers are full every send to it waits.
        stuck_ws = await client.ws_connect("/ws")
        stuck = next(iter(console.browsers))
        reader = await client.ws_connect("/ws")
        await next_json(reader, "hello")
        with Camera(node, 640, 480, hz=30.0, noisy=True):
            deadline = time.monotonic() + WAIT_S
            # Wait until the stuck browser's socket is full: pictures pile up in its slot.
            while stuck.frames_dropped < 10:
                assert time.monotonic() < deadline, "the stuck browser never filled up"
                await next_picture(reader)
            sent, dropped = stuck.frames_sent, stuck.frames_dropped
            received = 0
            newest = 0
            for _ in range(15):  # half a second of pictures at 30 fps, to the reader alone
                header, _ = await next_picture(reader)
                assert int(header["stamp"]) > newest  # each newer than the last: live
                newest = int(header["stamp"])
                received += 1
                # Never more than one picture per camera is held for the stuck browser.
                assert len(stuck.pictures) <= 1
                assert stuck.held_bytes <= 640 * 480 * 3
            assert stuck.frames_sent <= sent + 1  # at most the one send it was waiting in
            assert stuck.frames_dropped > dropped
        await stuck_ws.close()
        await reader.close()

    run(test, fps=30.0)


# --- the process ----------------------------------------------------------------------------

@pytest.mark.slow  # starts processes or waits on real time: the real tier
def test_console_process_stops_cleanly_on_sigint() -> None:
    # No node needed: the console starts, waits for one, and a Ctrl-C ends it in order.
    console = ConsoleProcess("--node", "/no_such_node")
    try:
        assert console.url.startswith("http://127.0.0.1:") and "token" not in console.url
        assert console.stop(signal.SIGINT) == 0, "\n".join(console.lines[-30:])
        assert not console.tree.survivors_after(5.0)
        assert any("console: stopping" in line for line in console.lines)
    finally:
        console.tree.close()


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, as PEM files (what an operator would make)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "robot console")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = tmp_path / "console.crt", tmp_path / "console.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


def test_tls_options_go_together_and_name_a_bad_file(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    assert server.tls_context(None, None) is None
    assert server.tls_context(cert, key) is not None
    with pytest.raises(ValueError, match="--tls-cert and --tls-key go together"):
        server.tls_context(cert, None)
    with pytest.raises(ValueError, match=f"--tls-cert {key} / --tls-key {cert}: cannot be used"):
        server.tls_context(key, cert)


def test_a_wildcard_host_is_printed_as_an_address_a_browser_can_use() -> None:
    assert server.reachable_host("127.0.0.1") == "127.0.0.1"
    assert server.reachable_host("::1") == "[::1]"
    assert server.reachable_host("0.0.0.0") not in ("0.0.0.0", "")


@pytest.mark.slow  # starts processes or waits on real time: the real tier
def test_console_with_tls_serves_the_page_over_https_only(tmp_path: Path) -> None:
    import ssl
    import urllib.error
    import urllib.request

    cert, key = self_signed(tmp_path)
    console = ConsoleProcess("--node", "/no_such_node", "--tls-cert", str(cert),
                             "--tls-key", str(key))
    try:
        assert console.url.startswith("https://127.0.0.1:")
        trusted = ssl.create_default_context(cafile=str(cert))
        with urllib.request.urlopen(console.url, context=trusted, timeout=WAIT_S) as page:
            assert page.status == 200 and b"console.js" in page.read()
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            urllib.request.urlopen(console.url.replace("https://", "http://"), timeout=WAIT_S)
    finally:
        assert console.stop() == 0
        console.tree.close()


@pytest.mark.slow  # starts processes or waits on real time: the real tier
def test_console_off_loopback_prints_a_generated_token() -> None:
    console = ConsoleProcess("--host", "0.0.0.0", "--node", "/no_such_node")
    try:
        assert "?token=" in console.url
        assert any("token generated" in line for line in console.lines)
    finally:
        assert console.stop() == 0
        console.tree.close()
