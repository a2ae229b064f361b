"""Make a small synthetic but realistic camera recording as a real rosbag2 bag.

    demo_recording out/demo/recording                     # 640x480, 15 Hz, 4 s, mcap
    demo_recording /tmp/rec --storage sqlite3 --duration 2 --size 320x240

A table-top scene: a wall and a wooden table, three labelled objects (red box, green
cylinder, blue cup) moving on it, soft shadows and a little sensor noise. The bag holds, per
frame and with the same header stamp:

- ``/camera/image_raw`` (``sensor_msgs/Image``, rgb8),
- ``/camera/image_raw/compressed`` (``sensor_msgs/CompressedImage``, JPEG),
- ``/camera/camera_info`` (``sensor_msgs/CameraInfo``, a pinhole model),
- ``/ground_truth`` (``std_msgs/String``: JSON ``{"stamp_ns", "frame_id", "objects":
  [{"label", "box": [x_min, y_min, x_max, y_max]}]}`` in pixels), which replay scenarios can
  score ``box_iou`` expectations against.

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

import cv2
import numpy as np

from cosmos_reason_ros.eval import bagio

GENERATOR_VERSION = 1
START_NS = 1_700_000_000 * 1_000_000_000  # fixed: the same parameters give the same bag
FRAME_ID = "demo_camera"
IMAGE_TOPIC = "/camera/image_raw"
COMPRESSED_TOPIC = "/camera/image_raw/compressed"
CAMERA_INFO_TOPIC = "/camera/camera_info"
GROUND_TRUTH_TOPIC = "/ground_truth"
# label, RGB colour, shape, base x (fraction of width), speed (rad/s), sway (fraction of width)
OBJECTS = (
    ("red box", (205, 45, 40), "box", 0.22, 0.9, 0.07),
    ("green cylinder", (45, 165, 70), "cylinder", 0.50, 0.6, 0.05),
    ("blue cup", (40, 85, 210), "cup", 0.78, 1.2, 0.06),
)
MAX_FRAMES = 10_000
MAX_PIXELS = 4096 * 4096


@dataclass(frozen=True)
class RecordingParams:
    """Everything that determines the recording's content."""

    width: int = 640
    height: int = 480
    fps: float = 15.0
    duration_s: float = 4.0
    storage: str = "mcap"
    seed: int = 0
    jpeg_quality: int = 90

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

    @property
    def frames(self) -> int:
        """Number of frames (the first at t=0, the last at or before duration_s)."""
        return int(self.duration_s * self.fps + 1e-9) + 1


def _background(width: int, height: int, seed: int) -> np.ndarray:
    """Draw a wall with a vertical light falloff and a wooden table top with grain."""
    rng = np.random.default_rng(seed)
    y = np.linspace(0.0, 1.0, height)[:, None, None]
    wall = np.array([212, 204, 188], np.float32) * (1.05 - 0.25 * y)
    frame = np.broadcast_to(wall, (height, width, 3)).copy()
    table_y = int(height * 0.58)
    rows = height - table_y
    grain = np.sin(np.linspace(0, 40, width)[None, :] + rng.normal(0, 0.6, (rows, 1))) * 10
    wood = np.array([150, 112, 76], np.float32)[None, None, :] + grain[..., None]
    shade = np.linspace(0.85, 1.1, rows)[:, None, None]
    frame[table_y:] = wood * shade
    frame[table_y:table_y + max(2, height // 120)] = (95, 70, 48)  # the table's front edge
    return frame


def render_scene(t: float, width: int = 640, height: int = 480, seed: int = 0,
                 background: np.ndarray | None = None
                 ) -> tuple[np.ndarray, dict[str, tuple[int, int, int, int]]]:
    """Draw the scene at time ``t`` (s); return the RGB frame and ground-truth pixel boxes."""
    frame = (background if background is not None
             else _background(width, height, seed)).copy()
    scale = width / 640.0
    base_y = int(height * 0.74)
    truth: dict[str, tuple[int, int, int, int]] = {}
    labels: list[tuple[str, tuple[int, int]]] = []
    for i, (label, colour, shape, x_frac, speed, sway) in enumerate(OBJECTS):
        cx = int(width * (x_frac + sway * np.sin(speed * t + 1.7 * i)))
        bottom = base_y + int(height * 0.05 * (i % 2))
        w = int((74 + 8 * i) * scale)
        h = int((96 - 12 * i) * scale)
        x0, x1, y0 = cx - w // 2, cx + w // 2, bottom - h
        # A soft shadow on the table, offset away from the light (up and to the left).
        shadow = np.zeros((height, width), np.float32)
        cv2.ellipse(shadow, (cx + w // 4, bottom), (int(w * 0.7), max(3, h // 10)), 0, 0, 360,
                    1.0, -1)
        shadow = cv2.GaussianBlur(shadow, (0, 0), max(1.0, 6 * scale))
        frame *= (1.0 - 0.45 * shadow)[..., None]
        c = np.array(colour, np.float32)
        if shape == "box":
            cv2.rectangle(frame, (x0, y0), (x1, bottom), (c * 0.75).tolist(), -1)
            cv2.rectangle(frame, (x0, y0), (x1 - w // 5, bottom), c.tolist(), -1)
            cv2.rectangle(frame, (x0, y0), (x1, y0 + h // 8), (c * 1.15).clip(0, 255).tolist(),
                          -1)
        elif shape == "cylinder":
            ry = max(3, h // 10)
            for k in range(w):  # horizontal shading: lit on the left
                shade = 0.65 + 0.5 * np.cos((k / max(1, w - 1) - 0.35) * np.pi) ** 2
                cv2.line(frame, (x0 + k, y0 + ry), (x0 + k, bottom - ry),
                         (c * shade).clip(0, 255).tolist(), 1)
            cv2.ellipse(frame, (cx, bottom - ry), (w // 2, ry), 0, 0, 180, (c * 0.7).tolist(), -1)
            cv2.ellipse(frame, (cx, y0 + ry), (w // 2, ry), 0, 0, 360,
                        (c * 1.2).clip(0, 255).tolist(), -1)
        else:  # a cup: tapered body and a handle
            top, bot = w // 2, int(w * 0.38)
            body = np.array([[cx - top, y0], [cx + top, y0], [cx + bot, bottom],
                             [cx - bot, bottom]], np.int32)
            cv2.fillConvexPoly(frame, body, c.tolist())
            cv2.ellipse(frame, (cx + top, y0 + h // 2), (max(4, w // 5), h // 4), 0, -90, 90,
                        (c * 0.8).tolist(), max(2, int(5 * scale)))
            cv2.ellipse(frame, (cx, y0), (top, max(2, h // 14)), 0, 0, 360,
                        (c * 0.45).tolist(), -1)
            x1 = cx + top + max(4, w // 5)  # the handle and the rim are part of the cup
            y0 -= max(2, h // 14)
        labels.append((label, (x0, max(12, y0 - int(8 * scale)))))
        truth[label] = (max(0, x0), max(0, y0), min(width - 1, x1), min(height - 1, bottom))
    rng = np.random.default_rng(int(t * 1000) + seed)  # sensor noise, per frame
    frame += rng.normal(0.0, 2.0, frame.shape).astype(np.float32)
    out = frame.clip(0, 255).astype(np.uint8)
    for label, origin in labels:  # printed labels, like stickers on the objects
        cv2.putText(out, label, origin, cv2.FONT_HERSHEY_SIMPLEX, 0.45 * max(0.7, scale),
                    (25, 25, 25), 1, cv2.LINE_AA)
    return out, truth


def camera_info(params: RecordingParams) -> dict:
    """Return a pinhole camera with a ~62 degree horizontal field of view (plain form)."""
    f = params.width / (2 * np.tan(np.radians(31)))
    cx, cy = params.width / 2, params.height / 2
    return {"height": params.height, "width": params.width, "distortion_model": "plumb_bob",
            "d": [0.0] * 5, "k": [f, 0, cx, 0, f, cy, 0, 0, 1], "r": [1, 0, 0, 0, 1, 0, 0, 0, 1],
            "p": [f, 0, cx, 0, 0, f, cy, 0, 0, 0, 1, 0]}


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
    with Writer(path, version=9, storage_plugin=plugin) as writer:
        conns = {topic: writer.add_connection(topic, msgtype, typestore=store)
                 for topic, msgtype in ((IMAGE_TOPIC, bagio.IMAGE_TYPE),
                                        (COMPRESSED_TOPIC, bagio.COMPRESSED_TYPE),
                                        (CAMERA_INFO_TOPIC, bagio.CAMERA_INFO_TYPE),
                                        (GROUND_TRUTH_TOPIC, bagio.STRING_TYPE))}
        for k in range(params.frames):
            t = k / params.fps
            stamp_ns = START_NS + int(round(t * 1e9))
            rgb, truth = render_scene(t, params.width, params.height, params.seed, background)
            header = types["std_msgs/msg/Header"](
                stamp=types["builtin_interfaces/msg/Time"](sec=stamp_ns // 1_000_000_000,
                                                          nanosec=stamp_ns % 1_000_000_000),
                frame_id=FRAME_ID)
            image = types[bagio.IMAGE_TYPE](
                header=header, height=params.height, width=params.width, encoding="rgb8",
                is_bigendian=0, step=params.width * 3, data=rgb.reshape(-1))
            ok, jpeg = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR),
                                    [cv2.IMWRITE_JPEG_QUALITY, params.jpeg_quality])
            if not ok:
                raise RuntimeError("JPEG encoding failed")
            compressed = types[bagio.COMPRESSED_TYPE](header=header, format="rgb8; jpeg "
                                                      "compressed bgr8", data=jpeg.reshape(-1))
            cam = bagio.from_plain(bagio.CAMERA_INFO_TYPE, {**info, "header": {
                "stamp": {"sec": header.stamp.sec, "nanosec": header.stamp.nanosec},
                "frame_id": FRAME_ID}}, store)
            gt = {"stamp_ns": stamp_ns, "frame_id": FRAME_ID,
                  "objects": [{"label": label, "box": list(box)} for label, box in truth.items()]}
            for topic, msg, msgtype in (
                    (IMAGE_TOPIC, image, bagio.IMAGE_TYPE),
                    (COMPRESSED_TOPIC, compressed, bagio.COMPRESSED_TYPE),
                    (CAMERA_INFO_TOPIC, cam, bagio.CAMERA_INFO_TYPE),
                    (GROUND_TRUTH_TOPIC, types[bagio.STRING_TYPE](data=json.dumps(gt)),
                     bagio.STRING_TYPE)):
                writer.write(conns[topic], stamp_ns, store.serialize_cdr(msg, msgtype))
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
    ap.add_argument("--force", action="store_true", help="replace an existing directory")
    args = ap.parse_args(argv)
    params = RecordingParams(args.size[0], args.size[1], args.fps, args.duration, args.storage,
                             args.seed)
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
