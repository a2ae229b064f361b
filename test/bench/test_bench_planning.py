"""The bench's planning mode against the in-process node on the scripted engine.

The phase runs as ``bench --modes planning --planning-mcp inprocess`` runs it (the MCP server
in this process: the fast tier starts no process) and reports both figures: a running
behaviour's tick and an MCP tool call's overhead over the action goal it wraps. Outcome only;
what the figures are on a real engine is docs/PERFORMANCE.md's.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
pytest.importorskip("py_trees", reason="needs py-trees (make setup)")
pytest.importorskip("mcp", reason="needs the mcp SDK (make setup)")
from fake_engine import Script  # noqa: E402
from inprocess_node import InProcessNode  # noqa: E402
from waiting import DISCOVERY_S  # noqa: E402

from cosmos_reason_ros.bench import report as benchreport  # noqa: E402
from cosmos_reason_ros.bench import runner  # noqa: E402
from cosmos_reason_ros.bench.phases import PHASES  # noqa: E402
from cosmos_reason_ros.bench.results import Results  # noqa: E402
from cosmos_reason_ros.bench.ros_side import RosSide  # noqa: E402
from cosmos_reason_ros.bench.workload import NODE_TOPIC  # noqa: E402

pytestmark = [pytest.mark.ros]


def generating(_request):
    # Long enough for a behaviour to be ticked while its goal runs.
    return Script(deltas=["word "] * 20, delay_s=0.005)


def test_the_planning_mode_reports_the_tick_and_the_tool_call_overhead(tmp_path: Path) -> None:
    node = InProcessNode(script=generating, image_topic=NODE_TOPIC)
    bench = runner.Bench(runner.parse_args(["--modes", "planning", "--planning-mcp", "inprocess",
                                            "--planning-rounds", "2", "--sizes", "64x48"]))
    try:
        bench.ros = RosSide()
        assert bench.ros.wait_subscribers(NODE_TOPIC, DISCOVERY_S)
        assert bench.ros.client.wait_for_server(DISCOVERY_S)
        bench.available["node"] = ""
        bench.budget.plan(["planning"])
        results = Results(tmp_path, {"device": "cpu"})
        PHASES["planning"](bench, results)
    finally:
        if bench.ros is not None:
            bench.ros.close()
        bench.gc_pauses.uninstall()
        node.close()
    data = results.data
    assert data["modes"]["planning"]["status"] == "ran", data["modes"]
    failed = [s for s in data["samples"] if not s.get("ok")]
    assert not failed, failed
    planning = data["extra"]["planning"]
    assert math.isfinite(planning["behaviour"]["tick_p50_us"])
    assert planning["behaviour"]["ticks"] > 0
    [tool] = planning["mcp_overhead"]
    assert tool["tool"] == "ask" and tool["pairs"] == 2
    assert math.isfinite(tool["overhead_p50_ms"])
    report = benchreport.render_report(data)
    assert "## Planners" in report and "running behaviour's tick (median)" in report
