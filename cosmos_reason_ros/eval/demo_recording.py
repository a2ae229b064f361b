"""Make a small synthetic but realistic camera recording as a real rosbag2 bag.

    demo_recording out/demo/recording                     # 640x480, 15 Hz, 4 s, mcap
    demo_recording /tmp/rec --storage sqlite3 --duration 2 --size 320x240
    demo_recording /tmp/rec --depth-encoding 32FC1 --depth-divisor 2   # foreign depth formats

A table-top scene: a wall and a wooden table, three labelled objects (red box, green
cylinder, blue cup) moving on it, soft shadows and a little sensor noise. The bag holds, per
frame and with the same header stamp:

- ``/camera/image_raw`` (``sensor_msgs/Image``, rgb8),
- ``/camera/image_raw/compressed`` (``sensor_msgs/CompressedImage``, JPEG),
- ``/camera/camera_info`` (``sensor_msgs/CameraInfo``: a pinhole model without distortion,
  62 degrees horizontal field of view, ``fx = fy = width / (2 tan 31 deg)``, principal point
  ``(width / 2, height / 2)``; 532.6 px at 640x480),
- ``/camera/aligned_depth_to_color/image_raw`` (``sensor_msgs/Image``, 16UC1 millimetres by
  default, as a RealSense publishes depth aligned to colour): depth registered to the colour
  image (same size, ``frame_id`` and stamps), rendered from the scene's 3D layout,
- ``/wrist/image_raw/compressed`` (``sensor_msgs/CompressedImage``, JPEG, ``frame_id``
  ``wrist_camera``): a second, smaller camera -- a wrist-style close view of the same scene
  (the table's middle, ``WRIST_CROP`` of the frame, at half the colour size), compressed
  only, as USB wrist cameras often publish, for multi-camera questions,
- ``/ground_truth`` (``std_msgs/String``: JSON ``{"stamp_ns", "frame_id", "objects":
  [{"label", "box": [x_min, y_min, x_max, y_max], "center_3d": [x, y, z], "size_3d":
  [w, h, d]}]}``), which replay scenarios score ``box_iou`` (pixels) and ``position_error``
  (metres) expectations against.

The 3D layout: the camera's optical axis is level, ``CAMERA_HEIGHT_M`` above the table top;
the table is the plane ``y = CAMERA_HEIGHT_M`` (optical frame: x right, y down, z forward),
ending at a wall (the plane ``z = wall``) where it meets the table's drawn back edge. Each
object is an upright cuboid standing on the table, its front face parallel to the image plane
at the depth where its base meets the table, sized so that the face projects (through the
CameraInfo's K) exactly onto the object's drawn box; depth is rendered on the object's drawn
pixels only, so colour and depth agree pixel for pixel (the background shows through beside
the cup's taper and handle). Objects move sideways at a constant depth. The cuboids' tops,
seen from above at a grazing angle (2-8 px high), are left out: depth on the drawn top of the
cylinder and rim of the cup is that of the front face. ``center_3d`` is the centre of the
object's front face -- what a box lifted from depth measures (the nearest surface in it,
``docs/INTERFACES.md``, "3D") -- in the colour camera's optical frame (``frame_id``), metres;
the cuboid's own centre lies ``size_3d[2] / 2`` behind it. Depth carries 0.2 % noise and 1 %
missing pixels (0 in 16UC1, NaN in 32FC1), as real sensors do.

Deterministic for given parameters (stamps start at a fixed time), so a cached recording is
reused when the parameters match (``ensure_recording``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from cosmos_reason_ros.core.rgbd import DEPTH_ENCODINGS, CameraModel
from cosmos_reason_ros.eval import bagio

GENERATOR_VERSION = 3  # 2: depth stream and 3D ground truth; 3: the wrist camera
START_NS = 1_700_000_000 * 1_000_000_000  # fixed: the same parameters give the same bag
FRAME_ID = "demo_camera"
IMAGE_TOPIC = "/camera/image_raw"
COMPRESSED_TOPIC = "/camera/image_raw/compressed"
CAMERA_INFO_TOPIC = "/camera/camera_info"
DEPTH_TOPIC = "/camera/aligned_depth_to_color/image_raw"
GROUND_TRUTH_TOPIC = "/ground_truth"
WRIST_TOPIC = "/wrist/image_raw/compressed"
WRIST_FRAME_ID = "wrist_camera"
# The wrist view: this part of the scene (x0, y0, x1, y1 as fractions of the frame), around
# the middle object and the table in front of it, rendered at half the colour size.
WRIST_CROP = (0.3, 0.45, 0.7, 0.85)
# label, RGB colour, shape, base x (fraction of width), speed (rad/s), sway (fraction of width)
OBJECTS = (
    ("red box", (205, 45, 40), "box", 0.22, 0.9, 0.07),
    ("green cylinder", (45, 165, 70), "cylinder", 0.50, 0.6, 0.05),
    ("blue cup", (40, 85, 210), "cup", 0.78, 1.2, 0.06),
)
TABLE_ROW = 0.58  # the table's back edge (where it meets the wall), fraction of the height
CAMERA_HEIGHT_M = 0.25  # the level optical axis above the table top: objects at ~1-1.2 m
DEPTH_NOISE_REL = 0.002  # depth noise (1 sigma) relative to depth: 2 mm at 1 m
DEPTH_MISSING = 0.01  # share of depth pixels without a return
MAX_FRAMES = 10_000
MAX_PIXELS = 4096 * 4096
MAX_DEPTH_DELAY_S = 10.0


@dataclass(frozen=True)
class RecordingParams:
    """Everything that determines the recording's content.

    The ``depth_*`` fields make foreign depth formats for tests of the 3D checks: 32FC1
    metres, depth at ``1 / depth_divisor`` of the colour size, another ``frame_id`` (not
    registered), or depth delivered ``depth_delay_s`` after its stamp (late).
    """

    width: int = 640
    height: int = 480
    fps: float = 15.0
    duration_s: float = 4.0
    storage: str = "mcap"
    seed: int = 0
    jpeg_quality: int = 90
    depth: bool = True
    depth_encoding: str = "16UC1"
    depth_divisor: int = 1
    depth_frame_id: str = ""  # empty: the colour frame_id (registered depth)
    depth_delay_s: float = 0.0
    wrist: bool = True  # the second, smaller camera (WRIST_TOPIC)

    def validate(self) -> None:
        """Raise ``ValueError`` naming the parameter when a value is out of range."""
        if not (32 <= self.width and 32 <= self.height and self.width * self.height
                <= MAX_PIXELS):
            raise ValueError(f"size={self.width}x{self.height}: each side >= 32, at most "
                             f"{MAX_PIXELS} pixels")
        if not 0.5 <= self.fps <= 120:
            raise ValueError(f"fps={self.fps}: allowed 0.5 to 120")
        if not 0 < self.duration_s or self.frames > MAX_FRAMES:
            raise ValueError(f"duration_s={self.duration_s}: must be > 0 and give at most "
                             f"{MAX_FRAMES} frames at {self.fps} Hz")
        if self.storage not in bagio.STORAGES:
            raise ValueError(f"storage={self.storage!r}: allowed {', '.join(bagio.STORAGES)}")
        if not 1 <= self.jpeg_quality <= 100:
            raise ValueError(f"jpeg_quality={self.jpeg_quality}: allowed 1 to 100")
        if self.depth_encoding not in DEPTH_ENCODINGS:
            raise ValueError(f"depth_encoding={self.depth_encoding!r}: allowed "
                             f"{', '.join(DEPTH_ENCODINGS)}")
        d = self.depth_divisor
        if not (1 <= d and self.width % d == 0 and self.height % d == 0
                and self.width // d >= 8 and self.height // d >= 8):
            raise ValueError(f"depth_divisor={d}: must divide the size {self.width}x"
                             f"{self.height} and leave at least 8x8 depth pixels")
        if not 0.0 <= self.depth_delay_s <= MAX_DEPTH_DELAY_S:
            raise ValueError(f"depth_delay_s={self.depth_delay_s}: allowed 0 to "
                             f"{MAX_DEPTH_DELAY_S:g}")

    @property
    def frames(self) -> int:
        """Number of frames (the first at t=0, the last at or before duration_s)."""
        return int(self.duration_s * self.fps + 1e-9) + 1


@dataclass(frozen=True)
class SceneFrame:
    """One rendered frame: colour, the labelled boxes drawn, and which object each pixel shows."""

    rgb: np.ndarray  # (height, width, 3) uint8
    boxes: dict[str, tuple[int, int, int, int]]  # label -> inclusive pixel box
    ids: np.ndarray  # (height, width) uint8: 0 background, k + 1 for OBJECTS[k]


@dataclass(frozen=True)
class Object3D:
    """An object's 3D ground truth in the camera's optical frame (metres)."""

    center: tuple[float, float, float]  # centre of the front face (what depth measures)
    size: tuple[float, float, float]  # the cuboid's extent along x, y, z
    face_depth_m: float  # z of the front face


def _background(width: int, height: int, seed: int) -> np.ndarray:
    """Draw a wall with a vertical light falloff and a wooden table top with grain."""
    rng = np.random.default_rng(seed)
    y = np.linspace(0.0, 1.0, height)[:, None, None]
    wall = np.array([212, 204, 188], np.float32) * (1.05 - 0.25 * y)
    frame = np.broadcast_to(wall, (height, width, 3)).copy()
    table_y = _table_row(height)
    rows = height - table_y
    grain = np.sin(np.linspace(0, 40, width)[None, :] + rng.normal(0, 0.6, (rows, 1))) * 10
    wood = np.array([150, 112, 76], np.float32)[None, None, :] + grain[..., None]
    shade = np.linspace(0.85, 1.1, rows)[:, None, None]
    frame[table_y:] = wood * shade
    frame[table_y:table_y + max(2, height // 120)] = (95, 70, 48)  # the table's front edge
    return frame


def _table_row(height: int) -> int:
    """First image row showing the table (the rows above show the wall)."""
    return int(height * TABLE_ROW)


def _draw_object(canvas: np.ndarray, shape: str, c: np.ndarray, cx: int, bottom: int, w: int,
                 h: int, scale: float) -> tuple[int, int, int]:
    """Draw one object on ``canvas`` (colour, or a mask); return its ``x0, y0, x1`` in pixels."""
    x0, x1, y0 = cx - w // 2, cx + w // 2, bottom - h
    if shape == "box":
        cv2.rectangle(canvas, (x0, y0), (x1, bottom), (c * 0.75).tolist(), -1)
        cv2.rectangle(canvas, (x0, y0), (x1 - w // 5, bottom), c.tolist(), -1)
        cv2.rectangle(canvas, (x0, y0), (x1, y0 + h // 8), (c * 1.15).clip(0, 255).tolist(), -1)
    elif shape == "cylinder":
        ry = max(3, h // 10)
        for k in range(w):  # horizontal shading: lit on the left
            shade = 0.65 + 0.5 * np.cos((k / max(1, w - 1) - 0.35) * np.pi) ** 2
            cv2.line(canvas, (x0 + k, y0 + ry), (x0 + k, bottom - ry),
                     (c * shade).clip(0, 255).tolist(), 1)
        cv2.ellipse(canvas, (cx, bottom - ry), (w // 2, ry), 0, 0, 180, (c * 0.7).tolist(), -1)
        cv2.ellipse(canvas, (cx, y0 + ry), (w // 2, ry), 0, 0, 360,
                    (c * 1.2).clip(0, 255).tolist(), -1)
    else:  # a cup: tapered body and a handle
        top, bot = w // 2, int(w * 0.38)
        body = np.array([[cx - top, y0], [cx + top, y0], [cx + bot, bottom],
                         [cx - bot, bottom]], np.int32)
        cv2.fillConvexPoly(canvas, body, c.tolist())
        cv2.ellipse(canvas, (cx + top, y0 + h // 2), (max(4, w // 5), h // 4), 0, -90, 90,
                    (c * 0.8).tolist(), max(2, int(5 * scale)))
        cv2.ellipse(canvas, (cx, y0), (top, max(2, h // 14)), 0, 0, 360,
                    (c * 0.45).tolist(), -1)
        x1 = cx + top + max(4, w // 5)  # the handle and the rim are part of the cup
        y0 -= max(2, h // 14)
    return x0, y0, x1


def render_frame(t: float, width: int = 640, height: int = 480, seed: int = 0,
                 background: np.ndarray | None = None) -> SceneFrame:
    """Draw the scene at time ``t`` (s): colour, ground-truth pixel boxes, object pixels."""
    frame = (background if background is not None
             else _background(width, height, seed)).copy()
    ids = np.zeros((height, width), np.uint8)
    scratch = np.zeros((height, width), np.uint8)
    white = np.full(3, 255.0, np.float32)
    scale = width / 640.0
    base_y = int(height * 0.74)
    truth: dict[str, tuple[int, int, int, int]] = {}
    labels: list[tuple[str, tuple[int, int]]] = []
    for i, (label, colour, shape, x_frac, speed, sway) in enumerate(OBJECTS):
        cx = int(width * (x_frac + sway * np.sin(speed * t + 1.7 * i)))
        bottom = base_y + int(height * 0.05 * (i % 2))
        w = int((74 + 8 * i) * scale)
        h = int((96 - 12 * i) * scale)
        # A soft shadow on the table, offset away from the light (up and to the left).
        shadow = np.zeros((height, width), np.float32)
        cv2.ellipse(shadow, (cx + w // 4, bottom), (int(w * 0.7), max(3, h // 10)), 0, 0, 360,
                    1.0, -1)
        shadow = cv2.GaussianBlur(shadow, (0, 0), max(1.0, 6 * scale))
        frame *= (1.0 - 0.45 * shadow)[..., None]
        x0, y0, x1 = _draw_object(frame, shape, np.array(colour, np.float32), cx, bottom, w, h,
                                  scale)
        # The same drawing on a mask: exactly the pixels this object covers (later objects
        # cover earlier ones, as in colour).
        scratch[:] = 0
        _draw_object(scratch, shape, white, cx, bottom, w, h, scale)
        ids[scratch > 0] = i + 1
        labels.append((label, (x0, max(12, y0 - int(8 * scale)))))
        truth[label] = (max(0, x0), max(0, y0), min(width - 1, x1), min(height - 1, bottom))
    rng = np.random.default_rng(int(t * 1000) + seed)  # sensor noise, per frame
    frame += rng.normal(0.0, 2.0, frame.shape).astype(np.float32)
    out = frame.clip(0, 255).astype(np.uint8)
    for label, origin in labels:  # printed labels, like stickers on the objects
        cv2.putText(out, label, origin, cv2.FONT_HERSHEY_SIMPLEX, 0.45 * max(0.7, scale),
                    (25, 25, 25), 1, cv2.LINE_AA)
    return SceneFrame(out, truth, ids)


def render_scene(t: float, width: int = 640, height: int = 480, seed: int = 0,
                 background: np.ndarray | None = None
                 ) -> tuple[np.ndarray, dict[str, tuple[int, int, int, int]]]:
    """Draw the scene at time ``t`` (s); return the RGB frame and ground-truth pixel boxes."""
    scene = render_frame(t, width, height, seed, background)
    return scene.rgb, scene.boxes


def wrist_view(rgb: np.ndarray) -> np.ndarray:
    """Return the wrist camera's image of a colour frame: ``WRIST_CROP`` at half its size."""
    height, width = rgb.shape[:2]
    x0, y0, x1, y1 = (int(round(f * n)) for f, n in zip(WRIST_CROP, (width, height, width,
                                                                     height), strict=True))
    return cv2.resize(rgb[y0:y1, x0:x1], (max(16, width // 2), max(16, height // 2)),
                      interpolation=cv2.INTER_AREA)


def _jpeg(types: Any, rgb: np.ndarray, header: Any, quality: int) -> Any:
    """Return a ``CompressedImage`` (JPEG) of ``rgb`` with ``header``."""
    ok, jpeg = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR),
                            [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise RuntimeError("JPEG encoding failed")
    return types[bagio.COMPRESSED_TYPE](header=header, format="rgb8; jpeg compressed bgr8",
                                        data=jpeg.reshape(-1))


def camera_info(params: RecordingParams) -> dict:
    """Return a pinhole camera with a ~62 degree horizontal field of view (plain form)."""
    f = params.width / (2 * np.tan(np.radians(31)))
    cx, cy = params.width / 2, params.height / 2
    return {"height": params.height, "width": params.width, "distortion_model": "plumb_bob",
            "d": [0.0] * 5, "k": [f, 0, cx, 0, f, cy, 0, 0, 1], "r": [1, 0, 0, 0, 1, 0, 0, 0, 1],
            "p": [f, 0, cx, 0, 0, f, cy, 0, 0, 0, 1, 0]}


def camera_model(params: RecordingParams) -> CameraModel:
    """Return the recording's CameraInfo as the lifting code reads it."""
    info = camera_info(params)
    return CameraModel.from_camera_info_fields(info["k"], info["d"], params.width,
                                               params.height, FRAME_ID, info["distortion_model"])


def wall_depth_m(camera: CameraModel) -> float:
    """Depth of the wall: where the table plane meets it is the table's drawn back edge.

    The edge is the top boundary of the first table row, i.e. K's row coordinate
    ``row - 0.5`` (K puts pixel centres on integers; ``core/rgbd.py``).
    """
    return camera.fy * CAMERA_HEIGHT_M / (_table_row(camera.height) - 0.5 - camera.cy)


def layout_3d(boxes: dict[str, tuple[int, int, int, int]], camera: CameraModel
              ) -> dict[str, Object3D]:
    """Place each drawn box in 3D: a cuboid on the table whose front face projects onto it.

    The face's lower edge (the lower boundary of the box's bottom row) lies on the table
    plane, which fixes its depth; its corners are the box's continuous pixel extent
    ``[x0, x1 + 1) x [y0, y1 + 1)`` back-projected to that depth. The cuboid's footprint is
    square (its depth equals the face's width).
    """
    out: dict[str, Object3D] = {}
    for label, (x0, y0, x1, y1) in boxes.items():
        z = camera.fy * CAMERA_HEIGHT_M / (y1 + 0.5 - camera.cy)
        left, top, _ = camera.back_project(float(x0), float(y0), z)
        right, bottom, _ = camera.back_project(float(x1 + 1), float(y1 + 1), z)
        width = right - left
        out[label] = Object3D(((left + right) / 2, (top + bottom) / 2, z),
                              (width, bottom - top, width), z)
    return out


def render_depth(scene: SceneFrame, camera: CameraModel, divisor: int = 1) -> np.ndarray:
    """Exact depth (metres, float32) of the scene at ``1 / divisor`` of the colour size.

    Each depth pixel shows what lies at its centre, in colour pixels ``(j + 0.5) * divisor``:
    the table plane or the wall, analytically, or the front face of the object drawn there.
    """
    height, width = scene.ids.shape
    rows = (np.arange(height // divisor) + 0.5) * divisor - 0.5 - camera.cy  # K row - cy
    wall = wall_depth_m(camera)
    below = np.maximum(rows, 1e-9)
    background = np.where(rows * wall > camera.fy * CAMERA_HEIGHT_M,
                          camera.fy * CAMERA_HEIGHT_M / below, wall).astype(np.float32)
    objects = layout_3d(scene.boxes, camera)
    faces = np.array([0.0] + [objects[label].face_depth_m for label, *_ in OBJECTS],
                     np.float32)
    first = (divisor - 1) // 2
    ids = scene.ids[first::divisor, first::divisor][:height // divisor, :width // divisor]
    return np.where(ids > 0, faces[ids], background[:, None]).astype(np.float32)


def depth_fields(depth_m: np.ndarray, encoding: str, rng: np.random.Generator
                 ) -> tuple[int, bytes]:
    """Add sensor noise and missing returns; encode per REP 118; return ``(step, data)``."""
    noisy = depth_m * (1.0 + rng.normal(0.0, DEPTH_NOISE_REL, depth_m.shape))
    missing = rng.random(depth_m.shape) < DEPTH_MISSING
    if encoding == "16UC1":
        mm = np.where(missing, 0, np.round(noisy * 1000.0)).astype("<u2")
        return depth_m.shape[1] * 2, mm.tobytes()
    metres = np.where(missing, np.nan, noisy).astype("<f4")
    return depth_m.shape[1] * 4, metres.tobytes()


def _header(types: Any, stamp_ns: int, frame_id: str) -> Any:
    return types["std_msgs/msg/Header"](
        stamp=types["builtin_interfaces/msg/Time"](sec=stamp_ns // 1_000_000_000,
                                                  nanosec=stamp_ns % 1_000_000_000),
        frame_id=frame_id)


def write_recording(path: str | Path, params: RecordingParams = RecordingParams()) -> Path:
    """Write the recording to a new bag directory ``path``; return it."""
    from rosbags.rosbag2 import StoragePlugin, Writer

    params.validate()
    path = Path(path)
    if path.exists():
        raise FileExistsError(f"{path} already exists")
    path.parent.mkdir(parents=True, exist_ok=True)
    store = bagio.typestore()
    types = store.types
    plugin = StoragePlugin.MCAP if params.storage == "mcap" else StoragePlugin.SQLITE3
    background = _background(params.width, params.height, params.seed)
    info = camera_info(params)
    camera = camera_model(params)
    topics = [(IMAGE_TOPIC, bagio.IMAGE_TYPE), (COMPRESSED_TOPIC, bagio.COMPRESSED_TYPE),
              (CAMERA_INFO_TOPIC, bagio.CAMERA_INFO_TYPE), (GROUND_TRUTH_TOPIC, bagio.STRING_TYPE)]
    if params.depth:
        topics.append((DEPTH_TOPIC, bagio.IMAGE_TYPE))
    if params.wrist:
        topics.append((WRIST_TOPIC, bagio.COMPRESSED_TYPE))
    delay_ns = int(round(params.depth_delay_s * 1e9))
    with Writer(path, version=9, storage_plugin=plugin) as writer:
        conns = {topic: writer.add_connection(topic, msgtype, typestore=store)
                 for topic, msgtype in topics}
        late: list[tuple[int, bytes]] = []  # depth delivered after its stamp, in time order
        for k in range(params.frames):
            t = k / params.fps
            stamp_ns = START_NS + int(round(t * 1e9))
            while late and late[0][0] <= stamp_ns:
                writer.write(conns[DEPTH_TOPIC], *late.pop(0))
            scene = render_frame(t, params.width, params.height, params.seed, background)
            rgb = scene.rgb
            header = _header(types, stamp_ns, FRAME_ID)
            image = types[bagio.IMAGE_TYPE](
                header=header, height=params.height, width=params.width, encoding="rgb8",
                is_bigendian=0, step=params.width * 3, data=rgb.reshape(-1))
            compressed = _jpeg(types, rgb, header, params.jpeg_quality)
            cam = bagio.from_plain(bagio.CAMERA_INFO_TYPE, {**info, "header": {
                "stamp": {"sec": header.stamp.sec, "nanosec": header.stamp.nanosec},
                "frame_id": FRAME_ID}}, store)
            objects = layout_3d(scene.boxes, camera)
            gt = {"stamp_ns": stamp_ns, "frame_id": FRAME_ID,
                  "objects": [{"label": label, "box": list(box),
                               "center_3d": [round(v, 6) for v in objects[label].center],
                               "size_3d": [round(v, 6) for v in objects[label].size]}
                              for label, box in scene.boxes.items()]}
            for topic, msg, msgtype in (
                    (IMAGE_TOPIC, image, bagio.IMAGE_TYPE),
                    (COMPRESSED_TOPIC, compressed, bagio.COMPRESSED_TYPE),
                    (CAMERA_INFO_TOPIC, cam, bagio.CAMERA_INFO_TYPE),
                    (GROUND_TRUTH_TOPIC, types[bagio.STRING_TYPE](data=json.dumps(gt)),
                     bagio.STRING_TYPE)):
                writer.write(conns[topic], stamp_ns, store.serialize_cdr(msg, msgtype))
            if params.wrist:  # taken at the same time as the colour frame (same stamp)
                wrist = _jpeg(types, wrist_view(rgb), _header(types, stamp_ns, WRIST_FRAME_ID),
                              params.jpeg_quality)
                writer.write(conns[WRIST_TOPIC], stamp_ns,
                             store.serialize_cdr(wrist, bagio.COMPRESSED_TYPE))
            if params.depth:
                d = params.depth_divisor
                depth_m = render_depth(scene, camera, d)
                step, data = depth_fields(depth_m, params.depth_encoding,
                                          np.random.default_rng([params.seed, k]))
                depth = types[bagio.IMAGE_TYPE](
                    header=_header(types, stamp_ns, params.depth_frame_id or FRAME_ID),
                    height=params.height // d, width=params.width // d,
                    encoding=params.depth_encoding, is_bigendian=0, step=step,
                    data=np.frombuffer(data, np.uint8))
                item = (stamp_ns + delay_ns, store.serialize_cdr(depth, bagio.IMAGE_TYPE))
                if delay_ns:
                    late.append(item)
                else:
                    writer.write(conns[DEPTH_TOPIC], *item)
        for t_ns, data in late:
            writer.write(conns[DEPTH_TOPIC], t_ns, data)
    return path


def ensure_recording(path: str | Path, params: RecordingParams = RecordingParams()) -> Path:
    """Return the recording at ``path``, (re)generating it unless it has these parameters."""
    path = Path(path)
    stamp = path.parent / f"{path.name}.params.json"
    wanted = {"generator": GENERATOR_VERSION, **asdict(params)}
    if (path / "metadata.yaml").is_file() and stamp.is_file():
        try:
            if json.loads(stamp.read_text()) == wanted:
                return path
        except ValueError:
            pass
    if path.exists():
        shutil.rmtree(path)
    stamp.unlink(missing_ok=True)
    write_recording(path, params)
    stamp.write_text(json.dumps(wanted, indent=1))
    return path


def parse_size(text: str) -> tuple[int, int]:
    """``640x480`` -> (640, 480)."""
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"size {text!r}: expected WIDTHxHEIGHT") from e
    return w, h


def main(argv: list[str] | None = None) -> int:
    """Generate a recording; exit 2 on bad parameters."""
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="bag directory to create")
    ap.add_argument("--size", type=parse_size, default=(640, 480))
    ap.add_argument("--fps", type=float, default=15.0)
    ap.add_argument("--duration", type=float, default=4.0, help="seconds")
    ap.add_argument("--storage", choices=bagio.STORAGES, default="mcap")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-depth", action="store_true", help="leave the depth stream out")
    ap.add_argument("--depth-encoding", choices=DEPTH_ENCODINGS, default="16UC1",
                    help="16UC1 millimetres or 32FC1 metres")
    ap.add_argument("--depth-divisor", type=int, default=1,
                    help="depth at 1/N of the colour size (registered, down-scaled)")
    ap.add_argument("--depth-frame-id", default="",
                    help="depth frame_id (default: the colour frame's; another is unregistered)")
    ap.add_argument("--depth-delay", type=float, default=0.0,
                    help="seconds between a depth frame's stamp and its bag time (late depth)")
    ap.add_argument("--no-wrist", action="store_true", help="leave the wrist camera out")
    ap.add_argument("--force", action="store_true", help="replace an existing directory")
    args = ap.parse_args(argv)
    params = RecordingParams(
        width=args.size[0], height=args.size[1], fps=args.fps, duration_s=args.duration,
        storage=args.storage, seed=args.seed, depth=not args.no_depth,
        depth_encoding=args.depth_encoding, depth_divisor=args.depth_divisor,
        depth_frame_id=args.depth_frame_id, depth_delay_s=args.depth_delay,
        wrist=not args.no_wrist)
    try:
        params.validate()
        if args.force and args.out.exists():
            shutil.rmtree(args.out)
        write_recording(args.out, params)
    except (ValueError, FileExistsError) as e:
        print(f"demo_recording: {e}", file=sys.stderr)
        return 2
    info = bagio.bag_info(args.out)
    print(f"demo_recording: wrote {args.out} ({info.storage}, {params.frames} frames, "
          f"{info.duration_s:.2f} s, topics: {', '.join(sorted(info.topics))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
