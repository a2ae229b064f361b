"""The chat-completions request an OpenAI-compatible vLLM server takes, built from a ChatRequest.

Fields, as verified against vLLM 0.32.0's server (``test/engines/test_openai_http.py``):

- Images: ``image_url`` parts with ``data:image/jpeg;base64,...`` URLs.
- Video: one ``video_url`` part (``data:video/mp4``, written with OpenCV's ``mp4v`` at the
  clip's fps; the server samples frames itself). Where the local OpenCV cannot write mp4, or
  with ``video_mode="frames"``, one image per frame, each after its timestamp in text (the
  model then sees images, not a video).
- Structured outputs: vLLM's ``structured_outputs: {"json": schema}`` (default) or the
  portable ``response_format: {"type": "json_schema", ...}``. The legacy ``guided_json`` is
  silently ignored by vLLM >= 0.12 and is never sent.
- Reasoning: with ``--reasoning-parser qwen3`` the server calls all output reasoning until
  ``</think>`` unless the request says ``chat_template_kwargs: {"enable_thinking": false}``,
  and holds structured outputs back until the reasoning ends; so with ``thinking="auto"``
  requests that do not ask for reasoning (``ChatRequest.wants_reasoning``) switch it off.
- Sampling: ``temperature``, ``top_p``, ``max_tokens``, ``seed``, ``presence_penalty``, and
  vLLM's own ``top_k``, ``repetition_penalty``, ``ignore_eos`` (in ``extra``: top-level JSON
  fields the OpenAI schema does not have).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import re
import tempfile
from typing import Any

import numpy as np

from cosmos_reason_ros.core.imaging import encode_jpeg
from cosmos_reason_ros.core.types import BadRequestError, ChatRequest, Video

_LOG = logging.getLogger(__name__)
THINKING = ("auto", "on", "off", "server")  # server: send nothing, the server decides
STRUCTURED_FIELDS = ("structured_outputs", "response_format")
VIDEO_MODES = ("mp4", "frames")


class RequestEncoder:
    """Builds request bodies; remembers whether this OpenCV can write mp4."""

    def __init__(self, jpeg_quality: int = 90, thinking: str = "auto",
                 structured_outputs_field: str = "structured_outputs",
                 video_mode: str = "mp4") -> None:
        """Keep the encoding choices (checked by the engine's config)."""
        self.jpeg_quality = jpeg_quality
        self.thinking = thinking
        self.structured_outputs_field = structured_outputs_field
        self.video_mode = video_mode
        self.mp4_ok = True

    async def body(self, request: ChatRequest) -> tuple[dict[str, Any], dict[str, Any]]:
        """Return the OpenAI fields (all but ``model``) and vLLM's extra top-level fields.

        Images are JPEG-encoded in worker threads, so the event loop keeps streaming other
        requests meanwhile.
        """
        parts = [p for m in request.messages for p in m.content]
        n_images = sum(p.kind == "image" for p in parts)
        if n_images != len(request.images):
            raise BadRequestError(
                f"messages reference {n_images} image(s) but request.images has "
                f"{len(request.images)}; expected one image part per image, in order")
        for p in parts:
            if p.kind not in ("text", "image", "video"):
                raise BadRequestError(f"content part kind={p.kind!r}; expected 'text', "
                                      "'image' or 'video'")
        has_video = any(p.kind == "video" for p in parts)
        if has_video and request.video is None:
            raise BadRequestError("messages contain a video part but request.video is None")
        images = iter(await asyncio.gather(*(
            asyncio.to_thread(_jpeg_url, img, f"images[{i}]", self.jpeg_quality)
            for i, img in enumerate(request.images))))
        video = await self._video_parts(request.video) \
            if has_video and request.video is not None else []
        messages = []
        for m in request.messages:
            content: list[dict[str, Any]] = []
            for p in m.content:
                if p.kind == "text":
                    content.append({"type": "text", "text": p.text})
                elif p.kind == "image":
                    content.append({"type": "image_url", "image_url": {"url": next(images)}})
                else:
                    content.extend(video)
            if all(c["type"] == "text" for c in content):
                messages.append({"role": m.role, "content": "".join(c["text"] for c in content)})
            else:
                messages.append({"role": m.role, "content": content})

        s = request.sampling
        body: dict[str, Any] = {
            "messages": messages, "stream": True, "stream_options": {"include_usage": True},
            "max_tokens": s.max_tokens, "temperature": s.temperature, "top_p": s.top_p}
        extra: dict[str, Any] = {}
        for fields, name in ((body, "seed"), (body, "presence_penalty"), (extra, "top_k"),
                             (extra, "repetition_penalty")):
            if getattr(s, name) is not None:
                fields[name] = getattr(s, name)
        if s.ignore_eos:
            extra["ignore_eos"] = True
        if request.json_schema is not None:
            if self.structured_outputs_field == "structured_outputs":
                extra["structured_outputs"] = {"json": request.json_schema}
            else:
                name = re.sub(r"[^A-Za-z0-9_-]", "_",
                              str(request.json_schema.get("title", "answer")))[:64]
                body["response_format"] = {"type": "json_schema", "json_schema": {
                    "name": name or "answer", "schema": request.json_schema}}
        if self.thinking == "off" or (self.thinking == "auto" and not request.wants_reasoning()):
            extra["chat_template_kwargs"] = {"enable_thinking": False}
        elif self.thinking == "on":
            extra["chat_template_kwargs"] = {"enable_thinking": True}
        return body, extra

    async def _video_parts(self, video: Video) -> list[dict[str, Any]]:
        if not video.frames:
            raise BadRequestError("video has no frames; expected at least one")
        if self.video_mode == "mp4" and self.mp4_ok:
            data = await asyncio.to_thread(_encode_mp4, video)
            if data is not None:
                return [{"type": "video_url", "video_url": {"url": _data_url("video/mp4", data)}}]
            self.mp4_ok = False
            _LOG.warning("this OpenCV cannot write mp4v; sending video clips as timestamped "
                         "frames from now on")
        urls = await asyncio.gather(*(
            asyncio.to_thread(_jpeg_url, f, f"video.frames[{i}]", self.jpeg_quality)
            for i, f in enumerate(video.frames)))
        times = list(video.timestamps_s) + [
            i / video.fps if video.fps else 0.0 for i in range(len(video.timestamps_s), len(urls))]
        parts: list[dict[str, Any]] = [
            {"type": "text", "text": f"{len(urls)} video frames follow, in time order:"}]
        for t, url in zip(times[: len(urls)], urls, strict=True):
            parts.append({"type": "text", "text": f"t={t:.2f}s"})
            parts.append({"type": "image_url", "image_url": {"url": url}})
        return parts


def _data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode("ascii")


def _jpeg_url(image: np.ndarray, what: str, quality: int) -> str:
    if (not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.ndim != 3
            or image.shape[2] != 3):
        raise BadRequestError(f"{what} shape={getattr(image, 'shape', None)} "
                              f"dtype={getattr(image, 'dtype', None)}; expected HxWx3 uint8 RGB")
    return _data_url("image/jpeg", encode_jpeg(image, quality))


def _encode_mp4(video: Video) -> bytes | None:
    """Write the clip as mp4 (OpenCV ``mp4v``); ``None`` where this OpenCV cannot."""
    import cv2

    h, w = video.frames[0].shape[:2]
    fps = float(video.fps) if video.fps and video.fps > 0 else 4.0
    fd, path = tempfile.mkstemp(suffix=".mp4", prefix="cosmos_reason_clip_")
    os.close(fd)
    try:
        writer = cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*"mp4v"), fps, (w, h))
        if not writer.isOpened():
            return None
        try:
            for i, frame in enumerate(video.frames):
                if frame.shape[:2] != (h, w) or frame.dtype != np.uint8:
                    raise BadRequestError(
                        f"video.frames[{i}] shape={frame.shape} dtype={frame.dtype}; expected "
                        f"{h}x{w}x3 uint8 like the first frame")
                writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
        finally:
            writer.release()
        with open(path, "rb") as f:
            return f.read() or None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
