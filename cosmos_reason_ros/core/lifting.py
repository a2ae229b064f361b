"""Lift 2D boxes, points and trajectories to 3D with a registered depth image and intrinsics.

Inputs are a depth image (a :class:`~cosmos_reason_ros.core.rgbd.DepthImage`, stored units
read as metres pixel by pixel, or an array already in metres), registered to the colour image
at an integer down-scale ``scale``
(:func:`~cosmos_reason_ros.core.rgbd.check_registration`), the colour camera's
:class:`~cosmos_reason_ros.core.rgbd.CameraModel` (rectified images assumed), and 2D items in
continuous colour-image pixels. Outputs are in the camera's optical frame (x right, y down,
z forward, metres).

Estimation, and why:

- **Invalid depth is skipped**: 0 (16UC1 "no return"), NaN/inf (32FC1), and anything outside
  ``[min_m, max_m]``. Too few valid pixels makes that item invalid with a reason; the caller
  keeps its 2D result.
- **Box depth = the nearest dominant surface**, not the median of the box nor the depth at its
  centre pixel (yolo_ros keeps pixels within 0.3 m of the centre pixel, mgonzs13/yolo_ros#13,
  which fails when that pixel is a hole or background): a box around an object also covers the
  table or wall behind it, and with a thin object the background can be most of the box. Valid
  depths go into a histogram with bins proportional to depth (``bin_rel``, so sensor noise that
  grows with depth spans the same number of bins); the nearest bin whose neighbourhood (+-2
  bins) holds ``surface_fraction`` of the valid pixels gives a first guess (the fullest bin
  there), refined to the median of the pixels within ``surface_tol_rel`` of it. Small nearer
  clutter (an occluding edge, flying pixels) holds less than the fraction and is passed over.
- **Box centre and size from that surface's pixels back-projected through K**, using the
  ``percentile``..``100 - percentile`` range per axis, not min/max (issue #19 cites yolo_ros
  3D boxes "unreasonably small" from a naive min/max, mgonzs13/yolo_ros#117): stray pixels
  stretch a min/max box, and a plain percentile range shrinks it by the trimmed share. So the
  range is divided by the share of samples it covers, which gives a uniformly covered surface
  (a fronto-parallel rectangle) its true size.
- **Points** use a small patch (``patch_px`` square, in depth pixels) and the surface under
  the point's own pixel (the nearest dominant one when that pixel has no depth); a plane
  fitted to that surface's inverse depth gives the depth at the point's sub-pixel position
  (exact on planes, e.g. a floor at a grazing angle), and the position is on the exact ray
  through the point. Trajectories lift each waypoint.
- **Bounded cost**: boxes larger than ``max_samples`` depth pixels are read on a regular
  strided grid (all numpy, no per-pixel Python), so a goal's cost does not grow with box size.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cosmos_reason_ros.core.rgbd import CameraModel, DepthImage
from cosmos_reason_ros.core.types import BadImageError, BadRequestError, Box, Point, Trajectory

_NAN3 = (math.nan, math.nan, math.nan)
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0  # most evenly spread fractional sequence k * _GOLDEN
_TINY = float(np.finfo(np.float32).tiny)  # smallest positive depth: 0 is "no return"
_WINDOW = np.ones(5, dtype=np.intp)


@dataclass(frozen=True)
class LiftSettings:
    """How depth is read; the node fills it once from its ``depth.*`` parameters."""

    min_m: float = 0.1  # nearer depth is invalid (below every RGB-D camera's minimum range)
    max_m: float = 10.0  # farther depth is invalid (too noisy to trust)
    min_valid_pixels: int = 5  # an item needs at least this many valid depth pixels ...
    min_valid_fraction: float = 0.1  # ... and at least this share of the pixels it covers
    surface_fraction: float = 0.15  # nearest surface holding >= this share of valid pixels
    bin_rel: float = 0.01  # histogram bin width as a fraction of depth
    surface_tol_rel: float = 0.04  # pixels within max(tol_rel * depth, tol_m) of the surface
    surface_tol_m: float = 0.02
    percentile: float = 5.0  # centre/size from the [p, 100 - p] percentile range per axis
    patch_px: int = 5  # side of the square patch read around a point, in depth pixels
    max_samples: int = 2048  # larger boxes are read on a strided grid of about this many

    def __post_init__(self) -> None:
        """Validate once, naming the field, so a bad parameter fails at startup."""
        checks = (
            ("min_m", self.min_m >= 0.0),
            ("max_m", self.max_m > self.min_m),
            ("min_valid_pixels", self.min_valid_pixels >= 1),
            ("min_valid_fraction", 0.0 <= self.min_valid_fraction <= 1.0),
            ("surface_fraction", 0.0 < self.surface_fraction <= 1.0),
            ("bin_rel", 0.0 < self.bin_rel <= 0.5),
            ("surface_tol_rel", self.surface_tol_rel >= 0.0),
            ("surface_tol_m", self.surface_tol_m >= 0.0),
            ("percentile", 0.0 <= self.percentile < 50.0),
            ("patch_px", self.patch_px >= 1 and self.patch_px % 2 == 1),
            ("max_samples", self.max_samples >= 16),
        )
        for name, ok in checks:
            value = getattr(self, name)
            if not ok or not math.isfinite(value):
                raise BadRequestError(
                    f"depth setting {name}={value!r} is out of range (min_m >= 0, max_m > "
                    "min_m, fractions in [0, 1], percentile in [0, 50), odd patch_px >= 1, "
                    "max_samples >= 16)"
                )


@dataclass(frozen=True)
class Lifted:
    """One 2D item lifted to 3D, in the camera's optical frame (metres).

    ``position`` is the centre (box) or the surface point on the pixel's ray (point); ``size``
    is a box's extent along x, y, z (zeros for points). Both are NaN when ``valid`` is false,
    and ``reason`` says why (the 2D result stays usable). ``depth_m`` is the surface depth the
    estimate used; ``valid_pixels`` counts the valid depth pixels examined and ``used_pixels``
    those on the chosen surface.
    """

    valid: bool
    position: tuple[float, float, float] = _NAN3
    size: tuple[float, float, float] = _NAN3
    depth_m: float = math.nan
    valid_pixels: int = 0
    used_pixels: int = 0
    reason: str = ""


DEFAULT_SETTINGS = LiftSettings()


def lift_box(
    depth: DepthImage | np.ndarray,
    camera: CameraModel,
    box: Box,
    scale: int = 1,
    settings: LiftSettings = DEFAULT_SETTINGS,
) -> Lifted:
    """Lift a box (colour-image pixels) to the 3D centre and size of the object it frames."""
    return _lift_box(_checked(depth, camera, scale), camera, box, scale, settings)


def _lift_box(depth: DepthImage, camera: CameraModel, box: Box, scale: int,
              settings: LiftSettings) -> Lifted:
    window = _pixel_window(depth.shape, scale, box.x_min, box.x_max, box.y_min, box.y_max,
                           settings.max_samples)
    if window is None:
        return Lifted(False, reason="box lies outside the depth image")
    rows, cols, stride = window
    z = depth.metres(rows, cols)  # one contiguous gather; the passes below run faster
    found = _surface(z, settings, "box")
    if isinstance(found, Lifted):
        return found
    surface, z_ref, n_valid = found
    # Back-project through K: depth pixel j's centre is colour pixel (j + 0.5) * scale, i.e.
    # K's pixel coordinate (j + 0.5) * scale - 0.5. Each sample stands for its footprint
    # (stride x stride depth pixels); spreading the samples across it (a golden-ratio offset by
    # row for x, by column for y) makes percentiles of the grid behave like those of the
    # continuous surface, so the range divided by the share it covers is the full extent --
    # without it, quantised percentiles are off by up to a sample on each side.
    step = stride * scale
    n_rows, n_cols = z.shape
    ax, ay = _ray_slopes(camera, scale, *depth.shape)
    slope_x = np.add.outer(_jitter(n_rows) * (step / camera.fx), ax[cols])
    slope_y = np.add.outer(ay[rows], _jitter(n_cols) * (step / camera.fy))
    zs = z[surface]
    n = zs.size
    xyz = np.empty((3, n), np.float32)
    np.multiply(slope_x[surface], zs, out=xyz[0])
    np.multiply(slope_y[surface], zs, out=xyz[1])
    xyz[2] = zs
    k_lo = int(settings.percentile / 100.0 * n)
    k_hi = n - 1 - k_lo
    xyz.partition((k_lo, k_hi), axis=1)  # in place: only the two order statistics are needed
    (x0, y0, z0), (x1, y1, z1) = xyz[:, k_lo].tolist(), xyz[:, k_hi].tolist()
    # Order statistic k of n uniform samples sits at (k + 1) / (n + 1) of the range on average.
    spread = (n + 1) / (k_hi - k_lo) if k_hi > k_lo else 1.0
    return Lifted(True, position=((x0 + x1) / 2.0, (y0 + y1) / 2.0, (z0 + z1) / 2.0),
                  size=((x1 - x0) * spread, (y1 - y0) * spread, (z1 - z0) * spread),
                  depth_m=z_ref, valid_pixels=n_valid, used_pixels=n)


def lift_point(
    depth: DepthImage | np.ndarray,
    camera: CameraModel,
    point: Point,
    scale: int = 1,
    settings: LiftSettings = DEFAULT_SETTINGS,
) -> Lifted:
    """Lift a point (colour-image pixels) to the surface point on its ray."""
    return _lift_point(_checked(depth, camera, scale), camera, point, scale, settings)


def _lift_point(depth: DepthImage, camera: CameraModel, point: Point, scale: int,
                settings: LiftSettings) -> Lifted:
    height, width = depth.shape
    if not (0.0 <= point.x <= width * scale and 0.0 <= point.y <= height * scale):
        return Lifted(False, reason="point lies outside the depth image")
    half = settings.patch_px // 2
    j = min(int(point.x / scale), width - 1)
    i = min(int(point.y / scale), height - 1)
    i0, j0 = max(i - half, 0), max(j - half, 0)
    z = depth.metres(slice(i0, i + half + 1), slice(j0, j + half + 1))
    # The surface at the point: the one holding the point's own pixel when it has depth (on
    # a steep plane the nearest dominant part of the patch would be off by the patch's slope).
    found = _surface(z, settings, "point patch", anchor=depth.at(i, j))
    if isinstance(found, Lifted):
        return found
    surface, z_ref, n_valid = found
    r, c = np.nonzero(surface)
    zs = z[r, c]
    z_point = _plane_depth(zs, (c + j0 + 0.5) * scale - point.x,
                           (r + i0 + 0.5) * scale - point.y)
    if z_point is None:
        # Too few pixels within the surface tolerance: on a steep plane at a coarse depth
        # scale neighbouring depth pixels differ by more than it. Fit every valid pixel of the
        # patch instead, trusted only if they all lie on one plane (within the tolerance).
        z_low = settings.min_m if settings.min_m > 0.0 else _TINY
        r, c = np.nonzero((z >= z_low) & (z <= settings.max_m))
        zs = z[r, c]
        z_point = _plane_depth(zs, (c + j0 + 0.5) * scale - point.x,
                               (r + i0 + 0.5) * scale - point.y,
                               max_error_m=_tolerance(z_ref, settings) / 4)
    # Trust the fit only within the depths it was fitted to (plus the surface tolerance).
    slack = _tolerance(z_ref, settings)
    if z_point is None or not float(zs.min()) - slack <= z_point <= float(zs.max()) + slack:
        z_point = z_ref
    x, y, _ = camera.back_project(point.x, point.y, z_point)
    return Lifted(True, position=(float(x), float(y), z_point), size=(0.0, 0.0, 0.0),
                  depth_m=z_point, valid_pixels=n_valid, used_pixels=int(r.size))


def lift_trajectory(
    depth: DepthImage | np.ndarray,
    camera: CameraModel,
    trajectory: Trajectory,
    scale: int = 1,
    settings: LiftSettings = DEFAULT_SETTINGS,
) -> tuple[Lifted, ...]:
    """Lift each waypoint of a trajectory (a 3D path; invalid waypoints say why)."""
    checked = _checked(depth, camera, scale)
    return tuple(_lift_point(checked, camera, p, scale, settings) for p in trajectory.points)


def lift_boxes(
    depth: DepthImage | np.ndarray,
    camera: CameraModel,
    boxes: Sequence[Box],
    scale: int = 1,
    settings: LiftSettings = DEFAULT_SETTINGS,
) -> tuple[Lifted, ...]:
    """Lift several boxes of one goal (convenience for the node and replay)."""
    checked = _checked(depth, camera, scale)
    return tuple(_lift_box(checked, camera, b, scale, settings) for b in boxes)


# --- internals ------------------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def _ray_slopes(camera: CameraModel, scale: int, height: int,
                width: int) -> tuple[np.ndarray, np.ndarray]:
    """x/z and y/z of the rays through each depth column and row centre (per camera, cached)."""
    ax = ((np.arange(width) + 0.5) * scale - 0.5 - camera.cx) / camera.fx
    ay = ((np.arange(height) + 0.5) * scale - 0.5 - camera.cy) / camera.fy
    ax, ay = ax.astype(np.float32), ay.astype(np.float32)
    ax.flags.writeable = ay.flags.writeable = False  # shared between calls
    return ax, ay


_JITTER = (np.modf(np.arange(1, 4097) * _GOLDEN)[0] - 0.5).astype(np.float32)


def _jitter(n: int) -> np.ndarray:
    """Offsets in (-0.5, 0.5), evenly spread for any prefix (golden-ratio sequence)."""
    if n <= _JITTER.size:
        return _JITTER[:n]
    return (np.modf(np.arange(1, n + 1) * _GOLDEN)[0] - 0.5).astype(np.float32)


def _checked(depth: DepthImage | np.ndarray, camera: CameraModel, scale: int) -> DepthImage:
    """Return ``depth`` as a DepthImage (an array is in metres), checked for wiring mistakes.

    Cheap checks only; registration itself is checked by check_registration.
    """
    raw = depth.raw if isinstance(depth, DepthImage) else depth
    if not isinstance(raw, np.ndarray) or raw.ndim != 2 or raw.size == 0:
        raise BadImageError(
            f"depth image has shape {getattr(raw, 'shape', None)}; expected (height, width)"
        )
    if isinstance(scale, bool) or not isinstance(scale, int) or scale < 1:
        raise BadRequestError(f"depth scale={scale!r}; expected a positive integer")
    height, width = raw.shape
    if camera.width and (width * scale, height * scale) != (camera.width, camera.height):
        raise BadImageError(
            f"depth image {width}x{height} at scale {scale} does not cover the camera's "
            f"{camera.width}x{camera.height} image"
        )
    return depth if isinstance(depth, DepthImage) else DepthImage(depth)


def _pixel_window(
    shape: tuple[int, ...], scale: int, x0: float, x1: float, y0: float, y1: float,
    max_samples: int,
) -> tuple[slice, slice, int] | None:
    """Depth pixels whose centres lie in the box, as (row slice, column slice, stride)."""
    height, width = shape
    # One test for all four: NaN and inf propagate through the sum (inf - inf is NaN too).
    if not math.isfinite(x0 + x1 + y0 + y1) or x1 < 0 or y1 < 0 or \
            x0 > width * scale or y0 > height * scale:
        return None
    cols = _span(x0 / scale, x1 / scale, width)
    rows = _span(y0 / scale, y1 / scale, height)
    n = (cols[1] - cols[0]) * (rows[1] - rows[0])
    stride = max(1, math.ceil(math.sqrt(n / max_samples))) if n > max_samples else 1
    return _strided(rows, stride), _strided(cols, stride), stride


def _span(a: float, b: float, size: int) -> tuple[int, int]:
    # Pixel j's centre is j + 0.5: j is inside [a, b) for ceil(a - 0.5) <= j < ceil(b - 0.5).
    lo = min(max(math.ceil(a - 0.5), 0), size)
    hi = min(max(math.ceil(b - 0.5), 0), size)
    if hi <= lo:  # thinner than a pixel: the pixel holding its middle
        lo = min(max(int((a + b) / 2.0), 0), size - 1)
        hi = lo + 1
    return lo, hi


def _strided(span: tuple[int, int], stride: int) -> slice:
    lo, hi = span
    # Centre the grid in the span so subsampling does not shift the estimate to one side.
    start = lo + ((hi - lo - 1) % stride) // 2
    return slice(start, hi, stride)


def _surface(
    z: np.ndarray, settings: LiftSettings, what: str, anchor: float = math.nan
) -> tuple[np.ndarray, float, int] | Lifted:
    """Find the surface in ``z``: (mask, depth, valid count), or an invalid result.

    The surface is the one around ``anchor`` when that is a valid depth, else the nearest
    dominant one.
    """
    n = z.size
    z_low = settings.min_m if settings.min_m > 0.0 else _TINY
    valid = (z >= z_low) & (z <= settings.max_m)  # NaN compares false (quietly): skipped too
    zv = z[valid]
    n_valid = zv.size
    need = max(settings.min_valid_pixels, math.ceil(settings.min_valid_fraction * n))
    if n_valid < need:
        return Lifted(False, valid_pixels=n_valid, reason=_no_depth(z, n_valid, need, settings,
                                                                    what))
    if z_low <= anchor <= settings.max_m:
        return _refine(z, zv, anchor, settings, n_valid)
    z_min = float(zv.min())
    step = math.log1p(settings.bin_rel)
    bins = np.log(zv)
    bins -= math.log(z_min)
    bins *= 1.0 / step
    counts = np.bincount(bins.astype(np.intp))
    # Mass within +-2 bins (~ +-2 % of depth): a noisy surface spreads over neighbouring bins.
    mass = np.correlate(counts, _WINDOW, mode="same")
    dense = int((mass >= settings.surface_fraction * n_valid).argmax())  # first such bin
    if mass[dense] >= settings.surface_fraction * n_valid:
        # The fullest bin in that window. (Not climbing the smoothed mass: two surfaces a few
        # bins apart merge in it, and its peak would then lie between them.)
        first = max(dense - 2, 0)
        peak = first + int(counts[first:dense + 3].argmax())
    else:  # depth spread thinly (e.g. a floor at a grazing angle): take the densest depth
        peak = int(mass.argmax())
    return _refine(z, zv, z_min * math.exp((peak + 0.5) * step), settings, n_valid)


def _refine(z: np.ndarray, zv: np.ndarray, z_peak: float, settings: LiftSettings,
            n_valid: int) -> tuple[np.ndarray, float, int]:
    """Median of the valid depths near ``z_peak``, and the mask of pixels near that median."""
    tol = _tolerance(z_peak, settings)
    near = zv[(zv >= z_peak - tol) & (zv <= z_peak + tol)]
    z_ref = _median(near) if near.size else z_peak
    tol = _tolerance(z_ref, settings)
    z_low = max(z_ref - tol, settings.min_m, _TINY)
    surface = (z >= z_low) & (z <= min(z_ref + tol, settings.max_m))
    return surface, z_ref, n_valid


def _plane_depth(z: np.ndarray, du: np.ndarray, dv: np.ndarray,
                 max_error_m: float = math.inf) -> float | None:
    """Depth at offset (0, 0) of a plane fitted to the patch, or None if it is ill-posed.

    Inverse depth of a plane is affine in pixel coordinates, so fitting ``1/z = a + b du +
    c dv`` is exact on any plane and reads the depth at the point's sub-pixel position: on a
    floor seen at a grazing angle, depth changes by centimetres per pixel (z^2 / (h fy)).
    None too when a pixel's depth differs from the plane by more than ``max_error_m``.
    """
    if z.size < 6:
        return None
    design = np.stack((np.ones(z.size), du, dv), axis=1)
    inverse = 1.0 / z.astype(np.float64)
    coef, _, rank, _ = np.linalg.lstsq(design, inverse, rcond=None)
    if rank < 3 or not coef[0] > 0.0:
        return None
    if math.isfinite(max_error_m):
        fitted = design @ coef
        if not np.all(fitted > 0.0) or float(np.max(np.abs(1.0 / fitted - 1.0 / inverse))) \
                > max_error_m:
            return None
    return float(1.0 / coef[0])


def _tolerance(depth: float, settings: LiftSettings) -> float:
    return max(settings.surface_tol_m, settings.surface_tol_rel * depth)


def _median(values: np.ndarray) -> float:
    """Median of ``values``, which it reorders (callers pass a fresh copy)."""
    n = values.size
    half = n // 2
    if n % 2:
        values.partition(half)
        return float(values[half])
    values.partition((half - 1, half))
    return (float(values[half - 1]) + float(values[half])) / 2.0


def _no_depth(z: np.ndarray, n_valid: int, need: int, settings: LiftSettings, what: str) -> str:
    """Say why an item has no depth: missing returns, or values outside the range (units?)."""
    n = z.size
    measured = z[np.isfinite(z) & (z > 0.0)]
    outside = measured.size - n_valid
    limits = f"[{settings.min_m:g}, {settings.max_m:g}] m"
    if n_valid == 0 and outside > 0:
        median = _median(measured.astype(np.float64))
        hint = ""
        if median >= 50.0 * settings.max_m or median <= settings.min_m / 50.0:
            # A factor-1000 error is the classic unit mix-up (16UC1 mm read as m or back).
            hint = "; check the depth unit (16UC1 millimetres, 32FC1 metres, depth.scale)"
        return (f"all depth outside {limits}: {outside} of {n} pixels in {what} measured, "
                f"median {median:.4g} m{hint}")
    return (f"no valid depth in {what}: {n_valid} of {n} pixels valid "
            f"({n - measured.size} missing, {outside} outside {limits}), need >= {need}")
