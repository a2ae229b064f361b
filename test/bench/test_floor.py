"""The bench's floor mode: a bare rclpy action beside the node and the engine, in one rotation.

The statistics (pure) and the latency phase run with ``--modes floor`` against the in-process
node and engine on the scripted engine, the floor's server in this process (the fast tier
starts no process; ``bench`` starts it as the node is started). Outcomes only: the figures
themselves are docs/PERFORMANCE.md's.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from waiting import DISCOVERY_S

from cosmos_reason_ros.bench import report as benchreport
from cosmos_reason_ros.bench import runner

# Per round at 640x480, end to end in ms: the floor, the engine, and what the node adds above
# both (node = engine + floor + that). The last round's floor request fails: no pair there.
FLOOR_640 = (6.0, 6.2, 6.1, 9.0, 6.0, 6.3, 7.0)
ENGINE_640 = (40.0, 41.0, 42.0, 50.0, 50.0, 51.0, 60.0)
ABOVE_640 = (0.5, 0.5, 9.5, 0.5, 0.5, 9.5, 0.5)


def _sample(mode: str, size: str, r: int, e2e_ms: float, **fields: object) -> dict:
    return {"phase": "latency", "mode": mode, "size": size, "length": "short", "round": r,
            "warmup": r < 0, "ok": True, "e2e_s": e2e_ms / 1e3,
            "output_tokens": None if mode == "floor" else 8, **fields}


def _samples(above_640: tuple[float, ...] = ABOVE_640) -> list[dict]:
    samples = [_sample(m, "640x480", -1, 50.0) for m in ("floor", "node", "engine")]
    for r, (floor, engine, above) in enumerate(zip(FLOOR_640, ENGINE_640, above_640,
                                                   strict=True)):
        samples += [_sample("floor", "640x480", r, floor),
                    _sample("node", "640x480", r, engine + floor + above),
                    _sample("engine", "640x480", r, engine)]
    samples[-3] = {**samples[-3], "ok": False, "error": "goal status 6"}
    # Another size without the engine: the floor alone.
    for r in range(3):
        samples += [_sample("floor", "1280x720", r, 5.0),
                    _sample("node", "1280x720", r, 100.0)]
    # Long answers are not compared with the floor.
    samples.append({**_sample("node", "640x480", 0, 1000.0), "length": "128"})
    return samples


def test_what_the_node_adds_above_engine_and_floor_is_paired_per_round() -> None:
    rows = {r["size"]: r for r in benchreport.floor_overhead(_samples())}
    assert list(rows) == ["640x480", "1280x720"]
    at640 = rows["640x480"]
    assert at640["floor_n"] == 6 and at640["floor_p50_ms"] == pytest.approx(6.15)
    # Node - engine over all seven rounds: the floor plus what the node adds.
    assert at640["engine_pairs"] == 7
    assert at640["node_minus_engine_p50_ms"] == pytest.approx(7.5)
    assert at640["node_minus_engine_interval_ms"] == [pytest.approx(6.5), pytest.approx(15.8)]
    # Node - engine - floor over the six rounds with all three: 0.5 x 4 and 9.5 x 2.
    assert at640["pairs"] == 6
    assert at640["above_floor_p50_ms"] == pytest.approx(0.5)
    assert at640["above_floor_interval_ms"] == [pytest.approx(0.5), pytest.approx(9.5)]
    assert at640["verdict"].startswith("undecided (95 % interval 0.5 to 9.5 ms, 6 pairs")
    at720 = rows["1280x720"]
    assert at720["floor_n"] == 3 and at720["floor_p50_ms"] == pytest.approx(5.0)
    assert at720["engine_pairs"] == at720["pairs"] == 0
    assert math.isnan(at720["above_floor_p50_ms"])
    assert at720["verdict"] == "undecided: 0 pairs, a 95 % interval needs 6"


def test_the_report_has_the_floor_rows_and_decides_the_target_by_the_interval() -> None:
    data = {"meta": {"device": "gpu"}, "samples": _samples((0.4,) * 7), "batches": [],
            "extra": {"floor": {"result_bytes": 412}}}
    report = benchreport.render_report(data)
    assert "## Node over the transport floor" in report and "(412 bytes)" in report
    assert "| 640x480 | 6 | 6.15 |" in report
    assert "| 6 | 0.40 | 0.40 to 0.40 | 0.40 |" in report
    assert "| node - engine - floor at 640x480, short answers | 0.40 ms (target <= 1 ms) | " \
           "met (95 % interval 0.4 to 0.4 ms, 6 pairs) |" in report
    assert "| node - engine - floor at 1280x720, short answers | – ms (target <= 1 ms) | " \
           "undecided: 0 pairs" in report
    data["samples"] = [s for s in data["samples"] if s["mode"] != "floor"]
    assert "transport floor" not in benchreport.render_report(data)


@pytest.mark.parametrize(("modes", "started", "latency"), [
    ("floor", {"engine", "node"}, ["engine", "node", "floor"]),
    ("node,floor", {"node"}, ["node", "floor"]),  # node - floor alone
    ("engine,floor", {"engine", "node"}, ["engine", "node", "floor"]),  # floor needs the node
    ("engine,node", {"engine", "node"}, ["engine", "node"]),
])
def test_the_floor_is_measured_beside_the_node_and_the_engine(modes: str, started: set[str],
                                                              latency: list[str]) -> None:
    bench = runner.Bench(runner.parse_args(["--modes", modes]))
    try:
        assert {p for p in ("engine", "node", "baseline") if bench.needs(p)} == started
        assert bench.needs("floor") == ("floor" in modes)
        assert bench.latency_modes() == latency
    finally:
        bench.gc_pauses.uninstall()


@pytest.mark.ros
def test_the_floor_mode_runs_in_the_latency_rotation_on_short_answers(tmp_path: Path) -> None:
    pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
    from fake_engine import FakeEngine, Script
    from inprocess_node import InProcessNode
    from rclpy.serialization import deserialize_message

    from cosmos_reason_interfaces.msg import ReasoningResult
    from cosmos_reason_ros.bench.engine_side import EngineBench
    from cosmos_reason_ros.bench.floor import FloorClient, FloorServer
    from cosmos_reason_ros.bench.phases import PHASES
    from cosmos_reason_ros.bench.results import Results
    from cosmos_reason_ros.bench.ros_side import RosSide
    from cosmos_reason_ros.bench.workload import NODE_TOPIC

    def short_answer(_request: object) -> Script:
        return Script(deltas=["word "] * 8)

    rounds = 6  # a 95 % interval needs 6 pairs
    node = InProcessNode(script=short_answer, image_topic=NODE_TOPIC)
    bench = runner.Bench(runner.parse_args(["--modes", "floor", "--repeats", str(rounds),
                                            "--sizes", "64x48,96x72",
                                            "--lengths", "short,128"]))
    server = None
    try:
        bench.engine = EngineBench("nvidia/Cosmos-Reason2-2B", {}, {},
                                   engine=FakeEngine(short_answer))
        bench.engine.start(timeout_s=30)
        bench.ros = RosSide()
        assert bench.ros.wait_subscribers(NODE_TOPIC, DISCOVERY_S)
        assert bench.ros.client.wait_for_server(DISCOVERY_S)
        bench.available.update(engine="", node="")
        # What bench's start does, the server in this process instead of its own.
        result = deserialize_message(bench.floor_result(), ReasoningResult)
        assert result.answer and result.output_tokens == 8  # a node's short answer
        server = FloorServer(result, threads=4).serve_in_thread()
        bench.floor = FloorClient()
        assert bench.floor.wait_for_server(DISCOVERY_S)
        bench.available["floor"] = ""
        bench.budget.plan(["latency"])
        results = Results(tmp_path, {"device": "cpu", "argv": ["--modes", "floor"]})
        PHASES["latency"](bench, results)
    finally:
        bench.close()
        if server is not None:
            server.close()
        bench.gc_pauses.uninstall()
        node.close()
    data = results.data
    assert {m: data["modes"][m]["status"] for m in ("engine", "node", "floor")} \
        == {"engine": "ran", "node": "ran", "floor": "ran"}, data["modes"]
    failed = [s for s in data["samples"] if not s.get("ok")]
    assert not failed, failed
    measured = [s for s in data["samples"] if not s["warmup"]]
    floor = [s for s in measured if s["mode"] == "floor"]
    # One floor goal per round and size, on short answers only; the other modes at both lengths.
    assert sorted((s["size"], s["round"]) for s in floor) \
        == sorted((size, r) for size in ("64x48", "96x72") for r in range(rounds))
    assert {s["length"] for s in floor} == {"short"}
    assert {s["length"] for s in measured if s["mode"] == "node"} == {"short", "128"}
    rows = {r["size"]: r for r in benchreport.floor_overhead(data["samples"])}
    assert list(rows) == ["64x48", "96x72"]
    for row in rows.values():
        assert row["floor_n"] == row["engine_pairs"] == row["pairs"] == rounds
        assert all(math.isfinite(v) for v in (*row["above_floor_interval_ms"],
                                              *row["node_minus_engine_interval_ms"]))
        low, high = row["above_floor_interval_ms"]
        assert low <= row["above_floor_p50_ms"] <= high
    report = benchreport.render_report(data)
    assert "## Node over the transport floor" in report
    assert "| 64x48 | short | floor | 6 |" in report  # the floor's own latency row
    for size in ("64x48", "96x72"):
        assert f"node - engine - floor at {size}, short answers" in report
