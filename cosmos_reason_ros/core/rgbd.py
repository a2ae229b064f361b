"""RGB-D camera inputs: pinhole intrinsics, depth image decoding, and the registration check.

The ROS layer passes the plain fields of ``sensor_msgs/CameraInfo`` and ``sensor_msgs/Image``;
everything here is pure numpy so that the node, offline replay and the unit tests share it.

Pixel convention (one for the whole package): box and point coordinates are *continuous*
colour-image pixels, x right, y down, pixel ``i`` covering ``[i, i + 1)`` (so a full-image box
is ``0..width``). ``K`` in ``CameraInfo`` follows ROS/OpenCV, where pixel ``i``'s *centre* is at
``i``; :class:`CameraModel` converts between the two (``u = x - 0.5``), a half-pixel that would
otherwise shift every lifted position by ``0.5 * z / fx`` (0.8 mm at 1 m, fx 600).

3D positions are in the camera's optical frame (REP 103): x right, y down, z forward, metres.

Errors: a depth image or CameraInfo that cannot give correct geometry raises
:class:`~cosmos_reason_ros.core.types.BadImageError` naming the field, the value and what is
expected -- never silently wrong geometry.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from cosmos_reason_ros.core.imaging import DEFAULT_MAX_PIXELS, ImageData, image_view
from cosmos_reason_ros.core.types import BadImageError, BadRequestError

DEPTH_UNITS_M: dict[str, float] = {"16UC1": 0.001, "32FC1": 1.0}
"""Metres per depth unit by encoding, as REP 118 defines them: 16UC1 millimetres, 32FC1 metres.

Mixing the two up is the classic failure (yolo_ros: 3D detections "far-off" until its fixed
unit divisor was changed, mgonzs13/yolo_ros#105), so the unit is taken from the encoding and
only an explicit ``depth.scale`` overrides it.
"""

DEPTH_ENCODINGS: tuple[str, ...] = tuple(DEPTH_UNITS_M)
"""Depth encodings :func:`depth_image` accepts (matched ignoring case)."""

_Num = TypeVar("_Num", float, np.ndarray)


@dataclass(frozen=True)
class CameraModel:
    """Pinhole intrinsics of the colour camera (``CameraInfo``), for rectified images.

    Rectified images are assumed: lifting uses ``fx, fy, cx, cy`` only and never undistorts.
    ``distortion`` is kept so that the node can warn once when it is non-zero
    (:attr:`has_distortion`), i.e. when the image may still be distorted and positions away
    from the image centre are off by the lens distortion.
    """

    fx: float
    fy: float
    cx: float
    cy: float
    width: int  # of the colour image the intrinsics belong to; 0 = not given
    height: int
    frame_id: str = ""
    distortion_model: str = ""
    distortion: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        """Refuse intrinsics that cannot project (uncalibrated zeros, NaN, negative sizes)."""
        for name in ("fx", "fy"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0.0):
                raise BadImageError(
                    f"camera_info {name}={value!r}: expected a positive focal length in pixels "
                    "(an all-zero K means the camera is not calibrated)"
                )
        for name in ("cx", "cy"):
            if not math.isfinite(getattr(self, name)):
                raise BadImageError(f"camera_info {name}={getattr(self, name)!r}: not finite")
        for name in ("width", "height"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise BadImageError(
                    f"camera_info {name}={value!r}: expected a non-negative integer"
                )

    @classmethod
    def from_camera_info_fields(
        cls,
        k: Sequence[float],
        d: Sequence[float],
        width: int,
        height: int,
        frame_id: str = "",
        distortion_model: str = "",
        p: Sequence[float] | None = None,
        rectified: bool = False,
    ) -> CameraModel:
        """Build from the fields of a ``sensor_msgs/CameraInfo`` (row-major ``k``, ``p``).

        ``rectified=True`` says the colour topic is already rectified (``image_rect*``): then
        the intrinsics come from the projection matrix ``p`` (what ROS defines for rectified
        images) and the distortion is dropped, since it was already removed. Otherwise ``k``
        is used and ``d`` kept, so :attr:`has_distortion` can flag a possibly distorted image.
        """
        k_values = _floats(k, 9, "k")
        fx, fy, cx, cy = k_values[0], k_values[4], k_values[2], k_values[5]
        distortion = tuple(_floats(d, None, "d"))
        if rectified:
            if p is not None and any(p):
                p_values = _floats(p, 12, "p")
                fx, fy, cx, cy = p_values[0], p_values[5], p_values[2], p_values[6]
            distortion = ()
        return cls(fx=fx, fy=fy, cx=cx, cy=cy, width=int(width), height=int(height),
                   frame_id=str(frame_id), distortion_model=str(distortion_model),
                   distortion=distortion)

    @property
    def has_distortion(self) -> bool:
        """Whether any distortion coefficient is non-zero (the node then warns once)."""
        return any(c != 0.0 for c in self.distortion)

    def project(self, x: _Num, y: _Num, z: _Num) -> tuple[_Num, _Num]:
        """Project optical-frame points (metres) to continuous pixel coordinates."""
        return self.fx * x / z + self.cx + 0.5, self.fy * y / z + self.cy + 0.5

    def back_project(self, u: _Num, v: _Num, z: _Num) -> tuple[_Num, _Num, _Num]:
        """Return the optical-frame point at depth ``z`` on the ray through pixel ``(u, v)``.

        ``u, v`` are continuous pixel coordinates (the package's convention), ``z`` the depth
        along the optical axis (what a depth image holds), not the range along the ray.
        """
        return (u - 0.5 - self.cx) * z / self.fx, (v - 0.5 - self.cy) * z / self.fy, z


def _floats(values: Sequence[float], length: int | None, name: str) -> list[float]:
    try:
        out = [float(v) for v in values]
    except (TypeError, ValueError):
        raise BadImageError(f"camera_info {name}={values!r}: expected numbers") from None
    if length is not None and len(out) != length:
        raise BadImageError(f"camera_info {name} has {len(out)} values; expected {length}")
    return out


@dataclass(frozen=True)
class DepthImage:
    """A depth image as stored (a zero-copy view) and its metres per stored unit.

    Lifting converts only the pixels it reads (:meth:`metres`): converting a whole 640x480
    16UC1 frame to float metres cost ~0.3 ms a goal, more than a typical box's lift.
    """

    raw: np.ndarray  # (height, width): uint16, float32 or float64, any byte order
    unit_m: float = 1.0

    @property
    def shape(self) -> tuple[int, int]:
        """``(height, width)``."""
        return self.raw.shape  # type: ignore[return-value]

    def metres(self, rows: slice = slice(None), cols: slice = slice(None)) -> np.ndarray:
        """Return ``raw[rows, cols]`` (default: all) in metres, a native-order float array."""
        return self._in_metres(self.raw[rows, cols])

    def metres_at(self, flat: np.ndarray) -> np.ndarray:
        """Return the pixels at row-major indices ``flat`` (``row * width + col``) in metres.

        A gather through one flat index is ~4x cheaper than indexing by row and column arrays;
        a padded image (rows farther apart than the width) is read by row and column instead.
        """
        if self.raw.flags.c_contiguous:
            return self._in_metres(self.raw.ravel().take(flat))
        rows, cols = np.divmod(flat, self.raw.shape[1])
        return self._in_metres(self.raw[rows, cols])

    def _in_metres(self, window: np.ndarray) -> np.ndarray:
        if self.unit_m == 1.0 and window.dtype.kind == "f":
            return np.ascontiguousarray(window, dtype=window.dtype.newbyteorder("="))
        return np.multiply(window, np.float32(self.unit_m), dtype=np.float32)


def depth_image(
    encoding: str,
    width: int,
    height: int,
    step: int,
    data: ImageData,
    is_bigendian: bool | int = False,
    scale: float | None = None,
    *,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> DepthImage:
    """Read a depth ``sensor_msgs/Image`` as a :class:`DepthImage` (no copy, no conversion).

    16UC1 is millimetres and 32FC1 metres (REP 118) unless ``scale`` (metres per stored unit,
    the node's ``depth.scale``) overrides it, e.g. ``0.0001`` for a 16UC1 camera in 0.1 mm.
    Invalid pixels stay recognisable: 16UC1 zeros read as 0.0, 32FC1 NaN/inf stay as they are;
    :mod:`~cosmos_reason_ros.core.lifting` skips both. Row padding and big-endian data are
    handled. Raises BadImageError for another encoding or inconsistent fields, and
    BadRequestError for a non-positive ``scale``.
    """
    key = str(encoding).strip().upper()
    if key not in DEPTH_UNITS_M:
        raise BadImageError(
            f"depth encoding={encoding!r} is not supported; expected 16UC1 (millimetres) or "
            "32FC1 (metres); for other units of these encodings set depth.scale"
        )
    if scale is not None and (
        isinstance(scale, bool) or not math.isfinite(float(scale)) or float(scale) <= 0.0
    ):
        raise BadRequestError(
            f"depth.scale={scale!r}: expected a positive number of metres per depth unit "
            "(e.g. 0.001 for millimetres), or unset for the encoding's own unit"
        )
    view = image_view(width, height, key, is_bigendian, step, data, max_pixels=max_pixels)
    return DepthImage(view, DEPTH_UNITS_M[key] if scale is None else float(scale))


def _size(value: Sequence[int], name: str) -> tuple[int, int]:
    try:
        w, h = value
    except (TypeError, ValueError):
        raise BadImageError(f"{name}={value!r}: expected (width, height)") from None
    for v in (w, h):
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v <= 0:
            raise BadImageError(f"{name}={value!r}: expected positive integer (width, height)")
    return int(w), int(h)


def check_registration(
    colour_size: Sequence[int],
    depth_size: Sequence[int],
    colour_frame_id: str,
    depth_frame_id: str,
    registered_frame_id: str = "",
    camera: CameraModel | None = None,
) -> int:
    """Check that a depth image is registered to the colour image; return the down-scale.

    Sizes are ``(width, height)``. The depth image must have the colour image's size or an
    exact integer down-scale of it (e.g. 320x240 for 640x480 gives 2), and its ``frame_id``
    must be the colour image's or the declared ``registered_frame_id``. If ``camera`` (the
    colour CameraInfo) is given, its size (when set) and frame_id must match the colour image
    too. Anything else raises BadImageError with a specific message: unregistered depth gives
    plausible-looking but wrong 3D positions (depth assumed registered without checking),
    so it is refused rather than used.
    """
    cw, ch = _size(colour_size, "colour image size")
    dw, dh = _size(depth_size, "depth image size")
    factor = cw // dw if dw <= cw else 0
    if factor < 1 or cw != dw * factor or ch != dh * factor:
        raise BadImageError(
            f"depth image {dw}x{dh} does not fit colour image {cw}x{ch}: expected the same size "
            f"or an exact integer down-scale of it (e.g. {cw // 2}x{ch // 2}); publish depth "
            "aligned to the colour camera (e.g. RealSense align_depth.enable:=true)"
        )
    allowed = {colour_frame_id} | ({registered_frame_id} if registered_frame_id else set())
    if depth_frame_id not in allowed:
        declared = (f" or the declared registered frame {registered_frame_id!r}"
                    if registered_frame_id else "")
        raise BadImageError(
            f"depth frame_id={depth_frame_id!r} is not the colour frame_id="
            f"{colour_frame_id!r}{declared}: depth must be registered to the colour camera "
            "(use the aligned depth topic, e.g. aligned_depth_to_color/image_raw) or declare "
            "its frame as registered"
        )
    if camera is not None:
        if (camera.width or camera.height) and (camera.width, camera.height) != (cw, ch):
            raise BadImageError(
                f"camera_info size {camera.width}x{camera.height} does not match the colour "
                f"image {cw}x{ch}: expected the CameraInfo of the colour image"
            )
        if camera.frame_id and camera.frame_id != colour_frame_id:
            raise BadImageError(
                f"camera_info frame_id={camera.frame_id!r} is not the colour frame_id="
                f"{colour_frame_id!r}: expected the CameraInfo of the colour camera"
            )
    return factor
