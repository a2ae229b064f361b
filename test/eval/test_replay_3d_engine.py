"""Offline replay with depth on the demo recording, on the real vLLM engine (tiny model).

What only this proves: the demo scenario's grounding goals, answered by the real engine
(constrained decoding of Reason2 boxes, the real resize and coordinate mapping), come back
with 3D positions lifted from the recording's registered depth -- ``lift_code`` LIFT_OK, the
colour frame's ``frame_3d`` and depth stamp -- and the replay's ``position_error`` figure is
the distance from the lifted position to the recording's 3D ground truth, computed here
independently. The tiny model's weights are random, so its boxes are anywhere: the test
prints the 3D error next to the 2D IoU (a box off the object lifts whatever surface it
covers) and asserts consistency, not accuracy; ``test_replay_3d.py`` checks the accuracy with
a box on the object. One engine start.
"""

from __future__ import annotations

import importlib.util
import json
import math

import pytest
import yaml

from cosmos_reason_ros.core.cdr import read_stored_frame
from cosmos_reason_ros.core.lifting import lift_box
from cosmos_reason_ros.core.rgbd import depth_image
from cosmos_reason_ros.core.types import Box
from cosmos_reason_ros.eval import bagio, demo_recording, replay, replay_records

# vLLM looked up, not imported, at collection: every pytest worker collects every module.
pytestmark = [pytest.mark.engine, pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                 reason="needs the vLLM engine (make setup)")]

NS = 1_000_000_000
DEMO_SCENARIO = replay_records.REPO_ROOT / "config" / "scenarios" / "demo.yaml"


def demo_ground_query():
    """The demo scenario with only its grounding query (same targets and expectations)."""
    doc = yaml.safe_load(DEMO_SCENARIO.read_text())
    doc["queries"] = [q for q in doc["queries"] if q["name"] == "ground"]
    assert doc["queries"] and any(e["kind"] == "position_error"
                                  for e in doc["queries"][0]["expect"])
    return doc


def truth_by_stamp(bag):
    """The recording's ground truth, read straight from its JSON messages: label -> object."""
    store = bagio.typestore()
    out = {}
    for _t, msgtype, _ts, data in bagio.messages(bag, [demo_recording.GROUND_TRUTH_TOPIC]):
        doc = json.loads(store.deserialize_cdr(data, msgtype).data)
        out[doc["stamp_ns"]] = {o["label"]: o for o in doc["objects"]}
    return out


def on_object_errors(bag, stamps, truth, camera):
    """What a perfect 2D box allows: the 3D error of each ground-truth box lifted."""
    errors = []
    for _t, _m, _ts, data in bagio.messages(bag, [demo_recording.DEPTH_TOPIC]):
        d = read_stored_frame((False, data))
        if d.stamp_ns not in stamps:
            continue
        z = depth_image(d.encoding, d.width, d.height, d.step, d.data).metres()
        for o in truth[d.stamp_ns].values():
            x0, y0, x1, y1 = o["box"]
            lifted = lift_box(z, camera, Box(x0, y0, x1 + 1, y1 + 1))
            errors.append(math.dist(lifted.position, o["center_3d"]))
    return errors


def test_grounding_on_the_demo_recording_returns_3d_positions_scored_against_truth(
        tiny_qwen3_vl, tmp_path):
    bag = demo_recording.write_recording(tmp_path / "recording",
                                         demo_recording.RecordingParams())  # the demo's own
    scenario = tmp_path / "ground.yaml"
    scenario.write_text(yaml.safe_dump(demo_ground_query()))
    out = tmp_path / "run"
    code = replay.main([str(bag), "--scenario", str(scenario), "--out", str(out), "--mode",
                        "offline", "--preset", "cpu_demo", "--model", str(tiny_qwen3_vl),
                        "--param", "depth.enabled:=true", "--no-progress"])
    assert code == replay.EXIT_OK  # the position_error checks are informational
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["t_s"] for r in records] == [1.0, 2.5, 4.0]
    truth = truth_by_stamp(bag)
    camera = demo_recording.camera_model(demo_recording.RecordingParams())
    lifted = 0
    rows = []
    for r in records:
        res = r["result"]
        assert r["status"] == "succeeded" and res["error_code"] == 0, res["error_message"]
        stamp = res["header"]["stamp"]["sec"] * NS + res["header"]["stamp"]["nanosec"]
        boxes = [b for b in res["boxes"] if not b["degenerate"]]
        if boxes:
            assert res["lift_code"] == 1, res["lift_message"]  # LIFT_OK
            assert res["frame_3d"] == demo_recording.FRAME_ID
            depth = res["depth_stamp"]["sec"] * NS + res["depth_stamp"]["nanosec"]
            assert depth == stamp  # the depth frame recorded with the colour frame
        else:  # nothing to lift: the 2D answer had no box
            assert res["lift_code"] == 0
        for b in boxes:
            p3 = b["position_3d"]
            if p3["valid"]:
                lifted += 1
                assert all(math.isfinite(p3["position"][k]) for k in "xyz")
                assert p3["depth_pixels"] > 0 and p3["status"] == ""
                # Somewhere in the scene (between the camera's minimum range and the wall),
                # on the rays of the model's box: the 3D error is what the 2D box allows.
                x, y, z = (p3["position"][k] for k in "xyz")
                assert 0.1 <= z <= demo_recording.wall_depth_m(camera) * 1.05
                u, v = camera.project(x, y, z)
                margin_u = 2 + 0.05 * (b["x_max"] - b["x_min"])
                margin_v = 2 + 0.05 * (b["y_max"] - b["y_min"])
                assert b["x_min"] - margin_u <= u <= b["x_max"] + margin_u, (b, u)
                assert b["y_min"] - margin_v <= v <= b["y_max"] + margin_v, (b, v)
            else:
                assert p3["status"], b  # why not, in words
        scores = {(s["kind"], s["label"]): s for s in r["scores"]}
        for (kind, label), s in scores.items():
            if kind != "position_error":
                continue
            centre = truth[stamp][label]["center_3d"]
            mine = [math.dist([b["position_3d"]["position"][k] for k in "xyz"], centre)
                    for b in boxes if b["label"].casefold() == label.casefold()
                    and b["position_3d"]["valid"]]
            if mine:
                assert s["value"] == pytest.approx(min(mine), abs=1e-9), (label, s)
            else:
                assert s["value"] is None and not s["passed"]
            iou = scores[("box_iou", label)]["value"]
            rows.append(f"  t={r['t_s']:.1f}s {label:8s} IoU "
                        + ("  n/a" if iou is None else f"{iou:.2f}") + "  3D error "
                        + ("n/a" if s["value"] is None else f"{s['value']:.3f} m")
                        + f"  ({s['reason']})")
    stamps = {r["result"]["header"]["stamp"]["sec"] * NS
              + r["result"]["header"]["stamp"]["nanosec"] for r in records}
    perfect = on_object_errors(bag, stamps, truth, camera)
    assert max(perfect) <= 0.02  # a box on the object lifts to within 2 cm at ~1 m
    print("\ndemo grounding, tiny random model, depth on:\n" + "\n".join(rows)
          + f"\n  lifted boxes: {lifted}; for reference, the ground-truth boxes of the same "
          f"frames lift to within {max(perfect):.4f} m (mean {sum(perfect) / len(perfect):.4f})")
    # The results bag carries the 3D fields too, read back equal to the JSONL.
    assert bagio.read_results(out / "results_bag") == [r["result"] for r in records]
    assert "IoU / 3D error" in (out / "report.html").read_text()
