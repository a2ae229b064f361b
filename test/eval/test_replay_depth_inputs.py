"""Replay through a node with depth on: CameraInfo and depth reach the node before the first goal.

A node subscribes to depth and CameraInfo once it has discovered their publishers (it follows
their reliability), so a replay that starts publishing as soon as the colour topic matches can
lose the first CameraInfo and send its first goal to a node without one ("no CameraInfo
received yet", 2 of 21 runs). The replay waits, bounded, for the node to subscribe and to
acknowledge, and reports per topic what happened. Fast tier: the in-process node, scripted
engine, the generated demo recording.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("rosbags", reason="needs rosbags (make setup)")
pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
from fake_engine import Script  # noqa: E402
from inprocess_node import InProcessNode  # noqa: E402
from waiting import DISCOVERY_S  # noqa: E402

from cosmos_reason_interfaces.msg import ReasoningResult  # noqa: E402
from cosmos_reason_ros.eval import demo_recording, replay  # noqa: E402

pytestmark = [pytest.mark.ros]

# The first goal comes with the first frames: nothing else has had time to arrive.
SCENARIO = """
name: first goal with depth
queries:
  - {name: ground, at: 0.1, task: ground, targets: [red box]}
"""
ANSWER = '[{"bbox_2d": [400, 400, 600, 600], "label": "red box"}]'  # Reason2: 0-1000
TO_NODE = {demo_recording.IMAGE_TOPIC: "/image", demo_recording.DEPTH_TOPIC: "/depth/image",
           demo_recording.CAMERA_INFO_TOPIC: "/camera_info"}


@pytest.fixture(scope="module")
def bag(tmp_path_factory):
    root = tmp_path_factory.mktemp("depth_inputs")
    (root / "scenario.yaml").write_text(SCENARIO)
    params = demo_recording.RecordingParams(width=320, height=240, duration_s=0.5,
                                            storage="sqlite3")
    return demo_recording.write_recording(root / "bag", params), root / "scenario.yaml"


def replay_through_node(bag, out, remaps, *extra):
    path, scenario = bag
    n = InProcessNode({"use_sim_time": True, "model.family": "cosmos_reason2",
                       "depth.enabled": True, "image.max_age_s": 0.0},
                      script=lambda _request: Script(deltas=[ANSWER]))
    try:
        args = [str(path), "--scenario", str(scenario), "--out", str(out), "--no-progress",
                "--connect-timeout", str(DISCOVERY_S)]
        for source, target in remaps.items():
            args += ["--remap", f"{source}:={target}"]
        code = replay.main(args + list(extra))
        has_camera_info = n.node.camera.camera_model() is not None  # the node's own state
    finally:
        n.close()
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    return code, records, {i["kind"]: i for i in summary["depth_inputs"]}, has_camera_info


def test_the_first_goal_finds_camera_info_and_depth_at_the_node(bag, tmp_path):
    code, records, inputs, has_camera_info = replay_through_node(bag, tmp_path / "out",
                                                                 TO_NODE)
    assert code == replay.EXIT_OK
    (first,) = records
    assert first["status"] == "succeeded", first["result"]["error_message"]
    assert first["result"]["lift_code"] == ReasoningResult.LIFT_OK, \
        first["result"]["lift_message"]
    assert has_camera_info
    for kind, topic in (("camera_info", demo_recording.CAMERA_INFO_TOPIC),
                        ("depth", demo_recording.DEPTH_TOPIC)):
        item = inputs[kind]
        assert item["topic"] == topic and item["published_as"] == TO_NODE[topic]
        assert item["subscribed"] and item["acknowledged"] and item["published"] >= 1, item
        assert item["status"] == "received by the node before the first goal"


def test_a_camera_info_topic_nobody_takes_is_reported_once_the_bound_passes(bag, tmp_path,
                                                                            capsys):
    # The node's camera_info is not remapped to the bag's: it never subscribes to it.
    remaps = {k: v for k, v in TO_NODE.items() if k != demo_recording.CAMERA_INFO_TOPIC}
    code, records, inputs, has_camera_info = replay_through_node(
        bag, tmp_path / "out", remaps, "--depth-inputs-timeout", "0.5")
    (first,) = records
    assert first["result"]["lift_code"] == ReasoningResult.LIFT_NO_DEPTH
    assert not has_camera_info
    item = inputs["camera_info"]
    assert not item["subscribed"] and not item["acknowledged"]
    assert item["status"].startswith(
        f"nobody subscribed to {demo_recording.CAMERA_INFO_TOPIC} within 0.5 s: remap the "
        "node's camera_info to it")
    assert inputs["depth"]["subscribed"] and inputs["depth"]["acknowledged"]
    assert code == replay.EXIT_OK  # a report, not a failure: nothing scored regressed
