"""The README's first command: the demo runs end to end on the CPU with the tiny model."""

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.ros, pytest.mark.engine, pytest.mark.slow]


def test_demo_answers_every_query_and_saves_frames(tmp_path, tiny_qwen3_vl):
    out = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "cosmos_reason_ros.tools.demo", "--model",
                           str(tiny_qwen3_vl), "--preset", "cpu_demo", "--out", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary == {"queries": 4, "failed": 0, "out": str(out)}
    assert "== ground: succeeded" in proc.stdout
    assert (out / "ground.png").stat().st_size > 1000
