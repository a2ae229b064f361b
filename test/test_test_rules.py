"""The tests' own rules, enforced in CI: no sleeps as synchronisation, no duration bounds
outside the drills (scripts/check_test_timing.py, also run by ``make lint``), and the drills'
report (test/drill_report.py)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from drill_report import Figure, Report
from repo_scripts import REPO, load_script

check_test_timing = load_script("check_test_timing")


def flagged(source: str) -> list[str]:
    findings = check_test_timing.check_source(Path("test_x.py"), textwrap.dedent(source))
    return [f.message.split("'")[0].strip() for f in findings]


def test_the_suite_keeps_its_timing_rules():
    findings = check_test_timing.check(REPO, check_test_timing.PENDING)
    assert not findings, "\n".join(str(f) for f in findings)


def test_a_pending_count_is_exact(tmp_path):
    (tmp_path / "test" / "ros").mkdir(parents=True)
    (tmp_path / "test" / "ros" / "test_t.py").write_text(
        "import time\n\ndef test_t():\n    time.sleep(1)\n    time.sleep(2)\n")
    module = "test/ros/test_t.py"
    assert check_test_timing.check(tmp_path, {module: 2}) == []
    assert len(check_test_timing.check(tmp_path, {module: 1})) == 2  # a relapse: all shown
    fell = check_test_timing.check(tmp_path, {module: 3})
    assert "lower its count" in fell[-1].message


def test_drills_and_bench_may_measure_time(tmp_path):
    for folder in ("drills", "bench", "ros"):
        (tmp_path / "test" / folder).mkdir(parents=True)
        (tmp_path / "test" / folder / "test_t.py").write_text(
            "import time\n\ndef test_t():\n    time.sleep(1)\n")
    assert [str(f.path) for f in check_test_timing.check(tmp_path)] == ["test/ros/test_t.py"]


@pytest.mark.parametrize("line", [
    "time.sleep(0.5)",
    "await asyncio.sleep(0.05)",
    "sleep(1)",
    "time.sleep(0.5)  # let the frame arrive",
])
def test_a_sleep_without_a_pacing_reason_is_flagged(line):
    assert flagged(f"async def test_t():\n    {line}\n") == ["sleep without"]


@pytest.mark.parametrize("line", [
    "time.sleep(1 / 30)  # paces: the simulated camera's 30 Hz",
    "await asyncio.sleep(0)",  # yields to the loop once, waits for no time
    "stop.wait(0.1)",
])
def test_a_pacing_sleep_or_a_yield_is_allowed(line):
    assert flagged(f"async def test_t():\n    {line}\n") == []


@pytest.mark.parametrize("line", [
    "assert done.wait(10.0), 'no result'",
    "result = handle.result(60)",
    "wait_until(lambda: seen, 30.0, 'a result')",
    "await asyncio.wait_for(task, 30)",
    "thread.join(timeout=5)",
    "proc.communicate(timeout=30)",
    "result = client.run(goal, 120)",
    "subprocess.run(['true'], timeout=60)",
    "node.wait_ready(timeout_s=120)",  # the tests' helpers name their bound timeout_s
])
def test_an_outcome_wait_with_a_short_literal_bound_is_flagged(line):
    [message] = flagged(f"def test_t():\n    {line}\n")
    assert message.startswith("wait bounded by")


@pytest.mark.parametrize("line", [
    "assert done.wait(NEVER_S)",
    "assert not stopped.wait(5.0)",  # waits for something not to happen
    "stop.wait(0.5)",  # under a second: meant to run out
    "result = handle.result(600)",
    "threading.Event().wait(3.0)  # bound: the hold itself",
    "subprocess.run(['sleep', '1'])",
    "goal = client.goal('q', timeout_s=30.0)",  # a goal's time limit: a value under test
])
def test_other_waits_are_not(line):
    assert flagged(f"def test_t():\n    {line}\n") == []


@pytest.mark.parametrize("assertion", [
    "assert took < 2.0",
    "assert took_s <= 5",
    "assert max(late) < 1.0",
    "assert time.monotonic() - t0 < 10",
    "assert 1.0 <= elapsed < 5.0",
    "assert 2.0 > result.total_s",
    "assert statistics.median(latency) < BOUND_S",
    "assert time.monotonic() - t_cancel < max(10.0, 0.5 * remaining)",
])
def test_a_duration_below_a_number_is_flagged(assertion):
    assert flagged(f"BOUND_S = 1.5\n\ndef test_t():\n    {assertion}\n") == ["duration bound"]


@pytest.mark.parametrize("assertion", [
    "assert took > 0",  # a lower bound proves it waited, not that it was fast
    "assert elapsed < deadline",  # against another measurement, not a number
    "assert count < 5",
    "assert status.level <= 1",
    "assert time.monotonic() < deadline, 'never happened'",  # a wait's bound for "never"
])
def test_other_comparisons_are_not(assertion):
    assert flagged(f"def test_t():\n    {assertion}\n") == []


def test_the_report_shows_met_missed_and_exceeded(tmp_path):
    report = Report()
    report.add(Figure("test_a", "cancel", 1.2, "s", 2.0, 20.0))
    report.add(Figure("test_a", "idle", 3.5, "s", 2.0, 20.0))
    report.add(Figure("test_b", "late", 30.0, "s", 2.0, 20.0))
    # 82 s, of which the machine held a process 77 s: the mechanism took 5 s
    report.add(Figure("test_c", "frozen", 82.0, "s", 2.0, 30.0, machine_held_s=77.0))
    report.write(tmp_path)
    data = json.loads((tmp_path / "report.json").read_text())
    assert [(f["name"], f["met"], f["within_bound"]) for f in data["figures"]] == [
        ("cancel", True, True), ("idle", False, True), ("late", False, False),
        ("frozen", False, True)]
    table = (tmp_path / "report.md").read_text()
    assert "| test_a | cancel | 1.20 s | 2 s | met |  | 20 s | ok |" in table
    assert "| test_a | idle | 3.50 s | 2 s | missed |  | 20 s | ok |" in table
    assert "| test_b | late | 30.00 s | 2 s | missed |  | 20 s | EXCEEDED |" in table
    assert "| test_c | frozen | 82.00 s | 2 s | missed | 77.0 s | 30 s | ok |" in table


def test_a_target_above_its_hard_bound_is_refused():
    with pytest.raises(ValueError, match="above its hard bound"):
        Report().add(Figure("test_a", "cancel", 1.0, "s", 5.0, 2.0))


@pytest.mark.parametrize("source", [
    "import vllm\n",
    "from transformers import AutoTokenizer\n",
    "import pytest\ntorch = pytest.importorskip('torch')\n",
    "try:\n    import vllm.sampling_params\nexcept ImportError:\n    pass\n",
])
def test_a_heavy_import_at_module_level_is_flagged(source):
    found = check_test_timing.heavy_imports(Path("test/drills/test_x.py"), source)
    assert [f.line for f in found] and "imported at module level" in found[0].message


def test_a_heavy_import_inside_a_test_is_not_flagged():
    source = "def test_t():\n    from transformers import AutoTokenizer\n    import vllm\n"
    assert check_test_timing.heavy_imports(Path("test/test_x.py"), source) == []
