"""Unit tests of the bench statistics and report (pure: no rclpy, no vLLM)."""

from __future__ import annotations

import math

import pytest

from cosmos_reason_ros.bench import report as benchreport
from cosmos_reason_ros.bench import stats as bs


def test_group_leaves_out_failed_and_warmup_samples() -> None:
    samples = [
        {"mode": "node", "ok": True, "e2e_s": 1.0},
        {"mode": "node", "ok": False, "e2e_s": 9.0},
        {"mode": "node", "ok": True, "warmup": True, "e2e_s": 9.0},
        {"mode": "engine", "ok": True, "e2e_s": 0.5},
    ]
    summary = bs.summarize(samples, ("mode",), "e2e_s")
    assert summary[("node",)] == bs.Summary(1, 1.0, 1.0)
    assert summary[("engine",)].median == 0.5


def test_paired_overhead_pairs_rounds_and_ignores_unpaired() -> None:
    samples = []
    for r, (engine, node) in enumerate([(0.100, 0.104), (0.200, 0.206), (0.150, 0.152)]):
        samples.append({"mode": "engine", "ok": True, "size": "s", "length": "l", "round": r,
                        "e2e_s": engine})
        samples.append({"mode": "node", "ok": True, "size": "s", "length": "l", "round": r,
                        "e2e_s": node})
    # A node sample without an engine partner in its round must not enter the deltas.
    samples.append({"mode": "node", "ok": True, "size": "s", "length": "l", "round": 9,
                    "e2e_s": 5.0})
    over, deltas = bs.paired_overhead(samples, "node", "engine", "e2e_s")[("s", "l")]
    assert deltas.n == 3
    assert deltas.median == pytest.approx(4.0)  # ms: deltas 4, 6, 2
    assert over.reference_ms == pytest.approx(150.0)
    assert over.ms == pytest.approx(over.mode_ms - 150.0)


def test_paired_overhead_skips_pairs_with_different_output_lengths() -> None:
    samples = [{"mode": "engine", "ok": True, "size": "s", "length": "l", "round": r,
                "e2e_s": 1.0, "output_tokens": 512} for r in range(2)]
    samples += [{"mode": "node", "ok": True, "size": "s", "length": "l", "round": 0,
                 "e2e_s": 1.01, "output_tokens": 512},
                {"mode": "node", "ok": True, "size": "s", "length": "l", "round": 1,
                 "e2e_s": 0.3, "output_tokens": 97}]  # stopped at EOS: not comparable
    over, deltas = bs.paired_overhead(samples, "node", "engine", "e2e_s")[("s", "l")]
    assert deltas.n == 1 and deltas.median == pytest.approx(10.0)
    assert bs.paired_overhead(samples, "node", "engine", "e2e_s", same=None)[("s", "l")][1].n \
        == 2


def test_throughput_and_scaling_use_batch_medians() -> None:
    batches = [
        {"mode": "node", "concurrency": 1, "ok": True, "wall_s": 1.0, "output_tokens": 100},
        {"mode": "node", "concurrency": 1, "ok": True, "wall_s": 2.0, "output_tokens": 100},
        {"mode": "node", "concurrency": 8, "ok": True, "wall_s": 2.0, "output_tokens": 800},
        {"mode": "node", "concurrency": 8, "ok": True, "warmup": True, "wall_s": 9.0,
         "output_tokens": 1},
        {"mode": "node", "concurrency": 8, "ok": False, "wall_s": 9.0, "output_tokens": 1},
    ]
    tput = bs.throughput(batches)
    assert tput[("node", 1)].median == pytest.approx(75.0)
    assert tput[("node", 8)] == bs.Summary(1, 400.0, 400.0)
    assert bs.scaling(tput, "node") == {1: 1.0, 8: pytest.approx(400 / 75)}
    assert bs.scaling(tput, "engine") == {}
    # Batches of another phase (prefill on/off) stay out of the concurrency figures.
    prefill = [{"phase": "prefill", "mode": "node", "concurrency": 8, "prefill": on, "ok": True,
                "wall_s": 1.0, "output_tokens": tokens} for on, tokens in ((True, 900),
                                                                          (False, 1000))]
    assert bs.throughput(batches + prefill) == tput
    assert bs.throughput(batches + prefill, ("prefill",), phase="prefill") == {
        (True,): bs.Summary(1, 900.0, 900.0), (False,): bs.Summary(1, 1000.0, 1000.0)}


def test_growth_compares_tail_with_the_level_after_warm_up() -> None:
    flat = [(float(i), 100.0 + (50.0 if i < 5 else 0.0)) for i in range(100)]
    assert bs.growth(flat) == pytest.approx(0.0)  # warm-up spike ignored
    leak = [(float(i), 100.0 + i * 0.5) for i in range(100)]
    assert bs.growth(leak) == pytest.approx(40.0)  # medians of points 10-19 and 90-99
    assert math.isnan(bs.growth([(0.0, 1.0)]))


def test_plan_slices_and_rounds_that_fit() -> None:
    slices = bs.plan_slices(100.0, [bs.Slice("a", 3), bs.Slice("b", 1)])
    assert slices == {"a": 75.0, "b": 25.0}
    assert bs.plan_slices(-5.0, [bs.Slice("a", 1)]) == {"a": 0.0}
    assert bs.rounds_that_fit(75.0, 10.0, wanted=20) == 7
    assert bs.rounds_that_fit(5.0, 10.0, wanted=20) == 1  # always at least one
    assert bs.rounds_that_fit(500.0, 10.0, wanted=4) == 4
    assert bs.rounds_that_fit(10.0, math.nan, wanted=4) == 4


def test_table_aligns_numbers_right_and_text_left() -> None:
    text = benchreport.table(("name", "ms"), [("node", "1.5"), ("engine", "–")])
    lines = text.splitlines()
    assert lines[1] == "|---|---:|"
    assert lines[2] == "| node | 1.5 |"


def _report_data(node_delta_s: float, rounds: int = 8) -> dict:
    samples = []
    for r in range(rounds):
        for mode, e2e in (("engine", 0.100), ("node", 0.100 + node_delta_s),
                          ("baseline", 0.400)):
            samples.append({"phase": "latency", "mode": mode, "size": "1280x720",
                            "length": "short", "round": r, "ok": True, "e2e_s": e2e,
                            "ttft_s": e2e / 2, "output_tokens": 8})
    return {"meta": {"device": "cpu", "argv": ["--modes", "engine,node,baseline"]},
            "samples": samples, "batches": [], "series": {},
            "modes": {"engine": {"status": "ran"}, "prefill": {"status": "skipped",
                                                              "reason": "no parameter"}},
            "extra": {"ingest_callback": {"median_ms": 0.08, "p95_ms": 0.2}}}


def test_report_states_ratios_and_target_results() -> None:
    report = benchreport.render_report(_report_data(0.002))
    assert "| 1280x720 | short | 8 | 100.0 | 102.0 | 2.0 | 2.0 to 2.0 |" in report
    assert "3.92x" in report  # baseline 400 ms / node 102 ms
    assert "node overhead p50 at 1280x720, short answers | 2.0 ms (target <= 5 ms) | met " \
        "(95 % interval 2.0 to 2.0 ms, 8 pairs)" in report
    assert "| prefill | skipped |" in report and "no parameter" in report
    assert "camera callback per 1080p frame (median) | 0.080 ms" in report


def test_report_flags_a_missed_target() -> None:
    report = benchreport.render_report(_report_data(0.020))
    assert "20.0 ms (target <= 5 ms) | MISSED (95 % interval" in report


def test_report_says_when_too_few_pairs_decide_nothing() -> None:
    report = benchreport.render_report(_report_data(0.002, rounds=3))
    assert "2.0 ms (target <= 5 ms) | undecided: 3 pairs, a 95 % interval needs 6" in report


def test_median_interval_is_the_order_statistics_of_the_binomial_bound() -> None:
    assert all(math.isnan(v) for v in bs.median_interval([1.0, 2.0, 3.0, 4.0, 5.0]))
    assert bs.median_interval([6.0, 1.0, 5.0, 2.0, 4.0, 3.0]) == (1.0, 6.0)  # 96.9 %
    # n = 20: P(Binomial(20, 1/2) <= 5) = 2.1 % <= 2.5 % < P(<= 6) = 5.8 %: x(6) to x(15)
    assert bs.median_interval(range(1, 21)) == (6.0, 15.0)
    assert bs.median_interval(range(1, 101)) == (40.0, 61.0)  # the textbook n = 100 interval
    assert bs.median_interval([*range(1, 21), None, math.nan]) == (6.0, 15.0)  # skipped


def test_decide_judges_the_interval_against_the_limit() -> None:
    deltas = [float(v) for v in range(1, 21)]  # median 10.5, interval 6 to 15
    assert bs.decide(deltas, 15.0) == bs.Decision("met", 6.0, 15.0, 20, None)
    assert bs.decide(deltas, 5.9) == bs.Decision("MISSED", 6.0, 15.0, 20, None)
    # Half-width 4.5, 1.5 from the limit: about 20 * (4.5 / 1.5)^2 = 180 pairs decide.
    assert bs.decide(deltas, 12.0) == bs.Decision("undecided", 6.0, 15.0, 20, 180)
    assert bs.decide(deltas, 10.5).pairs_needed is None  # the median is the limit
    assert bs.decide([1.0, 2.0], 3.0).pairs_needed == 6
    assert bs.decide(deltas, 12.0).text() == \
        "undecided (95 % interval 6.0 to 15.0 ms, 20 pairs; about 180 pairs decide)"


def test_report_checks_prefill_targets_on_the_gpu() -> None:
    samples = [{"phase": "prefill", "mode": "node", "prefill": on, "setting": setting,
                "ok": True, "ttft_s": t, "node_ttft_s": t - 0.005, "cached_prompt_tokens": c}
               for on, setting, t, c in ((True, "on", 0.040, 304), (False, "off", 0.080, 0),
                                         (True, "on+ready", 0.030, 304))]
    samples.append({"phase": "prefill", "mode": "node", "prefill": True, "ok": True,
                    "ttft_s": 0.050})  # an older run's sample: no setting, prefill on
    samples += [{"phase": "prefill", "mode": "baseline", "setting": "baseline", "ok": True,
                 "ttft_s": t} for t in (0.080, 0.100)]  # P2: the baseline in the rotation
    batches = [{"phase": "prefill", "mode": "node", "prefill": on, "setting": setting,
                "concurrency": 8, "ok": True, "wall_s": 1.0, "output_tokens": tokens}
               for on, setting, tokens in ((True, "on", 850), (False, "off", 1000),
                                           (True, "on+ready", 950))]
    report = benchreport.render_report({"meta": {"device": "gpu"}, "samples": samples,
                               "batches": batches, "extra": {}})
    assert "| on+ready | 1 | 30.0 | 30.0 | 25.0 | 304 | 1 | 950.0 |" in report
    assert "| on | 2 | 45.0 |" in report
    assert "prefill on+ready / off | 0.38x (target <= 0.4x) | met" in report
    assert "prefill on / off | 0.56x (target <= 0.4x) | MISSED" in report
    assert "8-goal throughput, prefill on / off | 0.85x (target >= 0.9x) | MISSED" in report
    assert "8-goal throughput, prefill on+ready / off | 0.95x (target >= 0.9x) | met" in report
    assert "## Concurrency" not in report  # prefill batches are not the concurrency sweep
    assert "| baseline | 2 | 90.0 | 100.0 | – |" in report
    assert "prefill baseline" not in report  # not a prefill setting
    assert "P2: baseline TTFT / node's (prefill on+ready), latest frame of a 5 Hz camera | " \
           "3.00x (target >= 3x) | met" in report


def test_report_splits_prefill_goals_by_camera_phase_and_checks_the_ttft_spread() -> None:
    # 16 goals well after a frame (its prefill done) at 25 ms, 4 just after one at 70 ms:
    # the table shows that the slow goals are those that came while the prefill ran.
    def goal(phase_s: float, ttft_s: float, newest: bool) -> dict:
        return {"phase": "prefill", "mode": "node", "prefill": True, "setting": "on+ready",
                "ok": True, "ttft_s": ttft_s + 0.005, "node_ttft_s": ttft_s,
                "camera_phase_s": phase_s, "on_newest_frame": newest}

    samples = [goal(0.06 + 0.008 * i, 0.025, True) for i in range(16)]
    samples += [goal(0.01 * i, 0.070, False) for i in range(1, 5)]
    samples.append({**goal(0.01, 0.5, False), "warmup": True})  # left out
    report = benchreport.render_report({"meta": {"device": "gpu"}, "samples": samples, "extra": {}})
    assert "| on+ready | 0-50 ms | 4 | 0 | 70.0 | 70.0 |" in report
    assert "| on+ready | 50-100 ms | 5 | 5 | 25.0 | 25.0 |" in report
    assert "| on+ready | 100-150 ms | 7 | 7 | 25.0 | 25.0 |" in report
    assert "| on+ready | 150-200 ms | 4 | 4 | 25.0 | 25.0 |" in report
    assert "node TTFT p95 / p50, prefill on+ready, camera streaming (20 goals) | 2.80x " \
           "(target <= 1.5x) | MISSED" in report
    fast = [s for s in samples if s["node_ttft_s"] == 0.025] * 2
    assert "(32 goals) | 1.00x (target <= 1.5x) | met" in benchreport.render_report(
        {"meta": {"device": "gpu"}, "samples": fast, "extra": {}})


def test_lifting_phase_lifts_every_box_and_the_report_checks_the_target() -> None:
    from cosmos_reason_ros.bench.phases import lifting

    rows = [lifting.measure_goal(640, 480, large=False, runs=3),
            lifting.measure_goal(1280, 720, large=True, runs=3)]
    assert [r["valid"] for r in rows] == [10, 10]
    assert all(0 < r["wall_p50_ms"] <= r["wall_p95_ms"] for r in rows)
    data = _report_data(0.002)
    data["extra"]["lifting"] = {"items": 10, "depth_off_ms": 0.0, "rows": rows,
                                "target_p50_ms": 1e9}
    report = benchreport.render_report(data)
    assert "## 3D lifting per goal" in report and "| 1280x720 | large | 3 |" in report
    assert "3D lifting per goal, 640x480, 10 boxes (p50)" in report and "| met |" in report
