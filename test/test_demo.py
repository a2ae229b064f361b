"""The README's first command: the demo runs end to end on the CPU with the tiny model."""

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.ros, pytest.mark.engine, pytest.mark.slow]


def test_demo_replays_the_recording_through_the_node_and_reports(tmp_path, tiny_qwen3_vl):
    out = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "cosmos_reason_ros.tools.demo", "--model",
                           str(tiny_qwen3_vl), "--preset", "cpu_demo", "--out", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    # The demo scenario schedules 8 goals on the 4 s recording (one about both cameras); all
    # must succeed.
    assert (summary["queries"], summary["succeeded"], summary["regressions"]) == (8, 8, 0)
    assert summary["ok"] and summary["report"] == str(out / "replay" / "report.html")
    assert "ground#0" in proc.stdout and "demo: PASS" in proc.stdout
    records = (out / "replay" / "results.jsonl").read_text().splitlines()
    assert len(records) == 8
    both = next(json.loads(r)["result"] for r in records if '"both cameras"' in r)
    assert [f["camera"] for f in both["camera_frames"]] == ["front", "wrist"]
    assert (out / "recording" / "metadata.yaml").is_file()  # a real rosbag2 bag
    assert len(list((out / "replay" / "frames").glob("*.png"))) == 8
