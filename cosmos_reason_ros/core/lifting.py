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
  ``percentile``..``100 - percentile`` range per axis, not min/max (yolo_ros users
  found 3D boxes "unreasonably small" from a naive min/max, mgonzs13/yolo_ros#117): stray pixels
  stretch a min/max box, and a plain percentile range shrinks it by the trimmed share. So the
  range is divided by the share of samples it covers, which gives a uniformly covered surface
  (a fronto-parallel rectangle) its true size.
- **Points** use a small patch (``patch_px`` square, in depth pixels) and the surface under
  the point's own pixel (the nearest dominant one when that pixel has no depth); a plane
  fitted to that surface's inverse depth gives the depth at the point's sub-pixel position
  (exact on planes, e.g. a floor at a grazing angle), and the position is on the exact ray
  through the point. Trajectories lift each waypoint.
- **Bounded cost, no sampling bias**: boxes larger than ``max_samples`` depth pixels are read
  on an even grid of about that many cells tiling the box exactly, one sample spread across
  each cell (all numpy, no per-pixel Python), so a goal's cost does not grow with box size and
  the centre and size match those from every pixel (a strided grid's samples overhang the box
  and the object's edges, shifting the centre and growing the size by up to a stride); the
  boxes (or points) of a goal go through each step together, one numpy call for all.
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
    is a box's extent along its own axes (zeros for points), which ``orientation`` (a unit
    quaternion x, y, z, w) turns into the position's frame: the camera's optical axes, so the
    identity until the item is moved into another frame. Position and size are NaN when
    ``valid`` is false, and ``reason`` says why (the 2D result stays usable). ``depth_m`` is
    the surface depth the estimate used; ``valid_pixels`` counts the valid depth pixels
    examined and ``used_pixels`` those on the chosen surface.
    """

    valid: bool
    position: tuple[float, float, float] = _NAN3
    size: tuple[float, float, float] = _NAN3
    depth_m: float = math.nan
    valid_pixels: int = 0
    used_pixels: int = 0
    reason: str = ""
    orientation: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 1.0)  # last: positional


DEFAULT_SETTINGS = LiftSettings()


def lift_box(
    depth: DepthImage | np.ndarray,
    camera: CameraModel,
    box: Box,
    scale: int = 1,
    settings: LiftSettings = DEFAULT_SETTINGS,
) -> Lifted:
    """Lift a box (colour-image pixels) to the 3D centre and size of the object it frames."""
    return _lift_boxes(_checked(depth, camera, scale), camera, (box,), scale, settings)[0]


def _lift_boxes(depth: DepthImage, camera: CameraModel, boxes: Sequence[Box], scale: int,
                settings: LiftSettings) -> tuple[Lifted, ...]:
    """Lift every box of a goal in one pass over all their depth samples.

    Why batched: a box is ~1 500 samples, so a numpy call on one box costs about as much in
    overhead as in work; one call per step for all boxes is measured in
    docs/bench/lifting-2026-12-02.md. The order statistics (one partition per box) stay per box.
    """
    lifted: list[Lifted | None] = [None] * len(boxes)
    grids: list[tuple[int, _Grid]] = []
    for k, box in enumerate(boxes):
        grid = _cell_grid(depth.shape, scale, box, settings.max_samples)
        if grid is None:
            lifted[k] = Lifted(False, reason="box lies outside the depth image")
        else:
            grids.append((k, grid))
    if not grids:
        return tuple(lifted)  # type: ignore[arg-type]
    sizes = np.array([g.rows * g.cols for _, g in grids])
    ends = np.cumsum(sizes).tolist()
    slope_x = np.empty(ends[-1], np.float32)
    slope_y = np.empty(ends[-1], np.float32)
    windows: list[tuple[int, np.ndarray]] = []  # (box, its depth samples)
    width = depth.shape[1]
    x_scale, y_scale = scale / camera.fx, scale / camera.fy
    x_zero, y_zero = (0.5 + camera.cx) / camera.fx, (0.5 + camera.cy) / camera.fy
    for (k, grid), end in zip(grids, ends, strict=True):
        # Continuous depth coordinates (pixel j spans [j, j + 1)) of each cell's sample: the
        # cell's centre plus an offset within +-(0.5 - 0.5 / n) of a cell, so strictly inside
        # the box's pixels; the pixel read, the floor, is one of them (coordinates >= 0, so
        # truncation is the floor).
        u = np.add.outer(_jitter(grid.rows), _halves(grid.cols))  # in cells
        u *= grid.cell_c
        u += grid.c_lo
        v = np.add.outer(_halves(grid.rows), _jitter(grid.cols))
        v *= grid.cell_r
        v += grid.r_lo
        flat = v.astype(np.intp)
        flat *= width
        flat += u.astype(np.intp)
        windows.append((k, depth.metres_at(flat)))
        # Back-project through K: continuous depth coordinate u is K's pixel u * scale - 0.5.
        np.subtract(u.ravel() * x_scale, x_zero, out=slope_x[end - flat.size:end])
        np.subtract(v.ravel() * y_scale, y_zero, out=slope_y[end - flat.size:end])
    z_all = np.concatenate([z.ravel() for _, z in windows])
    found = _surfaces(z_all, sizes, settings)
    used = np.flatnonzero(found.surface)  # samples on their box's surface, box after box
    zs = z_all[used]
    xyz = np.empty((3, used.size), np.float32)
    np.multiply(slope_x[used], zs, out=xyz[0])
    np.multiply(slope_y[used], zs, out=xyz[1])
    xyz[2] = zs
    used_ends = np.searchsorted(used, ends).tolist()
    for g, (k, z) in enumerate(windows):
        n_valid = found.n_valid[g]
        if not found.ok[g]:
            lifted[k] = Lifted(False, valid_pixels=n_valid, reason=_no_depth(
                z, n_valid, found.need[g], settings, "box"))
            continue
        own = xyz[:, (used_ends[g - 1] if g else 0):used_ends[g]]
        n = own.shape[1]
        k_lo = int(settings.percentile / 100.0 * n)
        k_hi = n - 1 - k_lo
        own.partition((k_lo, k_hi), axis=1)  # in place: only the two order statistics matter
        (x0, y0, z0), (x1, y1, z1) = own[:, k_lo].tolist(), own[:, k_hi].tolist()
        # The samples sit evenly across the surface (_jitter), like pixel centres: order
        # statistic k of n sits at (k + 0.5) / n of the extent.
        spread = n / (k_hi - k_lo) if k_hi > k_lo else 1.0
        lifted[k] = Lifted(True, position=((x0 + x1) / 2.0, (y0 + y1) / 2.0, (z0 + z1) / 2.0),
                           size=((x1 - x0) * spread, (y1 - y0) * spread, (z1 - z0) * spread),
                           depth_m=found.z_ref[g], valid_pixels=n_valid, used_pixels=n)
    return tuple(lifted)  # type: ignore[arg-type]


def lift_point(
    depth: DepthImage | np.ndarray,
    camera: CameraModel,
    point: Point,
    scale: int = 1,
    settings: LiftSettings = DEFAULT_SETTINGS,
) -> Lifted:
    """Lift a point (colour-image pixels) to the surface point on its ray."""
    return _lift_points(_checked(depth, camera, scale), camera, (point,), scale, settings)[0]


def lift_points(
    depth: DepthImage | np.ndarray,
    camera: CameraModel,
    points: Sequence[Point],
    scale: int = 1,
    settings: LiftSettings = DEFAULT_SETTINGS,
) -> tuple[Lifted, ...]:
    """Lift several points of one goal, in order (one batch, like :func:`lift_boxes`)."""
    return _lift_points(_checked(depth, camera, scale), camera, points, scale, settings)


def lift_trajectory(
    depth: DepthImage | np.ndarray,
    camera: CameraModel,
    trajectory: Trajectory,
    scale: int = 1,
    settings: LiftSettings = DEFAULT_SETTINGS,
) -> tuple[Lifted, ...]:
    """Lift each waypoint of a trajectory (a 3D path; invalid waypoints say why)."""
    return lift_points(depth, camera, trajectory.points, scale, settings)


def _lift_points(depth: DepthImage, camera: CameraModel, points: Sequence[Point], scale: int,
                 settings: LiftSettings) -> tuple[Lifted, ...]:
    height, width = depth.shape
    half = settings.patch_px // 2
    lifted: list[Lifted | None] = [None] * len(points)
    patches: list[tuple[int, int, int, np.ndarray]] = []  # (point, first row, first column, z)
    anchors = []
    for k, point in enumerate(points):
        if not (0.0 <= point.x <= width * scale and 0.0 <= point.y <= height * scale):
            lifted[k] = Lifted(False, reason="point lies outside the depth image")
            continue
        j = min(int(point.x / scale), width - 1)
        i = min(int(point.y / scale), height - 1)
        i0, j0 = max(i - half, 0), max(j - half, 0)
        z = depth.metres(slice(i0, i + half + 1), slice(j0, j + half + 1))
        patches.append((k, i0, j0, z))
        # The surface at the point: the one holding the point's own pixel when it has depth
        # (on a steep plane the nearest dominant part of the patch would be off by its slope).
        anchors.append(z[i - i0, j - j0])
    if not patches:
        return tuple(lifted)  # type: ignore[arg-type]
    sizes = np.array([z.size for *_, z in patches])
    found = _surfaces(np.concatenate([z.ravel() for *_, z in patches]), sizes, settings,
                      np.array(anchors, np.float64))
    start = 0
    for g, (k, i0, j0, z) in enumerate(patches):
        surface = found.surface[start:start + z.size].reshape(z.shape)
        start += z.size
        if not found.ok[g]:
            lifted[k] = Lifted(False, valid_pixels=found.n_valid[g],
                               reason=_no_depth(z, found.n_valid[g], found.need[g], settings,
                                                "point patch"))
            continue
        lifted[k] = _point_on_surface(camera, points[k], scale, settings, z, i0, j0, surface,
                                      found.z_ref[g], found.n_valid[g])
    return tuple(lifted)  # type: ignore[arg-type]


def _point_on_surface(camera: CameraModel, point: Point, scale: int, settings: LiftSettings,
                      z: np.ndarray, i0: int, j0: int, surface: np.ndarray, z_ref: float,
                      n_valid: int) -> Lifted:
    """Place a point on the surface found in its patch ``z`` (first pixel at i0, j0)."""
    slack = _tolerance(z_ref, settings)

    def fitted(r: np.ndarray, c: np.ndarray, max_error_m: float = math.inf) -> float | None:
        zs = z[r, c]
        z_fit = _plane_depth(zs, (c + j0 + 0.5) * scale - point.x,
                             (r + i0 + 0.5) * scale - point.y, max_error_m=max_error_m)
        # Trust the fit only within the depths it was fitted to (plus the surface tolerance).
        if z_fit is None or not float(zs.min()) - slack <= z_fit <= float(zs.max()) + slack:
            return None
        return z_fit

    r, c = np.nonzero(surface)
    z_point = fitted(r, c)
    if z_point is None:
        # On a steep plane at a coarse depth scale neighbouring depth pixels differ by more
        # than the surface tolerance: too few pixels lie within it, or they form a strip whose
        # depths the point lies just past. Fit every valid pixel of the patch instead, trusted
        # only if they all lie on one plane (within the tolerance).
        z_low = settings.min_m if settings.min_m > 0.0 else _TINY
        r, c = np.nonzero((z >= z_low) & (z <= settings.max_m))
        z_point = fitted(r, c, max_error_m=slack / 4)
    if z_point is None:
        z_point = z_ref
    x, y, _ = camera.back_project(point.x, point.y, z_point)
    return Lifted(True, position=(float(x), float(y), z_point), size=(0.0, 0.0, 0.0),
                  depth_m=z_point, valid_pixels=n_valid, used_pixels=int(r.size))


def lift_boxes(
    depth: DepthImage | np.ndarray,
    camera: CameraModel,
    boxes: Sequence[Box],
    scale: int = 1,
    settings: LiftSettings = DEFAULT_SETTINGS,
) -> tuple[Lifted, ...]:
    """Lift several boxes of one goal, in order (one batch: cheaper than box by box)."""
    return _lift_boxes(_checked(depth, camera, scale), camera, boxes, scale, settings)


# --- internals ------------------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def _halves(n: int) -> np.ndarray:
    """``k + 0.5`` for k < n: cell centres in cells (cached: boxes of a size recur)."""
    halves = np.arange(n) + 0.5
    halves.flags.writeable = False
    return halves


@functools.lru_cache(maxsize=64)
def _jitter(n: int) -> np.ndarray:
    """Return ``n`` offsets in (-0.5, 0.5): ``(k + 0.5) / n - 0.5`` in golden-ratio order.

    Evenly spaced, so the samples of a column of cells sit like the pixels of a finer grid
    (their mean offset is exactly 0: no shift of the centre); in golden-ratio order, so
    neighbouring rows (or columns) get far-apart offsets and an edge is seen in every part.
    """
    order = np.argsort(np.modf(np.arange(1, n + 1) * _GOLDEN)[0])
    offsets = np.empty(n)
    offsets[order] = (np.arange(n) + 0.5) / n - 0.5
    offsets.flags.writeable = False  # shared between calls
    return offsets


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


@dataclass(frozen=True)
class _Grid:
    """The cells a box is read on.

    ``rows`` x ``cols`` cells of ``cell_r`` x ``cell_c`` depth pixels, from pixel (``r_lo``,
    ``c_lo``), tiling the box's pixels exactly.
    """

    r_lo: int
    c_lo: int
    rows: int
    cols: int
    cell_r: float
    cell_c: float


def _cell_grid(shape: tuple[int, ...], scale: int, box: Box, max_samples: int) -> _Grid | None:
    """Return the even grid of cells a box's depth pixels are read on (None: outside the image).

    One cell per pixel for a box of up to ``max_samples`` pixels, else about ``max_samples``
    cells that tile the box exactly. Each cell is read at one point spread across it (the x
    offset follows the cell's row, the y offset its column, :func:`_jitter`), at the depth
    pixel under that point. So each column of cells samples its whole width evenly, and an
    object's edge inside a cell is seen in proportion to the part of the cell it covers: the
    percentiles of the samples are those of all the box's pixels, without the bias of a
    strided grid (whose samples stand for footprints overhanging the box and the object's
    edges, shifting the centre and growing the size by up to a stride).
    """
    height, width = shape
    x0, x1, y0, y1 = box.x_min, box.x_max, box.y_min, box.y_max
    # One test for all four: NaN and inf propagate through the sum (inf - inf is NaN too).
    if not math.isfinite(x0 + x1 + y0 + y1) or x1 < 0 or y1 < 0 or \
            x0 > width * scale or y0 > height * scale:
        return None
    c_lo, c_hi = _span(x0 / scale, x1 / scale, width)
    r_lo, r_hi = _span(y0 / scale, y1 / scale, height)
    n = (c_hi - c_lo) * (r_hi - r_lo)
    stride = max(1, math.ceil(math.sqrt(n / max_samples))) if n > max_samples else 1
    cols, rows = -(-(c_hi - c_lo) // stride), -(-(r_hi - r_lo) // stride)
    return _Grid(r_lo, c_lo, rows, cols, (r_hi - r_lo) / rows, (c_hi - c_lo) / cols)


def _span(a: float, b: float, size: int) -> tuple[int, int]:
    # Pixel j's centre is j + 0.5: j is inside [a, b) for ceil(a - 0.5) <= j < ceil(b - 0.5).
    lo = min(max(math.ceil(a - 0.5), 0), size)
    hi = min(max(math.ceil(b - 0.5), 0), size)
    if hi <= lo:  # thinner than a pixel: the pixel holding its middle
        lo = min(max(int((a + b) / 2.0), 0), size - 1)
        hi = lo + 1
    return lo, hi


@dataclass(frozen=True)
class _Surfaces:
    """The chosen surface of each segment of a sample array (lists are per segment)."""

    surface: np.ndarray  # mask over all samples: on its segment's surface (False if not ok)
    z_ref: list[float]  # the surface's depth
    n_valid: list[int]  # valid samples
    need: list[int]  # valid samples required
    ok: list[bool]  # enough valid samples to trust a surface


def _surfaces(z: np.ndarray, sizes: np.ndarray, settings: LiftSettings,
              anchors: np.ndarray | None = None) -> _Surfaces:
    """Find the surface in each segment of the flat samples ``z`` (segments of ``sizes``).

    A segment's surface is the one around its ``anchors`` entry when that is a valid depth,
    else the nearest dominant one (module docstring). All segments go through each step in
    one numpy call: the histograms share one bincount, each segment in its own row.
    """
    # Per-segment values reach the samples by np.repeat (segments are contiguous), which is
    # ~3x cheaper than indexing with a segment number per sample.
    count = sizes.size
    z_low = settings.min_m if settings.min_m > 0.0 else _TINY
    valid = (z >= z_low) & (z <= settings.max_m)  # NaN compares false (quietly): skipped too
    zv = z[valid]  # the valid samples, still in segment order
    n_valid = np.add.reduceat(valid, np.cumsum(sizes) - sizes, dtype=np.intp)
    valid_starts = np.minimum(np.cumsum(n_valid) - n_valid, max(zv.size - 1, 0))
    need = np.maximum(settings.min_valid_pixels,
                      np.ceil(settings.min_valid_fraction * sizes).astype(np.intp))
    ok = n_valid >= need
    z_peak = np.full(count, math.nan)
    if anchors is not None:
        anchored = (anchors >= z_low) & (anchors <= settings.max_m)
        z_peak[anchored] = anchors[anchored]
    histogram = ok & np.isnan(z_peak)
    if histogram.any():
        # (A segment without valid samples reads a neighbour's minimum: it is not ok anyway.)
        z_min = np.minimum.reduceat(zv, valid_starts).astype(np.float64)
        step = math.log1p(settings.bin_rel)
        bins = np.log(zv)
        bins -= np.repeat(np.log(z_min).astype(np.float32), n_valid)
        bins *= 1.0 / step
        bins = bins.astype(np.intp)
        width = int(bins.max()) + 5  # 2 empty bins either side: windows stay in their row
        bins += np.repeat(np.arange(count) * width + 2, n_valid)
        counts = np.bincount(bins, minlength=count * width).reshape(count, width)
        # Mass within +-2 bins (~ +-2 % of depth): a noisy surface spreads over neighbouring
        # bins. mass[:, b] is the window centred on bin b.
        total = np.zeros((count, width + 1), np.intp)
        np.cumsum(counts, axis=1, out=total[:, 1:])
        mass = total[:, 5:] - total[:, :-5]
        enough = mass >= (settings.surface_fraction * n_valid)[:, None]
        dense = enough.argmax(axis=1)  # first such bin
        rows = np.arange(count)
        # The fullest bin in that window. (Not climbing the smoothed mass: two surfaces a few
        # bins apart merge in it, and its peak would then lie between them.) Else depth is
        # spread thinly (e.g. a floor at a grazing angle): take the densest depth.
        peak = np.where(enough[rows, dense],
                        dense - 2 + counts[rows[:, None], dense[:, None] + np.arange(5)]
                        .argmax(axis=1),
                        mass.argmax(axis=1))
        z_peak = np.where(histogram, z_min * np.exp((peak + 0.5) * step), z_peak)
    # Refine: the median of the valid depths near the peak, then the pixels near that median.
    # Bounds in float32 like the samples: a float64 bound would split equal depths.
    tol = np.maximum(settings.surface_tol_m, settings.surface_tol_rel * z_peak)
    near_peak = zv >= np.repeat((z_peak - tol).astype(np.float32), n_valid)
    near_peak &= zv <= np.repeat((z_peak + tol).astype(np.float32), n_valid)
    near = zv[near_peak]
    near_ends = np.concatenate(([0], np.cumsum(near_peak)))[np.cumsum(n_valid)].tolist()
    z_ref = z_peak.tolist()
    start = 0
    for k, end in enumerate(near_ends):
        if end > start and ok[k]:
            z_ref[k] = _median(near[start:end])
        start = end
    z_ref_array = np.array(z_ref)
    tol = np.maximum(settings.surface_tol_m, settings.surface_tol_rel * z_ref_array)
    low = np.maximum(z_ref_array - tol, max(settings.min_m, _TINY))
    high = np.minimum(z_ref_array + tol, settings.max_m)
    low[~ok] = np.inf  # no surface where depth is too sparse to trust
    surface = z >= np.repeat(low.astype(np.float32), sizes)
    surface &= z <= np.repeat(high.astype(np.float32), sizes)
    return _Surfaces(surface, z_ref, n_valid.tolist(), need.tolist(), ok.tolist())


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
