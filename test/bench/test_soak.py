"""The soak tool's threshold logic (the 60-second run itself is a drill: test/drills/)."""

from __future__ import annotations

import pytest

from cosmos_reason_ros.bench import soak


def samples(rss: list[float], fds: int = 40, threads: int = 30,
            stored: list[int] | None = None) -> list[dict]:
    return [{"t": float(i), "rss_mb": r, "fds": fds, "threads": threads,
             **({"node_frames_stored": stored[i]} if stored else {})}
            for i, r in enumerate(rss)]


def counts(sent=10, results=10, ok=10, periodic=5, counted=5) -> dict[str, int]:
    return {"goals_sent": sent, "goal_results": results, "goals_ok": ok,
            "periodic_results": periodic, "periodic_counted": counted}


ARGS = soak.parse_args(["--warmup-s", "5", "--window-s", "5", "--max-rss-growth-mb", "50"])


def test_thresholds_pass_on_a_flat_run():
    verdict = soak.evaluate(samples([500.0] * 60), counts(), ARGS)
    assert verdict["passed"], verdict["failures"]
    assert verdict["growth"]["rss_mb"] == 0


@pytest.mark.parametrize(("run", "failure"), [
    ((samples([500.0] * 30 + [600.0] * 30), counts()), "RSS grew 100.0 MB > 50.0 MB"),
    ((samples([500.0] * 60), counts(results=9)), "1 goals without a result"),
    ((samples([500.0] * 60), counts(counted=7)), "2 periodic runs not published"),
    ((samples([500.0] * 60), counts(ok=0)), "no goal succeeded"),
    ((samples([500.0] * 60), {**counts(results=9), "goals_not_sent": 1}),
     "1 goals not sent (the client found no action server)"),
])
def test_thresholds_fail_on_loss_or_growth(run, failure):
    verdict = soak.evaluate(*run, ARGS)
    assert not verdict["passed"] and failure in verdict["failures"]


def test_growth_is_the_last_tenth_against_the_second_by_default():
    # Growth = median(last 10 %) - median(10-20 %); warm-up reported apart.
    rss = [400.0] * 10 + [500.0] * 80 + [510.0] * 10  # 100 samples, 0..99 s
    verdict = soak.evaluate(samples(rss), counts(), soak.parse_args([]))
    assert verdict["windows"]["baseline"] == pytest.approx((9.9, 19.8))
    assert verdict["windows"]["final"] == pytest.approx((89.1, 99.0))
    assert verdict["growth"]["rss_mb"] == pytest.approx(10.0)
    assert verdict["warmup"]["rss_mb"] == pytest.approx(100.0)
    span_h = (89.1 + 99.0 - 9.9 - 19.8) / 2 / 3600  # between the window midpoints
    assert verdict["rss_growth_mb_per_hour"] == pytest.approx(10.0 / span_h)


def test_warm_up_lasts_until_the_frame_history_is_full():
    # A starved node fills its 64-frame history (~59 MB at 640x480) late: that fill is
    # warm-up, not growth, however long it takes.
    rss = [500.0 + min(i, 32) for i in range(60)]  # grows while the history fills
    stored = [min(64, 2 * i) for i in range(60)]  # full at t = 32 s
    verdict = soak.evaluate(samples(rss, stored=stored), counts(), ARGS)
    assert verdict["windows"]["baseline"][0] == 32.0
    assert verdict["growth"]["rss_mb"] == 0 and verdict["warmup"]["rss_mb"] == 32
    # Without the history's count the fill would count as growth after a 5 s warm-up.
    flat_args = soak.parse_args(["--warmup-s", "5", "--window-s", "5",
                                 "--max-rss-growth-mb", "2"])
    assert not soak.evaluate(samples(rss), counts(), flat_args)["passed"]


def test_an_unsettled_final_periodic_count_fails():
    verdict = soak.evaluate(samples([500.0] * 60), {**counts(), "periodic_count_exact": False},
                            ARGS)
    assert not verdict["passed"] and "did not settle" in verdict["failures"][0]
