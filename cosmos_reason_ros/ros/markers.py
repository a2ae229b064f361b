"""3D answers for RViz/Foxglove (``~/markers``) and a servoing hook (``~/target_point``).

Markers: a cube per lifted box (its size, a label above it), a sphere per lifted point, a
line strip through each trajectory's lifted waypoints; each result first deletes the previous
result's markers, so the display shows the latest answer only. The target point is the first
lifted point of the answer, else the first lifted box's centre.
"""

from __future__ import annotations

from typing import Any

from geometry_msgs.msg import PointStamped
from visualization_msgs.msg import Marker, MarkerArray

from cosmos_reason_interfaces.msg import ReasoningResult
from cosmos_reason_ros.ros.detections import header_3d, is_detection

MIN_SIZE_M = 0.01  # a flat object must still show
_BOX_COLOUR = (0.1, 0.8, 0.2, 0.5)
_POINT_COLOUR = (1.0, 0.3, 0.1, 0.9)
_PATH_COLOUR = (0.2, 0.5, 1.0, 0.9)


def _marker(result: ReasoningResult, ns: str, marker_id: int, kind: int,
            colour: tuple[float, float, float, float]) -> Marker:
    m = Marker(header=header_3d(result), ns=ns, id=marker_id, type=kind, action=Marker.ADD)
    m.pose.orientation.w = 1.0
    m.color.r, m.color.g, m.color.b, m.color.a = colour
    return m


def _label(result: ReasoningResult, marker_id: int, text: str, at: Any, above_m: float
           ) -> Marker:
    m = _marker(result, "labels", marker_id, Marker.TEXT_VIEW_FACING, (1.0, 1.0, 1.0, 1.0))
    m.pose.position.x, m.pose.position.y = at.x, at.y
    m.pose.position.z = at.z
    m.pose.position.y -= above_m  # optical frames point y down: "above" is -y
    m.scale.z = 0.05
    m.text = text
    return m


def to_markers(result: ReasoningResult) -> MarkerArray:
    """Markers for every lifted box, point and trajectory of ``result``."""
    markers = [Marker(header=header_3d(result), action=Marker.DELETEALL)]
    next_id = 0
    for box in result.boxes:
        p = box.position_3d
        if not is_detection(box) or not p.valid:
            continue
        cube = _marker(result, "boxes", next_id, Marker.CUBE, _BOX_COLOUR)
        cube.pose.position = p.position
        cube.scale.x, cube.scale.y, cube.scale.z = (max(MIN_SIZE_M, v)
                                                    for v in (p.size.x, p.size.y, p.size.z))
        markers += [cube, _label(result, next_id, box.label, p.position, p.size.y / 2 + 0.03)]
        next_id += 1
    for point in result.points:
        p = point.position_3d
        if not p.valid:
            continue
        sphere = _marker(result, "points", next_id, Marker.SPHERE, _POINT_COLOUR)
        sphere.pose.position = p.position
        sphere.scale.x = sphere.scale.y = sphere.scale.z = 0.03
        markers += [sphere, _label(result, next_id, point.label, p.position, 0.04)]
        next_id += 1
    for trajectory in result.trajectories:
        strip = _marker(result, "trajectories", next_id, Marker.LINE_STRIP, _PATH_COLOUR)
        strip.scale.x = 0.01
        strip.points = [w.position_3d.position for w in trajectory.points
                        if w.position_3d.valid]
        if len(strip.points) >= 2:
            markers.append(strip)
            next_id += 1
    return MarkerArray(markers=markers)


def target_point(result: ReasoningResult) -> PointStamped | None:
    """Return the first lifted point, else the first lifted box's centre (or None)."""
    for point in result.points:
        if point.position_3d.valid:
            return PointStamped(header=header_3d(result), point=point.position_3d.position)
    for box in result.boxes:
        if is_detection(box) and box.position_3d.valid:
            return PointStamped(header=header_3d(result), point=box.position_3d.position)
    return None
