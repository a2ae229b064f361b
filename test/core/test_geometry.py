"""Tests for core/geometry.py: exact hand-computed mappings, fixes, and round-trip properties."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cosmos_reason_ros.core.geometry import (
    box_area,
    box_iou,
    box_to_model,
    check_geometry,
    map_answer,
    map_box,
    map_point,
    map_trajectory,
    model_extent,
    point_to_model,
    scale_factors,
    trajectory_to_model,
)
from cosmos_reason_ros.core.parsing import parse_output
from cosmos_reason_ros.core.types import (
    BadImageError,
    Box,
    CoordinateConvention,
    ImageGeometry,
    ParsedAnswer,
    Point,
    Trajectory,
)

NORM = CoordinateConvention.NORMALIZED_1000
PIX = CoordinateConvention.INPUT_PIXELS

# A 1920x1080 camera frame resized by the package to 1288x728 (multiples of 28) for Reason1.
HD = ImageGeometry(original_width=1920, original_height=1080, input_width=1288, input_height=728)


# --- hand-computed examples -----------------------------------------------------------------


def test_normalized_box_hand_computed():
    # Reason2: 0-1000 per axis regardless of aspect ratio -> x * 1920/1000, y * 1080/1000.
    out = map_box(Box(250, 500, 750, 1000, label="cup", score=0.5), HD, NORM)
    assert out == Box(480.0, 540.0, 1440.0, 1080.0, label="cup", score=0.5)


def test_input_pixels_box_hand_computed():
    # Reason1: pixels of the 1288x728 input -> x * 1920/1288, y * 1080/728.
    out = map_box(Box(644, 364, 1288, 728), HD, PIX)
    assert out == Box(960.0, 540.0, 1920.0, 1080.0)
    out = map_box(Box(161, 91, 322, 182), HD, PIX)
    assert out.x_min == pytest.approx(240.0, abs=1e-9)
    assert out.y_min == pytest.approx(135.0, abs=1e-9)
    assert out.x_max == pytest.approx(480.0, abs=1e-9)
    assert out.y_max == pytest.approx(270.0, abs=1e-9)


def test_normalized_ignores_input_size():
    a = ImageGeometry(640, 480, 448, 336)
    b = ImageGeometry(640, 480, 1024, 1024)
    assert map_point(Point(500, 500), a, NORM) == map_point(Point(500, 500), b, NORM)
    assert map_point(Point(500, 500), a, NORM) == Point(320.0, 240.0)


def test_input_pixels_point_hand_computed():
    geo = ImageGeometry(original_width=640, original_height=480, input_width=448, input_height=336)
    assert map_point(Point(224, 168, label="p"), geo, PIX) == Point(320.0, 240.0, label="p")


def test_scale_factors_and_extent():
    assert scale_factors(HD, NORM) == (1.92, 1.08)
    assert scale_factors(HD, PIX) == (1920 / 1288, 1080 / 728)
    assert model_extent(HD, NORM) == (1000.0, 1000.0)
    assert model_extent(HD, PIX) == (1288.0, 728.0)
    assert scale_factors(HD, "normalized_1000") == (1.92, 1.08)  # plain strings accepted


# --- fixes ----------------------------------------------------------------------------------


def test_clamped_to_image_and_reported():
    problems: list[str] = []
    out = map_box(Box(-10, -5, 1100, 1001), HD, NORM, problems)
    assert out == Box(0.0, 0.0, 1920.0, 1080.0)
    assert any("clamped" in p for p in problems)
    assert map_point(Point(2000, -1), HD, NORM) == Point(1920.0, 0.0)


def test_inverted_corners_swapped():
    problems: list[str] = []
    out = map_box(Box(750, 1000, 250, 500), HD, NORM, problems)
    assert out == Box(480.0, 540.0, 1440.0, 1080.0)
    assert any("inverted" in p and "swapped" in p for p in problems)


def test_degenerate_boxes_kept_and_flagged():
    problems: list[str] = []
    zero_width = map_box(Box(100, 100, 100, 200), HD, NORM, problems)
    assert zero_width is not None and zero_width.degenerate
    outside = map_box(Box(1100, 100, 1200, 200), HD, NORM, problems)  # clamps to x=1920..1920
    assert outside is not None and outside.degenerate
    assert outside.x_min == outside.x_max == 1920.0
    assert sum("degenerate" in p for p in problems) == 2
    assert not map_box(Box(1, 1, 2, 2), HD, NORM).degenerate


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_coordinates_dropped_never_propagated(bad):
    problems: list[str] = []
    assert map_box(Box(bad, 1, 2, 3), HD, NORM, problems) is None
    assert map_point(Point(1, bad), HD, PIX, problems) is None
    assert len(problems) == 2 and all("non-finite" in p for p in problems)


def test_huge_finite_coordinates_clamp_without_overflow():
    out = map_box(Box(-1e308, -1e308, 1e308, 1e308), HD, NORM)
    assert out == Box(0.0, 0.0, 1920.0, 1080.0)


def test_non_finite_score_dropped():
    assert map_box(Box(1, 1, 2, 2, score=math.nan), HD, NORM).score is None


def test_trajectory_drops_bad_points_and_empty_trajectories():
    problems: list[str] = []
    traj = Trajectory((Point(0, 0), Point(math.nan, 1), Point(1000, 1000)), label="arm")
    out = map_trajectory(traj, HD, NORM, problems)
    assert out == Trajectory((Point(0.0, 0.0), Point(1920.0, 1080.0)), label="arm")
    assert map_trajectory(Trajectory((Point(math.inf, 0),)), HD, NORM, problems) is None
    assert any("no valid points" in p for p in problems)


@pytest.mark.parametrize(
    "field", ["original_width", "original_height", "input_width", "input_height"]
)
@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_invalid_geometry_raises_bad_image(field, value):
    sizes = {"original_width": 10, "original_height": 10, "input_width": 10, "input_height": 10}
    sizes[field] = value
    geo = ImageGeometry(**sizes)
    with pytest.raises(BadImageError, match=field):
        check_geometry(geo)
    with pytest.raises(BadImageError):
        map_point(Point(1, 1), geo, PIX)


# --- map_answer -----------------------------------------------------------------------------


def test_map_answer_end_to_end_from_model_text():
    text = (
        "<think>The cup is at the right.</think>\n```json\n"
        '[{"bbox_2d": [500, 0, 1000, 500], "label": "cup"},'
        ' {"bbox_2d": [10, 10, 10, 20], "label": "line"},'
        ' {"point_2d": [250, 750], "label": "handle"}]\n```'
    )
    parsed = parse_output(text)
    problems: list[str] = []
    boxes, points, trajectories = map_answer(parsed, HD, NORM, problems)
    assert boxes[0] == Box(960.0, 0.0, 1920.0, 540.0, label="cup")
    assert boxes[1].degenerate and boxes[1].label == "line"
    assert points == (Point(480.0, 810.0, label="handle"),)
    assert trajectories == ()
    assert problems == ["box 2 has zero width or height after clamping; kept as degenerate"]


def test_map_answer_drops_non_finite_and_reports():
    parsed = ParsedAnswer(
        raw_text="",
        reasoning="",
        answer="",
        boxes=(Box(math.nan, 0, 1, 1), Box(0, 0, 500, 500)),
        points=(Point(math.inf, 0),),
        trajectories=(Trajectory((Point(0, 0), Point(1000, 0))),),
    )
    problems: list[str] = []
    boxes, points, trajectories = map_answer(parsed, HD, NORM, problems)
    assert boxes == (Box(0.0, 0.0, 960.0, 540.0),)
    assert points == ()
    assert trajectories == (Trajectory((Point(0.0, 0.0), Point(1920.0, 0.0))),)
    assert "box 1 has a non-finite coordinate (nan, 0, 1, 1); dropped" in problems
    assert any(p.startswith("point 1 has a non-finite") for p in problems)
    for b in boxes:
        assert all(math.isfinite(v) for v in (b.x_min, b.y_min, b.x_max, b.y_max))


def test_map_answer_without_problems_list_is_fine():
    parsed = ParsedAnswer(raw_text="", reasoning="", answer="", boxes=(Box(2000, 0, -5, 10),))
    boxes, _, _ = map_answer(parsed, HD, NORM)
    assert boxes == (Box(0.0, 0.0, 1920.0, 10.8),)


# --- inverse --------------------------------------------------------------------------------


def test_inverse_hand_computed():
    assert box_to_model(Box(480, 540, 1440, 1080), HD, NORM) == Box(250, 500, 750, 1000)
    assert point_to_model(Point(960, 540), HD, PIX) == Point(644, 364)
    assert point_to_model(Point(100, 100), HD, NORM, quantize=True) == Point(52, 93)
    traj = trajectory_to_model(Trajectory((Point(1920, 1080),), "t"), HD, NORM)
    assert traj == Trajectory((Point(1000.0, 1000.0),), "t")


# --- round-trip properties ------------------------------------------------------------------
#
# Bounds (stated honestly):
# - exact float model coordinates: pixel -> model -> pixel is exact up to float rounding, so
#   within 1e-6 px for images up to 4096 px.
# - integer model coordinates (what models emit): rounding to the nearest integer moves a
#   coordinate by at most 0.5 model units, i.e. at most half a quantization step in pixels:
#   0.5 * original/1000 for NORMALIZED_1000 (up to ~2 px on a 4096-px side: the 1 px bound
#   only holds for sides up to 2000 px) and 0.5 * original/input for INPUT_PIXELS.

_SIDE = st.integers(min_value=16, max_value=4096)


@st.composite
def _geometry_and_box(draw):
    ow, oh = draw(_SIDE), draw(_SIDE)
    # random aspect ratios, upscaled or downscaled inputs
    iw, ih = draw(_SIDE), draw(_SIDE)
    geo = ImageGeometry(ow, oh, iw, ih)
    unit = st.floats(min_value=0.0, max_value=1.0)
    xs = sorted((draw(unit) * ow, draw(unit) * ow))
    ys = sorted((draw(unit) * oh, draw(unit) * oh))
    return geo, Box(xs[0], ys[0], xs[1], ys[1])


@settings(max_examples=100, deadline=None, database=None)
@given(case=_geometry_and_box(), convention=st.sampled_from(list(CoordinateConvention)))
def test_round_trip_exact_model_coordinates(case, convention):
    geo, box = case
    back = map_box(box_to_model(box, geo, convention), geo, convention)
    assert back is not None
    for a, b in zip(_coords(back), _coords(box), strict=True):
        assert abs(a - b) <= 1e-6


@settings(max_examples=100, deadline=None, database=None)
@given(case=_geometry_and_box(), convention=st.sampled_from(list(CoordinateConvention)))
def test_round_trip_integer_model_coordinates_within_half_a_step(case, convention):
    geo, box = case
    model = box_to_model(box, geo, convention, quantize=True)
    assert all(float(v).is_integer() for v in _coords(model))
    back = map_box(model, geo, convention)
    assert back is not None
    step_x, step_y = scale_factors(geo, convention)  # pixels per model unit
    tol_x, tol_y = 0.5 * step_x + 1e-6, 0.5 * step_y + 1e-6
    assert abs(back.x_min - box.x_min) <= tol_x and abs(back.x_max - box.x_max) <= tol_x
    assert abs(back.y_min - box.y_min) <= tol_y and abs(back.y_max - box.y_max) <= tol_y
    if convention is NORM and max(geo.original_width, geo.original_height) <= 2000:
        assert all(abs(a - b) <= 1.0 for a, b in zip(_coords(back), _coords(box), strict=True))


@settings(max_examples=100, deadline=None, database=None)
@given(
    geo=st.builds(ImageGeometry, _SIDE, _SIDE, _SIDE, _SIDE),
    convention=st.sampled_from(list(CoordinateConvention)),
    coords=st.lists(
        st.floats(allow_nan=True, allow_infinity=True, width=64), min_size=4, max_size=4
    ),
)
def test_mapped_boxes_always_inside_image_and_ordered(geo, convention, coords):
    problems: list[str] = []
    out = map_box(Box(*coords), geo, convention, problems)
    if not all(math.isfinite(c) for c in coords):
        assert out is None and problems
        return
    assert out is not None
    assert 0 <= out.x_min <= out.x_max <= geo.original_width
    assert 0 <= out.y_min <= out.y_max <= geo.original_height
    assert out.degenerate == (out.x_min == out.x_max or out.y_min == out.y_max)


def _coords(b: Box) -> tuple[float, float, float, float]:
    return (b.x_min, b.y_min, b.x_max, b.y_max)


# --- IoU ------------------------------------------------------------------------------------


def test_box_iou_hand_computed():
    a = Box(0, 0, 10, 10)
    assert box_iou(a, a) == 1.0
    assert box_iou(a, Box(5, 0, 15, 10)) == pytest.approx(50 / 150)
    assert box_iou(a, Box(10, 0, 20, 10)) == 0.0  # touching edges
    assert box_iou(a, Box(20, 20, 30, 30)) == 0.0
    assert box_iou(a, Box(2, 2, 4, 4)) == pytest.approx(4 / 100)
    assert box_iou(a, Box(3, 3, 3, 8)) == 0.0  # degenerate
    assert box_iou(a, Box(10, 10, 0, 0)) == 0.0  # inverted has no area
    assert box_iou(a, Box(math.nan, 0, 1, 1)) == 0.0
    assert box_area(Box(0, 0, 2, 3)) == 6.0


@settings(max_examples=100, deadline=None, database=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=8, max_size=8))
def test_box_iou_is_symmetric_bounded_and_never_nan(c):
    a, b = Box(*c[:4]), Box(*c[4:])
    v = box_iou(a, b)
    assert 0.0 <= v <= 1.0
    assert v == box_iou(b, a)
