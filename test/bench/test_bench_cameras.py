"""The cameras mode's statistics and report section (pure: no rclpy, no vLLM)."""

from __future__ import annotations

import json
import math

import pytest

from cosmos_reason_ros.bench import report as benchreport

# (side, cameras) -> (TTFT s, e2e s, prompt tokens) of round 0; each later round adds 10 ms.
ROUND_0 = {("engine", 1): (0.100, 0.150, 120), ("engine", 2): (0.130, 0.180, 170),
           ("node", 1): (0.105, 0.156, 120), ("node", 2): (0.140, 0.190, 170)}


def _samples(rounds: int = 3) -> list[dict]:
    samples = []
    for r in range(-1, rounds):
        for (mode, cameras), (ttft, e2e, tokens) in ROUND_0.items():
            drift = 0.010 * max(r, 0)
            sample = {"phase": "cameras", "mode": mode, "cameras": cameras, "size": "640x480",
                      "wrist_size": "320x240", "round": r, "warmup": r < 0, "ok": True,
                      "ttft_s": ttft + drift, "e2e_s": e2e + drift, "prompt_tokens": tokens,
                      "output_tokens": 8,
                      "node_preprocess_s": 0.002 * cameras if mode == "node" else None}
            if (mode, cameras, r) == ("node", 2, 1):  # a failed goal pairs with nothing
                sample = {**sample, "ok": False, "error": "NO_IMAGE"}
            samples.append(sample)
    # Another phase's samples must not enter the figures.
    samples.append({"phase": "latency", "mode": "node", "round": 0, "ok": True, "e2e_s": 9.0,
                    "ttft_s": 9.0, "output_tokens": 8})
    return samples


def _row(rows: list[dict], **match: object) -> dict:
    return next(r for r in rows if all(r[k] == v for k, v in match.items()))


def test_camera_cost_per_setting_second_camera_and_node_overhead() -> None:
    cost = benchreport.camera_cost(_samples())
    engine_two = _row(cost["settings"], mode="engine", cameras=2)
    assert engine_two["n"] == 3 and engine_two["prompt_tokens_p50"] == 170
    assert engine_two["ttft_p50_ms"] == pytest.approx(140.0)  # 130, 140, 150
    assert math.isnan(engine_two["preprocess_p50_ms"])
    assert _row(cost["settings"], mode="node", cameras=2)["preprocess_p50_ms"] \
        == pytest.approx(4.0)
    engine = _row(cost["second_camera"], mode="engine")
    assert engine["pairs"] == 3
    assert engine["ttft_delta_p50_ms"] == pytest.approx(30.0)
    assert engine["ttft_ratio"] == pytest.approx(140.0 / 110.0)
    assert engine["e2e_delta_p50_ms"] == pytest.approx(30.0)
    node = _row(cost["second_camera"], mode="node")
    assert node["pairs"] == 2  # round 1's two-camera goal failed: no pair that round
    assert node["ttft_delta_p50_ms"] == pytest.approx(35.0)
    one, two = (_row(cost["node_overhead"], cameras=n) for n in (1, 2))
    assert one["pairs"] == 3 and one["overhead_p50_ms"] == pytest.approx(6.0)
    assert one["ttft_overhead_p50_ms"] == pytest.approx(5.0)
    assert two["pairs"] == 2 and two["overhead_p50_ms"] == pytest.approx(10.0)
    json.dumps(cost)  # stored as the run's extra["cameras"]


def test_camera_cost_is_empty_without_cameras_samples() -> None:
    assert benchreport.camera_cost(_samples()[-1:]) == {"settings": [], "second_camera": [],
                                               "node_overhead": []}


def test_report_has_the_cameras_section_only_when_the_mode_ran() -> None:
    data = {"meta": {"device": "cpu"}, "samples": _samples(), "batches": [], "extra": {}}
    report = benchreport.render_report(data)
    assert "## Second camera: front 640x480 + wrist 320x240" in report
    assert "| engine | 1 | 3 | 110.0 | 120.0 | 160.0 | 120 | – |" in report
    assert "| engine | 3 | 110.0 | 140.0 | 30.0 | 1.27x | 30.0 |" in report
    assert "| 2 | 2 | 190.0 | 200.0 | 10.0 | 10.0 | 10.0 |" in report
    data["samples"] = [s for s in data["samples"] if s["phase"] != "cameras"]
    assert "Second camera" not in benchreport.render_report(data)
