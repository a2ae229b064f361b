"""Draw boxes, points and trajectories onto a copy of an RGB image (for ``~/annotated_image``).

Pure numpy + OpenCV. Geometry is read by attribute, so both the core types (``Box``,
``Point``, ``Trajectory``) and the ROS messages (``Box2D``, ``Point2D``, ``Trajectory2D``,
whose field names match) can be drawn. Coordinates are original-image pixels.

OpenCV's Hershey fonts cover printable ASCII only (they draw other code points as ``?`` boxes
or nothing at all), so every non-ASCII character of a label or title is drawn as ``?``; the
full text stays in ``~/results``.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

from cosmos_reason_ros.core.types import BadImageError

# Tableau-10-like colours (RGB): distinct, readable on typical camera images.
PALETTE: tuple[tuple[int, int, int], ...] = (
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (188, 189, 34),
    (23, 190, 207),
    (255, 215, 0),
)
TITLE_MAX_CHARS = 80
_FONT = cv2.FONT_HERSHEY_SIMPLEX
# Coordinates are clamped to this many image sizes around the image before the int conversion
# OpenCV needs: far-off values (1e30 from a bad parse) would overflow int32, and OpenCV clips
# whatever lies outside the image anyway.
_COORD_MARGIN = 4


@dataclass(frozen=True)
class _Style:
    """Sizes scaled with the image so annotations read the same at 320 px and at 4K."""

    line: int  # box and trajectory line thickness
    font_scale: float
    font_thickness: int
    radius: int  # point marker radius
    pad: int  # space around label text

    @classmethod
    def for_image(cls, width: int, height: int) -> _Style:
        size = max(width, height)
        line = max(2, round(size / 300))  # 2 px at 640, 6 px at 1920, 13 px at 4000
        font_scale = max(0.35, size / 1400)  # ~10 px glyphs at 640, ~30 px at 1920
        return cls(line=line, font_scale=font_scale,
                   font_thickness=max(1, round(font_scale * 1.6)),
                   radius=max(2, line * 2), pad=max(1, line))


def label_colour(label: str) -> tuple[int, int, int]:
    """Return a stable RGB colour for ``label`` (CRC32: ``hash()`` is salted per process)."""
    return PALETTE[zlib.crc32(label.encode("utf-8")) % len(PALETTE)]


def ascii_text(text: str) -> str:
    """``text`` with line breaks as spaces and every non-ASCII character as ``?``.

    Hershey fonts have glyphs for printable ASCII only; CJK or accented labels would otherwise
    be dropped or garbled.
    """
    flat = " ".join(text.split())
    return "".join(c if " " <= c <= "~" else "?" for c in flat)


def draw_annotations(rgb: np.ndarray, boxes: Iterable[Any] = (), points: Iterable[Any] = (),
                     trajectories: Iterable[Any] = (), title: str = "") -> np.ndarray:
    """Return a new RGB uint8 image: ``rgb`` with the geometry and an optional title drawn.

    ``rgb`` (HxWx3 uint8) is never modified. Boxes get a thick outline in their label's
    colour and a label (with the score, when finite) on a filled background above them;
    degenerate boxes (zero width or height) are drawn as a short cross so they stay visible.
    Points are a filled circle with a cross; trajectories a polyline with an arrow head on every
    segment and a ring at the start. ``title`` (its first 80 characters) goes in a translucent
    banner at the top, drawn first so that no geometry is hidden under it. Anything with a NaN
    or infinite coordinate is skipped (waypoints individually).
    """
    if not (isinstance(rgb, np.ndarray) and rgb.ndim == 3 and rgb.shape[2] == 3
            and rgb.dtype == np.uint8 and rgb.shape[0] > 0 and rgb.shape[1] > 0):
        shape = getattr(rgb, "shape", None)
        dtype = getattr(rgb, "dtype", type(rgb).__name__)
        raise BadImageError(f"rgb: got shape={shape} dtype={dtype}, expected HxWx3 uint8")
    out = np.array(rgb, dtype=np.uint8, order="C", copy=True)
    height, width = out.shape[:2]
    style = _Style.for_image(width, height)
    if title:
        _draw_title(out, title, style)
    for box in boxes:
        _draw_box(out, box, style)
    for trajectory in trajectories:
        _draw_trajectory(out, trajectory, style)
    for point in points:  # last: the smallest marks stay on top
        _draw_point(out, point, style)
    return out


# --- primitives ------------------------------------------------------------------------------


def _finite(*values: float) -> bool:
    return all(math.isfinite(float(v)) for v in values)


def _px(value: float, size: int) -> int:
    limit = _COORD_MARGIN * size
    return int(round(min(max(float(value), -limit), limit + size)))


def _contrast(colour: tuple[int, int, int]) -> tuple[int, int, int]:
    """Black or white, whichever reads better on ``colour`` (Rec. 601 luma)."""
    r, g, b = colour
    return (0, 0, 0) if 0.299 * r + 0.587 * g + 0.114 * b > 140 else (255, 255, 255)


def _text_size(text: str, style: _Style) -> tuple[int, int, int]:
    (w, h), baseline = cv2.getTextSize(text, _FONT, style.font_scale, style.font_thickness)
    return w, h, baseline


def _draw_label(out: np.ndarray, text: str, colour: tuple[int, int, int], anchor_x: int,
                anchor_y: int, style: _Style, below_y: int | None = None) -> None:
    """Draw ``text`` on a filled ``colour`` box whose bottom-left corner is at the anchor.

    When there is no room above ``anchor_y``, the label goes below ``below_y`` (or just under
    the anchor). The label is shifted to stay inside the image horizontally and vertically.
    """
    text = ascii_text(text)
    if not text:
        return
    height, width = out.shape[:2]
    tw, th, baseline = _text_size(text, style)
    box_w, box_h = tw + 2 * style.pad, th + baseline + 2 * style.pad
    top = anchor_y - box_h
    if top < 0:
        top = (below_y if below_y is not None else anchor_y) + 1
    top = min(max(top, 0), max(height - box_h, 0))
    left = min(max(anchor_x, 0), max(width - box_w, 0))
    cv2.rectangle(out, (left, top), (left + box_w - 1, top + box_h - 1), colour, cv2.FILLED)
    cv2.putText(out, text, (left + style.pad, top + style.pad + th), _FONT, style.font_scale,
                _contrast(colour), style.font_thickness, cv2.LINE_AA)


def _draw_cross(out: np.ndarray, x: int, y: int, half: int, colour: tuple[int, int, int],
                thickness: int) -> None:
    cv2.line(out, (x - half, y - half), (x + half, y + half), colour, thickness, cv2.LINE_AA)
    cv2.line(out, (x - half, y + half), (x + half, y - half), colour, thickness, cv2.LINE_AA)


def _draw_title(out: np.ndarray, title: str, style: _Style) -> None:
    text = ascii_text(title)
    if len(text) > TITLE_MAX_CHARS:
        text = text[: TITLE_MAX_CHARS - 3].rstrip() + "..."
    if not text:
        return
    height, width = out.shape[:2]
    tw, th, baseline = _text_size(text, style)
    room = width - 2 * style.pad
    if tw > room:  # Hershey glyphs are close to fixed width: cut to what fits
        keep = max(1, int(len(text) * room / tw) - 3)
        text = text[:keep].rstrip() + "..."
    banner_h = min(height, th + baseline + 2 * style.pad)
    # Darken the banner rows instead of painting them over, so the scene stays visible.
    out[:banner_h] = (out[:banner_h].astype(np.uint16) * 2 // 7).astype(np.uint8)
    cv2.putText(out, text, (style.pad, style.pad + th), _FONT, style.font_scale,
                (255, 255, 255), style.font_thickness, cv2.LINE_AA)


def _draw_box(out: np.ndarray, box: Any, style: _Style) -> None:
    if not _finite(box.x_min, box.y_min, box.x_max, box.y_max):
        return
    height, width = out.shape[:2]
    x0, x1 = sorted((_px(box.x_min, width), _px(box.x_max, width)))
    y0, y1 = sorted((_px(box.y_min, height), _px(box.y_max, height)))
    label = str(getattr(box, "label", "") or "")
    colour = label_colour(label)
    score = getattr(box, "score", None)
    text = label
    if score is not None and math.isfinite(float(score)):
        text = f"{label} {float(score):.2f}".strip()
    if getattr(box, "degenerate", False) or x1 - x0 < 1 or y1 - y0 < 1:
        cx, cy = (x0 + x1) // 2, (y0 + y1) // 2
        half = max(4, 3 * style.line)
        _draw_cross(out, cx, cy, half, colour, style.line)
        _draw_label(out, text, colour, cx - half, cy - half - style.line, style,
                    below_y=cy + half + style.line)
        return
    # LINE_8: axis-aligned edges gain nothing from anti-aliasing, and keep the exact colour.
    cv2.rectangle(out, (x0, y0), (x1, y1), colour, style.line, cv2.LINE_8)
    # Label flush with the outline's outer edge, falling back to inside the top of the box.
    outer = style.line // 2
    _draw_label(out, text, colour, x0 - outer, y0 - outer, style, below_y=y0 + outer)


def _draw_point(out: np.ndarray, point: Any, style: _Style) -> None:
    if not _finite(point.x, point.y):
        return
    height, width = out.shape[:2]
    x, y = _px(point.x, width), _px(point.y, height)
    label = str(getattr(point, "label", "") or "")
    colour = label_colour(label)
    r = style.radius
    cv2.circle(out, (x, y), r, colour, cv2.FILLED, cv2.LINE_AA)
    cv2.circle(out, (x, y), r, _contrast(colour), max(1, style.line // 2), cv2.LINE_AA)
    # The cross reaches past the disc so the exact location reads even on a busy background.
    arm = 2 * r
    thin = max(1, style.line // 2)
    cv2.line(out, (x - arm, y), (x + arm, y), colour, thin, cv2.LINE_AA)
    cv2.line(out, (x, y - arm), (x, y + arm), colour, thin, cv2.LINE_AA)
    _draw_label(out, label, colour, x + arm + style.pad, y - style.pad, style, below_y=y + arm)


def _draw_trajectory(out: np.ndarray, trajectory: Any, style: _Style) -> None:
    height, width = out.shape[:2]
    waypoints = [(_px(p.x, width), _px(p.y, height))
                 for p in trajectory.points if _finite(p.x, p.y)]
    if not waypoints:
        return
    label = str(getattr(trajectory, "label", "") or "")
    colour = label_colour(label)
    head_px = max(8.0, 5.0 * style.line)
    for start, end in zip(waypoints, waypoints[1:], strict=False):
        length = math.hypot(end[0] - start[0], end[1] - start[1])
        if length < 1:
            continue
        # tipLength is a fraction of the segment: keep heads the same size on every segment.
        tip = min(0.5, head_px / length)
        cv2.arrowedLine(out, start, end, colour, style.line, cv2.LINE_AA, 0, tip)
    x, y = waypoints[0]
    ring = style.radius + style.line
    cv2.circle(out, (x, y), ring, colour, style.line, cv2.LINE_AA)
    cv2.circle(out, (x, y), max(1, style.line), colour, cv2.FILLED, cv2.LINE_AA)
    _draw_label(out, label, colour, x + ring + style.pad, y - style.pad, style, below_y=y + ring)
