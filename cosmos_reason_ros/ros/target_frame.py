"""3D answers in a ``target_frame`` through tf2_ros, looked up at the colour image's stamp.

yolo_ros users found 3D boxes off while the robot moved because TF was looked up at "latest"
instead of the image stamp; here the lookup is at the stamp of the frame the answer is about,
with a bounded wait. tf2_ros is optional (no PyPI wheel): without it the node says once that
``target_frame`` is ignored and positions stay in the camera's optical frame. No TF code of
our own: only the rigid transform tf2 returns is applied, to each item's pose (position and
axes; a box's size stays along its own axes).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
from rclpy.duration import Duration
from rclpy.time import Time

from cosmos_reason_ros.core.answer3d import Answer3D, LiftCode
from cosmos_reason_ros.core.lifting import Lifted


def rotation_matrix(q: tuple[float, float, float, float]) -> np.ndarray:
    """Rotation matrix of a unit quaternion (x, y, z, w)."""
    x, y, z, w = q
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
        [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
        [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)]])


def quaternion_product(a: tuple[float, float, float, float],
                       b: tuple[float, float, float, float]) -> tuple[float, float, float, float]:
    """Hamilton product ``a * b`` of (x, y, z, w) quaternions (``b``'s rotation first), unit."""
    ax, ay, az, aw = a
    bx, by, bz, bw = b
    q = (aw * bx + ax * bw + ay * bz - az * by,
         aw * by - ax * bz + ay * bw + az * bx,
         aw * bz + ax * by - ay * bx + az * bw,
         aw * bw - ax * bx - ay * by - az * bz)
    norm = math.sqrt(sum(v * v for v in q))  # tf2 quaternions are unit only to float precision
    return (q[0] / norm, q[1] / norm, q[2] / norm, q[3] / norm)


class TargetFrame:
    """Transforms :class:`Answer3D` positions into ``target_frame`` (empty: no transform)."""

    def __init__(self, node: Any, target_frame: str, timeout_s: float,
                 buffer: Any = None) -> None:
        """Listen to TF when ``target_frame`` is set and tf2_ros is importable.

        ``buffer`` replaces tf2_ros's ``Buffer`` (anything with ``lookup_transform(target,
        source, time, timeout)`` returning a ``TransformStamped``), e.g. in tests.
        """
        self.target_frame = target_frame
        self.timeout = Duration(seconds=timeout_s)
        self.buffer = buffer
        self._listener = None
        if not target_frame or buffer is not None:
            return
        try:
            import tf2_ros
        except ImportError:
            node.get_logger().warning(
                f"target_frame={target_frame!r} is ignored: tf2_ros is not installed; 3D "
                f"positions stay in the camera's optical frame")
            self.target_frame = ""
            return
        self.buffer = tf2_ros.Buffer()
        self._listener = tf2_ros.TransformListener(self.buffer, node)

    def apply(self, answer: Answer3D, stamp_ns: int) -> Answer3D:
        """Return ``answer`` in the target frame, or with ``TF_FAILED`` and camera-frame items."""
        if not self.target_frame or answer.code is not LiftCode.OK \
                or answer.frame_id == self.target_frame:
            return answer
        try:
            tf = self.buffer.lookup_transform(self.target_frame, answer.frame_id,
                                              Time(nanoseconds=stamp_ns), self.timeout)
        except Exception as e:  # noqa: BLE001 - tf2's lookup errors share no public base
            return dataclasses.replace(
                answer, code=LiftCode.TF_FAILED,
                message=f"no transform {answer.frame_id!r} -> {self.target_frame!r} at the "
                        f"image stamp ({type(e).__name__}: {e}); positions are in "
                        f"{answer.frame_id!r}")
        r = tf.transform.rotation
        turn = quaternion_product((r.x, r.y, r.z, r.w), (0.0, 0.0, 0.0, 1.0))  # normalised
        rotation = rotation_matrix(turn)
        t = tf.transform.translation
        translation = np.array([t.x, t.y, t.z])

        def move(item: Lifted) -> Lifted:
            # The item moves as a pose: its position, and its axes (a box's size is measured
            # along them), so a box keeps its shape instead of becoming axis-aligned here.
            if not item.valid or not all(math.isfinite(v) for v in item.position):
                return item
            x, y, z = rotation @ np.array(item.position) + translation
            return dataclasses.replace(item, position=(float(x), float(y), float(z)),
                                       orientation=quaternion_product(turn, item.orientation))

        return dataclasses.replace(
            answer, frame_id=self.target_frame,
            boxes=tuple(move(b) for b in answer.boxes),
            points=tuple(move(p) for p in answer.points),
            trajectories=tuple(tuple(move(p) for p in t) for t in answer.trajectories))
