"""The console's pictures: per camera, recent serialized frames by stamp, turned into JPEG.

A camera pane has two sources: the camera stream (``sensor_msgs/Image`` or
``CompressedImage``, as the node's camera receives it) and the node's annotated image (drawn
by the node for each answer, stamped with the answer's frame). Both are kept as the serialized
bytes the subscription delivered, in the package's ``FrameHistory`` (bounded by frames and
bytes), and nothing is decoded on receipt: a frame becomes a JPEG only when a browser is shown
it (at the console's capped rate) or an answer names its stamp.

An answer is drawn over *its* frame, found by the stamp the result names: first in the stream
history (the clean frame), then among the annotated images the node published for it (which
carry the node's own drawing), else the page says the frame is no longer held.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from cosmos_reason_ros.core.cdr import header_stamp_ns, read_stored_frame
from cosmos_reason_ros.core.frames import FrameHistory, StoredFrame
from cosmos_reason_ros.core.imaging import encode_jpeg, message_to_rgb

StoredMessage = tuple[bool, bytes]  # (compressed, serialized bytes), as the node stores frames
JPEG_QUALITY = 80
# The stream counts as live while its newest frame arrived this recently; otherwise the
# pane shows the node's annotated image (a node whose camera topic the console cannot see).
STREAM_FRESH_S = 2.0
ANNOTATED_FRAMES = 8  # the node publishes one per answer: the last few answers' frames
_JPEG_MAGIC = b"\xff\xd8"


@dataclass(frozen=True)
class Picture:
    """A frame ready for the page: JPEG bytes, the frame's stamp, and where it came from."""

    jpeg: bytes
    stamp_ns: int
    source: str  # "camera" (the stream) or "annotated" (the node's drawing)


class CameraFrames:
    """One camera's recent frames (stream and annotated), safe to fill from the ROS thread."""

    def __init__(self, name: str, max_frames: int, max_bytes: int) -> None:
        """Hold at most ``max_frames`` stream frames and ``max_bytes`` of them."""
        self.name = name
        self.stream: FrameHistory[StoredMessage] = FrameHistory(max_frames, max_bytes)
        self.annotated: FrameHistory[StoredMessage] = FrameHistory(
            ANNOTATED_FRAMES, max(max_bytes // 4, 1))
        self._stream_monotonic: float | None = None
        self._jpeg_stream_monotonic: float | None = None

    def store(self, data: bytes, compressed: bool) -> None:
        """Keep a serialized camera frame (the subscription callback: O(1), no decoding).

        When the camera also publishes JPEG (``image/compressed``), raw frames are dropped:
        the JPEG goes to the browser as it is, the raw one would have to be encoded.
        """
        now = time.monotonic()
        if compressed:
            self._jpeg_stream_monotonic = now
        elif self._jpeg_stream_monotonic is not None \
                and now - self._jpeg_stream_monotonic < STREAM_FRESH_S:
            return
        self._stream_monotonic = now
        self.stream.append((compressed, data), header_stamp_ns(data), nbytes=len(data))

    def store_annotated(self, data: bytes) -> None:
        """Keep a serialized annotated image from the node."""
        self.annotated.append((False, data), header_stamp_ns(data), nbytes=len(data))

    def live(self) -> tuple[StoredFrame[StoredMessage], str] | None:
        """Return the frame a live pane shows now and its source (None: there is none).

        The camera stream while it flows; else the node's newest annotated image.
        """
        newest = self.stream.latest()
        fresh = self._stream_monotonic is not None \
            and time.monotonic() - self._stream_monotonic < STREAM_FRESH_S
        if newest is not None and fresh:
            return newest, "camera"
        annotated = self.annotated.latest()
        if annotated is not None:
            return annotated, "annotated"
        return (newest, "camera") if newest is not None else None

    def at_stamp(self, stamp_ns: int) -> tuple[StoredFrame[StoredMessage], str] | None:
        """Return the frame stamped ``stamp_ns``: the stream's, else the node's annotated one."""
        for history, source in ((self.stream, "camera"), (self.annotated, "annotated")):
            frames = history.frames_since(stamp_ns, stamp_ns)
            if frames:
                return frames[-1], source
        return None


def to_jpeg(frame: StoredMessage, quality: int = JPEG_QUALITY) -> bytes:
    """JPEG bytes of a stored frame; a JPEG ``CompressedImage`` passes through unchanged.

    Uses the node's own readers (``core/cdr``) and converters (``core/imaging``), so every
    encoding the node accepts shows on the page. Raises ``BadImageError`` when unreadable.
    """
    image = read_stored_frame(frame)
    if image.compressed and bytes(image.data[:2]) == _JPEG_MAGIC:
        return bytes(image.data)
    return encode_jpeg(message_to_rgb(image), quality)


def picture(frame: StoredFrame[StoredMessage], source: str) -> Picture:
    """Encode a stored frame for the page (runs on the console's encoder thread)."""
    return Picture(to_jpeg(frame.payload), frame.stamp_ns, source)
