"""ROS image buffers <-> numpy without rclpy or cv_bridge, resizing, and JPEG/PNG encoding.

The ROS layer passes the plain fields of a ``sensor_msgs/Image`` (``width``, ``height``,
``encoding``, ``is_bigendian``, ``step``, ``data``) or a ``sensor_msgs/CompressedImage``
(``format``, ``data``); everything here is pure numpy / OpenCV / Pillow so it is testable without
ROS. ``data`` may be ``bytes``, ``bytearray``, ``memoryview``, ``array.array('B')`` (what rclpy
gives for ``uint8[]``) or a numpy ``uint8`` array.

Every malformed input raises :class:`~cosmos_reason_ros.core.types.BadImageError` whose message
names the field, the value and what was expected. Sizes are checked against ``max_pixels``
before anything is allocated or decoded.

Conversion rule for 16-bit and float images (``mono16``, ``16UC1``, ``32FC1``, compressed
depth): non-finite values (NaN, +-inf) become 0; the remaining values are mapped linearly from
``value_range`` (default: the frame's own finite min..max) to 0..255, clipped, and replicated to
the three RGB channels. A constant frame maps to 0. Pass a fixed ``value_range`` (e.g.
``(0.0, 10.0)`` metres for float depth) for a brightness that does not flicker between frames.
"""

from __future__ import annotations

import array
import base64
import io
import struct
import zlib
from dataclasses import dataclass
from typing import NamedTuple

import cv2
import numpy as np
from PIL import Image

from cosmos_reason_ros.core.types import BadImageError

DEFAULT_MAX_PIXELS = 50_000_000
"""Largest image (width x height) accepted by default: above any real camera, far below RAM."""

ImageData = bytes | bytearray | memoryview | array.array | np.ndarray
"""What ``data`` may be: any bytes-like object holding the message's ``uint8[]``."""


@dataclass(frozen=True)
class _Layout:
    """How one ROS encoding lays out a pixel."""

    channels: int
    dtype: str  # numpy kind+size without byte order: "u1", "u2", "f4"
    # How to reach RGB: "rgb", "bgr", "rgba", "bgra", "gray", "scale" (16-bit/float),
    # "uyvy", "yuyv", or "bayer_xxxx".
    kind: str

    @property
    def itemsize(self) -> int:
        return int(self.dtype[1])

    @property
    def bytes_per_pixel(self) -> int:
        return self.channels * self.itemsize


# Names as in sensor_msgs/image_encodings.hpp. "8UC3"/"8UC4" are taken as BGR(A), like
# cv_bridge. "yuv422" is UYVY (U0 Y0 V0 Y1), "yuv422_yuy2" is YUYV (Y0 U0 Y1 V0).
_LAYOUTS: dict[str, _Layout] = {
    "rgb8": _Layout(3, "u1", "rgb"),
    "bgr8": _Layout(3, "u1", "bgr"),
    "8UC3": _Layout(3, "u1", "bgr"),
    "rgba8": _Layout(4, "u1", "rgba"),
    "bgra8": _Layout(4, "u1", "bgra"),
    "8UC4": _Layout(4, "u1", "bgra"),
    "mono8": _Layout(1, "u1", "gray"),
    "8UC1": _Layout(1, "u1", "gray"),
    "mono16": _Layout(1, "u2", "scale"),
    "16UC1": _Layout(1, "u2", "scale"),
    "32FC1": _Layout(1, "f4", "scale"),
    "yuv422": _Layout(2, "u1", "uyvy"),
    "uyvy": _Layout(2, "u1", "uyvy"),
    "yuv422_yuy2": _Layout(2, "u1", "yuyv"),
    "yuyv": _Layout(2, "u1", "yuyv"),
    "bayer_rggb8": _Layout(1, "u1", "bayer_rggb"),
    "bayer_bggr8": _Layout(1, "u1", "bayer_bggr"),
    "bayer_gbrg8": _Layout(1, "u1", "bayer_gbrg"),
    "bayer_grbg8": _Layout(1, "u1", "bayer_grbg"),
}
_LAYOUTS_FOLDED = {name.lower(): layout for name, layout in _LAYOUTS.items()}

SUPPORTED_ENCODINGS: tuple[str, ...] = tuple(_LAYOUTS)
"""Encodings accepted by :func:`image_view` and :func:`image_to_rgb` (matched ignoring case)."""

# OpenCV names a Bayer pattern by the 2x2 block starting at the second row and column, so ROS
# "rggb" (top-left R G / G B) is OpenCV "BG" -- the same mapping cv_bridge uses.
_COLOR_CODES: dict[str, int] = {
    "bgr": cv2.COLOR_BGR2RGB,
    "rgba": cv2.COLOR_RGBA2RGB,
    "bgra": cv2.COLOR_BGRA2RGB,
    "gray": cv2.COLOR_GRAY2RGB,
    "uyvy": cv2.COLOR_YUV2RGB_UYVY,
    "yuyv": cv2.COLOR_YUV2RGB_YUYV,
    "bayer_rggb": cv2.COLOR_BayerBG2RGB,
    "bayer_bggr": cv2.COLOR_BayerRG2RGB,
    "bayer_gbrg": cv2.COLOR_BayerGR2RGB,
    "bayer_grbg": cv2.COLOR_BayerGB2RGB,
}

# Colour conversions that act on each pixel alone (channel reorder / drop / replicate): for
# these, resizing first and converting after gives the same result on fewer pixels.
_PER_PIXEL_KINDS = frozenset({"rgb", "bgr", "rgba", "bgra", "gray"})


def bytes_per_pixel(encoding: str) -> int:
    """Return the bytes one pixel takes in ``encoding`` (raises BadImageError if unknown)."""
    return _layout(encoding).bytes_per_pixel


def _layout(encoding: str) -> _Layout:
    layout = _LAYOUTS_FOLDED.get(str(encoding).strip().lower())
    if layout is None:
        raise BadImageError(
            f"encoding={encoding!r} is not supported; expected one of "
            f"{', '.join(SUPPORTED_ENCODINGS)}"
        )
    return layout


def _as_byte_buffer(data: ImageData) -> memoryview:
    """Return a flat, C-contiguous ``uint8`` memoryview of ``data`` (no copy when possible)."""
    if isinstance(data, np.ndarray):
        if data.dtype != np.uint8:
            raise BadImageError(f"data has dtype={data.dtype}; expected uint8")
        if not data.flags.c_contiguous:
            data = np.ascontiguousarray(data)
        return memoryview(data.reshape(-1))
    if isinstance(data, bytes | bytearray | memoryview | array.array):
        view = memoryview(data)
        if view.itemsize != 1:
            raise BadImageError(
                f"data has item size {view.itemsize} bytes (format {view.format!r}); expected a "
                "buffer of single bytes (uint8[])"
            )
        if not view.c_contiguous:
            view = memoryview(view.tobytes())
        return view.cast("B") if view.format != "B" or view.ndim != 1 else view
    raise BadImageError(
        f"data has type {type(data).__name__}; expected bytes, bytearray, memoryview, "
        "array.array('B') or a numpy uint8 array"
    )


def _check_size(width: int, height: int, max_pixels: int, what: str = "image") -> None:
    for name, value in (("width", width), ("height", height)):
        if not isinstance(value, int | np.integer) or isinstance(value, bool) or value <= 0:
            raise BadImageError(f"{what} {name}={value!r}; expected a positive integer")
    width, height = int(width), int(height)  # numpy integers could overflow the product
    if width * height > max_pixels:
        raise BadImageError(
            f"{what} size {width}x{height} = {width * height} pixels exceeds "
            f"max_pixels={max_pixels}"
        )


def image_view(
    width: int,
    height: int,
    encoding: str,
    is_bigendian: bool | int,
    step: int,
    data: ImageData,
    *,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> np.ndarray:
    """Return a read-only, zero-copy numpy view of a ``sensor_msgs/Image`` in its native layout.

    The shape is ``(height, width)`` for one-channel encodings (mono, 16UC1, 32FC1, Bayer) and
    ``(height, width, channels)`` otherwise (2 bytes per pixel for the YUV 4:2:2 encodings).
    Row padding (``step`` larger than a packed row) is skipped through the row stride; 16/32-bit
    dtypes carry the message's byte order, so big-endian data is read correctly without a copy.
    The view keeps ``data`` alive. The only copy made is for a non-contiguous numpy or
    memoryview input. Raises BadImageError for any inconsistent field.
    """
    layout = _layout(encoding)
    _check_size(width, height, max_pixels)
    width, height = int(width), int(height)
    kind = layout.kind
    if kind in ("uyvy", "yuyv") and width % 2:
        raise BadImageError(
            f"width={width} is odd; encoding={encoding!r} packs pixel pairs and needs an even width"
        )
    if kind.startswith("bayer") and (width < 2 or height < 2):
        raise BadImageError(
            f"size {width}x{height} is too small for encoding={encoding!r}; a Bayer mosaic "
            "needs at least 2x2 pixels"
        )
    row_bytes = width * layout.bytes_per_pixel
    if not isinstance(step, int | np.integer) or isinstance(step, bool) or step < row_bytes:
        raise BadImageError(
            f"step={step!r} is smaller than width x bytes per pixel = {width} x "
            f"{layout.bytes_per_pixel} = {row_bytes} for encoding={encoding!r}"
        )
    step = int(step)
    buf = _as_byte_buffer(data)
    expected = step * height
    if buf.nbytes != expected:
        raise BadImageError(
            f"len(data)={buf.nbytes} does not match step x height = {step} x {height} = "
            f"{expected} bytes"
        )
    order = ">" if is_bigendian and layout.itemsize > 1 else "<"
    dtype = np.dtype(order + layout.dtype) if layout.itemsize > 1 else np.dtype(np.uint8)
    if layout.channels == 1:
        shape: tuple[int, ...] = (height, width)
        strides: tuple[int, ...] = (step, layout.itemsize)
    else:
        shape = (height, width, layout.channels)
        strides = (step, layout.bytes_per_pixel, layout.itemsize)
    view = np.ndarray(shape, dtype=dtype, buffer=buf, offset=0, strides=strides)
    view.flags.writeable = False
    return view


def scale_to_uint8(
    values: np.ndarray, value_range: tuple[float, float] | None = None
) -> np.ndarray:
    """Map a 16-bit or float single-channel image to uint8 by the module's documented rule.

    Non-finite values become 0; the rest map linearly from ``value_range`` (default: the
    finite min..max of this frame) to 0..255, clipped. A constant frame maps to 0.
    """
    work = values.astype(np.float32, copy=True)  # native byte order, owned
    finite = np.isfinite(work)
    all_finite = bool(finite.all())
    if value_range is not None:
        low, high = float(value_range[0]), float(value_range[1])
        if not (np.isfinite(low) and np.isfinite(high) and high > low):
            raise BadImageError(
                f"value_range={value_range!r}; expected finite (low, high) with high > low"
            )
    elif all_finite:
        low, high = float(work.min()), float(work.max())
    elif finite.any():
        low, high = float(work[finite].min()), float(work[finite].max())
    else:
        low, high = 0.0, 0.0
    if not all_finite:
        work[~finite] = low  # maps to 0 below
    if high <= low:
        return np.zeros(values.shape, np.uint8)
    work -= low
    work *= 255.0 / (high - low)
    np.clip(work, 0.0, 255.0, out=work)
    out = (work + 0.5).astype(np.uint8)
    if not all_finite:
        out[~finite] = 0
    return out


def image_to_rgb(
    width: int,
    height: int,
    encoding: str,
    is_bigendian: bool | int,
    step: int,
    data: ImageData,
    *,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    size: tuple[int, int] | None = None,
    value_range: tuple[float, float] | None = None,
) -> np.ndarray:
    """Convert ``sensor_msgs/Image`` fields to an HxWx3 ``uint8`` RGB array.

    ``size=(width, height)`` also resizes (see :func:`resize_rgb`); for encodings whose colour
    conversion is per pixel (rgb/bgr/rgba/bgra/mono 8-bit) the resize runs first, so a large
    frame is converted at the model's resolution. ``value_range`` applies to 16-bit and float
    encodings (see the module docstring). The result is always a new C-contiguous array that
    does not share memory with ``data``. Raises BadImageError for malformed fields.
    """
    view = image_view(width, height, encoding, is_bigendian, step, data, max_pixels=max_pixels)
    kind = _layout(encoding).kind
    if size is not None:
        _check_size(size[0], size[1], max_pixels, what="target")
    if kind in _PER_PIXEL_KINDS:
        if size is not None and (size[0], size[1]) != (width, height):
            resized = _resize(view, int(size[0]), int(size[1]))
            return resized if kind == "rgb" else cv2.cvtColor(resized, _COLOR_CODES[kind])
        if kind == "rgb":
            return np.array(view, order="C", copy=True)
        return cv2.cvtColor(view, _COLOR_CODES[kind])
    if kind == "scale":
        rgb = cv2.cvtColor(scale_to_uint8(view, value_range), cv2.COLOR_GRAY2RGB)
    else:
        # YUV and Bayer need neighbouring pixels: convert at full size, then resize.
        rgb = cv2.cvtColor(view, _COLOR_CODES[kind])
    if size is not None:
        rgb = resize_rgb(rgb, int(size[0]), int(size[1]))
    return rgb


def _resize(image: np.ndarray, width: int, height: int) -> np.ndarray:
    src_h, src_w = image.shape[:2]
    factor = int(min(src_w / width, src_h / height))  # whole-number shrink factor, 0 = enlarge
    if factor >= 2:
        # An exact integer INTER_AREA is OpenCV's fast box-filter path: use the largest
        # factor that divides both sides (1280x720 -> 3 does not divide 1280, 2 does).
        divisor = next((f for f in range(factor, 1, -1) if src_w % f == 0 and src_h % f == 0),
                       1)
        if min(src_w / divisor / width, src_h / divisor / height) >= 2:
            # Bilinear would alias over the >= 2x left: OpenCV's general INTER_AREA path,
            # correct but ~5x slower than the exact one.
            return cv2.resize(image, (width, height), interpolation=cv2.INTER_AREA)
        # The box filter removes the frequencies that would alias, leaving a < 2x step for
        # bilinear.
        image = cv2.resize(image, (src_w // divisor, src_h // divisor),
                           interpolation=cv2.INTER_AREA)
        if image.shape[1] == width and image.shape[0] == height:
            return image
    # Enlarging, or shrinking by less than 2x: every source pixel still weighs in some output
    # pixel, so aliasing stays small, and bilinear is ~5x faster than a fractional INTER_AREA.
    return cv2.resize(image, (width, height), interpolation=cv2.INTER_LINEAR)


def resize_rgb(image: np.ndarray, width: int, height: int) -> np.ndarray:
    """Resize an HxWxC (or HxW) image to ``width`` x ``height``; fast and alias-free enough.

    Shrinking by 2x or more first box-filters by the whole factor (``INTER_AREA``, exact and
    fast when the size divides), then finishes with bilinear; smaller shrinks and enlargements
    are bilinear. Returns ``image`` itself when it already has that size.
    """
    if width <= 0 or height <= 0:
        raise BadImageError(f"target size {width}x{height}; expected positive width and height")
    if image.ndim < 2 or image.shape[0] == 0 or image.shape[1] == 0:
        raise BadImageError(f"image shape={image.shape}; expected a non-empty HxW(xC) array")
    if image.shape[1] == width and image.shape[0] == height:
        return image
    return _resize(image, width, height)


def _check_rgb(rgb: np.ndarray) -> None:
    if not isinstance(rgb, np.ndarray) or rgb.dtype != np.uint8:
        raise BadImageError(
            f"image is {type(rgb).__name__} dtype={getattr(rgb, 'dtype', None)}; "
            "expected a numpy uint8 array"
        )
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.shape[0] == 0 or rgb.shape[1] == 0:
        raise BadImageError(f"image shape={rgb.shape}; expected HxWx3 RGB")


def encode_jpeg(rgb: np.ndarray, quality: int = 90) -> bytes:
    """Encode an HxWx3 uint8 RGB image as JPEG bytes (``quality`` 1..100)."""
    _check_rgb(rgb)
    if not 1 <= quality <= 100:
        raise BadImageError(f"quality={quality}; expected 1..100")
    ok, buf = cv2.imencode(
        ".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, int(quality)]
    )
    if not ok:  # pragma: no cover - OpenCV only fails on invalid input, checked above
        raise BadImageError(f"JPEG encoding failed for shape={rgb.shape}")
    return buf.tobytes()


def encode_png(rgb: np.ndarray, compression: int = 1) -> bytes:
    """Encode an HxWx3 uint8 RGB image as PNG bytes (``compression`` 0..9; 1 is fast)."""
    _check_rgb(rgb)
    if not 0 <= compression <= 9:
        raise BadImageError(f"compression={compression}; expected 0..9")
    ok, buf = cv2.imencode(
        ".png", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_PNG_COMPRESSION, compression]
    )
    if not ok:  # pragma: no cover
        raise BadImageError(f"PNG encoding failed for shape={rgb.shape}")
    return buf.tobytes()


def encode_data_url(rgb: np.ndarray, fmt: str = "jpeg", quality: int = 90) -> str:
    """Encode an RGB image as a ``data:image/...;base64,`` URL (``fmt`` "jpeg" or "png")."""
    if fmt == "jpeg":
        return "data:image/jpeg;base64," + base64.b64encode(encode_jpeg(rgb, quality)).decode()
    if fmt == "png":
        return "data:image/png;base64," + base64.b64encode(encode_png(rgb)).decode()
    raise BadImageError(f"fmt={fmt!r}; expected 'jpeg' or 'png'")


# compressed_depth_image_transport prepends this to its PNG: int32 format, float depthQuantA,
# float depthQuantB (little-endian). 32FC1 depth is stored as quantized inverse depth.
_DEPTH_HEADER = struct.Struct("<iff")

# Errors Pillow raises for corrupt or truncated files (it has no single base class for them).
_DECODE_ERRORS = (
    OSError,
    SyntaxError,
    ValueError,
    EOFError,
    struct.error,
    zlib.error,
    Image.DecompressionBombError,
)


def compressed_to_rgb(
    format: str,  # the sensor_msgs/CompressedImage field name
    data: ImageData,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    *,
    value_range: tuple[float, float] | None = None,
) -> np.ndarray:
    """Decode a ``sensor_msgs/CompressedImage`` (JPEG or PNG) to HxWx3 uint8 RGB.

    The size declared in the file header is checked against ``max_pixels`` before the pixels
    are decoded (Pillow parses headers lazily), so a small file declaring a huge image is
    rejected cheaply. ``format`` strings from image_transport (``"jpeg"``, ``"bgr8; jpeg
    compressed bgr8"``, ``"16UC1; compressedDepth png"``) are accepted; the file content decides
    the codec. 16-bit PNG and compressedDepth images follow the 16-bit/float rule of the module
    docstring. Corrupt, truncated or non-JPEG/PNG data raises BadImageError.
    """
    buf = _as_byte_buffer(data)
    fmt = str(format)
    depth_quant: tuple[float, float] | None = None
    if "compresseddepth" in fmt.lower():
        if buf.nbytes < _DEPTH_HEADER.size:
            raise BadImageError(
                f"len(data)={buf.nbytes} is shorter than the {_DEPTH_HEADER.size}-byte "
                f"compressedDepth header (format={fmt!r})"
            )
        _, quant_a, quant_b = _DEPTH_HEADER.unpack_from(buf, 0)
        if fmt.strip().upper().startswith("32FC1"):
            depth_quant = (quant_a, quant_b)
        buf = buf[_DEPTH_HEADER.size :]
    if buf.nbytes == 0:
        raise BadImageError(f"data is empty (format={fmt!r})")
    try:
        with Image.open(io.BytesIO(buf), formats=("JPEG", "PNG")) as im:
            width, height = im.size
            _check_size(width, height, max_pixels, what=f"{im.format} header")
            im.load()
            if im.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
                array16 = np.asarray(im)
            else:
                return np.array(im.convert("RGB") if im.mode != "RGB" else im)
    except BadImageError:
        raise
    except Image.DecompressionBombError as exc:
        # Pillow refuses headers above twice its own limit before we see the size.
        raise BadImageError(
            f"compressed image declares too many pixels (max_pixels={max_pixels}): {exc}"
        ) from exc
    except _DECODE_ERRORS as exc:
        raise BadImageError(
            f"cannot decode compressed image (format={fmt!r}, {buf.nbytes} bytes): {exc}"
        ) from exc
    if depth_quant is not None:
        # compressed_depth_image_transport: depth = A / (q - B); q == 0 marks no reading.
        quant = array16.astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            depth = depth_quant[0] / (quant - depth_quant[1])
        depth[quant == 0] = np.nan
        array16 = depth
    return cv2.cvtColor(scale_to_uint8(array16, value_range), cv2.COLOR_GRAY2RGB)


class ImageFields(NamedTuple):
    """The fields of a ``sensor_msgs/Image`` (``is_bigendian`` is always 0 here)."""

    width: int
    height: int
    encoding: str
    step: int
    data: bytes


_FROM_RGB: dict[str, int | None] = {
    "rgb8": None,
    "bgr8": cv2.COLOR_RGB2BGR,
    "rgba8": cv2.COLOR_RGB2RGBA,
    "bgra8": cv2.COLOR_RGB2BGRA,
    "mono8": cv2.COLOR_RGB2GRAY,
}


def rgb_to_image_fields(rgb: np.ndarray, encoding: str = "rgb8") -> ImageFields:
    """Pack an HxWx3 uint8 RGB array into ``sensor_msgs/Image`` fields (no row padding).

    ``encoding`` is one of rgb8, bgr8, rgba8 (opaque alpha), bgra8, mono8. Used to publish
    annotated images and to build test inputs.
    """
    _check_rgb(rgb)
    if encoding not in _FROM_RGB:
        raise BadImageError(
            f"encoding={encoding!r} cannot be produced; expected one of {', '.join(_FROM_RGB)}"
        )
    code = _FROM_RGB[encoding]
    out = np.ascontiguousarray(rgb) if code is None else cv2.cvtColor(rgb, code)
    height, width = out.shape[:2]
    step = width * _LAYOUTS[encoding].bytes_per_pixel
    return ImageFields(width, height, encoding, step, out.tobytes())


@dataclass(frozen=True)
class ImageMessage:
    """A camera image's fields, raw (``sensor_msgs/Image``) or compressed (``CompressedImage``).

    Read from the wire (``core/cdr.read_frame``), a recording or a goal; the pixels of a raw
    image may be a view into the serialized message.
    """

    stamp_ns: int
    frame_id: str
    width: int = 0
    height: int = 0
    encoding: str = ""
    is_bigendian: bool = False
    step: int = 0
    data: bytes | memoryview = b""
    compressed_format: str | None = None  # set for a CompressedImage

    @property
    def compressed(self) -> bool:
        """True for a ``CompressedImage`` (JPEG/PNG bytes)."""
        return self.compressed_format is not None


def message_to_rgb(image: ImageMessage, max_pixels: int = DEFAULT_MAX_PIXELS,
                   size: tuple[int, int] | None = None) -> np.ndarray:
    """HxWx3 uint8 RGB of an ``ImageMessage``; raw images are resized on the way to ``size``.

    ``size`` applies to raw images only (a compressed image is decoded at its own size).
    """
    if image.compressed_format is not None:
        return compressed_to_rgb(image.compressed_format, bytes(image.data), max_pixels)
    return image_to_rgb(image.width, image.height, image.encoding, image.is_bigendian,
                        image.step, image.data, max_pixels=max_pixels, size=size)
