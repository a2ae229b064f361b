"""The node, offline replay and bench's engine mode build the same request for one goal and frame.

All three go through ``core/pipeline.GoalPipeline``; this checks the result, not the wiring:
a recorded camera frame (real rosbag2 bytes) is published to the in-process node and replayed
offline, the same pixels are given to the bench, and the engine requests they produce are
compared field by field (the request id aside).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
import yaml  # noqa: E402
from action_msgs.msg import GoalStatus  # noqa: E402
from fake_engine import FakeEngine  # noqa: E402
from inprocess_node import InProcessNode  # noqa: E402

from cosmos_reason_interfaces.action import Reason  # noqa: E402
from cosmos_reason_ros.core.cdr import read_stored_frame  # noqa: E402
from cosmos_reason_ros.core.imaging import message_to_rgb  # noqa: E402
from cosmos_reason_ros.eval import bagio, demo_recording  # noqa: E402
from cosmos_reason_ros.eval.replay_offline import OfflineRunner  # noqa: E402
from cosmos_reason_ros.eval.replay_records import ReplayConfig  # noqa: E402
from cosmos_reason_ros.eval.scenario import build_schedule, load_scenario  # noqa: E402

pytestmark = [pytest.mark.ros]
PROMPT = "What is on the table?"
MAX_TOKENS = 16


def comparable(request):
    """Every field of a ChatRequest but its id and routing key, with pixel arrays as bytes.

    The routing key says who asks (the node's name; offline replay has none), not what the
    model sees.
    """
    fields = dataclasses.asdict(dataclasses.replace(request, request_id="", session_key=""))
    fields["images"] = [(img.shape, img.tobytes()) for img in request.images]
    return fields


def replayed_request(tmp_path, node, bag, info, image_topic, query, **config):
    """Replay the bag offline with the node's parameters and one query; its engine request."""
    preset = tmp_path / "preset.yaml"
    preset.write_text(yaml.safe_dump({"/**": {"ros__parameters":
                                              node.node.params.to_values()}}))
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump({"queries": [{
        "name": "q", "at": [0.0], "prompt": PROMPT, "max_tokens": MAX_TOKENS, "greedy": True,
        **query}]}))
    schedule = build_schedule(load_scenario(scenario), info.duration_s)
    offline_engine = FakeEngine()
    runner = OfflineRunner(ReplayConfig(bag=bag, scenario=scenario, out=tmp_path / "out",
                                        mode="offline", preset=str(preset), **config),
                           engine=offline_engine)
    try:
        records = []
        runner.run(schedule, info, image_topic,
                   type("Rec", (), {"add": lambda _s, *a: records.append(a)})(), lambda: None)
    finally:
        runner.close()
    assert records[0][1] == "succeeded", records[0]
    return offline_engine.requests[0]


def test_node_replay_and_bench_build_identical_requests(tiny_qwen3_vl, tmp_path):
    bag = demo_recording.write_recording(tmp_path / "bag", demo_recording.RecordingParams(
        width=320, height=240, duration_s=1.0, storage="sqlite3"))
    info = bagio.bag_info(bag)
    _topic, _type, _t, data = next(bagio.messages(bag, [demo_recording.IMAGE_TOPIC]))
    # The node's parameters, shared with the offline runner's preset and matching the bench's
    # settings (profile pixel budget, 1024-token cap, fixed output length).
    params = {"engine.model": str(tiny_qwen3_vl), "model.family": "auto",
              "model.max_pixels": 0, "limits.max_tokens": 1024,
              "limits.fixed_output_length": True, "image.max_age_s": 0.0}

    node = InProcessNode(params)
    try:
        node.camera.publish(data)  # the recorded CDR bytes, as replay publishes them
        node.wait_frames(1)
        status, _ = node.ask(prompt=PROMPT, max_tokens=MAX_TOKENS, greedy=True,
                             source=Reason.Goal.SOURCE_LATEST)
        from_node = node.engine.requests[0]
    finally:
        node.close()

    from_replay = replayed_request(tmp_path, node, bag, info, demo_recording.IMAGE_TOPIC, {})

    from cosmos_reason_ros.bench.engine_side import EngineBench

    bench_engine = FakeEngine()
    bench = EngineBench(str(tiny_qwen3_vl), {}, {}, engine=bench_engine)
    bench.start(30.0)
    try:
        rgb = message_to_rgb(read_stored_frame((False, data)))
        out = bench.submit(np.ascontiguousarray(rgb), PROMPT, MAX_TOKENS)()
        assert out["ok"]
    finally:
        bench.close()
    from_bench = bench_engine.requests[0]

    assert status == GoalStatus.STATUS_SUCCEEDED
    assert len(from_node.images) == 1 and from_node.sampling.max_tokens == MAX_TOKENS
    assert from_node.sampling.ignore_eos and from_node.sampling.temperature == 0.0
    assert comparable(from_node) == comparable(from_replay)
    assert comparable(from_node) == comparable(from_bench)


def test_node_and_replay_build_identical_two_camera_requests(tiny_qwen3_vl, tmp_path):
    # The demo recording's two cameras: the colour Image and the smaller compressed wrist view.
    bag = demo_recording.write_recording(tmp_path / "bag", demo_recording.RecordingParams(
        width=320, height=240, duration_s=1.0, storage="sqlite3", depth=False))
    info = bagio.bag_info(bag)
    cameras = {"front": demo_recording.IMAGE_TOPIC, "wrist": demo_recording.WRIST_TOPIC}
    first = {}
    for topic, _type, _t, data in bagio.messages(bag, list(cameras.values())):
        first.setdefault(topic, data)
    params = {"engine.model": str(tiny_qwen3_vl), "model.family": "auto",
              "limits.max_tokens": 1024, "image.max_age_s": 0.0,
              "cameras.names": list(cameras), "cameras.inputs": ["raw", "compressed"]}
    from sensor_msgs.msg import CompressedImage

    node = InProcessNode(params)
    try:
        wrist = node.side.node.create_publisher(CompressedImage, "/wrist/image/compressed", 10)
        assert node.side.wait_matched(wrist, 10.0)
        node.camera.publish(first[cameras["front"]])  # the recorded CDR bytes
        wrist.publish(first[cameras["wrist"]])
        node.wait_frames(1, camera="front")
        node.wait_frames(1, camera="wrist")
        status, result = node.ask(prompt=PROMPT, max_tokens=MAX_TOKENS, greedy=True,
                                  cameras=["wrist", "front"])
        assert status == GoalStatus.STATUS_SUCCEEDED, result.error_message
        from_node = node.engine.requests[0]
    finally:
        node.close()

    from_replay = replayed_request(tmp_path, node, bag, info, cameras["front"],
                                   {"cameras": ["wrist", "front"]}, cameras=cameras)
    assert len(from_node.images) == 2
    assert comparable(from_node) == comparable(from_replay)
