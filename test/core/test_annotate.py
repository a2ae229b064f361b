"""draw_annotations: marks land where the geometry is, nothing else changes, input is kept."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cosmos_reason_ros.core.annotate import ascii_text, draw_annotations, label_colour
from cosmos_reason_ros.core.types import BadImageError, Box, Point, Trajectory

GREY = 90


def grey(height: int = 240, width: int = 320) -> np.ndarray:
    return np.full((height, width, 3), GREY, dtype=np.uint8)


def changed(before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """HxW mask of pixels that differ."""
    return np.any(before != after, axis=2)


def test_box_outline_pixels_change_and_far_pixels_do_not():
    image = grey()
    out = draw_annotations(image, boxes=[Box(100, 120, 200, 200, label="cup")])
    diff = changed(image, out)
    # On each edge of the outline, away from the label.
    assert diff[160, 100] and diff[160, 200] and diff[200, 150] and diff[120, 150]
    assert not diff[160, 150]  # box interior
    assert not diff[20:60, 250:].any() and not diff[220:, :60].any()
    assert tuple(out[160, 100]) == label_colour("cup")


def test_box_label_has_filled_background_above_the_box():
    image = grey()
    out = draw_annotations(image, boxes=[Box(100, 120, 200, 200, label="cup")])
    above = changed(image, out)[108:118, 101:116]  # just above the top-left corner
    assert above.all()  # a solid label background, not just thin glyph strokes


def test_box_at_the_top_edge_keeps_its_label_inside_the_image():
    image = grey()
    out = draw_annotations(image, boxes=[Box(250, 0, 319, 60, label="a long label")])
    diff = changed(image, out)
    assert diff[5:15, 255:300].any()  # label drawn inside the top of the box
    assert not diff[100:, :200].any()


def test_input_is_not_modified_and_a_new_array_is_returned():
    image = grey()
    before = image.copy()
    out = draw_annotations(image, boxes=[Box(10, 10, 50, 50, "a")], points=[Point(5, 5, "p")],
                           trajectories=[Trajectory((Point(0, 0), Point(30, 30)), "t")],
                           title="answer")
    np.testing.assert_array_equal(image, before)
    assert out is not image and not np.shares_memory(out, image)
    assert out.dtype == np.uint8 and out.shape == image.shape


def test_empty_inputs_return_an_equal_copy():
    image = np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    out = draw_annotations(image, [], [], [], "")
    np.testing.assert_array_equal(out, image)
    assert not np.shares_memory(out, image)


def test_non_contiguous_input_is_drawn_on_a_contiguous_copy():
    image = np.full((100, 100, 4), GREY, dtype=np.uint8)[:, :, :3]
    out = draw_annotations(image, points=[Point(50, 50)])
    assert out.flags.c_contiguous and changed(image, out)[50, 50]


def test_point_is_drawn_at_its_coordinates():
    image = grey()
    out = draw_annotations(image, points=[Point(60.4, 180.6, "handle")])
    diff = changed(image, out)
    assert diff[181, 60] and diff[181, 56] and diff[177, 60]  # disc and cross
    assert not diff[:120].any()  # nothing far above the point (label sits just above it)
    assert tuple(out[181, 60]) == label_colour("handle")


def test_trajectory_is_drawn_along_its_segments_with_a_start_marker():
    image = grey()
    path = Trajectory((Point(40, 200), Point(160, 200), Point(160, 60)), label="gripper")
    out = draw_annotations(image, trajectories=[path])
    diff = changed(image, out)
    assert diff[200, 100] and diff[130, 160]  # middle of each segment
    assert diff[200, 40]  # start marker
    assert not diff[100:180, 40:140].any()  # inside the corner the path turns around
    assert not diff[:, 260:].any()


def test_arrow_heads_point_along_the_path():
    image = grey()
    out = draw_annotations(image, trajectories=[Trajectory((Point(20, 120), Point(300, 120)))])
    diff = changed(image, out)
    # The head flares out across more rows just before the end than the shaft does elsewhere.
    assert diff[:, 292].sum() > diff[:, 75].sum() + 3


def test_degenerate_box_is_drawn_as_a_visible_cross():
    image = grey()
    out = draw_annotations(image, boxes=[Box(150, 100, 150, 100, label="x", degenerate=True)])
    diff = changed(image, out)
    assert diff[100, 150] and diff[96, 146] and diff[104, 154] and diff[96, 154]
    assert not diff[180:, :].any()


def test_nan_and_inf_coordinates_are_skipped():
    image = grey()
    out = draw_annotations(
        image,
        boxes=[Box(math.nan, 0, 10, 10), Box(0, 0, math.inf, 10)],
        points=[Point(math.nan, 5), Point(5, -math.inf)],
        trajectories=[Trajectory((Point(math.nan, math.nan),)), Trajectory(())],
    )
    np.testing.assert_array_equal(out, image)


def test_trajectory_skips_only_the_invalid_waypoints():
    image = grey()
    path = Trajectory((Point(40, 100), Point(math.nan, 0), Point(200, 100)))
    diff = changed(image, draw_annotations(image, trajectories=[path]))
    assert diff[100, 120]


def test_far_off_coordinates_do_not_overflow():
    image = grey()
    out = draw_annotations(image, boxes=[Box(-1e30, -1e30, 1e30, 1e30)],
                           points=[Point(1e12, 1e12)],
                           trajectories=[Trajectory((Point(-1e20, 0), Point(1e20, 0)))])
    assert out.shape == image.shape


def test_title_banner_darkens_the_top_and_keeps_the_rest():
    image = grey()
    out = draw_annotations(image, title="There are two cups on the table. " * 10)
    diff = changed(image, out)
    assert diff[:8].all()  # the whole banner row is shaded
    assert not diff[60:].any()


def test_colour_is_stable_per_label_and_scores_are_optional():
    assert label_colour("cup") == label_colour("cup")
    assert len({label_colour(f"object {i}") for i in range(40)}) > 3
    image = grey()
    a = draw_annotations(image, boxes=[Box(10, 40, 100, 100, "cup", score=0.87)])
    b = draw_annotations(image, boxes=[Box(10, 40, 100, 100, "cup", score=math.nan)])
    assert tuple(a[70, 10]) == tuple(b[70, 10]) == label_colour("cup")
    assert not np.array_equal(a, b)  # the score is part of the label text


def test_non_ascii_labels_are_drawn_as_question_marks():
    assert ascii_text("红色杯子 cup\nnext") == "???? cup next"
    image = grey()
    out = draw_annotations(image, boxes=[Box(50, 80, 150, 150, "红色杯子")],
                           points=[Point(200, 200, "tête")], title="桌子上有几个杯子？")
    assert changed(image, out)[115, 50]


def test_tiny_image():
    image = np.zeros((8, 8, 3), dtype=np.uint8)
    out = draw_annotations(image, boxes=[Box(1, 1, 6, 6, "a box with a long label")],
                           points=[Point(4, 4, "p")],
                           trajectories=[Trajectory((Point(0, 0), Point(7, 7)), "t")],
                           title="a title far wider than eight pixels")
    assert out.shape == (8, 8, 3) and changed(image, out).any()


def test_huge_image_scales_line_thickness():
    image = np.zeros((3000, 4000, 3), dtype=np.uint8)
    out = draw_annotations(image, boxes=[Box(1000, 1000, 2000, 2000, "cup")])
    diff = changed(image, out)
    assert diff[1500, 1000:1005].all()  # several pixels thick, not a hairline
    assert not diff[2500:, :].any()


@pytest.mark.parametrize("bad", [np.zeros((10, 10), np.uint8), np.zeros((10, 10, 3), np.float32),
                                 np.zeros((0, 10, 3), np.uint8), [[0, 0, 0]]])
def test_bad_image_raises_bad_image_error(bad):
    with pytest.raises(BadImageError, match="rgb"):
        draw_annotations(bad)
