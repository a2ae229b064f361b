"""scripts/stall_meter.py's summary: what .ci/run prints of the machine's freezes."""

from __future__ import annotations

from repo_scripts import load_script

stall_meter = load_script("stall_meter")


def test_the_summary_lists_the_longest_freezes_first(tmp_path):
    log = tmp_path / "stalls.log"
    log.write_text("14:47:42 start cpus=2\n"
                   "14:49:39 cpu=0 late_s=1.80\n"
                   "14:50:49 cpu=0 late_s=48.87\n"
                   "14:50:03 cpu=1 late_s=21.69\n")
    assert stall_meter.summary(str(log)) == (
        "stall meter: 3 wakes more than 1 s late, 2 of them 10 s or more; the longest: "
        "48.9 s at 14:50:49 (cpu=0), 21.7 s at 14:50:03 (cpu=1), 1.8 s at 14:49:39 (cpu=0)")


def test_a_quiet_run_and_a_missing_log_say_so(tmp_path):
    log = tmp_path / "stalls.log"
    log.write_text("14:47:42 start cpus=2\n")
    assert stall_meter.summary(str(log)) == "stall meter: no process was held more than 1 s"
    assert stall_meter.summary(str(tmp_path / "none.log")) == "stall meter: no log"


def test_held_counts_the_freezes_inside_a_span_once_across_cpus(tmp_path):
    log = tmp_path / "stalls.log"
    log.write_text("14:47:42 start cpus=2\n"
                   "14:49:39 cpu=0 late_s=1.80\n"  # written before wakes carried their time
                   "14:50:10 cpu=1 late_s=10.00 at=1010.00\n"  # 1000-1010
                   "14:50:12 cpu=0 late_s=8.00 at=1012.00\n"  # 1004-1012: overlaps cpu 1's
                   "14:50:30 cpu=any late_s=5.00 at=1030.00\n")  # 1025-1030
    held = stall_meter.held_s
    assert held(str(log), 990.0, 1100.0) == 17.0  # 1000-1012 and 1025-1030
    assert held(str(log), 1008.0, 1027.0) == 6.0  # 1008-1012 and 1025-1027
    assert held(str(log), 1013.0, 1024.0) == 0.0
    assert held(str(tmp_path / "none.log"), 0.0, 2000.0) == 0.0
