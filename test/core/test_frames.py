"""Tests for cosmos_reason_ros.core.frames: bounded history, waiting, clip sampling."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from waiting import NEVER_S

from cosmos_reason_ros.core.frames import FrameHistory, StoredFrame
from cosmos_reason_ros.core.types import ImageTooOldError, NoImageError

NS = 1_000_000_000


class FakeClock:
    """A settable nanosecond clock (stands in for ROS sim time)."""

    def __init__(self, now_ns: int = 0) -> None:
        self.now_ns = now_ns

    def __call__(self) -> int:
        return self.now_ns


def stream(history: FrameHistory, hz: float, seconds: float, start_ns: int = 100 * NS):
    """Append a steady stream of frames; stamp == receipt time; payload = index."""
    frames = []
    for i in range(int(round(hz * seconds))):
        stamp = start_ns + int(round(i * NS / hz))
        frames.append(history.append(i, stamp, nbytes=10, received_ns=stamp))
    return frames


# --- storage and bounds ---------------------------------------------------------------------


def test_empty_history_has_no_latest_and_require_latest_raises() -> None:
    history: FrameHistory[object] = FrameHistory()
    assert history.latest() is None and len(history) == 0
    with pytest.raises(NoImageError, match="no image received"):
        history.require_latest()


def test_append_stores_the_payload_object_itself() -> None:
    clock = FakeClock(5 * NS)
    history: FrameHistory[object] = FrameHistory(clock=clock)
    message = object()
    frame = history.append(message, 4 * NS, nbytes=123)
    assert frame.payload is message
    assert (frame.stamp_ns, frame.received_ns, frame.nbytes, frame.seq) == (4 * NS, 5 * NS, 123, 1)
    assert history.latest() is frame


def test_count_bound_evicts_oldest() -> None:
    history: FrameHistory[int] = FrameHistory(max_frames=4)
    stream(history, hz=10, seconds=1)
    assert [f.payload for f in history.snapshot()] == [6, 7, 8, 9]
    stats = history.stats()
    assert (stats.received, stats.evicted, stats.frames, stats.bytes) == (10, 6, 4, 40)


def test_byte_bound_evicts_oldest_but_keeps_the_newest_frame() -> None:
    history: FrameHistory[str] = FrameHistory(max_frames=100, max_bytes=100)
    for i in range(5):
        history.append(f"f{i}", i * NS, nbytes=30)
    assert [f.payload for f in history.snapshot()] == ["f2", "f3", "f4"]
    history.append("big", 10 * NS, nbytes=500)
    assert [f.payload for f in history.snapshot()] == ["big"]
    assert history.stats().bytes == 500 and history.stats().evicted == 5


def test_require_latest_checks_age_against_the_given_clock() -> None:
    clock = FakeClock(0)
    history: FrameHistory[str] = FrameHistory(clock=clock)
    history.append("a", 10 * NS, nbytes=1)
    assert history.require_latest(max_age_s=1.0, now_ns=int(10.5 * NS)).payload == "a"
    clock.now_ns = 12 * NS
    with pytest.raises(ImageTooOldError, match="2.000 s old.*max_age_s=1.0"):
        history.require_latest(max_age_s=1.0)
    assert history.require_latest(max_age_s=0).payload == "a"  # 0 = any age


def test_invalid_bounds_are_rejected() -> None:
    with pytest.raises(ValueError, match="max_frames=0"):
        FrameHistory(max_frames=0)
    with pytest.raises(ValueError, match="max_bytes=-1"):
        FrameHistory(max_bytes=-1)


# --- stamps going backwards -----------------------------------------------------------------


def test_large_backwards_jump_clears_history() -> None:
    history: FrameHistory[int] = FrameHistory(reset_backwards_s=1.0)
    stream(history, hz=10, seconds=2)  # stamps 100 s .. 101.9 s
    history.append(-1, 5 * NS, nbytes=10)  # bag looped
    assert [f.payload for f in history.snapshot()] == [-1]
    stats = history.stats()
    assert (stats.resets, stats.cleared, stats.frames) == (1, 20, 1)


def test_small_reordering_is_kept_and_time_queries_sort_by_stamp() -> None:
    history: FrameHistory[str] = FrameHistory(reset_backwards_s=1.0)
    history.append("b", 10 * NS, nbytes=1)
    history.append("a", int(9.8 * NS), nbytes=1)
    history.append("c", int(10.2 * NS), nbytes=1)
    assert history.stats().resets == 0
    assert [f.payload for f in history.frames_since(0)] == ["a", "b", "c"]
    assert [f.payload for f in history.clip(1.0, 5)] == ["a", "b", "c"]
    assert history.latest().payload == "c"


def test_clear_keeps_counters() -> None:
    history: FrameHistory[int] = FrameHistory()
    stream(history, hz=10, seconds=0.5)
    history.clear()
    assert len(history) == 0
    assert history.stats().received == 5 and history.stats().cleared == 5
    history.append(1, 0, nbytes=1)  # no reset after clear() even though the stamp went back
    assert history.stats().resets == 0


# --- waiting --------------------------------------------------------------------------------


def test_wait_for_next_returns_a_frame_published_by_another_thread() -> None:
    history: FrameHistory[str] = FrameHistory()
    history.append("old", 1 * NS, nbytes=1, received_ns=1 * NS)
    start = threading.Event()

    def publish() -> None:
        start.wait(NEVER_S)
        history.append("too early", 2 * NS, nbytes=1, received_ns=2 * NS)
        history.append("next", 3 * NS, nbytes=1, received_ns=3 * NS)
        history.append("later", 4 * NS, nbytes=1, received_ns=4 * NS)

    thread = threading.Thread(target=publish)
    thread.start()
    start.set()
    frame = history.wait_for_next(after_ns=2 * NS, timeout_s=5)
    thread.join(NEVER_S)
    assert frame is not None and frame.payload == "next"


def test_wait_for_next_returns_an_existing_frame_at_once() -> None:
    history: FrameHistory[str] = FrameHistory()
    # Stamps on the camera's own clock (far from the receipt times): receipt order decides.
    history.append("a", 1, nbytes=1, received_ns=10 * NS)
    history.append("b", 2, nbytes=1, received_ns=20 * NS)
    assert history.wait_for_next(after_ns=10 * NS, timeout_s=0).payload == "b"


def test_next_frame_is_one_taken_after_the_request_not_only_delivered_after() -> None:
    history: FrameHistory[str] = FrameHistory()
    goal_ns = 100 * NS
    # Taken 10 ms before the goal, delivered 20 ms after it (a busy callback, a replayed bag).
    history.append("before", goal_ns - 10_000_000, nbytes=1, received_ns=goal_ns + 20_000_000)
    history.append("after", goal_ns + 23_000_000, nbytes=1, received_ns=goal_ns + 30_000_000)
    assert history.wait_for_next(after_ns=goal_ns, timeout_s=0).payload == "after"


def test_wait_for_next_times_out_with_none() -> None:
    history: FrameHistory[str] = FrameHistory()
    history.append("a", 1, nbytes=1, received_ns=10)
    assert history.wait_for_next(after_ns=10, timeout_s=0.02) is None
    # after_ns=None: only frames appended after the call count.
    assert history.wait_for_next(timeout_s=0) is None


def test_wait_for_next_without_after_ns_sees_frames_appended_later() -> None:
    history: FrameHistory[int] = FrameHistory()
    history.append(0, 1, nbytes=1)
    result: list[StoredFrame[int] | None] = []
    waiting = threading.Event()

    def wait() -> None:
        waiting.set()
        result.append(history.wait_for_next(timeout_s=5))

    thread = threading.Thread(target=wait)
    thread.start()
    waiting.wait(NEVER_S)
    # The waiter may not have captured its starting point yet: keep publishing until it
    # returns (each append wakes it; no sleeps).
    i = 1
    while thread.is_alive() and i < 100_000:
        history.append(i, 1 + i, nbytes=1)
        thread.join(0.001)
        i += 1
    thread.join(NEVER_S)
    assert result and result[0] is not None and result[0].payload >= 1


def test_wait_for_next_after_a_clock_reset_returns_new_frames() -> None:
    # Sim time restarted: receipt times fall below after_ns, but the reset makes them count.
    history: FrameHistory[int] = FrameHistory(reset_backwards_s=1.0)
    history.append(0, 100 * NS, nbytes=1, received_ns=100 * NS)
    done = threading.Event()
    result: list[StoredFrame[int] | None] = []

    def wait() -> None:
        result.append(history.wait_for_next(after_ns=100 * NS, timeout_s=5))
        done.set()

    thread = threading.Thread(target=wait)
    thread.start()
    i = 0
    while not done.is_set() and i < 100_000:  # alternate timelines: every append resets
        stamp = (100 if i % 2 else 1) * NS
        history.append(i, stamp, nbytes=1, received_ns=stamp if stamp < 100 * NS else 50)
        done.wait(0.001)
        i += 1
    thread.join(NEVER_S)
    assert result and result[0] is not None
    assert history.stats().resets >= 1


def test_close_wakes_waiters() -> None:
    history: FrameHistory[int] = FrameHistory()
    result: list[object] = ["unset"]
    thread = threading.Thread(target=lambda: result.__setitem__(0, history.wait_for_next()))
    thread.start()
    history.close()
    thread.join(NEVER_S)
    assert not thread.is_alive() and result[0] is None


def test_concurrent_appends_keep_counters_consistent() -> None:
    history: FrameHistory[int] = FrameHistory(max_frames=50)

    def publish(offset: int) -> None:
        for i in range(500):
            history.append(i, offset + i, nbytes=2)

    threads = [threading.Thread(target=publish, args=(k * 10_000,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(NEVER_S)
    stats = history.stats()
    assert stats.received == 2000
    assert stats.frames + stats.evicted + stats.cleared == 2000
    assert stats.bytes == 2 * stats.frames
    assert len({f.seq for f in history.snapshot()}) == stats.frames


# --- clips ----------------------------------------------------------------------------------


def test_clip_of_15hz_stream_3s_at_4fps_gives_12_distinct_frames() -> None:
    history: FrameHistory[int] = FrameHistory(max_frames=300)
    frames = stream(history, hz=15, seconds=10)
    clip = history.clip(3.0, 4.0)
    assert len(clip) == 12
    assert len({f.seq for f in clip}) == 12
    stamps = [f.stamp_ns for f in clip]
    assert stamps == sorted(stamps)
    end = frames[-1].stamp_ns
    for k, frame in enumerate(reversed(clip)):
        target = end - k * NS // 4
        nearest = min(frames, key=lambda f: abs(f.stamp_ns - target))
        assert frame is nearest, (k, frame.stamp_ns, nearest.stamp_ns)
    assert clip[-1] is frames[-1]  # the window ends at the newest frame


def test_clip_caps_frames_by_spreading_samples_over_the_duration() -> None:
    history: FrameHistory[int] = FrameHistory(max_frames=300)
    stream(history, hz=15, seconds=10)
    clip = history.clip(3.0, 4.0, max_frames=6)
    assert len(clip) == 6
    gaps = [b.stamp_ns - a.stamp_ns for a, b in zip(clip, clip[1:], strict=False)]
    assert all(abs(g - NS // 2) <= NS // 15 for g in gaps)


def test_clip_with_slow_stream_or_gaps_has_no_duplicates() -> None:
    history: FrameHistory[int] = FrameHistory(max_frames=300)
    stream(history, hz=2, seconds=5)  # slower than the clip fps
    clip = history.clip(3.0, 4.0)
    assert len({f.seq for f in clip}) == len(clip) == 6


def test_clip_window_ends_at_now_when_given() -> None:
    history: FrameHistory[int] = FrameHistory(max_frames=300)
    frames = stream(history, hz=10, seconds=10)  # stamps 100 s .. 109.9 s
    clip = history.clip(1.0, 2.0, now_ns=105 * NS)
    assert [f.stamp_ns for f in clip] == [int(104.5 * NS), 105 * NS]
    assert history.clip(1.0, 2.0, now_ns=200 * NS) == []
    assert FrameHistory().clip(1.0, 4.0) == []
    assert frames[-1] in history.clip(0.1, 30.0)
    with pytest.raises(ValueError, match="fps=0"):
        history.clip(1.0, 0)


def test_frames_since_filters_by_stamp() -> None:
    history: FrameHistory[int] = FrameHistory()
    stream(history, hz=1, seconds=5, start_ns=0)
    assert [f.payload for f in history.frames_since(2 * NS)] == [2, 3, 4]
    assert [f.payload for f in history.frames_since(1 * NS, 3 * NS)] == [1, 2, 3]


@settings(max_examples=60, deadline=None)
@given(
    stamps=st.lists(st.integers(0, 20 * NS), min_size=1, max_size=80),
    duration_s=st.floats(0.1, 10.0),
    fps=st.floats(0.2, 30.0),
    max_frames=st.one_of(st.none(), st.integers(1, 40)),
)
def test_clip_properties(stamps, duration_s, fps, max_frames) -> None:
    history: FrameHistory[int] = FrameHistory(max_frames=100, reset_backwards_s=100.0)
    for i, stamp in enumerate(stamps):
        history.append(i, stamp, nbytes=1)
    clip = history.clip(duration_s, fps, max_frames=max_frames)
    assert clip, "the newest stamp is always sampled"
    assert clip[-1].stamp_ns == max(stamps)
    assert len({f.seq for f in clip}) == len(clip)
    assert [f.stamp_ns for f in clip] == sorted(f.stamp_ns for f in clip)
    limit = max(1, round(duration_s * fps))
    if max_frames is not None:
        limit = min(limit, max_frames)
    assert len(clip) <= limit
    earliest = max(stamps) - duration_s * NS - NS / fps
    assert all(f.stamp_ns >= earliest for f in clip)
