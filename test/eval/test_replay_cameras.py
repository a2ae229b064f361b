"""Offline replay of a bag with two cameras: topics mapped to camera names, as the node would.

The demo recording (small, generated) has a colour camera and a smaller, compressed
wrist-style view with the same stamps; the scripted engine (``test/fake_engine.py``) answers
with one box per camera, so the request (both images, in the query's camera order) and the
mapping of each box to its own camera's pixels are checked exactly. That node mode and
offline replay build the same two-camera request is checked in ``test_same_request.py``.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("rosbags", reason="needs rosbags (make setup)")
from fake_engine import FakeEngine, Script  # noqa: E402

from cosmos_reason_ros.eval import bagio, demo_recording, replay, replay_records  # noqa: E402

NS = 1_000_000_000
W, H = 320, 240  # the colour camera; the wrist view is half that
MODEL = "nvidia/Cosmos-Reason2-2B"  # Reason2 conventions by name; the engine is scripted
CAMERAS = {"front": demo_recording.IMAGE_TOPIC, "wrist": demo_recording.WRIST_TOPIC}
SCENARIO = """
name: two cameras
cameras:
  front: /camera/image_raw
  wrist: /wrist/image_raw/compressed
queries:
  - {name: front only, at: 0.2, prompt: "What is on the table?"}
  - name: both
    at: 0.4
    cameras: [wrist, front]
    task: ground
    targets: [green cylinder]
  - {name: both next, at: 0.5, source: next, cameras: [front, wrist], prompt: "Same scene?"}
"""
ANSWER = json.dumps([  # Reason2: 0-1000 per axis of each camera's own image
    {"bbox_2d": [250, 500, 750, 1000], "label": "green cylinder", "camera": "front"},
    {"bbox_2d": [0, 0, 500, 500], "label": "green cylinder", "camera": "wrist"},
])


@pytest.fixture(scope="module")
def bag(tmp_path_factory):
    root = tmp_path_factory.mktemp("cameras")
    (root / "scenario.yaml").write_text(SCENARIO)
    params = demo_recording.RecordingParams(width=W, height=H, duration_s=0.8,
                                            storage="sqlite3", depth=False)
    return demo_recording.write_recording(root / "bag", params), root / "scenario.yaml"


def run_offline(bag, scenario, out, **cfg):
    engine = FakeEngine(lambda request: Script(deltas=[ANSWER if len(request.images) > 1
                                                       else "A table."]), model=MODEL)
    config = replay.ReplayConfig(bag=bag, scenario=scenario, out=out, mode="offline",
                                 preset="cpu_demo", model=MODEL, progress=False, **cfg)
    return replay.run_replay(config, engine=engine), engine


def test_each_camera_is_fed_from_its_topic_and_boxes_map_to_its_pixels(bag, tmp_path):
    path, scenario = bag
    run, engine = run_offline(path, scenario, tmp_path / "out")
    assert [r["status"] for r in run.records] == ["succeeded"] * 3, run.records
    single, both, following = (r["result"] for r in run.records)
    # A query naming no camera asks about the default (first) camera alone.
    assert len(engine.requests[0].images) == 1
    assert [f["camera"] for f in single["camera_frames"]] == ["front"]
    # Two cameras: both images, in the query's order, the wrist's JPEG at its own size.
    request = engine.requests[1]
    assert [f["camera"] for f in both["camera_frames"]] == ["wrist", "front"]
    assert [(f["header"]["frame_id"], f["image_width"], f["image_height"])
            for f in both["camera_frames"]] == [(demo_recording.WRIST_FRAME_ID, W // 2, H // 2),
                                                (demo_recording.FRAME_ID, W, H)]
    assert [img.shape[:2] for img in request.images] == [
        (f["input_height"], f["input_width"]) for f in both["camera_frames"]]
    assert request.messages[-1].content[-1].text.startswith(
        'Image 1 is from the camera "wrist". Image 2 is from the camera "front".')
    # The recording takes both views at once: one stamp, the frame at the query time.
    start = bagio.bag_info(path).start_ns
    stamps = {f["header"]["stamp"]["sec"] * NS + f["header"]["stamp"]["nanosec"]
              for f in both["camera_frames"]}
    assert stamps == {start + 6 * NS // 15}  # 0.4 s at 15 Hz
    assert [(b["camera"], b["x_min"], b["y_min"], b["x_max"], b["y_max"])
            for b in both["boxes"]] == [("front", 80.0, 120.0, 240.0, 240.0),
                                        ("wrist", 0.0, 0.0, 80.0, 60.0)]
    # 'next' over two cameras: the first frames of both taken after the query time.
    next_stamps = {f["header"]["stamp"]["sec"] * NS + f["header"]["stamp"]["nanosec"]
                   for f in following["camera_frames"]}
    assert next_stamps == {start + 8 * NS // 15}  # the first frame after 0.5 s
    # The report draws each result on its first camera's frame.
    assert len(list((tmp_path / "out" / "frames").glob("*.png"))) == 3
    assert bagio.read_results(tmp_path / "out" / "results_bag") == [
        r["result"] for r in run.records]


def test_the_command_line_maps_topics_to_cameras(bag, tmp_path):
    path, _ = bag
    scenario = tmp_path / "plain.yaml"  # no cameras in the scenario: --camera names them
    scenario.write_text(SCENARIO.split("queries:")[0].split("cameras:")[0]
                        + "queries:" + SCENARIO.split("queries:")[1])
    args = replay.build_parser().parse_args(
        [str(path), "--scenario", str(scenario), "--out", str(tmp_path / "o"),
         "--camera", f"front={CAMERAS['front']}", "--camera", f"wrist={CAMERAS['wrist']}"])
    cfg = replay.config_from_args(args)
    assert cfg.cameras == CAMERAS and list(cfg.cameras) == ["front", "wrist"]


@pytest.mark.parametrize("argv, words", [
    (["--camera", "front"], "--camera 'front': expected NAME=TOPIC"),
    (["--camera", "wrist cam=/wrist/image_raw/compressed"], "is not a ROS name token"),
    (["--camera", "front=camera/image_raw"], "the topic an absolute name"),
])
def test_bad_camera_arguments_are_usage_errors(bag, tmp_path, capsys, argv, words):
    path, scenario = bag
    with pytest.raises(SystemExit) as e:
        replay.main([str(path), "--scenario", str(scenario), "--out", str(tmp_path / "o"),
                     *argv])
    assert e.value.code == 2 and words in capsys.readouterr().err


@pytest.mark.parametrize("cameras, words", [
    ({"front": CAMERAS["front"]}, "query 'both' names camera 'wrist'; cameras mapped to the "
                                  "bag's topics: front"),
    ({"front": CAMERAS["front"], "wrist": "/nope"}, "image topic '/nope' is not an image topic"),
    ({"front": CAMERAS["front"], "wrist": CAMERAS["front"]}, "both name /camera/image_raw"),
])
def test_camera_mappings_that_do_not_fit_the_bag_or_the_queries_exit_2(bag, tmp_path, capsys,
                                                                      cameras, words):
    path, scenario = bag
    argv = [a for name, topic in cameras.items() for a in ("--camera", f"{name}={topic}")]
    code = replay.main([str(path), "--scenario", str(scenario), "--out", str(tmp_path / "o"),
                        "--mode", "offline", "--model", MODEL, "--no-progress", *argv])
    assert code == replay.EXIT_BAD_INPUT
    assert words in capsys.readouterr().err


@pytest.mark.ros
def test_through_the_node_goals_name_the_cameras_the_bag_topics_feed(bag, tmp_path):
    pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
    from inprocess_node import InProcessNode
    from waiting import DISCOVERY_S

    path, scenario = bag
    n = InProcessNode({"use_sim_time": True, "model.family": "cosmos_reason2",
                       "cameras.names": ["front", "wrist"],
                       "cameras.inputs": ["raw", "compressed"], "image.max_age_s": 0.0},
                      script=lambda request: Script(deltas=[ANSWER if len(request.images) > 1
                                                            else "A table."]))
    try:
        # The node's cameras take the bag's topics (as `-r front/image:=/camera/image_raw`).
        code = replay.main([str(path), "--scenario", str(scenario), "--out",
                            str(tmp_path / "out"), "--rate", "max", "--no-progress",
                            "--connect-timeout", str(DISCOVERY_S),
                            "--remap", f"{CAMERAS['front']}:=/front/image",
                            "--remap", f"{CAMERAS['wrist']}:=/wrist/image/compressed"])
    finally:
        n.close()
    assert code == replay.EXIT_OK
    records = [json.loads(line) for line in
               (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert [r["status"] for r in records] == ["succeeded"] * 3, records
    assert [[f["camera"] for f in r["result"]["camera_frames"]] for r in records] == [
        ["front"], ["wrist", "front"], ["front", "wrist"]]
    assert [len(request.images) for request in n.engine.requests] == [1, 2, 2]
    assert [b["camera"] for b in records[1]["result"]["boxes"]] == ["front", "wrist"]


@pytest.mark.parametrize("text, words", [
    ("cameras: {front: /a/image}\nqueries: [{name: q, at: 0, prompt: p, cameras: [rear]}]",
     "queries[0].cameras: 'rear' is not one of the scenario's cameras (front)"),
    ("queries: [{name: q, at: 0, prompt: p, cameras: [front, front]}]",
     "queries[0].cameras[1]='front': named twice"),
    ("queries: [{name: q, at: 0, prompt: p, cameras: ['front cam']}]",
     "queries[0].cameras[0]='front cam' is not a ROS name token"),
    ("cameras: {front: camera/image}\nqueries: [{name: q, at: 0, prompt: p}]",
     "cameras.front='camera/image': expected the bag's image topic, an absolute name"),
    ("cameras: [front]\nqueries: [{name: q, at: 0, prompt: p}]",
     "cameras: expected a mapping of camera name to the bag's image topic"),
])
def test_scenario_cameras_are_checked_naming_the_field(text, words):
    import yaml

    from cosmos_reason_ros.eval.scenario import ScenarioError, parse_scenario

    with pytest.raises(ScenarioError) as e:
        parse_scenario(yaml.safe_load(text))
    assert words in str(e.value)


def test_the_demo_scenario_names_the_demo_recordings_cameras():
    from cosmos_reason_ros.eval.scenario import load_scenario

    s = load_scenario(replay_records.REPO_ROOT / "config" / "scenarios" / "demo.yaml")
    assert s.cameras == tuple(CAMERAS.items())
    assert [q.goal.cameras for q in s.queries if q.goal.cameras] == [("front", "wrist")]
