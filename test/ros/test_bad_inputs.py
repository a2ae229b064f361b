"""Bad-input catalogue and live fuzz through ONE real node (in-process, scripted engine).

Each catalogue case sends a bad goal (or publishes a bad camera frame, then asks for it),
asserts the goal's status, error code and a specific message fragment, and then checks that the
node still answers a normal goal. ``CATALOGUE`` is the table docs/RELIABILITY.md lists; cases run
in table order (the "no frame yet" cases come first, before anything is published).
The live fuzz sends seeded random goals (valid and invalid fields, random images) and checks
that every goal ends with a result whose code is one of the known ones.

Fast tier: every check here is the node's (goal fields, image decoding, schemas, limits), made
before or around the engine, so the node is the real ``ReasonNode`` in this process on the
scripted engine (``test/inprocess_node.py``), with cpu_demo's limits; goals travel over DDS from
the package's ``ReasonClient``. The one bad input only the real model's tokenizer can detect
(a prompt longer than the model's context, PROMPT_TOO_LONG) is in test_node.py.
"""

from __future__ import annotations

import errno
import io as iolib
import json
import math
import os
import random
import socket
import struct
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
from fake_engine import answers_the_task  # noqa: E402
from inprocess_node import InProcessNode  # noqa: E402
from node_process import NodeProcess, rgb_image_msg, scene  # noqa: E402
from PIL import Image as PILImage  # noqa: E402
from rclpy.serialization import serialize_message  # noqa: E402
from sensor_msgs.msg import CompressedImage, Image  # noqa: E402
from waiting import DISCOVERY_S, NEVER_S, wait_until  # noqa: E402

from cosmos_reason_interfaces.action import Reason  # noqa: E402
from cosmos_reason_ros.client import ReasonClient, ReasonResult  # noqa: E402
from cosmos_reason_ros.core.types import ErrorCode  # noqa: E402

pytestmark = [pytest.mark.ros]

Goal = Reason.Goal
MAX_TOKENS_CAP = 512  # cpu_demo's limits.max_tokens
OK, BAD_IMAGE, BAD_REQUEST = ErrorCode.OK, ErrorCode.BAD_IMAGE, ErrorCode.BAD_REQUEST
NO_IMAGE = ErrorCode.NO_IMAGE


# --- the probe: a port nobody should connect to, a FIFO nobody should open ------------------


class Probe:
    """A listening TCP port that records connections and a FIFO that must never be opened."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/schema.json"
        self.connections = 0
        self.dir = tempfile.mkdtemp(prefix="cr_probe_")
        self.fifo = os.path.join(self.dir, "secret.json")
        os.mkfifo(self.fifo)
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def fifo_has_reader(self) -> bool:
        try:
            fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:
            assert e.errno == errno.ENXIO  # no process has the FIFO open for reading
            return False
        os.close(fd)
        return True

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        os.unlink(self.fifo)
        os.rmdir(self.dir)


# --- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def node():
    # cpu_demo's limits (max_tokens 512; the rest are the defaults cpu_demo keeps).
    n = InProcessNode({"limits.max_tokens": MAX_TOKENS_CAP, "image.wait_s": 0.5,
                       "image.qos_reliability": "reliable", "image.qos_depth": 10},
                      answers_the_task)
    yield n
    n.close()


@pytest.fixture(scope="module")
def io(node):
    """Test side: camera publisher, results (both on the node's client side), client, probe."""
    class IO:
        pass

    io = IO()
    io.node = node.side.node
    io.camera = node.camera
    io.results = node.results  # every ~/results message, appended as it arrives
    io.client = ReasonClient(context=node.context)  # one participant: see InProcessNode
    assert io.client.wait_for_server(DISCOVERY_S)
    io.probe = Probe()
    yield io
    io.probe.close()
    io.client.close()


# --- goal builders --------------------------------------------------------------------------


def now_ns(io) -> int:
    return io.node.get_clock().now().nanoseconds


def goal(prompt: str = "What is on the table?", **fields) -> Goal:
    fields.setdefault("max_tokens", 4)
    return ReasonClient.goal(prompt, **fields)


def image_goal(image: Image | None = None, compressed: CompressedImage | None = None,
               prompt: str = "Describe it.", **fields) -> Goal:
    g = goal(prompt, source=Goal.SOURCE_GOAL_IMAGE, **fields)
    if image is not None:
        g.image = image
    if compressed is not None:
        g.compressed_image = compressed
    return g


def raw_image(width=64, height=48, encoding="rgb8", step=None, data=None, big=0) -> Image:
    msg = rgb_image_msg(scene(64, 48), 1_000_000_000)
    msg.width, msg.height, msg.encoding, msg.is_bigendian = width, height, encoding, big
    msg.step = 64 * 3 if step is None else step
    msg.data = bytes(64 * 48 * 3) if data is None else data
    return msg


def compressed(data: bytes, fmt: str = "jpeg") -> CompressedImage:
    msg = CompressedImage(format=fmt)
    msg.header.frame_id = "goal_cam"
    msg.data = data
    return msg


def jpeg(width=64, height=48) -> bytes:
    out = iolib.BytesIO()
    PILImage.fromarray(scene(width, height)).save(out, format="JPEG")
    return out.getvalue()


def png_declaring(width: int, height: int) -> bytes:
    """A 60-byte PNG whose header declares ``width`` x ``height`` (a decompression bomb)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b""))


def mono16_big_endian() -> Image:
    values = (np.arange(48 * 64, dtype=np.uint16).reshape(48, 64) * 20).astype(">u2")
    return raw_image(encoding="mono16", step=128, data=values.tobytes(), big=1)


def schema_nested(depth: int) -> str:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return json.dumps(schema)


def serialized_with_bad_utf8_encoding() -> bytes:
    """A camera frame whose ``encoding`` string holds bytes that are not UTF-8."""
    msg = rgb_image_msg(scene(64, 48), 0)
    msg.encoding = "zzzz"
    data = bytearray(serialize_message(msg))
    i = data.find(b"zzzz")
    data[i:i + 4] = b"\xff\xfe\xc3\x28"
    return bytes(data)


def serialized_truncated() -> bytes:
    """A camera frame cut in the middle of its pixel array (a corrupt message on the wire)."""
    data = serialize_message(rgb_image_msg(scene(64, 48), 0))
    return data[: len(data) // 2]


# --- running cases --------------------------------------------------------------------------


def ask_next_frame(io, frame: Callable[[], object], g: Goal | None = None) -> ReasonResult:
    """Send a SOURCE_NEXT goal; once it waits for an image, publish ``frame()`` until done."""
    waiting = threading.Event()

    def on_feedback(fb):
        if fb.stage == Reason.Feedback.STAGE_WAITING_FOR_IMAGE:
            waiting.set()

    g = g or goal(source=Goal.SOURCE_NEXT, wait_for_image_s=10.0)
    handle = io.client.submit(g, on_feedback)
    assert waiting.wait(NEVER_S), "the goal never reached waiting_for_image"
    deadline = time.monotonic() + 30
    while not handle.future.done() and time.monotonic() < deadline:
        payload = frame()
        if isinstance(payload, Image):
            payload.header.stamp = rclpy.time.Time(nanoseconds=now_ns(io)).to_msg()
        io.camera.publish(payload)
        time.sleep(0.05)  # paces: a 20 fps camera, until the goal that waits for it ends
    return handle.result(NEVER_S)


@dataclass(frozen=True)
class Case:
    """One class of bad input: how to send it and the outcome it must get."""

    name: str
    send: Callable[[object], ReasonResult]
    code: ErrorCode
    message: str  # a fragment the error message must contain ("" for OK)
    status: str = "aborted"


def via_goal(make: Callable[[], Goal]) -> Callable[[object], ReasonResult]:
    return lambda io: io.client.run(make(), NEVER_S)


def via_camera(frame: Callable[[], object]) -> Callable[[object], ReasonResult]:
    return lambda io: ask_next_frame(io, frame)


def probe_goal(make: Callable[[object], Goal]) -> Callable[[object], ReasonResult]:
    return lambda io: io.client.run(make(io.probe), NEVER_S)


CATALOGUE: list[Case] = [
    # --- no frame yet (run first) ---------------------------------------------------------
    Case("latest frame before any frame arrived", via_goal(lambda: goal()), NO_IMAGE,
         "no image received on '/image' yet"),
    Case("clip on a stream with no history", via_goal(lambda: goal(source=Goal.SOURCE_CLIP)),
         NO_IMAGE, "needs at least 2 frames; the history holds 0"),
    # --- raw images -------------------------------------------------------------------------
    Case("unknown encoding", via_goal(lambda: image_goal(raw_image(encoding="rgb9"))),
         BAD_IMAGE, "encoding='rgb9' is not supported"),
    Case("step smaller than width x bytes per pixel",
         via_goal(lambda: image_goal(raw_image(step=100))), BAD_IMAGE,
         "step=100 is smaller than width x bytes per pixel = 64 x 3 = 192"),
    Case("data shorter than step x height",
         via_goal(lambda: image_goal(raw_image(data=bytes(9215)))), BAD_IMAGE,
         "len(data)=9215 does not match step x height = 192 x 48 = 9216"),
    Case("data longer than step x height",
         via_goal(lambda: image_goal(raw_image(data=bytes(9217)))), BAD_IMAGE,
         "len(data)=9217 does not match step x height"),
    Case("zero width", via_goal(lambda: image_goal(raw_image(width=0))), BAD_IMAGE,
         "image width=0; expected a positive integer"),
    Case("zero height", via_goal(lambda: image_goal(raw_image(height=0))), BAD_IMAGE,
         "image height=0; expected a positive integer"),
    Case("absurd declared size 100000 x 100000",
         via_goal(lambda: image_goal(raw_image(width=100000, height=100000, step=300000))),
         BAD_IMAGE, "100000x100000 = 10000000000 pixels exceeds max_pixels=50000000"),
    Case("odd width for a YUV 4:2:2 encoding",
         via_goal(lambda: image_goal(raw_image(width=63, encoding="yuv422", step=126,
                                               data=bytes(126 * 48)))),
         BAD_IMAGE, "width=63 is odd"),
    Case("extreme aspect ratio (1 x 300)",
         via_goal(lambda: image_goal(raw_image(width=300, height=1, step=900,
                                               data=bytes(900)))),
         BAD_IMAGE, "aspect ratio 300.0; the processor accepts at most 200"),
    Case("big-endian 16-bit (mono16) is converted, not refused",
         via_goal(lambda: image_goal(mono16_big_endian())), OK, "", "succeeded"),
    # --- compressed images ------------------------------------------------------------------
    Case("corrupt JPEG (valid SOI marker, garbage after)",
         via_goal(lambda: image_goal(compressed=compressed(b"\xff\xd8" + bytes(range(256))))),
         BAD_IMAGE, "cannot decode compressed image (format='jpeg', 258 bytes)"),
    Case("truncated JPEG",
         via_goal(lambda: image_goal(compressed=compressed(jpeg()[:600]))), BAD_IMAGE,
         "cannot decode compressed image (format='jpeg', 600 bytes)"),
    Case("PNG bomb: 60 bytes declaring 100000 x 100000",
         via_goal(lambda: image_goal(compressed=compressed(png_declaring(100000, 100000),
                                                           "png"))),
         BAD_IMAGE, "declares too many pixels (max_pixels=50000000)"),
    Case("PNG declaring 8000 x 8000 (under Pillow's limit, over max_pixels)",
         via_goal(lambda: image_goal(compressed=compressed(png_declaring(8000, 8000), "png"))),
         BAD_IMAGE, "PNG header size 8000x8000 = 64000000 pixels exceeds max_pixels"),
    # --- image source -----------------------------------------------------------------------
    Case("image in the goal plus the camera source",
         via_goal(lambda: goal(image=rgb_image_msg(scene(64, 48), 1))), BAD_REQUEST,
         "the goal carries an image but source=0"),
    Case("both image and compressed_image in the goal",
         via_goal(lambda: image_goal(rgb_image_msg(scene(64, 48), 1), compressed(jpeg()))),
         BAD_REQUEST, "needs exactly one of image and compressed_image"),
    Case("SOURCE_GOAL_IMAGE without an image",
         via_goal(lambda: image_goal()), BAD_REQUEST,
         "needs exactly one of image and compressed_image"),
    Case("unknown source", via_goal(lambda: goal(source=7)), BAD_REQUEST,
         "source=7 is unknown"),
    Case("unknown feedback level", via_goal(lambda: goal(feedback=3)), BAD_REQUEST,
         "feedback=3 is unknown; allowed 0 (all: stages and text), 1 (stages only), 2 (none)"),
    # --- bad camera frames (published, then asked for with SOURCE_NEXT) ----------------------
    Case("camera frame with a malformed step",
         via_camera(lambda: raw_image(step=10)), BAD_IMAGE, "step=10 is smaller"),
    Case("camera frame whose encoding is not UTF-8 (raw CDR bytes)",
         via_camera(serialized_with_bad_utf8_encoding), BAD_IMAGE, "encoding is not UTF-8"),
    Case("camera frame cut short on the wire (raw CDR bytes)",
         via_camera(serialized_truncated), BAD_IMAGE, "serialized Image is truncated"),
    # --- text fields ------------------------------------------------------------------------
    Case("empty prompt", via_goal(lambda: goal("")), BAD_REQUEST,
         "prompt is empty; task 'vqa' needs the question"),
    Case("whitespace-only prompt", via_goal(lambda: goal(" \n\t ")), BAD_REQUEST,
         "prompt is empty"),
    Case("prompt over limits.max_prompt_chars", via_goal(lambda: goal("x" * 4001)),
         BAD_REQUEST, "prompt has 4001 characters; at most 4000 are allowed"),
    # (A NUL cannot travel: ROS strings end at the first NUL byte, so the node gets "a".)
    Case("control character in the prompt", via_goal(lambda: goal("a\x01b")),
         BAD_REQUEST, "prompt contains control character U+0001"),
    Case("unknown task", via_goal(lambda: goal(task="dance")), BAD_REQUEST,
         "unknown task 'dance'"),
    Case("targets missing for a grounding task", via_goal(lambda: goal("", task="ground")),
         BAD_REQUEST, "targets is empty; task 'ground' needs at least one object"),
    Case("targets missing for a pointing task", via_goal(lambda: goal("", task="point")),
         BAD_REQUEST, "targets is empty; task 'point'"),
    Case("too many targets", via_goal(lambda: goal("", task="ground",
                                                   targets=[f"t{i}" for i in range(17)])),
         BAD_REQUEST, "targets has 17 entries; at most 16"),
    Case("target too long", via_goal(lambda: goal("", task="ground", targets=["y" * 201])),
         BAD_REQUEST, "targets[0] has 201 characters; at most 200"),
    Case("temporal task on a single image", via_goal(lambda: image_goal(
        rgb_image_msg(scene(64, 48), 1), task="temporal")), BAD_REQUEST,
        "task 'temporal' needs a video clip"),
    # --- response_schema --------------------------------------------------------------------
    Case("response_schema that is not JSON", via_goal(lambda: goal(response_schema="{oops")),
         BAD_REQUEST, "response_schema is not valid JSON"),
    Case("response_schema that is not an object", via_goal(lambda: goal(response_schema="[1]")),
         BAD_REQUEST, "response_schema must be a JSON object, got list"),
    Case("response_schema with an unknown type",
         via_goal(lambda: goal(response_schema='{"type": "tuple"}')), BAD_REQUEST,
         "response_schema at #/type: 'tuple' is not a JSON Schema type"),
    Case("response_schema with min above max", via_goal(lambda: goal(
        response_schema='{"type": "string", "minLength": 5, "maxLength": 2}')), BAD_REQUEST,
        "minLength=5 exceeds maxLength=2"),
    Case("response_schema too large (> limits.max_schema_bytes)",
         via_goal(lambda: goal(response_schema=json.dumps(
             {"type": "string", "description": "d" * 17000}))), BAD_REQUEST,
         "at most 16384 allowed"),
    Case("response_schema nested too deep", via_goal(lambda: goal(
        response_schema=schema_nested(40))), BAD_REQUEST, "nested deeper than 16 levels"),
    Case("response_schema $ref to a URL (never fetched)",
         probe_goal(lambda p: goal(response_schema=json.dumps({"$ref": p.url}))), BAD_REQUEST,
         "is not a local reference"),
    Case("response_schema $ref to a local file (never read)",
         probe_goal(lambda p: goal(response_schema=json.dumps(
             {"type": "object", "properties": {"a": {"$ref": "file://" + p.fifo}}}))),
         BAD_REQUEST, "#/properties/a/$ref"),
    Case("prompt naming a file and a URL is plain text (nothing read or fetched)",
         probe_goal(lambda p: image_goal(rgb_image_msg(scene(64, 48), 1),
                                         prompt=f"Summarize file://{p.fifo} and {p.url}")),
         OK, "", "succeeded"),
    # --- numbers ----------------------------------------------------------------------------
    Case("huge max_tokens", via_goal(lambda: goal(max_tokens=2**31 - 1)), BAD_REQUEST,
         f"max_tokens=2147483647 exceeds the limit; allowed 1..{MAX_TOKENS_CAP}"),
    Case("negative max_tokens", via_goal(lambda: goal(max_tokens=-5)), BAD_REQUEST,
         f"max_tokens=-5 is negative; allowed 1..{MAX_TOKENS_CAP}, or 0 for the model preset"),
    Case("NaN temperature", via_goal(lambda: goal(temperature=math.nan)), BAD_REQUEST,
         "temperature=nan is not a finite number"),
    Case("infinite temperature", via_goal(lambda: goal(temperature=math.inf)), BAD_REQUEST,
         "temperature=inf is not a finite number"),
    Case("huge temperature", via_goal(lambda: goal(temperature=1e30)), BAD_REQUEST,
         "is too high; allowed 0 < temperature <= 2.0"),
    Case("NaN timeout_s", via_goal(lambda: goal(timeout_s=math.nan)), BAD_REQUEST,
         "timeout_s=nan: allowed 0 (node default) or a positive number"),
    Case("negative timeout_s", via_goal(lambda: goal(timeout_s=-1.0)), BAD_REQUEST,
         "timeout_s=-1.0"),
    Case("negative max_image_age_s", via_goal(lambda: goal(max_image_age_s=-1.0)),
         BAD_REQUEST, "max_image_age_s=-1.0: allowed 0 (node default) or a positive finite"),
    Case("infinite wait_for_image_s", via_goal(lambda: goal(wait_for_image_s=math.inf)),
         BAD_REQUEST, "wait_for_image_s=inf"),
    Case("NaN clip_duration_s", via_goal(lambda: goal(source=Goal.SOURCE_CLIP,
                                                      clip_duration_s=math.nan)),
         BAD_REQUEST, "clip_duration_s=nan"),
    Case("negative clip_duration_s", via_goal(lambda: goal(source=Goal.SOURCE_CLIP,
                                                           clip_duration_s=-2.0)),
         BAD_REQUEST, "clip_duration_s=-2.0"),
    Case("huge clip_duration_s", via_goal(lambda: goal(source=Goal.SOURCE_CLIP,
                                                       clip_duration_s=1e6)),
         BAD_REQUEST, "exceeds limits.max_clip_duration_s=60"),
    Case("huge clip_fps", via_goal(lambda: goal(source=Goal.SOURCE_CLIP, clip_fps=1000.0)),
         BAD_REQUEST, "clip_fps=1000: allowed 0 (default 4) up to 30"),
    Case("NaN clip_fps", via_goal(lambda: goal(source=Goal.SOURCE_CLIP, clip_fps=math.nan)),
         BAD_REQUEST, "clip_fps=nan"),
]


def normal_goal(io) -> ReasonResult:
    return io.client.run(image_goal(rgb_image_msg(scene(64, 48, seed=9), 2), max_tokens=2), NEVER_S)


@pytest.mark.parametrize("case", CATALOGUE, ids=[c.name for c in CATALOGUE])
def test_catalogue(io, case: Case):
    t0 = time.monotonic()
    result = case.send(io)
    took = time.monotonic() - t0
    assert (result.status, result.error_code) == (case.status, case.code), \
        (result.status, result.error_code, result.error_message)
    assert case.message in result.error_message, result.error_message
    if case.code is not OK:
        assert result.message.finish_reason == "error"
    print(f"\n{case.name}: {result.error_code.name} in {took:.2f} s: {result.error_message}")
    after = normal_goal(io)
    assert after.ok, after.error_message


def test_catalogue_probe_was_never_touched(io):
    # Runs after the catalogue: the URL and file cases neither connected nor opened anything.
    assert io.probe.connections == 0
    assert not io.probe.fifo_has_reader()


def test_catalogue_results_were_published(io):
    # Every catalogue goal's result also went out on ~/results (nothing lost silently).
    want = len(CATALOGUE) * 2
    wait_until(lambda: len(io.results) >= want, NEVER_S, f"{want} results on ~/results")
    codes = {m.error_code for m in io.results}
    assert {BAD_IMAGE, BAD_REQUEST, NO_IMAGE, OK} <= codes  # PROMPT_TOO_LONG: test_node.py


# --- live fuzz ------------------------------------------------------------------------------

KNOWN_CODES = set(ErrorCode)
FUZZ_GOALS = 40


def random_goal(rng: random.Random) -> Goal:
    """A goal with each field valid most of the time and off some of the time."""
    def pick(valid, invalid, p_bad=0.15):
        return rng.choice(invalid) if rng.random() < p_bad else rng.choice(valid)

    g = goal(pick(["What is here?", "Is the aisle blocked?", "", "\u6c34?"],
                  ["", "a\x01", "x" * 4100, " "]),
             task=pick(["", "vqa", "caption", "ground", "point", "verify", "next_action"],
                       ["temporal", "dance", "GROUND ", "\u00e9"]),
             targets=pick([[], ["cup"], ["red cup", "box"]], [["z" * 300], [""] * 20]),
             reasoning=rng.random() < 0.3, greedy=rng.random() < 0.3,
             max_tokens=pick([0, 1, 4, 8], [-7, 10**6, 513]),
             temperature=pick([0.0, 0.5, -1.0], [math.nan, 3.0, math.inf]),
             timeout_s=pick([0.0, 30.0], [-1.0, math.nan]),
             response_schema=pick(["", "", '{"type": "boolean"}'],
                                  ["{", "[]", '{"type": 5}', '{"$ref": "http://x/y"}']))
    if g.max_tokens == 0 or g.max_tokens > 8:  # keep the run short where the goal is valid
        g.max_tokens = g.max_tokens if g.max_tokens > MAX_TOKENS_CAP else 8
    kind = rng.choice(["rgb8", "bgr8", "mono8", "mono16", "jpeg", "png", "bad", "none"])
    w, h = rng.randint(8, 96), rng.randint(8, 96)
    rgb = scene(max(w, 41), max(h, 41), seed=rng.randint(0, 99))[:h, :w]
    if kind in ("rgb8", "bgr8", "mono8", "mono16"):
        pixels = {"rgb8": rgb, "bgr8": rgb[..., ::-1], "mono8": rgb[..., 0],
                  "mono16": rgb[..., 0].astype(np.uint16) * 257}[kind]
        bpp = {"rgb8": 3, "bgr8": 3, "mono8": 1, "mono16": 2}[kind]
        g.image = raw_image(w, h, kind, w * bpp, np.ascontiguousarray(pixels).tobytes())
    elif kind in ("jpeg", "png"):
        out = iolib.BytesIO()
        PILImage.fromarray(np.ascontiguousarray(rgb)).save(out, format=kind.upper())
        data = out.getvalue()
        if rng.random() < 0.3:
            data = data[: rng.randint(0, len(data))]
        g.compressed_image = compressed(data, kind)
    elif kind == "bad":
        g.image = raw_image(w, h, rng.choice(["rgb8", "weird"]), rng.randint(0, 3 * w),
                            bytes(rng.randint(0, 3 * w * h)))
    g.source = Goal.SOURCE_GOAL_IMAGE if kind != "none" else rng.choice([0, 1, 2, 9])
    g.wait_for_image_s = 0.2
    return g


def test_live_fuzz_every_goal_ends_with_a_known_code(io):
    rng = random.Random(8)
    goals = [random_goal(rng) for _ in range(FUZZ_GOALS)]
    results: list[ReasonResult] = []
    for batch in range(0, FUZZ_GOALS, 8):  # 8 at a time: within the node's goal bounds
        handles = [io.client.submit(g) for g in goals[batch:batch + 8]]
        results += [h.result(NEVER_S) for h in handles]
    assert len(results) == FUZZ_GOALS
    tally: dict[str, int] = {}
    for r in results:
        assert r.error_code in KNOWN_CODES
        assert (r.status == "succeeded") == (r.error_code is OK), (r.status, r.error_code)
        assert r.status in ("succeeded", "aborted"), (r.status, r.error_message)
        if r.error_code is not OK:
            assert r.error_message, r.error_code
        tally[r.error_code.name] = tally.get(r.error_code.name, 0) + 1
    print(f"\nlive fuzz outcomes: {tally}")
    assert tally.get("OK", 0) >= 3 and len(tally) >= 3  # both valid and invalid goals ran
    assert normal_goal(io).ok


# --- startup parameters ---------------------------------------------------------------------


@pytest.mark.engine
@pytest.mark.slow
def test_parameters_of_the_wrong_type_stop_the_node_naming_each(tiny_qwen3_vl):
    # Node-keyed (-p cosmos_reason:name:=value): rcl drops a plain -p whose type differs
    # from the same key's value in the '/**' preset, so the bad values would never arrive.
    proc = NodeProcess("cpu_demo", {"engine.model": str(tiny_qwen3_vl),
                                    "cosmos_reason:limits.max_tokens": "lots",
                                    "cosmos_reason:image.max_age_s": "true",
                                    "cosmos_reason:periodic.enabled": 3,
                                    "cosmos_reason:engine.fallback_urls": 5})
    try:
        assert proc.proc.wait(NEVER_S) == 2, proc.output[-2000:]
    finally:
        proc.stop()
    out = proc.output
    assert "limits.max_tokens='lots': expected int" in out
    assert "image.max_age_s=True: expected float" in out
    assert "periodic.enabled=3: expected bool" in out
    assert "engine.fallback_urls=5: expected list" in out
    assert "ready:" not in out
