"""rosbag2 input and output for the replay and demo tools, with ``rosbags`` (no ROS needed).

- Reading: sqlite3 and mcap bags, their topics and time span, camera messages, and the
  ground truth that ``demo_recording`` stores (``std_msgs/String`` JSON per frame).
- Results: ``ReasoningResult`` messages built from their plain form (the dict written to the
  replay's JSONL file) and written to a results bag whose connections carry the message
  definitions of ``cosmos_reason_interfaces`` (registered from its ``.msg`` files), so
  ``ros2 bag info/play`` and ``rosbags`` read it back.

Plain form: ``core.plain.to_plain`` (nested dicts and lists with the message's field names;
NaN floats become ``None``, so the JSONL is strict JSON); ``from_plain`` builds the message
back.
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from cosmos_reason_ros.core.plain import to_plain

RESULT_TYPE = "cosmos_reason_interfaces/msg/ReasoningResult"
IMAGE_TYPE = "sensor_msgs/msg/Image"
COMPRESSED_TYPE = "sensor_msgs/msg/CompressedImage"
CAMERA_INFO_TYPE = "sensor_msgs/msg/CameraInfo"
STRING_TYPE = "std_msgs/msg/String"
STORAGES = ("sqlite3", "mcap")
_NUMPY_DTYPES = {"bool": np.bool_, "int8": np.int8, "uint8": np.uint8, "byte": np.uint8,
                 "char": np.uint8, "int16": np.int16, "uint16": np.uint16, "int32": np.int32,
                 "uint32": np.uint32, "int64": np.int64, "uint64": np.uint64,
                 "float32": np.float32, "float64": np.float64}
_INTERFACES = "cosmos_reason_interfaces"


class BagError(ValueError):
    """A bag cannot be read or written as asked; the message says which and why."""


# --- types -------------------------------------------------------------------------------------


def interface_msg_dir() -> Path:
    """Directory holding ``cosmos_reason_interfaces``' ``.msg`` files (installed or source)."""
    candidates = []
    try:
        from ament_index_python.packages import get_package_share_directory

        candidates.append(Path(get_package_share_directory(_INTERFACES)) / "msg")
    except Exception:  # noqa: BLE001 - not installed / no ament index: try the others
        pass
    for prefix in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep):
        if prefix:
            candidates.append(Path(prefix) / "share" / _INTERFACES / "msg")
    candidates.append(Path(__file__).resolve().parents[2] / _INTERFACES / "msg")
    for path in candidates:
        if (path / "ReasoningResult.msg").is_file():
            return path
    raise BagError(f"cannot find {_INTERFACES}/msg/ReasoningResult.msg (looked in "
                   f"{', '.join(str(c) for c in candidates)})")


@functools.lru_cache(maxsize=1)
def typestore() -> Any:
    """Return the distro's standard message types plus ``cosmos_reason_interfaces``."""
    from rosbags.typesys import Stores, get_types_from_msg, get_typestore

    distro = (os.environ.get("ROS_DISTRO") or os.environ.get("COSMOS_REASON_ROS_DISTRO")
              or "kilted").lower()
    store = get_typestore({"humble": Stores.ROS2_HUMBLE, "jazzy": Stores.ROS2_JAZZY}.get(
        distro, Stores.ROS2_KILTED))
    types: dict[str, Any] = {}
    for path in sorted(interface_msg_dir().glob("*.msg")):
        types.update(get_types_from_msg(path.read_text(encoding="utf-8"),
                                        f"{_INTERFACES}/msg/{path.stem}"))
    store.register(types)
    return store


def from_plain(msgtype: str, plain: Mapping[str, Any] | None, store: Any = None) -> Any:
    """Build a rosbags message of ``msgtype`` from its plain form.

    Missing fields are zero, as in a freshly made ROS message (so a result built here equals
    the node's, e.g. a box's unfilled ``position_3d``); a float given as ``None`` is NaN.
    """
    store = store or typestore()
    plain = plain or {}
    try:
        cls = store.types[msgtype]
        _consts, fields = store.fielddefs[msgtype]
    except KeyError as e:
        raise BagError(f"message type {msgtype!r} is not registered") from e
    unknown = set(plain) - {name for name, _ in fields}
    if unknown:
        raise BagError(f"{msgtype}: unknown field(s) {', '.join(sorted(unknown))}")
    return cls(**{name: _value(store, node, plain.get(name, _MISSING))
                  for name, node in fields})


_MISSING = object()  # a field the plain form leaves out: zero, not NaN


def _value(store: Any, node: tuple[Any, Any], value: Any) -> Any:
    kind, detail = node
    kind_name = getattr(kind, "name", str(kind))
    if kind_name == "BASE":
        if value is _MISSING:
            return "" if detail[0] in ("string", "wstring") else _base(detail[0], 0)
        return _base(detail[0], value)
    if kind_name == "NAME":
        return from_plain(detail, None if value is _MISSING else value, store)
    if value is _MISSING:
        value = None
    (sub_kind, sub_detail), _count = detail
    if getattr(sub_kind, "name", "") == "BASE" and sub_detail[0] in _NUMPY_DTYPES:
        dtype = _NUMPY_DTYPES[sub_detail[0]]
        if isinstance(value, (bytes, bytearray, memoryview)):
            return np.frombuffer(value, dtype=dtype).copy()
        if isinstance(value, np.ndarray):
            return value.astype(dtype, copy=False)
        return np.array([_base(sub_detail[0], v) for v in value or []], dtype=dtype)
    return [_value(store, (sub_kind, sub_detail), v) for v in value or []]


def _base(type_name: str, value: Any) -> Any:
    if type_name in ("string", "wstring"):
        return "" if value is None else str(value)
    if type_name in ("float32", "float64"):
        return math.nan if value is None else float(value)
    if type_name == "bool":
        return bool(value)
    return int(value or 0)


def canonical_result(plain: Mapping[str, Any]) -> tuple[dict[str, Any], bytes]:
    """Return a result's plain form as a bag reads it back (float32 rounding) and its CDR."""
    store = typestore()
    data = bytes(store.serialize_cdr(from_plain(RESULT_TYPE, plain, store), RESULT_TYPE))
    return to_plain(store.deserialize_cdr(data, RESULT_TYPE)), data


# --- reading -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class BagInfo:
    """What a bag holds."""

    path: str
    storage: str
    topics: dict[str, str]  # topic -> message type
    counts: dict[str, int]
    start_ns: int
    end_ns: int

    @property
    def duration_s(self) -> float:
        """Time from the first to the last message."""
        return (self.end_ns - self.start_ns) / 1e9


def _reader(path: str | Path) -> Any:
    from rosbags.rosbag2 import Reader

    p = Path(path)
    if not (p / "metadata.yaml").is_file():
        raise BagError(f"{str(p)!r} is not a rosbag2 bag (no metadata.yaml in it)")
    return Reader(p)


def storage_of(path: str | Path) -> str:
    """``mcap`` or ``sqlite3``, from the bag's files."""
    return "mcap" if any(Path(path).glob("*.mcap")) else "sqlite3"


def bag_info(path: str | Path) -> BagInfo:
    """Open a bag and describe it; ``BagError`` if it cannot be read or is empty."""
    try:
        with _reader(path) as reader:
            topics = {c.topic: c.msgtype for c in reader.connections}
            counts: dict[str, int] = {}
            for c in reader.connections:
                counts[c.topic] = counts.get(c.topic, 0) + c.msgcount
            start, end = reader.start_time, reader.end_time
    except BagError:
        raise
    except Exception as e:  # noqa: BLE001 - rosbags raises several kinds; name the bag
        raise BagError(f"cannot read bag {str(path)!r}: {e}") from e
    if not counts or sum(counts.values()) == 0:
        raise BagError(f"bag {str(path)!r} has no messages")
    return BagInfo(str(path), storage_of(path), topics, counts, int(start), int(end))


def image_encoding(path: str | Path, topic: str) -> str:
    """Return the ``encoding`` of an Image topic's first message (empty when it has none)."""
    stream = messages(path, [topic])
    try:
        first = next(stream, None)
    finally:
        stream.close()
    return "" if first is None else str(typestore().deserialize_cdr(first[3], first[1]).encoding)


def _is_depth(info: BagInfo, topic: str) -> bool:
    from cosmos_reason_ros.core.rgbd import DEPTH_ENCODINGS

    return image_encoding(info.path, topic).upper() in DEPTH_ENCODINGS


def pick_image_topic(info: BagInfo, requested: str = "") -> str:
    """Return ``requested`` if given, else the bag's only colour Image (or CompressedImage) topic.

    Depth images (16UC1, 32FC1) are not colour: a bag with one camera and its registered
    depth has one colour topic.
    """
    images = {t: m for t, m in info.topics.items() if m in (IMAGE_TYPE, COMPRESSED_TYPE)}
    if requested:
        if requested not in images:
            listed = ", ".join(f"{t} ({m})" for t, m in sorted(images.items())) or "none"
            raise BagError(f"image topic {requested!r} is not an image topic of "
                           f"{info.path!r}; image topics: {listed}")
        return requested
    raw = [t for t, m in images.items() if m == IMAGE_TYPE]
    if len(raw) > 1:  # reading encodings costs a message each: only when it decides
        images = {t: m for t, m in images.items() if t not in raw or not _is_depth(info, t)}
    for kind in (IMAGE_TYPE, COMPRESSED_TYPE):
        found = sorted(t for t, m in images.items() if m == kind)
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise BagError(f"{info.path!r} has several {kind} topics ({', '.join(found)}); "
                           f"choose one with --image-topic")
    raise BagError(f"{info.path!r} has no sensor_msgs Image or CompressedImage topic")


def pick_depth_topics(info: BagInfo, depth_topic: str = "", camera_info_topic: str = ""
                      ) -> tuple[str, str]:
    """Return the bag's depth Image topic and CameraInfo topic (the requested ones if given).

    Without a request: the only Image topic whose encoding is a depth encoding (16UC1,
    32FC1), and the only CameraInfo topic. ``BagError`` says what is missing or ambiguous.
    """
    if depth_topic:
        if info.topics.get(depth_topic) != IMAGE_TYPE:
            has = info.topics.get(depth_topic, "no such topic")
            raise BagError(f"depth topic {depth_topic!r} is not a {IMAGE_TYPE} topic of "
                           f"{info.path!r} ({has})")
    else:
        found = sorted(t for t, m in info.topics.items()
                       if m == IMAGE_TYPE and _is_depth(info, t))
        if len(found) != 1:
            raise BagError(f"{info.path!r} has {len(found)} depth image topics (16UC1/32FC1)"
                           + (f" ({', '.join(found)})" if found else "")
                           + ": choose one with --depth-topic")
        depth_topic = found[0]
    if camera_info_topic:
        if info.topics.get(camera_info_topic) != CAMERA_INFO_TYPE:
            raise BagError(f"camera_info topic {camera_info_topic!r} is not a "
                           f"{CAMERA_INFO_TYPE} topic of {info.path!r}")
    else:
        found = sorted(t for t, m in info.topics.items() if m == CAMERA_INFO_TYPE)
        if len(found) != 1:
            raise BagError(f"{info.path!r} has {len(found)} CameraInfo topics"
                           + (f" ({', '.join(found)})" if found else "")
                           + ": choose one with --camera-info-topic")
        camera_info_topic = found[0]
    return depth_topic, camera_info_topic


def messages(path: str | Path, topics: Sequence[str]) -> Iterator[tuple[str, str, int, bytes]]:
    """Yield ``(topic, msgtype, log_time_ns, cdr_bytes)`` in time order for ``topics``."""
    with _reader(path) as reader:
        conns = [c for c in reader.connections if c.topic in set(topics)]
        for conn, t_ns, data in reader.messages(connections=conns):
            yield conn.topic, conn.msgtype, int(t_ns), bytes(data)


def header_stamp_ns(msg: Any) -> int:
    """``header.stamp`` of a deserialized message, in nanoseconds."""
    return int(msg.header.stamp.sec) * 1_000_000_000 + int(msg.header.stamp.nanosec)


def decode_image(msg: Any, msgtype: str, max_pixels: int = 50_000_000,
                 size: tuple[int, int] | None = None) -> np.ndarray:
    """RGB uint8 pixels of a deserialized Image/CompressedImage (the node's converters)."""
    from cosmos_reason_ros.core import imaging

    if msgtype == COMPRESSED_TYPE:
        return imaging.compressed_to_rgb(msg.format, bytes(msg.data), max_pixels)
    return imaging.image_to_rgb(msg.width, msg.height, msg.encoding, bool(msg.is_bigendian),
                                msg.step, msg.data, max_pixels=max_pixels, size=size)


BoxTuple = tuple[float, float, float, float]
Vec3 = tuple[float, float, float]
GroundTruth = dict[int, dict[str, BoxTuple]]
T = TypeVar("T")


@dataclass(frozen=True)
class Truth3D:
    """3D ground truth of one frame: object centres (metres) in the optical frame ``frame_id``."""

    frame_id: str
    centers: dict[str, Vec3]

    def to_dict(self) -> dict[str, Any]:
        """Plain form for the replay's records."""
        return {"frame_id": self.frame_id,
                "centers": {k: list(v) for k, v in self.centers.items()}}


GroundTruth3D = dict[int, Truth3D]


def _truth_docs(path: str | Path, topic: str) -> Iterator[dict[str, Any]]:
    info = bag_info(path)
    if info.topics.get(topic) != STRING_TYPE:
        return
    store = typestore()
    for _topic, msgtype, _t, data in messages(path, [topic]):
        try:
            doc = json.loads(store.deserialize_cdr(data, msgtype).data)
        except ValueError as e:
            raise BagError(f"{str(path)!r} {topic}: a ground-truth message is not JSON "
                           f"({e})") from e
        if not isinstance(doc, dict):
            raise BagError(f"{str(path)!r} {topic}: a ground-truth message is not a JSON "
                           f"object")
        yield doc


def load_ground_truth(path: str | Path, topic: str) -> GroundTruth:
    """Ground-truth boxes per frame stamp from a JSON ``std_msgs/String`` topic (or ``{}``).

    Each message: ``{"stamp_ns": int, "objects": [{"label": str, "box": [x0, y0, x1, y1]}]}``.
    """
    truth: GroundTruth = {}
    for doc in _truth_docs(path, topic):
        try:
            truth[int(doc["stamp_ns"])] = {str(o["label"]): tuple(float(v) for v in o["box"])
                                           for o in doc["objects"]}
        except (ValueError, KeyError, TypeError) as e:
            raise BagError(f"{str(path)!r} {topic}: a ground-truth message is not "
                           f"{{stamp_ns, objects: [{{label, box}}]}} JSON ({e})") from e
    return truth


def load_ground_truth_3d(path: str | Path, topic: str) -> GroundTruth3D:
    """3D ground truth per frame stamp from the same topic (``{}`` when it has none).

    Objects with ``"center_3d": [x, y, z]`` (metres, in the optical frame of the message's
    ``frame_id``) are read; frames without any are left out.
    """
    truth: GroundTruth3D = {}
    for doc in _truth_docs(path, topic):
        try:
            centers = {str(o["label"]): _vec3(o["center_3d"]) for o in doc["objects"]
                       if o.get("center_3d") is not None}
            if centers:
                truth[int(doc["stamp_ns"])] = Truth3D(str(doc.get("frame_id", "")), centers)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise BagError(f"{str(path)!r} {topic}: a ground-truth message is not "
                           f"{{stamp_ns, frame_id, objects: [{{label, center_3d: [x, y, z]}}]}} "
                           f"JSON ({e})") from e
    return truth


def _vec3(values: Any) -> Vec3:
    x, y, z = (float(v) for v in values)
    return x, y, z


def truth_at(truth: Mapping[int, T], stamp_ns: int, tolerance_ns: int = 20_000_000
             ) -> T | None:
    """Ground truth of the frame stamped ``stamp_ns`` (nearest within ``tolerance_ns``)."""
    if not truth:
        return None
    if stamp_ns in truth:
        return truth[stamp_ns]
    nearest = min(truth, key=lambda s: abs(s - stamp_ns))
    return truth[nearest] if abs(nearest - stamp_ns) <= tolerance_ns else None


# --- writing results ---------------------------------------------------------------------------


# Results bags are written in the rosbag2 format Humble records (metadata version 5) so that
# every supported distro reads them: Humble's rosbag2 (0.15.x) reads a topic's
# offered_qos_profiles as one YAML string, and fails ("yaml-cpp: bad conversion") on version
# 9's list form (ros2/rosbag2#2013, #1895); Iron and later read version 5 (backward compatible).
HUMBLE_METADATA_VERSION = 5
# The keys of a version-5 metadata.yaml (Humble's rosbag2_storage/yaml.hpp); later versions add
# custom_data, ros_distro and, per topic, type_description_hash.
_V5_KEYS = ("version", "storage_identifier", "duration", "starting_time", "message_count",
            "topics_with_message_count", "compression_format", "compression_mode",
            "relative_file_paths", "files")
_V5_TOPIC_KEYS = ("name", "type", "serialization_format", "offered_qos_profiles")


def _results_qos() -> Any:
    """Return the QoS of the node's ``~/results`` publisher (reliable, volatile, keep last 256).

    Stored in the bag as Humble's recorder stores a publisher's QoS, so ``ros2 bag play``
    republishes with it instead of guessing.
    """
    from rosbags.interfaces import (
        Qos,
        QosDurability,
        QosHistory,
        QosLiveliness,
        QosReliability,
        QosTime,
    )

    default = QosTime(0, 0)  # RMW_DURATION_UNSPECIFIED: the middleware's default
    depth = 256  # ros/outputs.py RESULTS_QUEUE_DEPTH (not imported: bag I/O needs no rclpy)
    return Qos(QosHistory.KEEP_LAST, depth, QosReliability.RELIABLE, QosDurability.VOLATILE,
               default, default, QosLiveliness.AUTOMATIC, default, False)


def to_humble_metadata(path: str | Path) -> None:
    """Rewrite a bag's metadata.yaml (written as version 8) as version 5, Humble's format."""
    import yaml

    meta_path = Path(path) / "metadata.yaml"
    doc = yaml.safe_load(meta_path.read_text(encoding="utf-8"))
    info = doc["rosbag2_bagfile_information"]
    if info.get("version") != 8:
        raise BagError(f"{meta_path}: expected metadata version 8 to convert, found "
                       f"{info.get('version')!r}")
    out = {k: info[k] for k in _V5_KEYS if k in info}
    out["version"] = HUMBLE_METADATA_VERSION
    out["topics_with_message_count"] = [
        {"topic_metadata": {k: t["topic_metadata"][k] for k in _V5_TOPIC_KEYS},
         "message_count": t["message_count"]}
        for t in info["topics_with_message_count"]]
    tmp = meta_path.with_suffix(".yaml.tmp")
    tmp.write_text(yaml.safe_dump({"rosbag2_bagfile_information": out}, sort_keys=False),
                   encoding="utf-8")
    os.replace(tmp, meta_path)


class ResultsBagWriter:
    """Writes ``ReasoningResult`` messages (from their plain form) to a new rosbag2 bag.

    The bag is what Humble's rosbag2 reads (``HUMBLE_METADATA_VERSION``); sqlite3 is Humble's
    default storage, mcap needs its ``ros-humble-rosbag2-storage-mcap`` package.
    """

    def __init__(self, path: str | Path, storage: str = "mcap",
                 topic: str = "/cosmos_reason/results") -> None:
        """Create the bag (the directory must not exist yet)."""
        from rosbags.rosbag2 import StoragePlugin, Writer

        if storage not in STORAGES:
            raise BagError(f"storage={storage!r}: allowed {', '.join(STORAGES)}")
        if Path(path).exists():
            raise BagError(f"results bag {str(path)!r} already exists")
        plugin = StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3
        self.path = Path(path)
        # rosbags writes versions 8 and 9 only; 8 stores QoS as Humble does (a YAML string),
        # and close() rewrites its metadata.yaml as version 5.
        self._writer = Writer(self.path, version=8, storage_plugin=plugin)
        self._writer.open()
        self._conn = self._writer.add_connection(topic, RESULT_TYPE, typestore=typestore(),
                                                 offered_qos_profiles=[_results_qos()])
        self.count = 0

    def write(self, cdr: bytes, t_ns: int) -> None:
        """Write one serialized result at bag time ``t_ns``."""
        self._writer.write(self._conn, int(t_ns), cdr)
        self.count += 1

    def close(self) -> None:
        """Finish the bag (writes metadata.yaml, in Humble's version 5)."""
        self._writer.close()
        to_humble_metadata(self.path)

    def __enter__(self) -> ResultsBagWriter:
        """Context manager: close on exit."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the bag."""
        self.close()


def read_results(path: str | Path, topic: str = "/cosmos_reason/results"
                 ) -> list[dict[str, Any]]:
    """Read a results bag back with the definitions stored in the bag itself (plain form)."""
    from rosbags.typesys import Stores, get_types_from_msg, get_typestore

    store = get_typestore(Stores.EMPTY)
    out = []
    with _reader(path) as reader:
        conns = [c for c in reader.connections if c.topic == topic]
        if not conns:
            raise BagError(f"{str(path)!r} has no {topic} topic")
        for conn in conns:
            store.register(get_types_from_msg(conn.msgdef.data, conn.msgtype))
        for conn, _t, data in reader.messages(connections=conns):
            out.append(to_plain(store.deserialize_cdr(bytes(data), conn.msgtype)))
    return out
