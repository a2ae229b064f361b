"""Map model coordinates to pixels of the original image, and back.

Two conventions exist, one per model family (results carry pixels; ``docs/INTERFACES.md``):

- ``NORMALIZED_1000`` (Qwen3-VL / Cosmos-Reason2): 0–1000 per axis, independent of the aspect
  ratio, origin top-left: ``x_orig = x / 1000 * original_width``.
- ``INPUT_PIXELS`` (Qwen2.5-VL / Cosmos-Reason1): absolute pixels of the resized model input:
  ``x_orig = x * original_width / input_width``. The package resizes the image to the input
  size itself, so ``ImageGeometry`` knows both sizes.

Mapped boxes and points are clamped to ``[0, width] × [0, height]``; boxes with inverted corners
are swapped; boxes with zero width or height after clamping are kept with ``degenerate=True``;
anything with a NaN or infinite coordinate is dropped. Each fix is reported in the optional
``problems`` list, so nothing here raises on model output (only on an invalid geometry).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TypeVar

from cosmos_reason_ros.core.types import (
    BadImageError,
    Box,
    CoordinateConvention,
    ImageGeometry,
    ParsedAnswer,
    Point,
    Trajectory,
)

NORMALIZED_RANGE = 1000.0
"""Full-axis extent of ``NORMALIZED_1000`` coordinates (Qwen3-VL / Cosmos-Reason2)."""


def check_geometry(geometry: ImageGeometry) -> None:
    """Raise :class:`BadImageError` unless every size in ``geometry`` is a positive integer."""
    for name in ("original_width", "original_height", "input_width", "input_height"):
        value = getattr(geometry, name)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise BadImageError(f"ImageGeometry.{name}={value!r}: expected a positive integer")


def model_extent(geometry: ImageGeometry, convention: CoordinateConvention) -> tuple[float, float]:
    """Width and height of the image in model units (1000×1000, or the input size).

    ``convention`` may also be its string value (``"normalized_1000"``, ``"input_pixels"``).
    """
    check_geometry(geometry)
    if CoordinateConvention(convention) is CoordinateConvention.NORMALIZED_1000:
        return NORMALIZED_RANGE, NORMALIZED_RANGE
    return float(geometry.input_width), float(geometry.input_height)


def scale_factors(geometry: ImageGeometry, convention: CoordinateConvention) -> tuple[float, float]:
    """Original-image pixels per model unit along x and y (the quantization step of a model)."""
    mw, mh = model_extent(geometry, convention)
    return geometry.original_width / mw, geometry.original_height / mh


def _to_pixels(value: float, size: int, extent: float) -> float:
    # value * size / extent (not value * (size / extent)): exact for integer coordinates that
    # land on whole pixels, e.g. 644 * 1920 / 1288 == 960.0.
    return value * size / extent


# --- model -> original pixels ---------------------------------------------------------------


def _clamp(value: float, high: float) -> float:
    return min(max(value, 0.0), high)


def _note(problems: list[str] | None, message: str) -> None:
    if problems is not None:
        problems.append(message)


def _finite(*values: float) -> bool:
    try:
        return all(math.isfinite(v) for v in values)
    except TypeError:
        return False


def map_point(
    point: Point,
    geometry: ImageGeometry,
    convention: CoordinateConvention,
    problems: list[str] | None = None,
    *,
    name: str = "point",
) -> Point | None:
    """Map a point from model coordinates to original-image pixels, clamped to the image.

    Returns ``None`` (and notes it in ``problems``) for a NaN or infinite coordinate.
    """
    mw, mh = model_extent(geometry, convention)
    if not _finite(point.x, point.y):
        _note(problems, f"{name} has a non-finite coordinate ({point.x}, {point.y}); dropped")
        return None
    w, h = geometry.original_width, geometry.original_height
    x, y = _to_pixels(point.x, w, mw), _to_pixels(point.y, h, mh)
    cx, cy = _clamp(x, w), _clamp(y, h)
    if cx != x or cy != y:
        _note(problems, f"{name} ({point.x:g}, {point.y:g}) lies outside the image; clamped")
    return replace(point, x=cx, y=cy)


def map_box(
    box: Box,
    geometry: ImageGeometry,
    convention: CoordinateConvention,
    problems: list[str] | None = None,
    *,
    name: str = "box",
) -> Box | None:
    """Map a box from model coordinates to original-image pixels.

    Inverted corners are swapped, the box is clamped to the image, and a box with zero width
    or height after that is kept with ``degenerate=True``. Returns ``None`` (and notes it) for
    a NaN or infinite coordinate.
    """
    mw, mh = model_extent(geometry, convention)
    coords = (box.x_min, box.y_min, box.x_max, box.y_max)
    if not _finite(*coords):
        _note(problems, f"{name} has a non-finite coordinate {coords}; dropped")
        return None
    x1, y1, x2, y2 = coords
    if x1 > x2 or y1 > y2:
        _note(problems, f"{name} has inverted corners {coords}; swapped")
        x1, x2 = min(x1, x2), max(x1, x2)
        y1, y2 = min(y1, y2), max(y1, y2)
    w, h = geometry.original_width, geometry.original_height
    px1, px2 = _to_pixels(x1, w, mw), _to_pixels(x2, w, mw)
    py1, py2 = _to_pixels(y1, h, mh), _to_pixels(y2, h, mh)
    cx1, cy1, cx2, cy2 = _clamp(px1, w), _clamp(py1, h), _clamp(px2, w), _clamp(py2, h)
    if (cx1, cy1, cx2, cy2) != (px1, py1, px2, py2):
        _note(problems, f"{name} {coords} extends outside the image; clamped")
    degenerate = cx1 >= cx2 or cy1 >= cy2
    if degenerate:
        _note(problems, f"{name} has zero width or height after clamping; kept as degenerate")
    score = box.score if box.score is None or _finite(box.score) else None
    return replace(
        box, x_min=cx1, y_min=cy1, x_max=cx2, y_max=cy2, score=score, degenerate=degenerate
    )


def map_trajectory(
    trajectory: Trajectory,
    geometry: ImageGeometry,
    convention: CoordinateConvention,
    problems: list[str] | None = None,
    *,
    name: str = "trajectory",
) -> Trajectory | None:
    """Map every point of a trajectory; non-finite points are dropped, an empty result is None."""
    points = []
    for i, point in enumerate(trajectory.points, start=1):
        mapped = map_point(point, geometry, convention, problems, name=f"{name} point {i}")
        if mapped is not None:
            points.append(mapped)
    if not points:
        _note(problems, f"{name} has no valid points; dropped")
        return None
    return replace(trajectory, points=tuple(points))


def map_answer(
    parsed: ParsedAnswer,
    geometry: ImageGeometry,
    convention: CoordinateConvention,
    problems: list[str] | None = None,
) -> tuple[tuple[Box, ...], tuple[Point, ...], tuple[Trajectory, ...]]:
    """Map a parsed answer's boxes, points and trajectories to original-image pixels.

    Returns ``(boxes, points, trajectories)``; what was fixed or dropped is appended to
    ``problems`` when a list is given. Raises :class:`BadImageError` only for an invalid
    ``geometry``.
    """
    check_geometry(geometry)
    boxes = [
        map_box(b, geometry, convention, problems, name=f"box {i}")
        for i, b in enumerate(parsed.boxes, start=1)
    ]
    points = [
        map_point(p, geometry, convention, problems, name=f"point {i}")
        for i, p in enumerate(parsed.points, start=1)
    ]
    trajectories = [
        map_trajectory(t, geometry, convention, problems, name=f"trajectory {i}")
        for i, t in enumerate(parsed.trajectories, start=1)
    ]
    return (
        tuple(b for b in boxes if b is not None),
        tuple(p for p in points if p is not None),
        tuple(t for t in trajectories if t is not None),
    )


def camera_of(
    named: str, cameras: Sequence[str], problems: list[str] | None, what: str
) -> str | None:
    """Return the camera of ``cameras`` an answer's item names, or ``None`` (noted) if none.

    Exact names first, then a unique case-insensitive match ("Front" for "front": the same
    name, spelled freely when decoding is not constrained). Anything else is a problem, never
    a guess: coordinates in the wrong image would point at the wrong thing.
    """
    name = named.strip()
    if name in cameras:
        return name
    folded = [c for c in cameras if c.casefold() == name.casefold()]
    if name and len(folded) == 1:
        return folded[0]
    allowed = ", ".join(f'"{c}"' for c in cameras)
    if not name:
        _note(problems, f"{what} names no camera (expected one of {allowed}); dropped")
    else:
        _note(problems, f"{what} names camera {name!r:.60}, not one of {allowed}; dropped")
    return None


_Item = TypeVar("_Item", Box, Point, Trajectory)


def map_answer_by_camera(
    parsed: ParsedAnswer,
    geometries: Mapping[str, ImageGeometry],
    convention: CoordinateConvention,
    problems: list[str] | None = None,
) -> tuple[tuple[Box, ...], tuple[Point, ...], tuple[Trajectory, ...]]:
    """Map a multi-image answer: every item with the geometry of the camera it names.

    ``geometries`` holds each camera's image (name -> geometry, in camera order). Each box,
    point and trajectory is mapped to its own camera's original pixels and carries that
    camera's name. With one camera every item is in its image whatever the model wrote; with
    several, an item that names no camera of ``geometries`` is dropped and noted in
    ``problems``, like any other unusable item.
    """
    for geometry in geometries.values():
        check_geometry(geometry)
    names = list(geometries)
    if not names:
        raise BadImageError("map_answer_by_camera needs at least one camera geometry")

    def mapped(items: Sequence[_Item], what: str,
               map_one: Callable[..., _Item | None]) -> list[tuple[str, _Item]]:
        """Each item mapped with its camera's geometry, with that camera's name."""
        out = []
        for i, item in enumerate(items, start=1):
            label = f"{what} {i}"
            name = names[0] if len(names) == 1 else camera_of(item.camera, names, problems,
                                                                label)
            if name is None:
                continue
            result = map_one(item, geometries[name], convention, problems, name=label)
            if result is not None:
                out.append((name, result))
        return out

    boxes = [replace(b, camera=name) for name, b in mapped(parsed.boxes, "box", map_box)]
    points = [replace(p, camera=name)
              for name, p in mapped(parsed.points, "point", map_point)]
    trajectories = [replace(t, camera=name, points=tuple(replace(p, camera=name)
                                                         for p in t.points))
                    for name, t in mapped(parsed.trajectories, "trajectory", map_trajectory)]
    return tuple(boxes), tuple(points), tuple(trajectories)


# --- original pixels -> model ---------------------------------------------------------------


def _to_model(value: float, size: int, extent: float, quantize: bool) -> float:
    out = value * extent / size
    return float(round(out)) if quantize and math.isfinite(out) else out


def point_to_model(
    point: Point,
    geometry: ImageGeometry,
    convention: CoordinateConvention,
    *,
    quantize: bool = False,
) -> Point:
    """Map a point in original-image pixels to model coordinates (the inverse of map_point).

    ``quantize`` rounds to integers as the models emit them. No clamping is applied.
    """
    mw, mh = model_extent(geometry, convention)
    w, h = geometry.original_width, geometry.original_height
    return Point(
        _to_model(point.x, w, mw, quantize), _to_model(point.y, h, mh, quantize), point.label
    )


def box_to_model(
    box: Box,
    geometry: ImageGeometry,
    convention: CoordinateConvention,
    *,
    quantize: bool = False,
) -> Box:
    """Map a box in original-image pixels to model coordinates (the inverse of map_box).

    Used for tests, ground-truth scoring and prompts that show the model a region.
    ``quantize`` rounds to integers as the models emit them. No clamping is applied.
    """
    mw, mh = model_extent(geometry, convention)
    w, h = geometry.original_width, geometry.original_height
    return replace(
        box,
        x_min=_to_model(box.x_min, w, mw, quantize),
        y_min=_to_model(box.y_min, h, mh, quantize),
        x_max=_to_model(box.x_max, w, mw, quantize),
        y_max=_to_model(box.y_max, h, mh, quantize),
    )


def trajectory_to_model(
    trajectory: Trajectory,
    geometry: ImageGeometry,
    convention: CoordinateConvention,
    *,
    quantize: bool = False,
) -> Trajectory:
    """Map a trajectory in original-image pixels to model coordinates."""
    return Trajectory(
        points=tuple(
            point_to_model(p, geometry, convention, quantize=quantize) for p in trajectory.points
        ),
        label=trajectory.label,
    )


# --- measures -------------------------------------------------------------------------------


def box_area(box: Box) -> float:
    """Area of a box (0 for inverted, degenerate or non-finite boxes)."""
    w, h = box.x_max - box.x_min, box.y_max - box.y_min
    if not _finite(w, h) or w <= 0 or h <= 0:
        return 0.0
    return w * h


def box_iou(a: Box, b: Box) -> float:
    """Intersection over union of two boxes in the same coordinate space, in [0, 1].

    Boxes with no area (degenerate, inverted, non-finite) give 0.
    """
    area_a, area_b = box_area(a), box_area(b)
    if area_a <= 0 or area_b <= 0:
        return 0.0
    iw = min(a.x_max, b.x_max) - max(a.x_min, b.x_min)
    ih = min(a.y_max, b.y_max) - max(a.y_min, b.y_min)
    if iw <= 0 or ih <= 0:
        return 0.0
    inter = iw * ih
    union = area_a + area_b - inter
    if not math.isfinite(union) or union <= 0:
        return 0.0
    return min(1.0, max(0.0, inter / union))
