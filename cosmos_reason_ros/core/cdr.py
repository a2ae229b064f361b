"""Read a serialized ``sensor_msgs/Image`` (CDR) without deserializing it.

The node keeps camera messages serialized until a goal needs one. A full deserialization
copies the whole pixel buffer (6 MB at 1080p) into a new Python array first; reading the few
header fields and taking a zero-copy view of the pixels skips that copy.

Layout (XCDR1 as rmw_fastrtps writes it; offsets after the 4-byte encapsulation header,
each primitive aligned to its size): stamp (int32 sec, uint32 nanosec), frame_id (uint32
length incl. NUL, bytes), height, width (uint32), encoding (string), is_bigendian (uint8),
step (uint32), data (uint32 length, bytes).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from cosmos_reason_ros.core.imaging import ImageMessage
from cosmos_reason_ros.core.types import BadImageError

_NS = 1_000_000_000


@dataclass(frozen=True)
class ImageFields:
    """The fields of a serialized Image; ``data`` is a view into the serialized bytes."""

    sec: int
    nanosec: int
    frame_id: str
    height: int
    width: int
    encoding: str
    is_bigendian: int
    step: int
    data: memoryview


class _Reader:
    def __init__(self, data: bytes | memoryview, what: str = "Image") -> None:
        self.buf = memoryview(data)
        self.what = what
        if len(self.buf) < 4 or self.buf[0] != 0 or self.buf[1] not in (0, 1):
            raise BadImageError(f"serialized {what}: not a CDR encapsulation header")
        self.order = "<" if self.buf[1] == 1 else ">"
        self.pos = 4

    def _take(self, size: int, align: int) -> memoryview:
        self.pos += (-(self.pos - 4)) % align
        end = self.pos + size
        if size < 0 or end > len(self.buf):
            raise BadImageError(f"serialized {self.what} is truncated: needs {end} bytes, has "
                                f"{len(self.buf)}")
        view = self.buf[self.pos:end]
        self.pos = end
        return view

    def u32(self) -> int:
        return struct.unpack(self.order + "I", self._take(4, 4))[0]

    def i32(self) -> int:
        return struct.unpack(self.order + "i", self._take(4, 4))[0]

    def u8(self) -> int:
        return self._take(1, 1)[0]

    def string(self, name: str) -> str:
        raw = bytes(self._take(self.u32(), 1))
        try:
            return raw.rstrip(b"\0").decode()
        except UnicodeDecodeError as e:
            raise BadImageError(f"serialized {self.what}: {name} is not UTF-8: {e}") from e

    def octets(self) -> memoryview:
        return self._take(self.u32(), 1)


def parse_image(data: bytes | memoryview) -> ImageFields:
    """Return the fields of a serialized ``sensor_msgs/Image``; ``BadImageError`` if malformed."""
    r = _Reader(data)
    sec, nanosec, frame_id = r.i32(), r.u32(), r.string("header.frame_id")
    height, width = r.u32(), r.u32()
    encoding, is_bigendian = r.string("encoding"), r.u8()
    step = r.u32()
    return ImageFields(sec, nanosec, frame_id, height, width, encoding, is_bigendian, step,
                       r.octets())


def read_frame(data: bytes | memoryview, compressed: bool) -> ImageMessage:
    """Read a serialized ``sensor_msgs/Image`` or ``CompressedImage`` into an ``ImageMessage``.

    One reader for live camera frames and recorded ones (rosbag2 stores the same CDR bytes),
    so the node and offline replay decode a frame identically. Pixels stay a view.
    """
    if not compressed:
        f = parse_image(data)
        return ImageMessage(stamp_ns=f.sec * _NS + f.nanosec, frame_id=f.frame_id,
                            width=f.width, height=f.height, encoding=f.encoding,
                            is_bigendian=bool(f.is_bigendian), step=f.step, data=f.data)
    r = _Reader(data, "CompressedImage")
    sec, nanosec, frame_id = r.i32(), r.u32(), r.string("header.frame_id")
    fmt = r.string("format")
    return ImageMessage(stamp_ns=sec * _NS + nanosec, frame_id=frame_id, data=r.octets(),
                        compressed_format=fmt)


def header_stamp_ns(data: bytes | memoryview) -> int:
    """``header.stamp`` of a serialized stamped message (0 if too short), without parsing more.

    Every stamped message starts with its Header, whose stamp (int32 sec, uint32 nanosec)
    follows the 4-byte encapsulation header (byte 1: 1 little endian, 0 big endian).
    """
    if len(data) < 12:
        return 0
    order = "<" if data[1] == 1 else ">"
    sec, nanosec = struct.unpack_from(order + "iI", data, 4)
    return sec * _NS + nanosec


def read_stored_frame(frame: tuple[bool, bytes]) -> ImageMessage:
    """Read a frame stored as ``(compressed, serialized bytes)`` (the node and replay store)."""
    return read_frame(frame[1], compressed=frame[0])
