"""Tests for core/rgbd.py and core/lifting.py with exactly rendered synthetic depth.

Depth images are ray-cast from a pinhole K through each depth pixel's centre (in the colour
image's pixel coordinates, so down-scaled depth is rendered as a registered camera would give
it): a fronto-parallel card or an axis-aligned cuboid in front of a wall, planes at any angle.
Ground truth is therefore known exactly, and the issue's "Done when" numbers are asserted.
"""

from __future__ import annotations

import array
import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cosmos_reason_ros.core.answer3d import DepthLifter, DepthSettings, LiftCode
from cosmos_reason_ros.core.frames import FrameHistory
from cosmos_reason_ros.core.imaging import ImageMessage
from cosmos_reason_ros.core.lifting import (
    LiftSettings,
    lift_box,
    lift_boxes,
    lift_point,
    lift_points,
    lift_trajectory,
)
from cosmos_reason_ros.core.rgbd import CameraModel, check_registration, depth_image
from cosmos_reason_ros.core.types import (
    BadImageError,
    BadRequestError,
    Box,
    ParsedAnswer,
    Point,
    ReasonOutcome,
    Trajectory,
)

CAM = CameraModel(fx=600.0, fy=600.0, cx=320.0, cy=240.0, width=640, height=480,
                  frame_id="cam_color_optical_frame")
finite = dict(allow_nan=False, allow_infinity=False)


# --- rendering ------------------------------------------------------------------------------


def rays(cam: CameraModel, scale: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Ray slopes (x/z, y/z) through the centres of the depth pixels at a down-scale."""
    # Written from K directly (not through CameraModel) so a convention slip there shows here:
    # K puts pixel i's centre at i; depth pixel j covers colour pixels j*scale..(j+1)*scale-1.
    w, h = cam.width // scale, cam.height // scale
    x = ((np.arange(w) + 0.5) * scale - 0.5 - cam.cx) / cam.fx
    y = ((np.arange(h) + 0.5) * scale - 0.5 - cam.cy) / cam.fy
    return np.broadcast_to(x[None, :], (h, w)), np.broadcast_to(y[:, None], (h, w))


def pixel_of(cam: CameraModel, x: float, y: float, z: float) -> tuple[float, float]:
    """Continuous pixel (pixel i spans [i, i + 1)) of a 3D point, from K directly."""
    return cam.fx * x / z + cam.cx + 0.5, cam.fy * y / z + cam.cy + 0.5


def render_cuboid(cam: CameraModel, lo: tuple[float, float, float],
                  hi: tuple[float, float, float], wall_z: float | None,
                  scale: int = 1) -> np.ndarray:
    """Depth (z, metres, float64) of an axis-aligned cuboid (lo..hi) before a wall z=wall_z.

    A cuboid with lo z == hi z is a fronto-parallel card. Misses with no wall are 0 (no return).
    """
    sx, sy = rays(cam, scale)
    near = np.full(sx.shape, 0.0)
    far = np.full(sx.shape, np.inf)
    # Slab method along the ray P = t * (sx, sy, 1): t is the depth z itself.
    for slope, a, b in ((sx, lo[0], hi[0]), (sy, lo[1], hi[1])):
        with np.errstate(divide="ignore", invalid="ignore"):
            t1, t2 = a / slope, b / slope
        inside_slab = (slope == 0) & (a <= 0) & (0 <= b)
        t_min = np.where(slope == 0, np.where(inside_slab, -np.inf, np.inf), np.minimum(t1, t2))
        t_max = np.where(slope == 0, np.where(inside_slab, np.inf, -np.inf), np.maximum(t1, t2))
        near, far = np.maximum(near, t_min), np.minimum(far, t_max)
    near, far = np.maximum(near, lo[2]), np.minimum(far, hi[2])
    hit = near <= far
    background = np.full(sx.shape, 0.0 if wall_z is None else wall_z)
    return np.where(hit, near, background)


def render_plane(cam: CameraModel, normal: tuple[float, float, float], offset: float,
                 scale: int = 1) -> np.ndarray:
    """Depth of the plane n . P = offset (0 where the ray misses it or hits behind)."""
    sx, sy = rays(cam, scale)
    denom = normal[0] * sx + normal[1] * sy + normal[2]
    with np.errstate(divide="ignore", invalid="ignore"):
        z = offset / denom
    return np.where(np.isfinite(z) & (z > 0), z, 0.0)


def project_box(cam: CameraModel, lo: tuple[float, float, float],
                hi: tuple[float, float, float], margin: float) -> Box:
    """The 2D box of a card/front face, grown by ``margin`` of its size on each side."""
    u0, v0 = pixel_of(cam, lo[0], lo[1], lo[2])
    u1, v1 = pixel_of(cam, hi[0], hi[1], lo[2])
    mu, mv = margin * (u1 - u0), margin * (v1 - v0)
    return Box(u0 - mu, v0 - mv, u1 + mu, v1 + mv, label="card")


def card(centre: tuple[float, float, float], width: float = 0.20, height: float = 0.15,
         thickness: float = 0.0) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    x, y, z = centre
    return ((x - width / 2, y - height / 2, z), (x + width / 2, y + height / 2, z + thickness))


def as_16uc1(depth: np.ndarray) -> dict:
    mm = np.round(np.nan_to_num(depth, nan=0.0) * 1000.0).astype("<u2")
    h, w = depth.shape
    return dict(encoding="16UC1", width=w, height=h, step=w * 2, data=mm.tobytes(),
                is_bigendian=False)


def as_32fc1(depth: np.ndarray) -> dict:
    h, w = depth.shape
    return dict(encoding="32FC1", width=w, height=h, step=w * 4,
                data=depth.astype("<f4").tobytes(), is_bigendian=False)


def error(lifted_position: tuple[float, float, float], truth: tuple[float, float, float]) -> float:
    return math.dist(lifted_position, truth)


# --- Done when: box centres -----------------------------------------------------------------


@pytest.mark.parametrize(("distance", "limit"), [(1.0, 0.005), (4.0, 0.02)])
def test_box_centre_on_card_before_wall_within_done_when_limits(distance, limit):
    centre = (0.12, -0.05, distance)  # off-axis, so a wrong cx/cy or half-pixel would show
    lo, hi = card(centre)
    depth = render_cuboid(CAM, lo, hi, wall_z=distance + 0.30).astype(np.float32)
    box = project_box(CAM, lo, hi, margin=0.25)  # the box also covers the wall around it
    result = lift_box(depth, CAM, box)
    assert result.valid, result.reason
    assert error(result.position, centre) <= limit
    assert result.depth_m == pytest.approx(distance, abs=1e-6)
    # Extent from percentiles plus coverage correction: the card's true size, not smaller.
    assert result.size[0] == pytest.approx(0.20, abs=2 * distance / 600 + 1e-3)
    assert result.size[1] == pytest.approx(0.15, abs=2 * distance / 600 + 1e-3)
    assert result.size[2] == pytest.approx(0.0, abs=1e-6)
    assert result.used_pixels < result.valid_pixels  # the wall pixels were left out


def test_box_centre_with_noise_and_invalid_pixels_within_1_5_cm_at_1_m():
    centre = (0.12, -0.05, 1.0)
    lo, hi = card(centre)
    clean = render_cuboid(CAM, lo, hi, wall_z=1.30)
    box = project_box(CAM, lo, hi, margin=0.25)
    worst = 0.0
    for seed in range(20):
        rng = np.random.default_rng(seed)
        noisy = clean * (1.0 + 0.01 * rng.standard_normal(clean.shape))  # 1 % depth noise
        holes = rng.random(clean.shape) < 0.10  # 10 % invalid: half zeros, half NaN
        noisy[holes] = np.where(rng.random(int(holes.sum())) < 0.5, 0.0, np.nan)
        for fields in (as_32fc1(noisy), as_16uc1(noisy)):
            result = lift_box(depth_image(**fields).metres(), CAM, box)
            assert result.valid, result.reason
            worst = max(worst, error(result.position, centre))
    assert worst <= 0.015


def test_box_picks_nearest_dominant_surface_not_the_median_of_everything():
    # A thin object (a 4 cm wide bottle-like card) in a wide box: the wall is ~2/3 of the
    # pixels, so the median of the box would be the wall at 1.3 m.
    centre = (0.0, 0.0, 1.0)
    lo, hi = card(centre, width=0.04, height=0.20)
    depth = render_cuboid(CAM, lo, hi, wall_z=1.30).astype(np.float32)
    box = project_box(CAM, lo, hi, margin=0.5)
    z = depth[int(box.y_min):int(box.y_max), int(box.x_min):int(box.x_max)]
    assert float(np.median(z)) == pytest.approx(1.30)  # what a naive estimate would return
    result = lift_box(depth, CAM, box)
    assert error(result.position, centre) <= 0.005
    assert result.size[0] == pytest.approx(0.04, abs=0.004)


def test_small_nearer_clutter_in_the_box_is_passed_over():
    centre = (0.0, 0.0, 1.0)
    lo, hi = card(centre)
    depth = render_cuboid(CAM, lo, hi, wall_z=1.30)
    box = project_box(CAM, lo, hi, margin=0.25)
    # A 6 px wide vertical edge of something at 0.6 m crossing the box (under 15 % of it).
    x0 = int(box.x_min) + 4
    depth[int(box.y_min):int(box.y_max), x0:x0 + 6] = 0.6
    result = lift_box(depth.astype(np.float32), CAM, box)
    assert result.depth_m == pytest.approx(1.0, abs=1e-6)
    assert error(result.position, centre) <= 0.005


def test_box_size_ignores_stray_pixels_that_min_max_would_include():
    # Mixed pixels near the object at a similar depth (within the surface tolerance), 1 % of
    # the box: min/max of x and y would stretch the box to the whole 2D box.
    centre = (0.0, 0.0, 1.0)
    lo, hi = card(centre)
    depth = render_cuboid(CAM, lo, hi, wall_z=1.30)
    box = project_box(CAM, lo, hi, margin=0.25)
    rng = np.random.default_rng(7)
    rows = np.arange(int(box.y_min) + 1, int(box.y_max) - 1)
    cols = np.arange(int(box.x_min) + 1, int(box.x_max) - 1)
    wall = [(r, c) for r in rows for c in cols if depth[r, c] > 1.2]
    picks = rng.choice(len(wall), size=int(0.01 * rows.size * cols.size), replace=False)
    for k in picks:
        depth[wall[k]] = 1.02
    result = lift_box(depth.astype(np.float32), CAM, box)
    assert result.size[0] == pytest.approx(0.20, abs=0.01)
    assert result.size[1] == pytest.approx(0.15, abs=0.01)
    assert error(result.position, centre) <= 0.005


def test_cuboid_on_axis_gives_its_front_face():
    lo, hi = card((0.0, 0.0, 1.0), thickness=0.10)
    depth = render_cuboid(CAM, lo, hi, wall_z=1.40).astype(np.float32)
    result = lift_box(depth, CAM, project_box(CAM, lo, hi, margin=0.2))
    assert error(result.position, (0.0, 0.0, 1.0)) <= 0.005  # centre of the visible surface
    assert result.size[2] == pytest.approx(0.0, abs=1e-6)


def test_large_box_is_read_on_a_strided_grid_without_losing_accuracy():
    centre = (0.05, 0.02, 1.0)
    lo, hi = card(centre, width=0.60, height=0.45)  # 360 x 270 px: ~10x max_samples
    depth = render_cuboid(CAM, lo, hi, wall_z=1.30).astype(np.float32)
    result = lift_box(depth, CAM, project_box(CAM, lo, hi, margin=0.1))
    assert result.valid_pixels <= LiftSettings().max_samples  # bounded work
    assert error(result.position, centre) <= 0.005
    assert result.size[0] == pytest.approx(0.60, abs=0.01)


HD = CameraModel(fx=900.0, fy=900.0, cx=639.5, cy=359.5, width=1280, height=720,
                 frame_id="cam_color_optical_frame")


@pytest.mark.parametrize("scale", [1, 2])
@pytest.mark.parametrize("margin", [0.0, 0.25])
def test_large_box_at_4_m_is_unbiased_at_full_and_half_depth_resolution(scale, margin):
    # A 232 px square face at 4 m (1280x720, f = 900 px: one pixel is 4.44 mm there), its
    # edges on depth-pixel borders at both resolutions, so reading every pixel is exact. A
    # strided grid shifted the centre by -2.5 mm and grew the face by 10 mm per axis when the
    # box is the face, and shifted it by up to 15 mm with a margin of wall around it.
    z = 4.0
    side = 232 * z / HD.fx
    centre = (90 * z / HD.fx, -46 * z / HD.fx, z)  # pixel (730, 314): off-axis
    lo, hi = card(centre, width=side, height=side)
    depth = render_cuboid(HD, lo, hi, wall_z=z + 1.0, scale=scale).astype(np.float32)
    box = project_box(HD, lo, hi, margin)
    every = lift_box(depth, HD, box, scale, LiftSettings(max_samples=10**9))
    sampled = lift_box(depth, HD, box, scale)
    assert every.valid and sampled.valid, (every.reason, sampled.reason)
    assert sampled.valid_pixels <= LiftSettings().max_samples < every.valid_pixels
    assert every.position == pytest.approx(centre, abs=2e-4)
    assert every.size[:2] == pytest.approx((side, side), abs=2e-4)
    # Sampled: the same within a fraction of a millimetre (centre) and of a pixel (size).
    assert error(sampled.position, centre) <= (1e-4 if margin == 0.0 else 1e-3)
    assert sampled.size[:2] == pytest.approx((side, side), abs=1e-4 if margin == 0.0 else 3e-3)
    assert sampled.size[2] == pytest.approx(0.0, abs=1e-6)


@settings(max_examples=60, deadline=None)
@given(x=st.floats(-0.25, 0.25, **finite), y=st.floats(-0.2, 0.2, **finite),
       z=st.floats(0.8, 4.0, **finite), width=st.floats(0.05, 0.45, **finite),
       height=st.floats(0.05, 0.35, **finite), margin=st.floats(0.0, 0.4, **finite),
       scale=st.sampled_from([1, 2]))
def test_sampled_box_matches_the_all_pixels_estimate(x, y, z, width, height, margin, scale):
    # Random cards and boxes: the sampled estimate stays within a small part of a grid cell
    # (stride depth pixels) of the one from every pixel. A strided grid was off by up to 0.6
    # cell (centre) and 1 cell (size) here: each edge could move by half a stride.
    lo, hi = card((x * z, y * z, z), width * z, height * z)
    depth = render_cuboid(CAM, lo, hi, wall_z=z + 0.5, scale=scale).astype(np.float32)
    box = project_box(CAM, lo, hi, margin)
    every = lift_box(depth, CAM, box, scale, LiftSettings(max_samples=10**9))
    sampled = lift_box(depth, CAM, box, scale)
    assert every.valid and sampled.valid, (every.reason, sampled.reason)
    area = (box.x_max - box.x_min) * (box.y_max - box.y_min) / scale**2
    stride = max(1, math.ceil(math.sqrt(area / LiftSettings().max_samples)))
    cell = stride * scale * z / CAM.fx  # one grid cell's footprint at the card
    assert sampled.position == pytest.approx(every.position, abs=0.25 * cell + 1e-6)
    assert sampled.size == pytest.approx(every.size, abs=0.5 * cell + 1e-6)


# --- the depth frame of a goal --------------------------------------------------------------


class ArrivingHistory(FrameHistory):
    """A depth history whose frame arrives while the lifter waits for it (or never does)."""

    def __init__(self, arriving: tuple[ImageMessage, int] | None) -> None:
        super().__init__(4, clock=lambda: STAMP_NS)
        self.arriving = arriving
        self.waits = 0

    def wait_for_next(self, after_ns=None, timeout_s=None):
        self.waits += 1
        if self.arriving is None:
            return None  # the wait ran out
        message, stamp = self.arriving
        self.append(message, stamp, nbytes=len(message.data))
        self.arriving = None
        return self.latest()


STAMP_NS = 1_700_000_000_000_000_000


def lifter_for(history: FrameHistory) -> DepthLifter:
    return DepthLifter(DepthSettings(max_skew_s=0.05), history, lambda m: m, lambda: CAM)


@pytest.mark.parametrize("arrives", [True, False])
def test_a_depth_frame_arriving_after_its_colour_frame_is_waited_for(arrives):
    # A driver publishes the pair together, but the larger depth frame can come after its
    # colour frame: a fast answer waits for it (at most max_skew_s) instead of NO_DEPTH.
    lo, hi = card((0.0, 0.0, 1.0))
    depth = render_cuboid(CAM, lo, hi, wall_z=1.3).astype("<f4")
    message = ImageMessage(STAMP_NS + 2_000_000, CAM.frame_id, 640, 480, "32FC1", False,
                           640 * 4, depth.tobytes())
    history = ArrivingHistory((message, message.stamp_ns) if arrives else None)
    outcome = ReasonOutcome(ParsedAnswer(raw_text="", reasoning="", answer=""),
                            boxes=(project_box(CAM, lo, hi, 0.2),))
    answer = lifter_for(history).lift(outcome, STAMP_NS, (640, 480), CAM.frame_id)
    assert history.waits == 1
    if arrives:
        assert answer.code is LiftCode.OK, answer.message
        assert answer.depth_stamp_ns == message.stamp_ns
        assert error(answer.boxes[0].position, (0.0, 0.0, 1.0)) <= 0.005
    else:
        assert answer.code is LiftCode.NO_DEPTH and "none received" in answer.message


def test_no_wait_when_newer_depth_shows_the_colour_frames_depth_will_not_come():
    history = ArrivingHistory(None)
    newer = ImageMessage(STAMP_NS + 500_000_000, CAM.frame_id, 1, 1, "32FC1", False, 4,
                         b"\0" * 4)
    history.append(newer, newer.stamp_ns, nbytes=4)
    outcome = ReasonOutcome(ParsedAnswer(raw_text="", reasoning="", answer=""),
                            boxes=(Box(10, 10, 50, 50, label="x"),))
    answer = lifter_for(history).lift(outcome, STAMP_NS, (640, 480), CAM.frame_id)
    assert answer.code is LiftCode.NO_DEPTH and history.waits == 0


# --- depth decoding -------------------------------------------------------------------------


def test_16uc1_and_32fc1_give_the_same_answer():
    lo, hi = card((0.12, -0.05, 1.0))
    depth = render_cuboid(CAM, lo, hi, wall_z=1.30)
    box = project_box(CAM, lo, hi, margin=0.25)
    from_mm = lift_box(depth_image(**as_16uc1(depth)).metres(), CAM, box)
    from_m = lift_box(depth_image(**as_32fc1(depth)).metres(), CAM, box)
    assert from_mm.valid and from_m.valid
    assert from_mm.position == pytest.approx(from_m.position, abs=1e-6)
    assert from_mm.size == pytest.approx(from_m.size, abs=1e-6)


def test_depth_image_units_byte_order_padding_and_scale():
    mm = np.array([[0, 1000, 65535], [250, 1500, 3]], dtype=np.uint16)
    expected = mm.astype(np.float32) / 1000
    little = depth_image("16UC1", 3, 2, 6, mm.astype("<u2").tobytes()).metres()
    big = depth_image("16uc1", 3, 2, 6, mm.astype(">u2").tobytes(), is_bigendian=True).metres()
    padded_rows = np.zeros((2, 5), dtype="<u2")
    padded_rows[:, :3] = mm
    padded = depth_image("16UC1", 3, 2, 10, padded_rows.tobytes()).metres()
    for out in (little, big, padded):
        assert out.dtype == np.float32
        np.testing.assert_allclose(out, expected, rtol=1e-6)
    # A camera storing 0.1 mm units: depth.scale overrides the encoding's unit.
    tenth = depth_image("16UC1", 3, 2, 6, mm.tobytes(), scale=0.0001).metres()
    np.testing.assert_allclose(tenth, expected / 10, rtol=1e-6)
    metres = np.array([[1.5, np.nan], [np.inf, 0.0]], dtype=np.float32)
    out = depth_image("32FC1", 2, 2, 8, metres.astype(">f4").tobytes(), is_bigendian=1).metres()
    np.testing.assert_array_equal(out, metres)  # NaN/inf kept: lifting skips them
    mm_floats = depth_image("32FC1", 2, 2, 8, (metres * 1000).tobytes(), scale=0.001).metres()
    np.testing.assert_allclose(mm_floats, metres, rtol=1e-6)


@pytest.mark.parametrize("encoding", ["mono8", "rgb8", "16SC1", "64FC1", ""])
def test_other_depth_encodings_are_refused_naming_what_is_allowed(encoding):
    with pytest.raises(BadImageError) as err:
        depth_image(encoding, 2, 2, 4, bytes(8)).metres()
    assert repr(encoding) in err.value.message
    assert "16UC1" in err.value.message and "32FC1" in err.value.message


@pytest.mark.parametrize("scale", [0.0, -0.001, math.nan, math.inf])
def test_bad_depth_scale_is_refused(scale):
    with pytest.raises(BadRequestError, match="depth.scale"):
        depth_image("16UC1", 2, 2, 4, bytes(8), scale=scale).metres()


def test_inconsistent_depth_buffer_is_refused():
    with pytest.raises(BadImageError, match="len\\(data\\)"):
        depth_image("16UC1", 4, 2, 8, bytes(10)).metres()


# --- registration ---------------------------------------------------------------------------


def test_registration_accepts_equal_and_integer_downscaled_sizes():
    f = "cam_color_optical_frame"
    assert check_registration((640, 480), (640, 480), f, f) == 1
    assert check_registration((640, 480), (320, 240), f, f) == 2
    assert check_registration((1280, 720), (320, 180), f, f, camera=CameraModel(
        600, 600, 640, 360, 1280, 720, f)) == 4


@pytest.mark.parametrize("depth_size", [(500, 400), (427, 320), (1280, 960), (320, 480)])
def test_registration_refuses_sizes_that_are_not_an_integer_downscale(depth_size):
    f = "cam_color_optical_frame"
    with pytest.raises(BadImageError) as err:
        check_registration((640, 480), depth_size, f, f)
    message = err.value.message
    assert f"{depth_size[0]}x{depth_size[1]}" in message and "640x480" in message
    assert "integer down-scale" in message


def test_registration_refuses_depth_from_another_frame_unless_declared():
    with pytest.raises(BadImageError) as err:
        check_registration((640, 480), (640, 480), "cam_color_optical_frame",
                           "cam_depth_optical_frame")
    assert "'cam_depth_optical_frame'" in err.value.message
    assert "'cam_color_optical_frame'" in err.value.message
    assert check_registration((640, 480), (640, 480), "cam_color_optical_frame",
                              "cam_depth_optical_frame",
                              registered_frame_id="cam_depth_optical_frame") == 1
    with pytest.raises(BadImageError, match="declared registered frame 'other'"):
        check_registration((640, 480), (640, 480), "a", "b", registered_frame_id="other")


def test_registration_refuses_camera_info_of_another_image():
    f = "cam_color_optical_frame"
    wrong_size = CameraModel(600, 600, 320, 240, 1280, 720, f)
    with pytest.raises(BadImageError, match="camera_info size 1280x720"):
        check_registration((640, 480), (640, 480), f, f, camera=wrong_size)
    wrong_frame = CameraModel(600, 600, 320, 240, 640, 480, "cam_depth_optical_frame")
    with pytest.raises(BadImageError, match="camera_info frame_id"):
        check_registration((640, 480), (640, 480), f, f, camera=wrong_frame)


def test_half_resolution_depth_gives_the_same_centre():
    centre = (0.12, -0.05, 1.0)
    lo, hi = card(centre)
    depth = render_cuboid(CAM, lo, hi, wall_z=1.30, scale=2).astype(np.float32)
    assert depth.shape == (240, 320)
    scale = check_registration((640, 480), (320, 240), CAM.frame_id, CAM.frame_id, camera=CAM)
    box = project_box(CAM, lo, hi, margin=0.25)  # still in colour pixels
    result = lift_box(depth, CAM, box, scale=scale)
    assert error(result.position, centre) <= 0.005
    assert result.size[0] == pytest.approx(0.20, abs=0.006)
    point = lift_point(depth, CAM, Point(*pixel_of(CAM, 0.1, -0.03, 1.0)), scale=scale)
    assert point.position == pytest.approx((0.1, -0.03, 1.0), abs=1e-6)


def test_lifting_refuses_depth_that_does_not_cover_the_camera_image():
    with pytest.raises(BadImageError, match="does not cover"):
        lift_box(np.ones((240, 320), np.float32), CAM, Box(0, 0, 10, 10), scale=1)


# --- no depth -------------------------------------------------------------------------------


def test_too_few_valid_pixels_gives_invalid_with_the_counts():
    depth = np.zeros((480, 640), np.float32)
    depth[100, 100:103] = 1.0  # 3 valid pixels in a 20 x 20 box
    result = lift_box(depth, CAM, Box(90, 90, 110, 110))
    assert not result.valid
    assert result.valid_pixels == 3
    assert "no valid depth in box: 3 of 400 pixels valid" in result.reason
    assert "need >= 40" in result.reason
    assert all(math.isnan(v) for v in result.position + result.size)


def test_depth_all_outside_range_says_so_and_hints_at_units():
    mm = np.full((480, 640), 1000.0, np.float32)  # millimetres taken for metres
    result = lift_box(mm, CAM, Box(100, 100, 120, 120))
    assert not result.valid
    assert result.reason.startswith("all depth outside [0.1, 10] m")
    assert "median 1000 m" in result.reason and "depth unit" in result.reason
    near = lift_point(np.full((480, 640), 0.05, np.float32), CAM, Point(320, 240),
                      settings=LiftSettings(min_m=0.2, max_m=5.0))
    assert not near.valid and "outside [0.2, 5] m" in near.reason
    assert "depth unit" not in near.reason  # 5 cm is plausibly just too near, not a unit bug


def test_nan_inf_and_zero_are_skipped_not_averaged():
    depth = np.full((480, 640), 2.0, np.float32)
    depth[::2, :] = np.nan
    depth[1::4, :] = np.inf
    depth[3::8, ::2] = 0.0
    result = lift_box(depth, CAM, Box(300, 220, 340, 260))
    assert result.valid and result.depth_m == 2.0
    assert result.position[2] == pytest.approx(2.0)


def test_box_outside_the_image_is_invalid():
    result = lift_box(np.ones((480, 640), np.float32), CAM, Box(700, 10, 720, 20))
    assert not result.valid and "outside the depth image" in result.reason


# --- points and trajectories ----------------------------------------------------------------


def test_point_on_a_fronto_parallel_plane_is_exact():
    depth = np.full((480, 640), 1.7, np.float32)
    for xyz in ((0.0, 0.0, 1.7), (0.31, -0.22, 1.7), (-0.9, 0.6, 1.7)):
        result = lift_point(depth, CAM, Point(*pixel_of(CAM, *xyz)))
        assert result.valid, result.reason
        assert result.position == pytest.approx(xyz, abs=1e-6)


def test_trajectory_on_the_floor_is_exact_at_sub_pixel_positions():
    # Floor 0.5 m below the camera (y down): depth grows by ~1 cm per pixel row at 2 m, so
    # reading the nearest pixel alone would be off by up to half of that.
    depth = render_plane(CAM, (0.0, 1.0, 0.0), 0.5).astype(np.float32)
    path = [(0.3 * math.sin(k / 3), 0.5, 1.5 + 0.3 * k) for k in range(8)]
    trajectory = Trajectory(tuple(Point(*pixel_of(CAM, *p)) for p in path), label="path")
    lifted = lift_trajectory(depth, CAM, trajectory)
    assert len(lifted) == len(path)
    for result, truth in zip(lifted, path, strict=True):
        assert result.valid, result.reason
        assert result.position == pytest.approx(truth, rel=1e-5, abs=1e-5)


def test_point_at_an_object_edge_takes_the_surface_under_it_not_a_mix():
    lo, hi = card((0.0, 0.0, 1.0))
    depth = render_cuboid(CAM, lo, hi, wall_z=1.30).astype(np.float32)
    u, v = pixel_of(CAM, hi[0], 0.0, 1.0)  # the card's right edge: half of each patch is wall
    on_card = lift_point(depth, CAM, Point(u - 0.6, v))
    on_wall = lift_point(depth, CAM, Point(u + 0.6, v))
    assert on_card.position[2] == pytest.approx(1.0, abs=1e-6)
    assert on_wall.position[2] == pytest.approx(1.3, abs=1e-6)
    assert on_card.used_pixels < on_card.valid_pixels == 25


def test_point_on_a_hole_uses_the_surface_around_it():
    depth = np.full((480, 640), 1.3, np.float32)
    depth[200:260, 280:360] = 0.9
    depth[230, 320] = 0.0  # no return exactly under the point
    result = lift_point(depth, CAM, Point(320.5, 230.5))
    assert result.valid and result.position == pytest.approx((0.0, -10 * 0.9 / 600, 0.9))


def test_box_whose_centre_pixel_is_a_hole_or_background_still_finds_the_object():
    # A ring-like object (a roll of tape seen face-on): the box centre shows the wall, and a
    # method anchored on the centre pixel (yolo_ros) would return the wall.
    depth = np.full((480, 640), 1.30, np.float32)
    v, u = np.mgrid[0:480, 0:640]
    radius = np.hypot(u + 0.5 - 320.5, v + 0.5 - 240.5)
    depth[(radius >= 30) & (radius <= 60)] = 1.0
    result = lift_box(depth, CAM, Box(250.5, 170.5, 390.5, 310.5))
    assert result.depth_m == pytest.approx(1.0)
    assert result.position == pytest.approx((0.0, 0.0, 1.0), abs=0.002)
    # An annulus covers its box unevenly, so its size is only approximately the 0.2 m diameter.
    assert result.size[0] == pytest.approx(0.2, abs=0.02)


def test_point_without_depth_is_invalid_with_reason():
    depth = np.zeros((480, 640), np.float32)
    result = lift_point(depth, CAM, Point(320, 240))
    assert not result.valid
    assert "no valid depth in point patch: 0 of 25 pixels valid" in result.reason
    assert lift_trajectory(depth, CAM, Trajectory(())) == ()


def test_lift_boxes_keeps_order():
    depth = np.full((480, 640), 3.0, np.float32)
    boxes = [Box(10, 10, 50, 50), Box(700, 0, 710, 5), Box(300, 200, 340, 280)]
    results = lift_boxes(depth, CAM, boxes)
    assert [r.valid for r in results] == [True, False, True]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), count=st.integers(1, 8))
def test_a_batch_lifts_each_item_as_if_it_were_alone(seed: int, count: int):
    # Boxes and points of a goal are lifted in one pass (one histogram row per item): no item
    # may see another's samples, whatever mix of surfaces, holes and outside items.
    rng = np.random.default_rng(seed)
    depth = np.full((120, 160), rng.uniform(1.0, 6.0), np.float32)
    for _ in range(4):
        r, c = rng.integers(0, 120), rng.integers(0, 160)
        depth[r:r + rng.integers(5, 60), c:c + rng.integers(5, 60)] = rng.uniform(0.05, 12.0)
    depth[rng.random(depth.shape) < rng.uniform(0.0, 0.95)] = rng.choice([0.0, np.nan])
    cam = CameraModel(150.0, 150.0, 79.5, 59.5, 160, 120, "cam")
    corners = rng.uniform(-30.0, 190.0, (count, 2))
    boxes = [Box(x, y, x + w, y + h) for (x, y), (w, h)
             in zip(corners, rng.uniform(0.2, 120.0, (count, 2)), strict=True)]
    points = [Point(x, y) for x, y in rng.uniform(-5.0, 165.0, (count, 2))]
    assert lift_boxes(depth, cam, boxes) == tuple(lift_box(depth, cam, b) for b in boxes)
    assert lift_points(depth, cam, points) == tuple(lift_point(depth, cam, p) for p in points)


# --- camera model ---------------------------------------------------------------------------


def test_pixel_convention_principal_point_is_a_pixel_centre():
    # K (ROS/OpenCV) puts pixel i's centre at i; boxes use continuous pixels where pixel i
    # spans [i, i + 1). The optical axis therefore passes through continuous (cx + .5, cy + .5).
    assert CAM.project(0.0, 0.0, 2.0) == (320.5, 240.5)
    assert CAM.back_project(320.5, 240.5, 2.0) == (0.0, 0.0, 2.0)
    assert CAM.back_project(0.0, 0.0, 1.0) == (-320.5 / 600, -240.5 / 600, 1.0)


def test_camera_info_fields_and_distortion_detection():
    k = [600.0, 0, 320.0, 0, 610.0, 240.0, 0, 0, 1]
    plain = CameraModel.from_camera_info_fields(k, [0.0] * 5, 640, 480, "f", "plumb_bob")
    assert (plain.fx, plain.fy, plain.cx, plain.cy) == (600.0, 610.0, 320.0, 240.0)
    assert not plain.has_distortion
    assert not CameraModel.from_camera_info_fields(k, [], 640, 480).has_distortion
    distorted = CameraModel.from_camera_info_fields(k, [0.1, -0.2, 0, 0, 0], 640, 480, "f",
                                                    "plumb_bob")
    assert distorted.has_distortion and distorted.distortion[:2] == (0.1, -0.2)
    # A rectified topic: intrinsics from P, distortion already removed.
    p = [580.0, 0, 318.0, 0, 0, 580.0, 242.0, 0, 0, 0, 1, 0]
    rect = CameraModel.from_camera_info_fields(k, [0.1, -0.2, 0, 0, 0], 640, 480, "f",
                                               "plumb_bob", p=p, rectified=True)
    assert (rect.fx, rect.fy, rect.cx, rect.cy) == (580.0, 580.0, 318.0, 242.0)
    assert not rect.has_distortion
    # rclpy hands the fields over as numpy arrays (k, p) and array.array (d).
    from_msg = CameraModel.from_camera_info_fields(np.array(k), array.array("d", [0.0] * 5),
                                                   np.uint32(640), np.uint32(480), "f",
                                                   "plumb_bob", p=np.array(p))
    assert from_msg == plain and isinstance(from_msg.width, int)


@pytest.mark.parametrize("k", [[0.0] * 9, [math.nan, 0, 1, 0, 1, 1, 0, 0, 1], [1.0] * 8])
def test_uncalibrated_or_malformed_camera_info_is_refused(k):
    with pytest.raises(BadImageError, match="camera_info"):
        CameraModel.from_camera_info_fields(k, [], 640, 480)


@pytest.mark.parametrize("field", [dict(min_m=-1.0), dict(max_m=0.05), dict(patch_px=4),
                                   dict(surface_fraction=0.0), dict(percentile=50.0)])
def test_bad_lift_settings_are_refused(field):
    name = next(iter(field))
    with pytest.raises(BadRequestError, match=name):
        LiftSettings(**field)


# --- properties -----------------------------------------------------------------------------



@settings(max_examples=200, deadline=None)
@given(fx=st.floats(200, 2000, **finite), fy=st.floats(200, 2000, **finite),
       cx=st.floats(0, 640, **finite), cy=st.floats(0, 480, **finite),
       x=st.floats(-5, 5, **finite), y=st.floats(-5, 5, **finite),
       z=st.floats(0.05, 50, **finite))
def test_project_back_project_round_trip(fx, fy, cx, cy, x, y, z):
    cam = CameraModel(fx, fy, cx, cy, 640, 480)
    u, v = cam.project(x, y, z)
    assert cam.back_project(u, v, z) == pytest.approx((x, y, z), rel=1e-9, abs=1e-9)


@settings(max_examples=150, deadline=None)
@given(f=st.floats(150, 900, **finite), scale=st.sampled_from([1, 2, 4]),
       fu=st.floats(0.1, 0.9, **finite), fv=st.floats(0.1, 0.9, **finite),
       z=st.floats(0.3, 8.0, **finite), tilt_x=st.floats(-0.6, 0.6, **finite),
       tilt_y=st.floats(-0.6, 0.6, **finite))
# Found by hypothesis: a steep plane at depth scale 4, where no neighbour of the point's depth
# pixel lies within the surface tolerance; the fit then takes the whole (planar) patch.
@example(f=150.0, scale=4, fu=0.125, fv=0.25, z=1.0, tilt_x=0.5625, tilt_y=0.5625)
# ... and one where the pixels within it form a strip whose depths the point lies just past
# (the fit was right, and was refused for leaving their range).
@example(f=150.0, scale=4, fu=0.1, fv=0.1, z=1.0, tilt_x=0.46875, tilt_y=0.5)
def test_lifted_point_equals_the_3d_point_it_was_projected_from(f, scale, fu, fv, z, tilt_x,
                                                                tilt_y):
    # A 3D point on a plane at any moderate tilt, seen through K at any integer depth scale:
    # project it, render the plane's depth, lift the pixel back -> the same 3D point.
    cam = CameraModel(f, f * 1.01, 160.0 - 3.5, 120.0 + 2.0, 320, 240, "c")
    u, v = 320 * fu, 240 * fv
    xyz = ((u - 0.5 - cam.cx) * z / cam.fx, (v - 0.5 - cam.cy) * z / cam.fy, z)
    normal = (tilt_x, tilt_y, 1.0)
    depth = render_plane(cam, normal, float(np.dot(normal, xyz)), scale).astype(np.float32)
    result = lift_point(depth, cam, Point(u, v), scale=scale,
                        settings=LiftSettings(max_m=100.0))
    assert result.valid, result.reason
    assert result.position == pytest.approx(xyz, rel=2e-5, abs=1e-5)


@settings(max_examples=40, deadline=None)
@given(x=st.floats(-0.2, 0.2, **finite), y=st.floats(-0.15, 0.15, **finite),
       z=st.floats(0.8, 4.0, **finite), behind=st.floats(0.2, 2.0, **finite),
       margin=st.floats(0.05, 0.4, **finite))
def test_box_centre_error_stays_within_a_pixel_footprint(x, y, z, behind, margin):
    # The wall is >= 5 % of depth behind: beyond the surface tolerance (4 %), so separable.
    x, y = x * z, y * z  # keep the card and its box inside the image
    lo, hi = card((x, y, z))
    depth = render_cuboid(CAM, lo, hi, wall_z=z + behind).astype(np.float32)
    box = project_box(CAM, lo, hi, margin)
    pixel = z / CAM.fx  # one pixel's footprint at the card
    # Every pixel read: rasterisation moves each edge by at most half a pixel.
    full = lift_box(depth, CAM, box, settings=LiftSettings(max_samples=10**9))
    assert full.valid, full.reason
    assert error(full.position, (x, y, z)) <= 1.0 * pixel
    assert full.size[:2] == pytest.approx((0.20, 0.15), abs=1.5 * pixel)
    # Default sampled read (about max_samples cells): a small part of a cell more.
    area = (box.x_max - box.x_min) * (box.y_max - box.y_min)
    stride = max(1, math.ceil(math.sqrt(area / LiftSettings().max_samples)))
    sampled = lift_box(depth, CAM, box)
    assert error(sampled.position, (x, y, z)) <= (1.0 + stride / 4) * pixel
    assert sampled.size[:2] == pytest.approx((0.20, 0.15), abs=(1.5 + stride / 2) * pixel)
