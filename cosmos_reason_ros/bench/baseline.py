"""The HTTP-client baseline for ``bench``: what users do today without this package.

A plain rclpy node, written the way a careful user writes one (see the public Jetson guides for
Cosmos-Reason: ``vllm serve`` plus a script that POSTs base64 JPEGs): it subscribes to the
camera (``sensor_msgs/Image``, deserialized by rclpy as usual), and when asked it converts the
frame to a BGR array, JPEG-encodes it with OpenCV, base64s it into a data URL and POSTs an
OpenAI chat completion to the server, streaming the answer (to see the first token early) over
a kept-alive ``requests`` session. Nothing is crippled: no extra copies, no reconnects, the
fastest common encoder, and the server gets exactly one image per question.

Trigger: a JSON ``std_msgs/String`` on ``~/ask``::

    {"id": "...", "prompt": "...", "max_tokens": 128, "ignore_eos": true, "seed": 1,
     "on": "latest" | "next"}

``latest`` answers about the newest cached frame at once (in the trigger's callback); ``next``
arms the image callback, which answers about the next frame that arrives (the
ros2_nanollm-style "run the model in the image callback" pattern). Each answer is published on
``~/answer`` as JSON (id, frame stamp, text, token counts, client-side timings, error); the
first streamed token is announced on ``~/first_token`` (the id) so a caller can see TTFT.

    python -m cosmos_reason_ros.bench.baseline --url http://127.0.0.1:8000/v1 --model m
"""

from __future__ import annotations

import argparse
import base64
import collections
import json
import signal
import sys
import threading
import time
from typing import Any

import cv2
import numpy as np
import requests

NODE_NAME = "bench_baseline"
MAX_PENDING = 64  # armed "next frame" questions kept at most


def image_to_bgr(msg: Any) -> np.ndarray:
    """Convert rgb8/bgr8/mono8 ``sensor_msgs/Image`` to a BGR array, as users do."""
    channels = {"rgb8": 3, "bgr8": 3, "mono8": 1}.get(msg.encoding)
    if channels is None:
        raise ValueError(f"encoding {msg.encoding!r} not handled (rgb8, bgr8, mono8)")
    buf = np.frombuffer(msg.data, np.uint8).reshape(msg.height, msg.step)
    img = buf[:, :msg.width * channels].reshape(msg.height, msg.width, channels)
    if msg.encoding == "rgb8":
        return cv2.cvtColor(img, cv2.COLOR_RGB2BGR)
    if msg.encoding == "mono8":
        return cv2.cvtColor(img, cv2.COLOR_GRAY2BGR)
    return img


def jpeg_data_url(bgr: np.ndarray, quality: int = 90) -> str:
    """JPEG-encode with OpenCV and wrap as a base64 data URL."""
    ok, buf = cv2.imencode(".jpg", bgr, [int(cv2.IMWRITE_JPEG_QUALITY), quality])
    if not ok:
        raise ValueError("JPEG encoding failed")
    return "data:image/jpeg;base64," + base64.b64encode(buf.tobytes()).decode("ascii")


def chat_body(model: str, prompt: str, data_url: str, max_tokens: int,
              ignore_eos: bool = False, seed: int | None = None) -> dict[str, Any]:
    """Build an OpenAI chat completion with one image (media first, as Qwen-VL expects)."""
    body: dict[str, Any] = {
        "model": model, "stream": True, "stream_options": {"include_usage": True},
        "max_tokens": max_tokens, "temperature": 0.0,
        "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": data_url}},
            {"type": "text", "text": prompt}]}],
    }
    if ignore_eos:
        body["ignore_eos"] = True  # vLLM extension: fixed output lengths for benchmarks
    if seed is not None:
        body["seed"] = seed
    return body


def post_streaming(session: requests.Session, url: str, body: dict[str, Any],
                   on_first_token: Any, timeout_s: float) -> dict[str, Any]:
    """POST and read the SSE stream; return text, usage and timings (seconds)."""
    t0 = time.monotonic()
    ttft = None
    text: list[str] = []
    usage: dict[str, Any] = {}
    with session.post(url + "/chat/completions", json=body, stream=True,
                      timeout=timeout_s) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {response.text[:300]}")
        for line in response.iter_lines():
            if not line or not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            event = json.loads(data)
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices", []):
                delta = choice.get("delta", {})
                piece = (delta.get("content") or "") + (delta.get("reasoning") or
                                                         delta.get("reasoning_content") or "")
                if piece:
                    if ttft is None:
                        ttft = time.monotonic() - t0
                        on_first_token()
                    text.append(piece)
    details = usage.get("prompt_tokens_details") or {}
    return {"text": "".join(text), "http_ttft_s": ttft, "http_total_s": time.monotonic() - t0,
            "prompt_tokens": usage.get("prompt_tokens"),
            "output_tokens": usage.get("completion_tokens"),
            "cached_prompt_tokens": details.get("cached_tokens")}


def main(argv: list[str] | None = None) -> int:
    """Run the baseline node until SIGINT/SIGTERM."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True, help="server base URL, e.g. http://host:8000/v1")
    ap.add_argument("--model", required=True, help="served model name")
    ap.add_argument("--quality", type=int, default=90, help="JPEG quality")
    ap.add_argument("--timeout", type=float, default=300.0, help="HTTP timeout (s)")
    ap.add_argument("--reliable", action="store_true", help="reliable camera QoS")
    args, ros_args = ap.parse_known_args(argv)

    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
    from sensor_msgs.msg import Image
    from std_msgs.msg import String

    rclpy.init(args=ros_args)
    node = rclpy.create_node(NODE_NAME)
    session = requests.Session()  # keep-alive: one TCP connection for every request
    latest: list[Any] = [None]
    armed: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_PENDING)
    answers = node.create_publisher(String, "~/answer", QoSProfile(
        depth=100, reliability=ReliabilityPolicy.RELIABLE))
    firsts = node.create_publisher(String, "~/first_token", QoSProfile(
        depth=100, reliability=ReliabilityPolicy.RELIABLE))

    def answer(ask: dict[str, Any], msg: Any) -> None:
        t0 = time.monotonic()
        out: dict[str, Any] = {"id": ask.get("id")}
        try:
            if msg is None:
                raise RuntimeError("no image received yet")
            out["stamp_ns"] = msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec
            bgr = image_to_bgr(msg)
            url = jpeg_data_url(bgr, args.quality)
            out["encode_s"] = time.monotonic() - t0
            out["jpeg_bytes"] = len(url)
            body = chat_body(args.model, ask.get("prompt", ""), url, int(ask.get("max_tokens",
                                                                                 64)),
                             bool(ask.get("ignore_eos")), ask.get("seed"))
            out.update(post_streaming(session, args.url, body,
                                      lambda: firsts.publish(String(data=str(ask.get("id")))),
                                      args.timeout))
            out["ok"] = True
        except Exception as e:  # noqa: BLE001 - reported to the caller, node keeps running
            out["ok"] = False
            out["error"] = f"{type(e).__name__}: {e}"
        out["callback_s"] = time.monotonic() - t0
        answers.publish(String(data=json.dumps(out)))

    def on_image(msg: Image) -> None:
        latest[0] = msg
        if armed:
            answer(armed.popleft(), msg)

    def on_ask(msg: String) -> None:
        try:
            ask = json.loads(msg.data)
        except json.JSONDecodeError as e:
            answers.publish(String(data=json.dumps({"ok": False, "error": f"bad ask: {e}"})))
            return
        if ask.get("on", "latest") == "next":
            armed.append(ask)
        else:
            answer(ask, latest[0])

    camera_qos = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE) if args.reliable \
        else qos_profile_sensor_data
    node.create_subscription(Image, "image", on_image, camera_qos)
    node.create_subscription(String, "~/ask", on_ask, QoSProfile(
        depth=100, reliability=ReliabilityPolicy.RELIABLE))
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    node.get_logger().info(f"ready: url={args.url} model={args.model}")
    try:
        while rclpy.ok() and not stop.is_set():
            executor.spin_once(timeout_sec=0.2)
    finally:
        executor.shutdown(timeout_sec=1.0)
        node.destroy_node()
        rclpy.try_shutdown()
        session.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
