"""The replay's results bag is one that ROS 2 Humble's rosbag2 reads.

Humble's rosbag2 (0.15.x) records metadata version 5 and decodes metadata.yaml by version
(rosbag2_storage/yaml.hpp on the humble branch): every field is read with yaml-cpp's
``as<T>()``, and a topic's ``offered_qos_profiles`` is one YAML *string* (version >= 4).
Version 9 (Jazzy and later) writes it as a list, which Humble rejects with "yaml-cpp: bad
conversion" (ros2/rosbag2#2013). Humble's sqlite3 plugin reads the ``topics`` and
``messages`` tables; mcap needs the ``ros-humble-rosbag2-storage-mcap`` package there.

No Humble rosbag2 runs here: ``humble_decode`` below mirrors what Humble's decoder reads, with
the types it demands, and the bag is also read back with rosbags.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import yaml

pytest.importorskip("rosbags", reason="needs rosbags (make setup)")
from cosmos_reason_ros.eval import bagio  # noqa: E402

TOPIC = "/cosmos_reason/results"


def humble_decode(info: dict) -> dict:
    """Read metadata the way Humble's ``convert<BagMetadata>::decode`` does; raise otherwise."""

    def need(node: dict, key: str, kind: type | tuple[type, ...]) -> object:
        assert key in node, f"Humble reads {key!r}, which is missing"
        value = node[key]
        assert isinstance(value, kind) and not isinstance(value, bool), \
            f"Humble reads {key!r} as {kind}, found {type(value).__name__}: {value!r}"
        return value

    version = need(info, "version", int)
    need(info, "storage_identifier", str)
    need(need(info, "duration", dict), "nanoseconds", int)
    need(need(info, "starting_time", dict), "nanoseconds_since_epoch", int)
    need(info, "message_count", int)
    topics = need(info, "topics_with_message_count", list)
    for topic in topics:
        meta = need(topic, "topic_metadata", dict)
        for key in ("name", "type", "serialization_format"):
            need(meta, key, str)
        if version >= 4:
            need(meta, "offered_qos_profiles", str)  # a YAML string, not a list (version 9)
        need(topic, "message_count", int)
    assert all(isinstance(p, str) for p in need(info, "relative_file_paths", list))
    if version >= 3:
        need(info, "compression_format", str)
        need(info, "compression_mode", str)
    if version >= 5:
        for f in need(info, "files", list):
            need(f, "path", str)
            need(need(f, "starting_time", dict), "nanoseconds_since_epoch", int)
            need(need(f, "duration", dict), "nanoseconds", int)
            need(f, "message_count", int)
    return info


def write_results(path: Path, storage: str) -> list[dict]:
    plains = [{"goal_id": "ab" * 8, "answer": "a cup", "error_code": 0},
              {"goal_id": "cd" * 8, "answer": "two cups", "error_code": 0}]
    out = []
    with bagio.ResultsBagWriter(path, storage, topic=TOPIC) as bag:
        for i, plain in enumerate(plains):
            canonical, cdr = bagio.canonical_result(plain)
            bag.write(cdr, 1_700_000_000_000_000_000 + i)
            out.append(canonical)
    return out


@pytest.mark.parametrize("storage", bagio.STORAGES)
def test_results_bag_metadata_is_humbles_version_5(tmp_path: Path, storage: str) -> None:
    path = tmp_path / "results"
    written = write_results(path, storage)
    info = yaml.safe_load((path / "metadata.yaml").read_text())["rosbag2_bagfile_information"]
    assert info["version"] == bagio.HUMBLE_METADATA_VERSION == 5
    assert info["storage_identifier"] == storage
    humble_decode(info)
    # Nothing Humble does not know: no custom_data, ros_distro, type_description_hash.
    assert set(info) <= set(bagio._V5_KEYS)
    (topic,) = info["topics_with_message_count"]
    assert topic["message_count"] == 2 and topic["topic_metadata"]["name"] == TOPIC
    assert set(topic["topic_metadata"]) == {"name", "type", "serialization_format",
                                            "offered_qos_profiles"}
    # The QoS string is what Humble's player parses: the node's reliable, volatile writer.
    (qos,) = yaml.safe_load(topic["topic_metadata"]["offered_qos_profiles"])
    assert (qos["history"], qos["depth"], qos["reliability"], qos["durability"]) == (1, 256, 1, 2)
    assert [p for p in path.iterdir() if p.name != "metadata.yaml"] \
        == [path / info["relative_file_paths"][0]]
    # Still a bag for every other reader: rosbags reads version 5 back, message for message.
    assert bagio.read_results(path, TOPIC) == written
    assert bagio.bag_info(path).counts == {TOPIC: 2}


def test_sqlite3_results_bag_has_the_tables_humbles_plugin_reads(tmp_path: Path) -> None:
    path = tmp_path / "results"
    write_results(path, "sqlite3")
    (db,) = path.glob("*.db3")
    with sqlite3.connect(db) as con:
        # Humble's SqliteStorage: SELECT name, type, serialization_format,
        # offered_qos_profiles FROM topics; messages by topic_id and timestamp.
        rows = con.execute("SELECT name, type, serialization_format, offered_qos_profiles "
                           "FROM topics").fetchall()
        count = con.execute("SELECT COUNT(*) FROM messages JOIN topics ON "
                            "messages.topic_id = topics.id").fetchone()[0]
    assert [r[:3] for r in rows] == [(TOPIC, bagio.RESULT_TYPE, "cdr")]
    assert [q["reliability"] for q in yaml.safe_load(rows[0][3])] == [1]  # one profile
    assert count == 2
