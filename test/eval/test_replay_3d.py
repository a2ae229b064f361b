"""Offline replay with depth: answers lifted to 3D as the node lifts them, foreign depth formats.

Small generated bags (``demo_recording`` at 320x240, under a second) and the scripted engine
(``test/fake_engine.py``) answering with a box exactly on the red box's drawn pixels, in
Cosmos-Reason2's 0-1000 coordinates: the 3D error against the recording's ground truth is then
the lifting's own (checked to <= 2 cm at ~1.15 m), and each foreign format either lifts as
well (32FC1 metres, depth at half the colour size) or ends with its specific lift code and
message while the 2D answer still succeeds (depth of another frame_id, depth delivered late).
"""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("rosbags", reason="needs rosbags (make setup)")
from fake_engine import FakeEngine, Script  # noqa: E402

from cosmos_reason_ros.eval import bagio, demo_recording, replay, replay_offline  # noqa: E402
from cosmos_reason_ros.eval.scoring import position_error  # noqa: E402

NS = 1_000_000_000
W, H = 320, 240
LABEL = "red box"
QUERY_T = 0.6  # a frame time (9 / 15 s): 'latest' takes exactly that frame
SCENARIO = f"""
name: 3d
image_topic: {demo_recording.IMAGE_TOPIC}
queries:
  - name: ground
    at: {QUERY_T}
    task: ground
    targets: [{LABEL}]
    expect:
      - {{kind: box_iou, label: {LABEL}, threshold: 0.9}}
      - {{kind: position_error, label: {LABEL}, threshold: 0.02}}
"""
# Cosmos-Reason2 by name: 0-1000 coordinates; the engine is scripted, nothing is loaded.
MODEL = "nvidia/Cosmos-Reason2-2B"
FORMATS = {
    "16UC1": {},
    "32FC1": {"depth_encoding": "32FC1"},
    "half resolution": {"depth_divisor": 2},
    "other frame_id": {"depth_frame_id": "demo_depth_optical_frame"},
    "late": {"depth_delay_s": 0.3},
}


@pytest.fixture(scope="module")
def bags(tmp_path_factory):
    root = tmp_path_factory.mktemp("bags3d")
    (root / "scenario.yaml").write_text(SCENARIO)
    out = {"scenario": root / "scenario.yaml"}
    for name, extra in FORMATS.items():
        params = demo_recording.RecordingParams(width=W, height=H, duration_s=0.8,
                                                storage="sqlite3", **extra)
        out[name] = demo_recording.write_recording(root / name.replace(" ", "_"), params)
    return out


def truth_of(bag, t_s):
    """The recording's 2D and 3D ground truth of the frame at ``t_s``."""
    stamp = bagio.bag_info(bag).start_ns + round(t_s * NS)
    boxes = bagio.load_ground_truth(bag, demo_recording.GROUND_TRUTH_TOPIC)[stamp]
    truth_3d = bagio.load_ground_truth_3d(bag, demo_recording.GROUND_TRUTH_TOPIC)[stamp]
    return stamp, boxes[LABEL], truth_3d


def on_object(box):
    """A Reason2 answer whose box covers exactly the object's drawn pixels.

    Ground-truth boxes are inclusive pixel indices; answers are continuous (pixel i spans
    [i, i + 1)), in 0-1000 per axis.
    """
    x0, y0, x1, y1 = box
    coords = [round(1000 * v / s) for v, s in ((x0, W), (y0, H), (x1 + 1, W), (y1 + 1, H))]
    return json.dumps([{"bbox_2d": coords, "label": LABEL}])


def run_offline(bag, scenario, out, answer, **cfg):
    engine = FakeEngine(lambda _request: Script(deltas=[answer]), model=MODEL)
    config = replay.ReplayConfig(
        bag=bag, scenario=scenario, out=out, mode="offline", preset="cpu_demo", model=MODEL,
        progress=False, params={"depth.enabled": True, **cfg})
    run = replay.run_replay(config, engine=engine)
    assert len(engine.requests) == 1
    (record,) = run.records
    # The 2D answer stands whatever happened in 3D.
    assert record["status"] == "succeeded" and record["result"]["error_code"] == 0
    assert len(record["result"]["boxes"]) == 1
    # The results bag reads back equal to the JSONL records: the 3D fields round-trip.
    assert bagio.read_results(out / "results_bag") == [record["result"]]
    return run, record


@pytest.mark.parametrize("fmt", ["16UC1", "32FC1", "half resolution"])
def test_a_box_on_the_object_lifts_to_its_ground_truth_centre(bags, tmp_path, fmt):
    stamp, box, truth_3d = truth_of(bags[fmt], QUERY_T)
    run, record = run_offline(bags[fmt], bags["scenario"], tmp_path / "out", on_object(box))
    result = record["result"]
    assert result["lift_code"] == 1, result["lift_message"]  # LIFT_OK
    assert result["frame_3d"] == demo_recording.FRAME_ID == truth_3d.frame_id
    depth_stamp = result["depth_stamp"]
    assert depth_stamp["sec"] * NS + depth_stamp["nanosec"] == stamp  # registered: same stamps
    p3 = result["boxes"][0]["position_3d"]
    assert p3["valid"] and p3["status"] == "" and p3["depth_pixels"] > 100
    xyz = (p3["position"]["x"], p3["position"]["y"], p3["position"]["z"])
    centre = truth_3d.centers[LABEL]
    error = position_error(xyz, centre)
    assert 1.0 < centre[2] < 1.3  # the red box stands ~1.15 m away
    assert error <= 0.02, (xyz, centre)
    # The object's face is ~16 x 21 cm: the lifted extent says so (percentiles, not min/max).
    assert abs(p3["size"]["x"] - 0.16) < 0.02 and abs(p3["size"]["y"] - 0.21) < 0.02
    # Scoring measured the same error, and the report shows it.
    iou, pos = record["scores"]
    assert iou["kind"] == "box_iou" and iou["passed"] and iou["value"] > 0.95
    assert pos["kind"] == "position_error" and pos["passed"] and pos["label"] == LABEL
    assert pos["value"] == pytest.approx(error, abs=1e-9)
    assert record["ground_truth_3d"]["centers"][LABEL] == list(centre)
    html = run.report.read_text()
    assert "IoU / 3D error" in html and f"{LABEL}: IoU" in html and f"{error:.3f} m" in html
    assert "3D error p50 / max (m)" in html and "LIFT_OK" in html


def test_depth_of_another_frame_is_refused_with_bad_depth(bags, tmp_path):
    _stamp, box, _truth = truth_of(bags["other frame_id"], QUERY_T)
    _run, record = run_offline(bags["other frame_id"], bags["scenario"], tmp_path / "out",
                               on_object(box))
    result = record["result"]
    assert result["lift_code"] == 3  # LIFT_BAD_DEPTH
    assert ("depth frame_id='demo_depth_optical_frame' is not the colour frame_id="
            "'demo_camera'") in result["lift_message"]
    assert not result["boxes"][0]["position_3d"]["valid"]
    _iou, pos = record["scores"]
    assert not pos["passed"] and pos["value"] is None
    assert pos["reason"].startswith("not lifted to 3D (LIFT_BAD_DEPTH): depth frame_id=")


def test_the_declared_registered_frame_is_accepted(bags, tmp_path):
    _stamp, box, truth_3d = truth_of(bags["other frame_id"], QUERY_T)
    _run, record = run_offline(bags["other frame_id"], bags["scenario"], tmp_path / "out",
                               on_object(box),
                               **{"depth.registered_frame_id": "demo_depth_optical_frame"})
    assert record["result"]["lift_code"] == 1
    assert record["scores"][1]["passed"], record["scores"][1]["reason"]


def test_depth_arriving_late_gives_no_depth(bags, tmp_path):
    # Each depth frame reaches the bag 0.3 s after its stamp: at the query time the newest
    # one received is stamped 0.33 s before the colour frame, beyond depth.max_skew_s.
    _stamp, box, _truth = truth_of(bags["late"], QUERY_T)
    _run, record = run_offline(bags["late"], bags["scenario"], tmp_path / "out",
                               on_object(box))
    result = record["result"]
    assert result["lift_code"] == 2  # LIFT_NO_DEPTH
    assert result["lift_message"] == ("no depth frame within depth.max_skew_s=0.05 s of the "
                                      "colour frame (newest is -0.333 s from it)")
    assert "boxes" in result and not result["boxes"][0]["position_3d"]["valid"]
    assert record["scores"][1]["reason"].startswith("not lifted to 3D (LIFT_NO_DEPTH)")


def test_late_depth_within_a_larger_skew_is_used(bags, tmp_path):
    _stamp, box, _truth = truth_of(bags["late"], QUERY_T)
    _run, record = run_offline(bags["late"], bags["scenario"], tmp_path / "out",
                               on_object(box), **{"depth.max_skew_s": 0.4})
    result = record["result"]
    assert result["lift_code"] == 1
    # The nearest received depth frame is 5 frames older; the red box moved meanwhile, so
    # only its depth (constant) is checked here, not its position.
    assert result["boxes"][0]["position_3d"]["valid"]
    stamp = bagio.bag_info(bags["late"]).start_ns + round(QUERY_T * NS)
    depth_ns = result["depth_stamp"]["sec"] * NS + result["depth_stamp"]["nanosec"]
    assert (stamp - depth_ns) / NS == pytest.approx(1 / 3, abs=1e-6)


def test_depth_off_leaves_results_2d(bags, tmp_path):
    _stamp, box, _truth = truth_of(bags["16UC1"], QUERY_T)
    engine = FakeEngine(lambda _request: Script(deltas=[on_object(box)]), model=MODEL)
    run = replay.run_replay(replay.ReplayConfig(
        bag=bags["16UC1"], scenario=bags["scenario"], out=tmp_path / "out", mode="offline",
        model=MODEL, progress=False), engine=engine)
    (record,) = run.records
    result = record["result"]
    assert result["lift_code"] == 0 and result["frame_3d"] == ""
    assert not result["boxes"][0]["position_3d"]["valid"]
    pos = record["scores"][1]
    assert not pos["passed"] and "LIFT_OFF" in pos["reason"]


def test_a_missing_depth_topic_is_a_bad_input_before_the_engine_starts(bags, tmp_path):
    no_depth = demo_recording.write_recording(tmp_path / "bag", demo_recording.RecordingParams(
        width=64, height=48, duration_s=0.2, storage="sqlite3", depth=False))
    engine = FakeEngine(model=MODEL)
    with pytest.raises(replay.ReplayError, match="has 0 depth image topics") as e:
        replay_offline.OfflineRunner(replay.ReplayConfig(
            bag=no_depth, scenario=bags["scenario"], out=tmp_path / "out", mode="offline",
            model=MODEL, params={"depth.enabled": True}), engine=engine)
    assert e.value.exit_code == replay.EXIT_BAD_INPUT
    assert engine.state.name == "STOPPED"  # never started
    with pytest.raises(replay.ReplayError, match="depth topic '/nope' is not a"):
        replay_offline.OfflineRunner(replay.ReplayConfig(
            bag=bags["16UC1"], scenario=bags["scenario"], out=tmp_path / "out",
            mode="offline", model=MODEL, params={"depth.enabled": True},
            depth_topic="/nope"), engine=engine)


def test_command_line_param_and_depth_flags(bags, tmp_path, capsys):
    args = replay.build_parser().parse_args([
        str(bags["16UC1"]), "--scenario", str(bags["scenario"]), "--out", str(tmp_path),
        "--mode", "offline", "--param", "depth.enabled:=true", "--param",
        "depth.max_skew_s:=0.1", "--depth-topic", demo_recording.DEPTH_TOPIC])
    cfg = replay.config_from_args(args)
    assert cfg.params == {"depth.enabled": True, "depth.max_skew_s": 0.1}
    assert cfg.depth_topic == demo_recording.DEPTH_TOPIC
    # Through the node these are the node's own parameters: refused, saying so.
    assert replay.main([str(bags["16UC1"]), "--scenario", str(bags["scenario"]), "--out",
                        str(tmp_path / "n"), "--param", "depth.enabled:=true",
                        "--no-progress"]) == replay.EXIT_BAD_INPUT
    assert "are for --mode offline" in capsys.readouterr().err


def test_outcome_plain_carries_every_3d_field_like_fill_3d():
    from cosmos_reason_ros.core.answer3d import Answer3D, LiftCode
    from cosmos_reason_ros.core.lifting import Lifted
    from cosmos_reason_ros.core.types import (
        Box,
        ImageGeometry,
        ParsedAnswer,
        Point,
        ReasonOutcome,
        Trajectory,
    )

    outcome = ReasonOutcome(ParsedAnswer("", "", ""), boxes=(Box(1, 2, 3, 4, label="a"),),
                            points=(Point(5, 6, label="p"),),
                            trajectories=(Trajectory((Point(1, 1), Point(2, 2)), label="t"),))
    geometry = ImageGeometry(10, 10, 10, 10)
    ok = Lifted(True, (0.1, 0.2, 1.0), (0.3, 0.4, 0.0), 1.0, 50, 40)
    bad = Lifted(False, reason="no valid depth")
    answer = Answer3D(LiftCode.OK, "", "cam", 5 * NS + 7, (ok,), (bad,), ((ok, bad),))
    plain = replay_offline.outcome_plain(outcome, geometry, [5 * NS], None, answer)
    assert (plain["lift_code"], plain["lift_message"], plain["frame_3d"]) == (1, "", "cam")
    assert plain["depth_stamp"] == {"sec": 5, "nanosec": 7}
    assert plain["boxes"][0]["position_3d"] == {
        "valid": True, "position": {"x": 0.1, "y": 0.2, "z": 1.0},
        "size": {"x": 0.3, "y": 0.4, "z": 0.0},
        "orientation": {"x": 0.0, "y": 0.0, "z": 0.0, "w": 1.0}, "depth_pixels": 40,
        "status": ""}
    nan = plain["points"][0]["position_3d"]
    assert not nan["valid"] and nan["position"]["x"] is None and nan["status"] == \
        "no valid depth"
    waypoints = plain["trajectories"][0]["points"]
    assert waypoints[0]["position_3d"]["valid"] and not waypoints[1]["position_3d"]["valid"]
    # Through the message and back: NaN positions stay None, the rest as given.
    result, _cdr = bagio.canonical_result(plain)
    assert result["boxes"][0]["position_3d"] == plain["boxes"][0]["position_3d"]
    assert result["points"][0]["position_3d"] == nan
    assert math.isclose(result["trajectories"][0]["points"][0]["position_3d"]["position"]["z"],
                        1.0)
    # Without lifting (refused or off) only the result-level fields are set, as fill_3d does.
    refused = replay_offline.outcome_plain(outcome, geometry, [5 * NS], None,
                                   Answer3D(LiftCode.BAD_DEPTH, "why", "cam", 3))
    assert refused["lift_code"] == 3 and "position_3d" not in refused["boxes"][0]
    # ... and in the message the unfilled position_3d is zero, as in the node's message.
    result, _cdr = bagio.canonical_result(refused)
    assert result["boxes"][0]["position_3d"] == {
        "valid": False, "position": {"x": 0.0, "y": 0.0, "z": 0.0},
        "size": {"x": 0.0, "y": 0.0, "z": 0.0},
        "orientation": {"x": 0.0, "y": 0.0, "z": 0.0, "w": 0.0},  # a bag has no defaults
        "depth_pixels": 0, "status": ""}
    assert result["queue_s"] == 0.0 and result["boxes"][0]["score"] is None  # None: NaN
