"""Tests for cosmos_reason_ros.core.imaging: ROS image fields <-> numpy, codecs, resize."""

from __future__ import annotations

import array
import base64
import io
import struct
import zlib

import cv2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from cosmos_reason_ros.core import imaging
from cosmos_reason_ros.core.imaging import (
    SUPPORTED_ENCODINGS,
    ImageFields,
    bytes_per_pixel,
    compressed_to_rgb,
    encode_data_url,
    encode_jpeg,
    encode_png,
    image_to_rgb,
    image_view,
    resize_rgb,
    rgb_to_image_fields,
    scale_to_uint8,
)
from cosmos_reason_ros.core.types import BadImageError, ErrorCode

# --- helpers --------------------------------------------------------------------------------


def reference_rgb(width: int = 16, height: int = 12, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def smooth_rgb(width: int = 16, height: int = 12) -> np.ndarray:
    """An image whose horizontal pixel pairs are equal, so 4:2:2 chroma loses nothing."""
    rng = np.random.default_rng(1)
    half = rng.integers(20, 236, (height, width // 2, 3), dtype=np.uint8)
    return np.repeat(half, 2, axis=1)


def gradient_rgb(width: int = 64, height: int = 32) -> np.ndarray:
    """A smooth image with a different ramp per channel (JPEG keeps it nearly intact)."""
    x = np.linspace(0, 1, width)[None, :]
    y = np.linspace(0, 1, height)[:, None]
    channels = [200 * x + 20 + 0 * y, 220 * y + 10 + 0 * x, 120 + 60 * x * y + 0 * y]
    return np.stack(channels, axis=2).round().astype(np.uint8)


def pad_rows(packed: np.ndarray, height: int, padding: int, fill: int = 0xAB) -> bytes:
    """Lay ``packed`` (any dtype, C order) out as ``height`` rows plus ``padding`` bytes each."""
    raw = np.frombuffer(packed.tobytes(), np.uint8).reshape(height, -1)
    out = np.full((height, raw.shape[1] + padding), fill, np.uint8)
    out[:, : raw.shape[1]] = raw
    return out.tobytes()


def rgb_to_yuv422(rgb: np.ndarray, order: str) -> np.ndarray:
    """BT.601 limited-range 4:2:2 packing (what OpenCV's YUV2RGB_UYVY/YUYV decode)."""
    f = rgb.astype(np.float64)
    r, g, b = f[..., 0], f[..., 1], f[..., 2]
    y = 16 + 0.257 * r + 0.504 * g + 0.098 * b
    u = 128 - 0.148 * r - 0.291 * g + 0.439 * b
    v = 128 + 0.439 * r - 0.368 * g - 0.071 * b
    u2 = (u[:, 0::2] + u[:, 1::2]) / 2
    v2 = (v[:, 0::2] + v[:, 1::2]) / 2
    h, w = y.shape
    out = np.empty((h, w, 2), np.float64)
    if order == "uyvy":
        out[:, 0::2, 0], out[:, 1::2, 0] = u2, v2
        out[:, :, 1] = y
    else:  # yuyv
        out[:, :, 0] = y
        out[:, 0::2, 1], out[:, 1::2, 1] = u2, v2
    return np.clip(np.round(out), 0, 255).astype(np.uint8)


BAYER_OFFSETS = {  # (row, col) of R, G1, G2, B in the 2x2 block
    "bayer_rggb8": ((0, 0), (0, 1), (1, 0), (1, 1)),
    "bayer_bggr8": ((1, 1), (0, 1), (1, 0), (0, 0)),
    "bayer_gbrg8": ((1, 0), (0, 0), (1, 1), (0, 1)),
    "bayer_grbg8": ((0, 1), (0, 0), (1, 1), (1, 0)),
}


def bayer_mosaic(encoding: str, colour: tuple[int, int, int], width: int, height: int):
    r_off, g1_off, g2_off, b_off = BAYER_OFFSETS[encoding]
    m = np.zeros((height, width), np.uint8)
    m[r_off[0] :: 2, r_off[1] :: 2] = colour[0]
    m[g1_off[0] :: 2, g1_off[1] :: 2] = colour[1]
    m[g2_off[0] :: 2, g2_off[1] :: 2] = colour[1]
    m[b_off[0] :: 2, b_off[1] :: 2] = colour[2]
    return m


def encode_8bit(rgb: np.ndarray, encoding: str) -> np.ndarray:
    """The native layout of ``rgb`` in an 8-bit direct encoding, built with OpenCV."""
    codes = {
        "rgb8": None,
        "bgr8": cv2.COLOR_RGB2BGR,
        "8UC3": cv2.COLOR_RGB2BGR,
        "rgba8": cv2.COLOR_RGB2RGBA,
        "bgra8": cv2.COLOR_RGB2BGRA,
        "8UC4": cv2.COLOR_RGB2BGRA,
        "mono8": cv2.COLOR_RGB2GRAY,
        "8UC1": cv2.COLOR_RGB2GRAY,
    }
    code = codes[encoding]
    return rgb.copy() if code is None else cv2.cvtColor(rgb, code)


DIRECT_8BIT = ["rgb8", "bgr8", "8UC3", "rgba8", "bgra8", "8UC4", "mono8", "8UC1"]


def expected_rgb(rgb: np.ndarray, encoding: str) -> np.ndarray:
    if encoding in ("mono8", "8UC1"):
        return np.repeat(cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)[..., None], 3, axis=2)
    return rgb


def png_with_header(width: int, height: int) -> bytes:
    """A syntactically valid PNG header declaring ``width`` x ``height`` with a tiny IDAT."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body))
            + kind
            + body
            + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\x00" * 64))
        + chunk(b"IEND", b"")
    )


# --- 8-bit direct encodings -----------------------------------------------------------------


@pytest.mark.parametrize("encoding", DIRECT_8BIT)
@pytest.mark.parametrize("padding", [0, 5])
def test_direct_8bit_encodings_convert_to_reference_rgb(encoding: str, padding: int) -> None:
    rgb = reference_rgb(17, 9)
    native = encode_8bit(rgb, encoding)
    step = 17 * bytes_per_pixel(encoding) + padding
    out = image_to_rgb(17, 9, encoding, False, step, pad_rows(native, 9, padding))
    assert out.shape == (9, 17, 3) and out.dtype == np.uint8
    np.testing.assert_array_equal(out, expected_rgb(rgb, encoding))


@pytest.mark.parametrize("encoding", DIRECT_8BIT)
def test_fused_resize_equals_convert_then_resize(encoding: str) -> None:
    rgb = reference_rgb(64, 48)
    native = encode_8bit(rgb, encoding)
    step = 64 * bytes_per_pixel(encoding)
    full = image_to_rgb(64, 48, encoding, False, step, native.tobytes())
    fused = image_to_rgb(64, 48, encoding, False, step, native.tobytes(), size=(32, 24))
    np.testing.assert_allclose(fused, resize_rgb(full, 32, 24), atol=1)


def test_every_data_type_gives_the_same_result() -> None:
    rgb = reference_rgb(8, 6)
    raw = rgb.tobytes()
    inputs = [
        raw,
        bytearray(raw),
        memoryview(raw),
        array.array("B", raw),
        np.frombuffer(raw, np.uint8).copy(),
        rgb.copy(),  # a 3-D uint8 array is accepted too
    ]
    for data in inputs:
        np.testing.assert_array_equal(image_to_rgb(8, 6, "rgb8", 0, 24, data), rgb)


def test_encoding_names_match_ignoring_case() -> None:
    rgb = reference_rgb(4, 2)
    bgr = encode_8bit(rgb, "bgr8").tobytes()
    np.testing.assert_array_equal(image_to_rgb(4, 2, "8uc3", 0, 12, bgr), rgb)
    np.testing.assert_array_equal(image_to_rgb(4, 2, "BGR8", 0, 12, bgr), rgb)


def test_result_is_an_owned_writable_copy() -> None:
    data = np.ascontiguousarray(reference_rgb(8, 4))
    out = image_to_rgb(8, 4, "rgb8", 0, 24, data)
    assert not np.shares_memory(out, data)
    assert out.flags.writeable and out.flags.c_contiguous
    out[:] = 0
    assert data.any()


# --- YUV and Bayer --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("encoding", "order"),
    [("yuv422", "uyvy"), ("uyvy", "uyvy"), ("yuv422_yuy2", "yuyv"), ("yuyv", "yuyv")],
)
@pytest.mark.parametrize("padding", [0, 6])
def test_yuv422_encodings_decode_to_reference(encoding: str, order: str, padding: int) -> None:
    rgb = smooth_rgb(16, 10)
    packed = rgb_to_yuv422(rgb, order)
    out = image_to_rgb(16, 10, encoding, 0, 32 + padding, pad_rows(packed, 10, padding))
    assert out.shape == (10, 16, 3)
    assert np.abs(out.astype(int) - rgb.astype(int)).max() <= 3


def test_yuv422_matches_opencv_encoder_when_available() -> None:
    if not hasattr(cv2, "COLOR_RGB2YUV_UYVY"):
        pytest.skip("this OpenCV has no RGB->UYVY encoder")
    rgb = smooth_rgb(16, 8)
    packed = cv2.cvtColor(rgb, cv2.COLOR_RGB2YUV_UYVY)
    out = image_to_rgb(16, 8, "yuv422", 0, 32, packed.tobytes())
    assert np.abs(out.astype(int) - rgb.astype(int)).max() <= 3


@pytest.mark.parametrize("encoding", list(BAYER_OFFSETS))
@pytest.mark.parametrize("colour", [(200, 100, 50), (10, 240, 130)])
def test_bayer_flat_colour_demosaics_to_that_colour(encoding: str, colour) -> None:
    mosaic = bayer_mosaic(encoding, colour, 12, 8)
    out = image_to_rgb(12, 8, encoding, 0, 16, pad_rows(mosaic, 8, 4))
    # Border pixels depend on OpenCV's edge handling; the interior must be exact.
    interior = out[2:-2, 2:-2].reshape(-1, 3)
    assert (np.abs(interior.astype(int) - np.array(colour)) <= 1).all(), interior[:3]


# --- 16-bit and float -----------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["mono16", "16UC1"])
@pytest.mark.parametrize("bigendian", [False, True])
@pytest.mark.parametrize("padding", [0, 3])
def test_16bit_scales_min_max_and_honours_byte_order(encoding, bigendian, padding) -> None:
    values = np.array([[1000, 2000, 3000], [1000, 1500, 3000]], np.uint16)
    native = values.astype(">u2" if bigendian else "<u2")
    out = image_to_rgb(3, 2, encoding, bigendian, 6 + padding, pad_rows(native, 2, padding))
    expected = np.array([[0, 128, 255], [0, 64, 255]], np.uint8)
    np.testing.assert_array_equal(out[..., 0], expected)
    np.testing.assert_array_equal(out[..., 0], out[..., 2])


@pytest.mark.parametrize("bigendian", [False, True])
def test_32fc1_non_finite_values_become_zero(bigendian: bool) -> None:
    values = np.array([[np.nan, 1.0, 2.0], [3.0, np.inf, -np.inf]], np.float32)
    native = values.astype(">f4" if bigendian else "<f4")
    out = image_to_rgb(3, 2, "32FC1", bigendian, 12, native.tobytes())
    np.testing.assert_array_equal(out[..., 1], np.array([[0, 0, 128], [255, 0, 0]], np.uint8))


def test_fixed_value_range_clips_and_is_frame_independent() -> None:
    values = np.array([[0.0, 5.0, 10.0, 20.0]], np.float32)
    out = image_to_rgb(4, 1, "32FC1", 0, 16, values.tobytes(), value_range=(0.0, 10.0))
    np.testing.assert_array_equal(out[0, :, 0], [0, 128, 255, 255])


def test_constant_and_all_nan_frames_map_to_zero() -> None:
    assert not scale_to_uint8(np.full((2, 2), 7, np.uint16)).any()
    assert not scale_to_uint8(np.full((2, 2), np.nan, np.float32)).any()
    with pytest.raises(BadImageError, match="value_range"):
        scale_to_uint8(np.zeros((1, 1), np.float32), (1.0, 1.0))


# --- zero-copy views ------------------------------------------------------------------------


def test_view_of_numpy_data_shares_memory_and_skips_padding() -> None:
    rgb = reference_rgb(10, 4)
    data = np.frombuffer(pad_rows(rgb, 4, 7), np.uint8).copy()
    view = image_view(10, 4, "rgb8", 0, 37, data)
    assert view.shape == (4, 10, 3)
    assert np.shares_memory(view, data)
    np.testing.assert_array_equal(view, rgb)
    assert not view.flags.writeable


def test_view_of_bytearray_is_live_not_copied() -> None:
    data = bytearray(12)
    view = image_view(4, 3, "mono8", 0, 4, data)
    data[5] = 99
    assert view[1, 1] == 99


def test_view_of_array_array_shares_memory() -> None:
    data = array.array("B", bytes(range(24)))
    view = image_view(4, 3, "16UC1", 0, 8, data)
    assert np.shares_memory(view, np.frombuffer(data, np.uint8))
    assert view[0, 0] == 0x0100


def test_big_endian_view_is_zero_copy_and_reads_right_values() -> None:
    values = np.array([[1, 258, 65535]], ">u2")
    data = np.frombuffer(values.tobytes(), np.uint8).copy()
    view = image_view(3, 1, "mono16", 1, 6, data)
    assert np.shares_memory(view, data)
    np.testing.assert_array_equal(view, [[1, 258, 65535]])


def test_yuv_and_bayer_view_shapes() -> None:
    assert image_view(4, 2, "yuv422", 0, 8, bytes(16)).shape == (2, 4, 2)
    assert image_view(4, 2, "bayer_rggb8", 0, 4, bytes(8)).shape == (2, 4)


# --- errors ---------------------------------------------------------------------------------


def test_unknown_encoding_lists_supported_ones() -> None:
    with pytest.raises(BadImageError) as info:
        image_to_rgb(2, 2, "nv12", 0, 2, bytes(4))
    message = str(info.value)
    assert "encoding='nv12'" in message
    for name in SUPPORTED_ENCODINGS:
        assert name in message
    assert info.value.code is ErrorCode.BAD_IMAGE


@pytest.mark.parametrize(
    ("width", "height", "field"), [(0, 2, "width=0"), (2, 0, "height=0"), (-1, 2, "width=-1")]
)
def test_non_positive_size_is_rejected(width: int, height: int, field: str) -> None:
    with pytest.raises(BadImageError, match=field):
        image_to_rgb(width, height, "mono8", 0, 2, bytes(4))


def test_step_smaller_than_a_row_is_rejected_with_the_numbers() -> None:
    with pytest.raises(BadImageError) as info:
        image_to_rgb(10, 2, "rgb8", 0, 29, bytes(58))
    message = str(info.value)
    assert "step=29" in message and "10 x 3 = 30" in message


@pytest.mark.parametrize("length", [59, 61, 0])
def test_data_length_must_equal_step_times_height(length: int) -> None:
    with pytest.raises(BadImageError) as info:
        image_to_rgb(10, 2, "rgb8", 0, 30, bytes(length))
    message = str(info.value)
    assert f"len(data)={length}" in message and "30 x 2 = 60" in message


def test_huge_size_is_rejected_before_looking_at_data() -> None:
    # No 1e10-byte buffer exists: the pixel bound must fire before the length check.
    with pytest.raises(BadImageError, match="max_pixels=50000000"):
        image_to_rgb(100_000, 100_000, "rgb8", 0, 300_000, b"")
    with pytest.raises(BadImageError, match="4x4 = 16 pixels exceeds max_pixels=15"):
        image_to_rgb(4, 4, "mono8", 0, 4, bytes(16), max_pixels=15)


def test_numpy_integer_sizes_do_not_overflow_the_bound() -> None:
    side = np.uint32(100_000)  # side * side wraps around in uint32
    with pytest.raises(BadImageError, match="exceeds max_pixels"):
        image_to_rgb(side, side, "mono8", 0, 100_000, b"")


def test_odd_width_yuv422_is_rejected() -> None:
    with pytest.raises(BadImageError, match="width=5 is odd"):
        image_to_rgb(5, 2, "yuv422", 0, 10, bytes(20))


def test_tiny_bayer_is_rejected() -> None:
    with pytest.raises(BadImageError, match="1x4"):
        image_to_rgb(1, 4, "bayer_rggb8", 0, 1, bytes(4))


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ([0, 1, 2, 3], "type list"),
        (np.zeros(4, np.uint16), "dtype=uint16"),
        (array.array("H", [0, 1]), "item size 2"),
    ],
)
def test_unsupported_data_types_are_rejected(data, match: str) -> None:
    with pytest.raises(BadImageError, match=match):
        image_to_rgb(2, 2, "mono8", 0, 2, data)


def test_bad_step_type_and_target_size_are_rejected() -> None:
    with pytest.raises(BadImageError, match="step=2.0"):
        image_to_rgb(2, 2, "mono8", 0, 2.0, bytes(4))  # type: ignore[arg-type]
    with pytest.raises(BadImageError, match="target width=0"):
        image_to_rgb(2, 2, "mono8", 0, 2, bytes(4), size=(0, 1))


# --- resize ---------------------------------------------------------------------------------


def test_resize_is_a_no_op_at_the_same_size() -> None:
    rgb = reference_rgb(8, 6)
    assert resize_rgb(rgb, 8, 6) is rgb


def test_resize_shrink_averages_areas() -> None:
    image = np.zeros((2, 4, 3), np.uint8)
    image[:, :2] = 100
    image[:, 2:] = 200
    out = resize_rgb(image, 2, 1)
    np.testing.assert_array_equal(out[0, :, 0], [100, 200])


@pytest.mark.parametrize(
    ("source", "target"),
    [((1920, 1080), (1504, 832)), ((1280, 720), (320, 176)), ((641, 481), (200, 150))],
)
def test_resize_shrink_stays_close_to_area_averaging(source, target) -> None:
    # Covers bilinear (< 2x), integer box filter + bilinear, and the non-divisible fallback.
    image = gradient_rgb(*source)
    out = resize_rgb(image, *target)
    assert out.shape == (target[1], target[0], 3)
    reference = cv2.resize(image, target, interpolation=cv2.INTER_AREA)
    assert np.abs(out.astype(int) - reference.astype(int)).max() <= 2


def test_resize_box_filters_noise_when_shrinking_a_lot() -> None:
    # A one-pixel checkerboard averages to grey; plain bilinear sampling would alias.
    board = (np.indices((64, 64)).sum(axis=0) % 2 * 255).astype(np.uint8)
    out = resize_rgb(np.repeat(board[..., None], 3, axis=2), 12, 12)
    assert np.abs(out.astype(int) - 128).max() <= 2


def test_resize_enlarge_and_invalid_sizes() -> None:
    assert resize_rgb(reference_rgb(4, 3), 9, 7).shape == (7, 9, 3)
    with pytest.raises(BadImageError, match="target size 0x3"):
        resize_rgb(reference_rgb(4, 3), 0, 3)


# --- compressed -----------------------------------------------------------------------------


def test_png_round_trip_is_exact() -> None:
    rgb = reference_rgb(20, 10)
    np.testing.assert_array_equal(compressed_to_rgb("png", encode_png(rgb)), rgb)


def test_jpeg_round_trip_is_close_and_format_string_is_informational() -> None:
    rgb = gradient_rgb(64, 32)
    data = encode_jpeg(rgb, quality=95)
    assert data[:2] == b"\xff\xd8"
    for fmt in ("jpeg", "bgr8; jpeg compressed bgr8", "png"):  # content decides the codec
        out = compressed_to_rgb(fmt, array.array("B", data))
        assert out.shape == rgb.shape
        assert np.abs(out.astype(int) - rgb.astype(int)).max() <= 6


@pytest.mark.parametrize("mode", ["L", "RGBA", "P", "LA"])
def test_png_modes_convert_to_rgb(mode: str) -> None:
    buf = io.BytesIO()
    Image.fromarray(reference_rgb(6, 4)).convert(mode).save(buf, "PNG")
    out = compressed_to_rgb("png", buf.getvalue())
    assert out.shape == (4, 6, 3) and out.dtype == np.uint8 and out.flags.writeable


def test_16bit_png_follows_the_scaling_rule() -> None:
    values = np.array([[100, 200, 300]], np.uint16)
    ok, png = cv2.imencode(".png", values)
    assert ok
    out = compressed_to_rgb("16UC1; png", png.tobytes())
    np.testing.assert_array_equal(out[0, :, 0], [0, 128, 255])


def test_compressed_depth_16uc1_and_32fc1() -> None:
    values = np.array([[0, 1000, 2000]], np.uint16)
    ok, png = cv2.imencode(".png", values)
    header = struct.pack("<iff", 0, 0.0, 0.0)
    out = compressed_to_rgb("16UC1; compressedDepth png", header + png.tobytes())
    np.testing.assert_array_equal(out[0, :, 0], [0, 128, 255])
    # 32FC1: depth = A / (q - B); q == 0 is "no reading" -> 0.
    quant = np.array([[0, 100, 200, 300]], np.uint16)
    ok, png = cv2.imencode(".png", quant)
    header = struct.pack("<iff", 0, 600.0, 0.0)  # depths: -, 6, 3, 2 m
    out = compressed_to_rgb("32FC1; compressedDepth", header + png.tobytes())
    np.testing.assert_array_equal(out[0, :, 0], [0, 255, 64, 0])
    with pytest.raises(BadImageError, match="12-byte compressedDepth header"):
        compressed_to_rgb("16UC1; compressedDepth png", b"\x00" * 5)


def test_corrupt_truncated_and_empty_compressed_data_raise() -> None:
    rgb = reference_rgb(64, 48)
    for data in (encode_jpeg(rgb)[:300], encode_png(rgb)[:200]):
        with pytest.raises(BadImageError, match="cannot decode"):
            compressed_to_rgb("jpeg", data)
    with pytest.raises(BadImageError, match="cannot decode"):
        compressed_to_rgb("jpeg", b"definitely not an image")
    with pytest.raises(BadImageError, match="data is empty"):
        compressed_to_rgb("jpeg", b"")


def test_other_image_formats_are_refused() -> None:
    buf = io.BytesIO()
    Image.fromarray(reference_rgb(4, 4)).save(buf, "BMP")
    with pytest.raises(BadImageError, match="cannot decode"):
        compressed_to_rgb("bmp", buf.getvalue())


@pytest.mark.parametrize(("side", "match"), [(8000, "8000x8000"), (30000, "too many pixels")])
def test_huge_declared_png_is_rejected_from_its_header(side: int, match: str) -> None:
    bomb = png_with_header(side, side)
    assert len(bomb) < 200
    with pytest.raises(BadImageError, match=match):
        compressed_to_rgb("png", bomb)


def test_max_pixels_applies_to_compressed_images() -> None:
    png = encode_png(reference_rgb(10, 10))
    with pytest.raises(BadImageError, match="PNG header size 10x10 = 100 pixels"):
        compressed_to_rgb("png", png, max_pixels=99)
    assert compressed_to_rgb("png", png, max_pixels=100).shape == (10, 10, 3)


# --- encoding and publishing ----------------------------------------------------------------


def test_data_urls_decode_back() -> None:
    rgb = reference_rgb(8, 8)
    url = encode_data_url(rgb, "png")
    assert url.startswith("data:image/png;base64,")
    decoded = compressed_to_rgb("png", base64.b64decode(url.split(",", 1)[1]))
    np.testing.assert_array_equal(decoded, rgb)
    assert encode_data_url(rgb).startswith("data:image/jpeg;base64,/9j/")
    with pytest.raises(BadImageError, match="fmt='gif'"):
        encode_data_url(rgb, "gif")


@pytest.mark.parametrize(
    ("image", "match"),
    [
        (np.zeros((4, 4), np.uint8), "shape=\\(4, 4\\)"),
        (np.zeros((4, 4, 3), np.float32), "dtype=float32"),
        (np.zeros((0, 4, 3), np.uint8), "shape=\\(0, 4, 3\\)"),
    ],
)
def test_encoders_reject_non_rgb_arrays(image: np.ndarray, match: str) -> None:
    for encode in (encode_jpeg, encode_png, rgb_to_image_fields):
        with pytest.raises(BadImageError, match=match):
            encode(image)
    with pytest.raises(BadImageError, match="quality=0"):
        encode_jpeg(reference_rgb(2, 2), quality=0)


@pytest.mark.parametrize("encoding", ["rgb8", "bgr8", "rgba8", "bgra8", "mono8"])
def test_image_fields_round_trip(encoding: str) -> None:
    rgb = reference_rgb(7, 5)
    fields = rgb_to_image_fields(rgb, encoding)
    assert isinstance(fields, ImageFields) and isinstance(fields.data, bytes)
    width, height, enc, step, data = fields
    assert (width, height, enc) == (7, 5, encoding)
    assert step == 7 * bytes_per_pixel(encoding) and len(data) == step * height
    np.testing.assert_array_equal(
        image_to_rgb(width, height, enc, 0, step, data), expected_rgb(rgb, encoding)
    )
    with pytest.raises(BadImageError, match="encoding='yuv422' cannot be produced"):
        rgb_to_image_fields(rgb, "yuv422")


# --- properties -----------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(
    width=st.integers(1, 40),
    height=st.integers(1, 30),
    padding=st.integers(0, 9),
    encoding=st.sampled_from(DIRECT_8BIT + ["mono16", "16UC1", "32FC1"]),
    bigendian=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_view_reads_back_any_layout(width, height, padding, encoding, bigendian, seed) -> None:
    rng = np.random.default_rng(seed)
    layout = imaging._layout(encoding)
    order = ">" if bigendian else "<"
    dtype = np.dtype(order + layout.dtype) if layout.itemsize > 1 else np.dtype(np.uint8)
    shape = (height, width) if layout.channels == 1 else (height, width, layout.channels)
    if dtype.kind == "f":
        values = rng.standard_normal(shape).astype(dtype)
    else:
        values = rng.integers(0, np.iinfo(dtype).max, shape, endpoint=True).astype(dtype)
    step = width * layout.bytes_per_pixel + padding
    data = np.frombuffer(pad_rows(values, height, padding), np.uint8).copy()
    view = image_view(width, height, encoding, bigendian, step, data)
    assert np.shares_memory(view, data)
    np.testing.assert_array_equal(view, values)
    out = image_to_rgb(width, height, encoding, bigendian, step, data)
    assert out.shape == (height, width, 3) and out.dtype == np.uint8


@settings(max_examples=40, deadline=None)
@given(
    width=st.integers(1, 30).map(lambda n: 2 * n),
    height=st.integers(1, 20),
    padding=st.integers(0, 7),
    order=st.sampled_from(["uyvy", "yuyv"]),
)
def test_yuv_round_trip_any_size(width: int, height: int, padding: int, order: str) -> None:
    rgb = smooth_rgb(width, height)
    packed = rgb_to_yuv422(rgb, order)
    out = image_to_rgb(
        width, height, order, 0, 2 * width + padding, pad_rows(packed, height, padding)
    )
    assert np.abs(out.astype(int) - rgb.astype(int)).max() <= 3


@settings(max_examples=150, deadline=None)
@given(
    codec=st.sampled_from(["jpeg", "png"]),
    edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=6),
    cut=st.one_of(st.none(), st.integers(0, 10**6)),
)
def test_damaged_compressed_data_raises_only_bad_image(codec, edits, cut) -> None:
    rgb = gradient_rgb(24, 16)
    data = bytearray(encode_jpeg(rgb) if codec == "jpeg" else encode_png(rgb))
    for position, value in edits:
        data[position % len(data)] = value
    if cut is not None:
        del data[cut % len(data) :]
    try:
        out = compressed_to_rgb(codec, bytes(data), max_pixels=10_000)
    except BadImageError:
        return
    assert out.ndim == 3 and out.shape[2] == 3 and out.dtype == np.uint8
