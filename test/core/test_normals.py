"""Surface normals from depth patches: planes at known angles, exact and noisy with holes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cosmos_reason_ros.core.normals import (
    NormalSettings,
    approach_orientation,
    surface_normal,
)
from cosmos_reason_ros.core.rgbd import CameraModel, DepthImage
from cosmos_reason_ros.core.types import BadRequestError
from cosmos_reason_ros.ros.target_frame import rotation_matrix

W, H = 640, 480
CAMERA = CameraModel(fx=525.0, fy=525.0, cx=319.5, cy=239.5, width=W, height=H)
# Tilts about the camera's x and y axes (degrees): facing, pitched, yawed, both, grazing.
TILTS = [(0, 0), (15, 0), (0, 30), (30, 30), (45, 0), (0, -45), (-30, 20), (60, 0), (0, 60)]
TARGETS = [(320.0, 240.0), (100.5, 400.25), (560.0, 60.0)]  # centre, lower left, upper right


def outward_normal(tilt_x: float, tilt_y: float) -> np.ndarray:
    """The unit normal, toward the camera, of a plane facing it then tilted about x and y."""
    ax, ay = math.radians(tilt_x), math.radians(tilt_y)
    rx = np.array([[1, 0, 0], [0, math.cos(ax), -math.sin(ax)], [0, math.sin(ax), math.cos(ax)]])
    ry = np.array([[math.cos(ay), 0, math.sin(ay)], [0, 1, 0], [-math.sin(ay), 0, math.cos(ay)]])
    return ry @ rx @ np.array([0.0, 0.0, -1.0])


def plane_depth(normal: np.ndarray, through: np.ndarray, scale: int = 1) -> np.ndarray:
    """Exact depth (metres, float64) of the plane with ``normal`` through point ``through``."""
    rows, cols = np.mgrid[0:H // scale, 0:W // scale]
    u, v = (cols + 0.5) * scale, (rows + 0.5) * scale
    ray = np.stack(((u - 0.5 - CAMERA.cx) / CAMERA.fx, (v - 0.5 - CAMERA.cy) / CAMERA.fy,
                    np.ones_like(u, dtype=np.float64)))
    denominator = np.tensordot(normal, ray, axes=1)
    return float(normal @ through) / denominator


def angle_deg(a: tuple[float, float, float], b: np.ndarray) -> float:
    cos = float(np.clip(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b), -1.0, 1.0))
    return math.degrees(math.acos(cos))


def planes(noise: float = 0.0, holes: float = 0.0, depth_m: float = 1.0, seed: int = 7):
    """Yield (expected normal, depth image, target pixel) for every tilt and target."""
    rng = np.random.default_rng(seed)
    for tilt in TILTS:
        normal = outward_normal(*tilt)
        for u, v in TARGETS:
            through = np.array(CAMERA.back_project(u, v, depth_m))
            z = plane_depth(normal, through)
            if noise:
                z = z * (1.0 + noise * rng.standard_normal(z.shape))
            if holes:
                z[rng.random(z.shape) < holes] = 0.0  # 16UC1-style "no return"
            yield tilt, normal, z.astype(np.float32), (u, v)


def test_planes_at_known_angles_give_their_normal_within_a_fraction_of_a_degree():
    errors = []
    for tilt, normal, z, (u, v) in planes():
        found = surface_normal(z, CAMERA, u, v)
        assert found.valid, (tilt, found.reason)
        errors.append(angle_deg(found.normal, normal))
    print(f"exact planes: max normal error {max(errors):.2e} deg over {len(errors)} patches")
    assert max(errors) <= 3.0
    assert max(errors) <= 0.1  # exact depth: float32 rounding only


def test_noisy_planes_with_holes_stay_within_three_degrees():
    """1 % depth noise (1 cm at 1 m) and 10 % holes, as the noisy recordings have."""
    errors = []
    for tilt, normal, z, (u, v) in planes(noise=0.01, holes=0.10):
        found = surface_normal(z, CAMERA, u, v)
        assert found.valid, (tilt, found.reason)
        assert all(math.isfinite(c) for c in found.normal + found.orientation)
        errors.append(angle_deg(found.normal, normal))
    print(f"noisy planes (1 % noise, 10 % holes): max normal error {max(errors):.3f} deg, "
          f"mean {np.mean(errors):.3f} deg over {len(errors)} patches")
    assert max(errors) <= 3.0


def test_half_resolution_millimetre_depth_gives_the_normal():
    normal = outward_normal(30, -20)
    through = np.array(CAMERA.back_project(200.0, 300.0, 2.0))
    mm = np.round(plane_depth(normal, through, scale=2) * 1000).astype(np.uint16)
    found = surface_normal(DepthImage(mm, 0.001), CAMERA, 200.0, 300.0, scale=2)
    assert found.valid, found.reason
    assert angle_deg(found.normal, normal) <= 3.0


def test_background_pixels_at_an_edge_are_trimmed():
    normal = outward_normal(20, 0)
    through = np.array(CAMERA.back_project(320.0, 240.0, 1.0))
    z = plane_depth(normal, through).astype(np.float32)
    z[:, 330:] = 3.0  # a wall far behind, a quarter of the patch
    found = surface_normal(z, CAMERA, 320.0, 240.0)
    assert found.valid, found.reason
    assert angle_deg(found.normal, normal) <= 3.0


@pytest.mark.parametrize("holes", [0.8, 1.0])
def test_a_too_sparse_patch_gives_no_normal_and_says_why(holes):
    _, normal, z, (u, v) = next(planes(holes=holes))
    found = surface_normal(z, CAMERA, u, v)
    assert not found.valid
    assert "too sparse" in found.reason and "need >=" in found.reason
    assert all(math.isnan(c) for c in found.normal + found.orientation)


def test_nan_and_out_of_range_depth_count_as_holes():
    _, normal, z, (u, v) = next(planes())
    z[::3, :] = np.nan
    z[1::6, :] = 50.0  # beyond max_m
    found = surface_normal(z, CAMERA, u, v)
    assert found.valid, found.reason
    assert angle_deg(found.normal, normal) <= 0.1


def test_a_target_outside_the_image_gives_no_normal():
    _, _, z, _ = next(planes())
    found = surface_normal(z, CAMERA, -1.0, 10.0)
    assert not found.valid and "outside" in found.reason


def test_approach_z_goes_into_the_surface_and_x_follows_the_image_right():
    assert approach_orientation((0.0, 0.0, -1.0)) == pytest.approx((0.0, 0.0, 0.0, 1.0))
    for tilt in TILTS:
        normal = outward_normal(*tilt)
        axes = rotation_matrix(approach_orientation(tuple(normal)))
        assert axes[:, 2] == pytest.approx(-normal, abs=1e-12)
        assert axes[:, 0] @ normal == pytest.approx(0.0, abs=1e-12)
        assert axes[0, 0] > 0.0  # x keeps the image's right
        assert np.linalg.det(axes) == pytest.approx(1.0)
    # Approach along the camera's x: x falls back to the camera's y, still deterministic.
    axes = rotation_matrix(approach_orientation((-1.0, 0.0, 0.0)))
    assert axes[:, 2] == pytest.approx((1.0, 0.0, 0.0)) and axes[:, 0] == pytest.approx(
        (0.0, 1.0, 0.0))


def test_bad_settings_are_refused_naming_the_field():
    with pytest.raises(BadRequestError, match="patch_m"):
        NormalSettings(patch_m=0.0)
