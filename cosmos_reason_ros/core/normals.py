"""The local surface normal under a pixel, from the depth patch around it: a grasp's approach.

A grasp or place planner takes a pose, not a point: where to go and from which direction. The
direction is the surface's normal at the target, estimated here from a registered depth image
(the same inputs as :mod:`~cosmos_reason_ros.core.lifting`, whose validity range it shares).

Estimation, and why:

- **A patch of fixed size on the surface, not in pixels**: ``patch_m`` wide at the surface's
  depth (clamped to ``[min_patch_px, max_patch_px]`` depth pixels), so the fit spans the same
  metric baseline near and far; sensor noise grows with depth, and a few pixels at 3 m would
  tilt with every noisy sample.
- **Holes and out-of-range pixels are skipped** (0, NaN, inf, outside ``[min_m, max_m]``); a
  patch with too few valid pixels gives no normal and a reason, never a NaN pose.
- **A least-squares plane in inverse depth**: a plane's ``1/z`` is affine in the normalised
  image coordinates, whose coefficients are along its normal. Depth noise is along the ray;
  a total-least-squares fit of back-projected points treats it as isotropic and tilts the
  normal away from the ray by several degrees at 1 % noise (its variance is comparable to a
  8 cm patch's extent), while regressing the noisy ``1/z`` on noise-free pixel coordinates
  does not. Exact on exact planes at any angle.
- **Robust**: the fit starts from the pixels next to the target and is refitted on the pixels
  within 3 robust standard deviations (1.4826 x the median absolute residual), so flying
  pixels and a sliver of background at the patch's edge are dropped.
- **Facing the camera**: the normal returned points out of the surface toward the camera
  (``n . p < 0`` for the patch's centre ``p``), since that is the side the camera sees.

Approach frame convention (:func:`approach_orientation`): the pose's z axis is the approach
direction, into the surface (minus the outward normal); its x axis is the camera's x (image
right) projected onto the surface plane (the camera's y, image down, when the approach is
along the camera's x); y completes a right-handed frame. So a surface facing the camera
squarely gives the camera's own optical orientation, and the frame turns with the surface.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cosmos_reason_ros.core.lifting import DEFAULT_SETTINGS, LiftSettings
from cosmos_reason_ros.core.rgbd import CameraModel, DepthImage
from cosmos_reason_ros.core.types import BadRequestError

_NAN3 = (math.nan, math.nan, math.nan)
_NAN4 = (math.nan, math.nan, math.nan, math.nan)
_TINY = float(np.finfo(np.float32).tiny)  # smallest positive depth: 0 is "no return"


@dataclass(frozen=True)
class NormalSettings:
    """How the patch around a target is read."""

    patch_m: float = 0.08  # patch side on the surface, metres (about a gripper's span)
    min_patch_px: int = 7  # ... but at least this many depth pixels a side
    max_patch_px: int = 41  # ... and at most this many (bounded cost near the camera)
    min_valid_fraction: float = 0.3  # a patch needs this share of its pixels valid ...
    min_valid_pixels: int = 12  # ... and at least this many
    iterations: int = 4  # robust refits (outlier trimming)

    def __post_init__(self) -> None:
        """Validate once, naming the field."""
        checks = (
            ("patch_m", self.patch_m > 0.0 and math.isfinite(self.patch_m)),
            ("min_patch_px", self.min_patch_px >= 3),
            ("max_patch_px", self.max_patch_px >= self.min_patch_px),
            ("min_valid_fraction", 0.0 <= self.min_valid_fraction <= 1.0),
            ("min_valid_pixels", self.min_valid_pixels >= 3),
            ("iterations", self.iterations >= 1),
        )
        for name, ok in checks:
            if not ok:
                raise BadRequestError(
                    f"normal setting {name}={getattr(self, name)!r} is out of range (patch_m > "
                    "0, 3 <= min_patch_px <= max_patch_px, fraction in [0, 1], "
                    "min_valid_pixels >= 3, iterations >= 1)")


DEFAULT_NORMAL_SETTINGS = NormalSettings()


@dataclass(frozen=True)
class SurfaceNormal:
    """The surface normal at a pixel, in the camera's optical frame.

    ``normal`` is a unit vector out of the surface toward the camera; ``orientation`` the
    approach frame (x, y, z, w; module docstring) whose z is ``-normal``. Both are NaN when
    ``valid`` is false, and ``reason`` says why. ``used_pixels`` counts the plane's inliers
    and ``rms_m`` is their distance to it.
    """

    valid: bool
    normal: tuple[float, float, float] = _NAN3
    orientation: tuple[float, float, float, float] = _NAN4
    used_pixels: int = 0
    rms_m: float = math.nan
    reason: str = ""


def surface_normal(
    depth: DepthImage | np.ndarray,
    camera: CameraModel,
    u: float,
    v: float,
    scale: int = 1,
    lift: LiftSettings = DEFAULT_SETTINGS,
    settings: NormalSettings = DEFAULT_NORMAL_SETTINGS,
) -> SurfaceNormal:
    """Estimate the surface normal at colour pixel ``(u, v)`` (continuous pixels).

    ``depth`` is registered to the colour image at integer down-scale ``scale`` (an array is in
    metres); ``lift`` gives the valid depth range.
    """
    image = depth if isinstance(depth, DepthImage) else DepthImage(np.asarray(depth))
    height, width = image.shape
    if not (math.isfinite(u) and math.isfinite(v)
            and 0.0 <= u <= width * scale and 0.0 <= v <= height * scale):
        return SurfaceNormal(False, reason=f"target pixel ({u:g}, {v:g}) lies outside the "
                                           "depth image")
    i = min(int(v / scale), height - 1)
    j = min(int(u / scale), width - 1)
    z_low = lift.min_m if lift.min_m > 0.0 else _TINY

    def window(half: int) -> tuple[int, int, np.ndarray]:
        i0, j0 = max(i - half, 0), max(j - half, 0)
        return i0, j0, image.metres(slice(i0, i + half + 1), slice(j0, j + half + 1))

    # The patch side in pixels from the depth near the target (the smallest patch's median).
    *_, near = window(settings.min_patch_px // 2)
    near_valid = near[(near >= z_low) & (near <= lift.max_m)]
    side = settings.min_patch_px
    if near_valid.size:
        z_near = float(np.median(near_valid))
        side = int(settings.patch_m * camera.fx / (z_near * scale))
        side = min(max(side, settings.min_patch_px), settings.max_patch_px)
    half = side // 2
    i0, j0, z = window(half)
    valid = (z >= z_low) & (z <= lift.max_m)  # NaN compares false: a hole too
    n_valid = int(np.count_nonzero(valid))
    need = max(settings.min_valid_pixels, math.ceil(settings.min_valid_fraction * z.size))
    if n_valid < need:
        return SurfaceNormal(False, used_pixels=n_valid, reason=(
            f"depth patch too sparse for a surface normal: {n_valid} of {z.size} pixels valid "
            f"in the {z.shape[1]}x{z.shape[0]} patch, need >= {need}"))
    r, c = np.nonzero(valid)
    zs = z[r, c].astype(np.float64)
    # Normalised image coordinates of each pixel's ray (x/z, y/z): noise-free, unlike depth.
    x_ray = ((c + j0 + 0.5) * scale - 0.5 - camera.cx) / camera.fx
    y_ray = ((r + i0 + 0.5) * scale - 0.5 - camera.cy) / camera.fy
    design = np.stack((x_ray, y_ray, np.ones(n_valid)), axis=1)
    inverse = 1.0 / zs
    # Start from the pixels next to the target (the patch's edge may hold another surface).
    core = settings.min_patch_px // 2
    keep = (np.abs(r + i0 - i) <= core) & (np.abs(c + j0 - j) <= core)
    if int(keep.sum()) < 6:
        keep = np.ones(n_valid, bool)
    for k in range(settings.iterations + 1):
        coef, _, rank, _ = np.linalg.lstsq(design[keep], inverse[keep], rcond=None)
        if rank < 3:
            return SurfaceNormal(False, used_pixels=int(keep.sum()), reason=(
                "depth patch is degenerate for a surface normal: its valid pixels lie on a "
                "line"))
        residual = np.abs(design @ coef - inverse) * zs  # relative depth error
        # 3 robust sigmas (1.4826 x the median absolute residual); the first scale comes from
        # the whole patch (robust while most of it is the target's surface), later ones from
        # the inliers. The floor keeps an exact plane's float rounding inside.
        scale_from = residual if k == 0 else residual[keep]
        bound = max(3.0 * 1.4826 * float(np.median(scale_from)), 1e-6)
        inliers = residual <= bound
        if int(inliers.sum()) < need or np.array_equal(inliers, keep):
            break
        keep = inliers
    # The plane n . X = d holds 1/z = (n . (x_ray, y_ray, 1)) / d, so n is along the
    # coefficients (b, c, a) of 1/z = a + b x_ray + c y_ray.
    normal = np.array((coef[0], coef[1], coef[2]))
    length = float(np.linalg.norm(normal))
    if not length > 0.0 or not math.isfinite(length):
        return SurfaceNormal(False, used_pixels=int(keep.sum()), reason=(
            "depth patch gives no plane for a surface normal"))
    normal /= length
    centre = np.array((x_ray[keep].mean(), y_ray[keep].mean(), 1.0))  # a ray to the patch
    if float(normal @ centre) > 0.0:  # face the camera (at the origin)
        normal = -normal
    rms = float(np.sqrt(np.mean(residual[keep] ** 2) * np.mean(zs[keep]) ** 2))
    n = (float(normal[0]), float(normal[1]), float(normal[2]))
    return SurfaceNormal(True, n, approach_orientation(n), int(keep.sum()), rms)


def approach_orientation(normal: tuple[float, float, float]) -> tuple[float, float, float, float]:
    """Return the approach frame (x, y, z, w quaternion) for an outward unit ``normal``.

    z = -normal (into the surface); x = the camera's x projected onto the surface plane (the
    camera's y when z is along the camera's x); y = z x x.
    """
    z_axis = -np.asarray(normal, np.float64)
    z_axis /= np.linalg.norm(z_axis)
    x_axis = np.array([1.0, 0.0, 0.0]) - z_axis[0] * z_axis
    if np.linalg.norm(x_axis) < 1e-6:
        x_axis = np.array([0.0, 1.0, 0.0]) - z_axis[1] * z_axis
    x_axis /= np.linalg.norm(x_axis)
    y_axis = np.cross(z_axis, x_axis)
    return matrix_quaternion(np.stack((x_axis, y_axis, z_axis), axis=1))


def matrix_quaternion(m: np.ndarray) -> tuple[float, float, float, float]:
    """Return the unit quaternion (x, y, z, w) of rotation matrix ``m`` (Shepperd's method)."""
    trace = m[0, 0] + m[1, 1] + m[2, 2]
    if trace > 0.0:
        s = 2.0 * math.sqrt(1.0 + trace)
        q = ((m[2, 1] - m[1, 2]) / s, (m[0, 2] - m[2, 0]) / s, (m[1, 0] - m[0, 1]) / s, s / 4)
    elif m[0, 0] > m[1, 1] and m[0, 0] > m[2, 2]:
        s = 2.0 * math.sqrt(1.0 + m[0, 0] - m[1, 1] - m[2, 2])
        q = (s / 4, (m[0, 1] + m[1, 0]) / s, (m[0, 2] + m[2, 0]) / s, (m[2, 1] - m[1, 2]) / s)
    elif m[1, 1] > m[2, 2]:
        s = 2.0 * math.sqrt(1.0 + m[1, 1] - m[0, 0] - m[2, 2])
        q = ((m[0, 1] + m[1, 0]) / s, s / 4, (m[1, 2] + m[2, 1]) / s, (m[0, 2] - m[2, 0]) / s)
    else:
        s = 2.0 * math.sqrt(1.0 + m[2, 2] - m[0, 0] - m[1, 1])
        q = ((m[0, 2] + m[2, 0]) / s, (m[1, 2] + m[2, 1]) / s, s / 4, (m[1, 0] - m[0, 1]) / s)
    norm = math.sqrt(sum(float(v) * float(v) for v in q))
    x, y, z, w = (float(v) / norm for v in q)
    return (x, y, z, w) if w >= 0.0 else (-x, -y, -z, -w)  # one sign: deterministic
