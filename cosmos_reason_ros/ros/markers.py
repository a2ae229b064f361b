"""3D answers for RViz/Foxglove (``~/markers``), servoing and grasp targets (``~/target_*``).

Markers: a cube per lifted box (its pose and size, a label above it), a sphere per lifted
point, a line strip through each trajectory's lifted waypoints; each result first deletes the
previous result's markers, so the display shows the latest answer only. The target point is
the first lifted point of the answer, else the first lifted box's centre, else the first
lifted waypoint of its trajectories. The target pose is the first lifted point, else the first
lifted box's centre, with the approach frame of the surface there (``core/normals.py``: z into
the surface, x along the image's right).

"Above" is up in the scene: -y in the camera's optical frame (y points down, REP 103), +z in
``depth.target_frame`` (a body or world frame: z up, REP 103).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from geometry_msgs.msg import PointStamped, PoseStamped, Quaternion
from visualization_msgs.msg import Marker, MarkerArray

from cosmos_reason_interfaces.msg import ReasoningResult
from cosmos_reason_ros.ros.detections import header_3d, is_detection
from cosmos_reason_ros.ros.target_frame import quaternion_product, rotation_matrix

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


def _up(result: ReasoningResult) -> np.ndarray:
    """Return the scene's "up" in ``frame_3d``: -y in the camera's optical frame, else +z."""
    if not result.frame_3d or result.frame_3d == result.header.frame_id:
        return np.array([0.0, -1.0, 0.0])
    return np.array([0.0, 0.0, 1.0])


def _label(result: ReasoningResult, marker_id: int, text: str, position3d: Any,
           margin_m: float) -> Marker:
    """Make a label ``margin_m`` above the item's top (its extent along "up" from its pose)."""
    p, q, s = position3d.position, position3d.orientation, position3d.size
    up = _up(result)
    axes = rotation_matrix((q.x, q.y, q.z, q.w))  # the item's axes, as columns
    half_height = 0.5 * float(np.abs(up @ axes) @ np.nan_to_num([s.x, s.y, s.z]))
    x, y, z = np.array([p.x, p.y, p.z]) + up * (half_height + margin_m)
    m = _marker(result, "labels", marker_id, Marker.TEXT_VIEW_FACING, (1.0, 1.0, 1.0, 1.0))
    m.pose.position.x, m.pose.position.y, m.pose.position.z = float(x), float(y), float(z)
    m.scale.z = 0.05
    m.text = text
    return m


def to_markers(result: ReasoningResult) -> MarkerArray:
    """Markers for every lifted box, point and trajectory of ``result``.

    The first is always DELETEALL, so each answer replaces the previous answer's markers; with
    nothing lifted it is the only one.
    """
    markers = [Marker(header=header_3d(result), action=Marker.DELETEALL)]
    next_id = 0
    for box in result.boxes:
        p = box.position_3d
        if not is_detection(box) or not p.valid:
            continue
        cube = _marker(result, "boxes", next_id, Marker.CUBE, _BOX_COLOUR)
        cube.pose.position = p.position
        cube.pose.orientation = p.orientation  # the scale is along the box's own axes
        cube.scale.x, cube.scale.y, cube.scale.z = (max(MIN_SIZE_M, v)
                                                    for v in (p.size.x, p.size.y, p.size.z))
        markers += [cube, _label(result, next_id, box.label, p, 0.03)]
        next_id += 1
    for point in result.points:
        p = point.position_3d
        if not p.valid:
            continue
        sphere = _marker(result, "points", next_id, Marker.SPHERE, _POINT_COLOUR)
        sphere.pose.position = p.position
        sphere.scale.x = sphere.scale.y = sphere.scale.z = 0.03
        markers += [sphere, _label(result, next_id, point.label, p, 0.04)]
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
    """Return the first lifted point, else box centre, else trajectory waypoint (or None).

    For a trajectory the first lifted waypoint: where the end effector is to go first.
    """
    for point in result.points:
        if point.position_3d.valid:
            return PointStamped(header=header_3d(result), point=point.position_3d.position)
    for box in result.boxes:
        if is_detection(box) and box.position_3d.valid:
            return PointStamped(header=header_3d(result), point=box.position_3d.position)
    for trajectory in result.trajectories:
        for waypoint in trajectory.points:
            if waypoint.position_3d.valid:
                return PointStamped(header=header_3d(result),
                                    point=waypoint.position_3d.position)
    return None


def pose_target(result: ReasoningResult) -> tuple[Any, float, float] | None:
    """Return the target pose's item (its ``position_3d``) and colour pixel, or None.

    The first lifted point, else the first lifted box (its centre pixel): what a ground or
    point goal asks the robot to reach.
    """
    for point in result.points:
        if point.position_3d.valid:
            return point.position_3d, float(point.x), float(point.y)
    for box in result.boxes:
        if is_detection(box) and box.position_3d.valid:
            return (box.position_3d, (box.x_min + box.x_max) / 2.0,
                    (box.y_min + box.y_max) / 2.0)
    return None


def target_pose(result: ReasoningResult, position3d: Any,
                approach: tuple[float, float, float, float]) -> PoseStamped:
    """Return the item's position with the ``approach`` frame (in the camera's optical axes).

    The item's orientation is the camera's axes in ``frame_3d`` (identity in the camera's
    frame, the camera's rotation at the image stamp in ``depth.target_frame``), so the
    approach turns with it into that frame.
    """
    q = position3d.orientation
    x, y, z, w = quaternion_product((q.x, q.y, q.z, q.w), approach)
    pose = PoseStamped(header=header_3d(result))
    pose.pose.position = position3d.position
    pose.pose.orientation = Quaternion(x=x, y=y, z=z, w=w)
    return pose
