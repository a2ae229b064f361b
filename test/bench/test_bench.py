"""The bench CLI: argument checks (fast) and one smoke run of every mode on the tiny model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from cosmos_reason_ros.bench import processes, runner, workload
from cosmos_reason_ros.bench.phases import PHASES

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_arguments_are_validated_with_the_bad_value_named(capsys: pytest.CaptureFixture
                                                          ) -> None:
    for argv, needle in ((["--modes", "engine,warp"], "unknown warp"),
                         (["--sizes", "640by480"], "640by480"),
                         (["--lengths", "short,1024"], "1024"),
                         (["--concurrency", "1,x"], "1,x"),
                         (["--memory-goals", "-1"], "--memory-goals")):
        with pytest.raises(SystemExit):
            runner.parse_args(argv)
        assert needle in capsys.readouterr().err


def test_engine_args_split_into_named_settings_and_pass_through() -> None:
    overrides = workload.parse_engine_args(["max_model_len=2048", "enforce-eager=true",
                                         'compilation_config={"level": 0}', "block_size=32"])
    settings, extras = workload.engine_settings("gpu", overrides)
    assert settings["max_model_len"] == 2048 and settings["enforce_eager"] is True
    assert settings["gpu_memory_utilization"] == 0.25  # three engines share one GPU
    assert extras == {"compilation_config": {"level": 0}, "block_size": 32}
    with pytest.raises(SystemExit, match="key=value"):
        workload.parse_engine_args(["novalue"])


@pytest.mark.ros
def test_node_parameters_reach_the_node_with_their_types() -> None:
    # engine.extra_args is JSON: unquoted, rcl read it as a mapping and the node did not start.
    rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
    from rclpy.context import Context

    values = {"engine.extra_args": '{"block_size": 32}', "engine.api_key_env": "",
              "cameras.names": ["front", "wrist"], "image.max_age_s": 0.0,
              "prefill.enabled": False, "limits.max_queued_goals": 64}
    args = ["--ros-args"] + [arg for k, v in values.items()
                             for arg in ("-p", f"{k}:={processes._ros_value(v)}")]
    context = Context()
    rclpy.init(args=args, context=context)
    try:
        node = rclpy.create_node("params_probe", context=context,
                                 automatically_declare_parameters_from_overrides=True)
        got = {k: node.get_parameter(k).value for k in values}
        node.destroy_node()
    finally:
        rclpy.shutdown(context=context)
    assert got == values


class _StaleFirstRos:
    """A node that answers about the frame before the newest once, then about the newest."""

    def __init__(self) -> None:
        self.stamps: list[int] = []
        self.published: list[tuple[str, int]] = []
        self.answers_about_earlier = 1

    def now_ns(self) -> int:
        return 1_000 * (len(self.stamps) + 1)

    def image_msg(self, rgb: object, stamp_ns: int) -> int:
        self.stamps.append(stamp_ns)
        return stamp_ns

    def publish(self, topic: str, msg: int) -> None:
        self.published.append((topic, msg))

    def node_submit(self, prompt: str, max_tokens: int, cameras: object = ()) -> object:
        stale = self.answers_about_earlier > 0
        self.answers_about_earlier -= 1
        stamp = self.stamps[-1] - 1 if stale else self.stamps[-1]
        return lambda: {"ok": True, "stamp_ns": stamp}


def test_a_node_answer_about_the_previous_frame_is_asked_again_on_the_same_pictures() -> None:
    # Acked by DDS is not stored by the node: the bench publishes the same pictures under a
    # new stamp and asks again, and a later question about the first stamp expects the new one.
    bench = runner.Bench(runner.parse_args(["--modes", "node"]))
    bench.ros = ros = _StaleFirstRos()  # type: ignore[assignment]
    rgb = workload.picture(8, 6, 1)
    stamp = bench.publish_frame(["node"], rgb)
    first = bench.run_one("node", rgb, stamp, "q", 8, 0)
    assert first == {"ok": True, "stamp_ns": ros.stamps[-1]} and ros.stamps[-1] != stamp
    assert [t for t, _ in ros.published] == [workload.NODE_TOPIC] * 2
    assert bench.run_one("node", rgb, stamp, "q2", 8, 0)["ok"]
    ros.answers_about_earlier = 2  # stale on the first repeat too: the next one succeeds
    assert bench.run_one("node", rgb, bench.publish_frame(["node"], rgb), "q", 8, 0)["ok"]
    # Stale past every repeat: a failed sample that names both stamps.
    ros.answers_about_earlier = 1 + len(runner.REASK_PAUSES_S)
    again = bench.run_one("node", rgb, bench.publish_frame(["node"], rgb), "q", 8, 0)
    assert not again["ok"] and "instead of" in again["error"]


def test_pictures_are_deterministic_and_differ_per_seed() -> None:
    a, b = workload.picture(64, 48, 3), workload.picture(64, 48, 3)
    assert a.shape == (48, 64, 3) and (a == b).all()
    assert not (a == workload.picture(64, 48, 4)).all()


@pytest.mark.parametrize(("modes", "started"), [
    ("node,second", {"node"}),  # no vllm serve baseline unless asked for (minutes)
    ("engine,concurrency", {"engine"}),
    ("second", {"engine", "node", "baseline"}),  # no side named: every side it can compare
    ("concurrency", {"engine", "node"}),
    ("cameras", {"engine", "node"}),  # one camera vs two, on both sides
    ("node,cameras", {"node"}),
    ("prefill", {"node"}),
    ("lifting", set()),
    ("planning", {"node"}),  # behaviours and MCP tools are clients of the node
])
def test_a_run_starts_only_the_sides_its_modes_measure(modes: str, started: set[str]) -> None:
    bench = runner.Bench(runner.parse_args(["--modes", modes]))
    try:
        assert {part for part in ("engine", "node", "baseline") if bench.needs(part)} == started
    finally:
        bench.gc_pauses.uninstall()


@pytest.mark.slow  # starts processes or waits on real time: the real tier
def test_archive_packs_the_whole_run_into_one_file(tmp_path: Path) -> None:
    # The lifting phase runs in-process (no engine, no node): seconds.
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "cosmos_reason_ros.bench", "--modes", "lifting",
                           "--lifting-runs", "2", "--archive", "--out", str(out)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    with tarfile.open(tmp_path / "run.tar.gz") as archive:
        names = set(archive.getnames())
    assert {"run/bench.json", "run/results.md"} <= names, names


def test_every_mode_is_run_by_a_phase() -> None:
    # engine, node, baseline and floor are measured by the latency phase; each other mode is
    # a phase.
    assert set(workload.ALL_MODES) - set(workload.LATENCY_MODES) <= set(PHASES)
    assert list(PHASES)[0] == "latency"


@pytest.mark.engine
@pytest.mark.ros
@pytest.mark.slow
def test_smoke_run_records_samples_for_every_mode(tmp_path: Path, tiny_qwen3_vl: Path) -> None:
    out = tmp_path / "bench"
    # The budget is for a starved machine (a loaded CI run took 303 s, 153 s of it in the
    # concurrency phase); an idle one finishes in ~125 s.
    args = [sys.executable, "-m", "cosmos_reason_ros.bench", "--model", str(tiny_qwen3_vl),
            "--repeats", "1", "--sizes", "320x240", "--lengths", "short",
            "--concurrency", "1,2", "--ingest-s", "1", "--ingest-callback-runs", "20",
            "--memory-frames", "20", "--memory-goals", "4", "--time-budget-s", "480",
            "--out", str(out)]
    proc = subprocess.run(args, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert (out / "bench.json").exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((out / "bench.json").read_text())
    statuses = {m: s.get("status") for m, s in data["modes"].items()}
    assert proc.returncode == 0, f"{statuses}\n{json.dumps(data['modes'], indent=1)[-3000:]}"
    measured = [s for s in data["samples"] if s.get("ok") and not s.get("warmup")]
    for mode in ("engine", "node", "baseline"):
        assert statuses[mode] == "ran"
        assert any(s["phase"] == "latency" and s["mode"] == mode and s["e2e_s"] > 0
                   and s["output_tokens"] > 0 for s in measured), mode
    # floor: the bare rclpy action's process, in the same rotation, with the node's result size
    assert statuses["floor"] == "ran", data["modes"]["floor"]
    assert any(s["phase"] == "latency" and s["mode"] == "floor" for s in measured)
    assert data["extra"]["floor"]["result_bytes"] > 0
    for mode in ("engine", "node", "baseline"):  # the same frame asked twice
        questions = {s["question"] for s in measured
                     if s["phase"] == "second" and s["mode"] == mode}
        assert questions == {1, 2}, mode
    assert {(b["mode"], b["concurrency"]) for b in data["batches"]
            if b.get("ok")} >= {("node", 1), ("node", 2), ("engine", 1), ("engine", 2)}
    assert data["extra"]["ingest_callback"]["median_ms"] > 0
    assert data["extra"]["ingest"]["camera_only_cpu_percent"] >= 0
    assert data["extra"]["memory"]["goals"] == 4 and data["series"]["node_rss"]
    # prefill: one goal at a time and 8 at once, both settings
    assert statuses["prefill"] == "ran", data["modes"]["prefill"]
    assert {s["prefill"] for s in measured
            if s["phase"] == "prefill" and s["mode"] == "node"} == {True, False}
    # ... each goal placed in the camera's period (a frame every 0.2 s, its prefill after it)
    assert all(s["camera_phase_s"] >= 0.0 and isinstance(s["on_newest_frame"], bool)
               for s in measured if s["phase"] == "prefill" and s["mode"] == "node")
    # P2: the baseline, fed by the same camera, in the same rotation
    assert any(s["phase"] == "prefill" and s["mode"] == "baseline" for s in measured)
    assert {b["prefill"] for b in data["batches"]
            if b.get("phase") == "prefill" and b.get("ok")} == {True, False}
    # cameras: one camera vs two on the node it started anyway (no process of its own)
    assert statuses["cameras"] == "ran", data["modes"]["cameras"]
    for mode in ("engine", "node"):
        asked = {s["cameras"]: s for s in measured if s["phase"] == "cameras"
                 and s["mode"] == mode}
        assert asked.keys() == {1, 2}, mode
        assert asked[2]["prompt_tokens"] > asked[1]["prompt_tokens"], mode
        assert (asked[1]["images"], asked[2]["images"]) == (1, 2), mode
    # planning: behaviour ticks and MCP tool calls (reason_mcp over stdio) on the same node
    assert data["extra"]["planning"]["behaviour"]["runs"] >= 1
    assert data["extra"]["planning"]["mcp_overhead"][0]["pairs"] >= 1
    report = (out / "results.md").read_text()
    assert "## Latency" in report and "## Targets" in report and "## Second camera" in report
    assert "## Node over the transport floor" in report
    assert "goal came after the newest frame" in report
    assert (out / "latency.png").stat().st_size > 0
