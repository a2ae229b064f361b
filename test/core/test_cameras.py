"""Several cameras in one goal: which cameras a goal means, and one frame each, in sync.

Real ``FrameHistory`` objects; frames that arrive during a wait are appended by a thread that
starts only once the chooser has looked and found no matching set (it asks ``should_stop``
right before each wait), so every test is deterministic and none sleeps.
"""

from __future__ import annotations

import threading

import pytest
from waiting import NEVER_S

from cosmos_reason_ros.core.cameras import (
    DEFAULT_CAMERA,
    resolve_cameras,
    synchronized_frames,
)
from cosmos_reason_ros.core.frames import FrameHistory
from cosmos_reason_ros.core.types import (
    BadRequestError,
    ErrorCode,
    ImageTooOldError,
    NoImageError,
    RequestCancelledError,
)

NS = 1_000_000_000
MS = 1_000_000
T0 = 1_000 * NS  # a camera clock far from 0
CONFIGURED = ("front", "wrist", "rear")


# --- which cameras ---------------------------------------------------------------------------

def test_no_cameras_means_the_default_camera_the_first_configured():
    assert resolve_cameras([], CONFIGURED, max_images=4) == ("front",)
    assert resolve_cameras((), (DEFAULT_CAMERA,), max_images=1) == (DEFAULT_CAMERA,)


def test_cameras_keep_the_goal_order_and_lose_surrounding_spaces():
    assert resolve_cameras([" wrist", "front "], CONFIGURED, 4) == ("wrist", "front")


def test_an_unknown_camera_is_a_bad_request_naming_it_and_the_configured_ones():
    with pytest.raises(BadRequestError) as err:
        resolve_cameras(["front", "left"], CONFIGURED, 4)
    assert err.value.code is ErrorCode.BAD_REQUEST
    assert "cameras[1]='left' is not a configured camera" in err.value.message
    assert "configured cameras: front, wrist, rear" in err.value.message


def test_more_cameras_than_images_per_request_is_a_bad_request_naming_both_numbers():
    with pytest.raises(BadRequestError) as err:
        resolve_cameras(["front", "wrist", "rear"], CONFIGURED, max_images=2)
    assert "names 3 cameras" in err.value.message and "at most 2 images" in err.value.message


@pytest.mark.parametrize(("names", "words"), [
    (["front", "front"], "names 'front' twice"),
    (["front", " "], "cameras[1] is empty"),
    ("front", "a list of camera names, not one string"),
])
def test_repeated_empty_or_unlisted_names_are_bad_requests(names, words):
    with pytest.raises(BadRequestError) as err:
        resolve_cameras(names, CONFIGURED, 4)
    assert words in err.value.message


# --- one frame each, in sync -----------------------------------------------------------------

def history_with(*stamps_ns: int) -> FrameHistory[str]:
    history: FrameHistory[str] = FrameHistory(max_frames=16, clock=lambda: T0)
    for stamp in stamps_ns:
        history.append(f"frame@{stamp}", stamp, nbytes=1, received_ns=stamp)
    return history


class Waiting:
    """A ``should_stop`` that says when the chooser is about to wait, and counts the waits."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1
        self.started.set()


def run_in_thread(target, *args, **kwargs):
    """Run ``target`` on a thread; return a function that joins it and gives its result."""
    box: dict = {}

    def body() -> None:
        try:
            box["value"] = target(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - handed to the test thread
            box["error"] = e

    thread = threading.Thread(target=body, daemon=True)
    thread.start()

    def result():
        thread.join(timeout=NEVER_S)
        assert not thread.is_alive(), "the chooser did not return within 30 s"
        if "error" in box:
            raise box["error"]
        return box["value"]

    return result


def stamps_of(chosen) -> dict[str, int]:
    return {c.camera: c.frame.stamp_ns for c in chosen}


def test_latest_takes_the_newest_set_within_the_skew_not_the_newest_frames():
    front = history_with(T0, T0 + 100 * MS, T0 + 200 * MS)
    wrist = history_with(T0 + 50 * MS, T0 + 180 * MS)
    chosen = synchronized_frames([("front", front), ("wrist", wrist)], max_skew_s=0.03,
                                 clock_ns=lambda: T0 + 250 * MS, wait_s=0.0, max_age_s=1.0)
    # The newest frames (200 and 180 ms) are 20 ms apart: within 30 ms, so that pair.
    assert stamps_of(chosen) == {"front": T0 + 200 * MS, "wrist": T0 + 180 * MS}
    assert [c.camera for c in chosen] == ["front", "wrist"]


def test_latest_with_a_tight_skew_picks_an_older_pair_when_the_newest_does_not_match():
    front = history_with(T0, T0 + 100 * MS, T0 + 200 * MS)
    wrist = history_with(T0 + 95 * MS, T0 + 160 * MS)
    chosen = synchronized_frames([("wrist", wrist), ("front", front)], max_skew_s=0.01,
                                 clock_ns=lambda: T0 + 250 * MS, wait_s=0.0, max_age_s=1.0)
    assert [c.camera for c in chosen] == ["wrist", "front"]
    assert stamps_of(chosen) == {"front": T0 + 100 * MS, "wrist": T0 + 95 * MS}


def test_too_skewed_frames_wait_for_a_matching_frame_then_return_it():
    front = history_with(T0 + 200 * MS)
    wrist = history_with(T0)
    waiting = Waiting()
    result = run_in_thread(
        synchronized_frames, [("front", front), ("wrist", wrist)], max_skew_s=0.02,
        clock_ns=lambda: T0 + 210 * MS, wait_s=60.0, max_age_s=1.0, should_stop=waiting)
    assert waiting.started.wait(NEVER_S)
    wrist.append("late wrist", T0 + 205 * MS, nbytes=1)
    assert stamps_of(result()) == {"front": T0 + 200 * MS, "wrist": T0 + 205 * MS}


def test_too_skewed_frames_fail_after_the_wait_naming_every_camera_age_and_skew():
    front = history_with(T0 + 200 * MS)
    wrist = history_with(T0 + 100 * MS, T0 + 150 * MS)
    with pytest.raises(NoImageError) as err:
        synchronized_frames([("front", front), ("wrist", wrist)], max_skew_s=0.02,
                            clock_ns=lambda: T0 + 250 * MS, wait_s=0.05, max_age_s=1.0)
    message = err.value.message
    assert err.value.code is ErrorCode.NO_IMAGE
    assert "cameras front, wrist within cameras.max_skew_s=0.02 s" in message
    assert "front newest 0.050 s old" in message and "wrist newest 0.100 s old" in message
    assert "the closest set is 0.050 s apart (limit 0.02 s)" in message


def test_a_camera_that_never_published_fails_no_image_naming_only_it():
    front = history_with(T0)
    wrist: FrameHistory[str] = FrameHistory()
    with pytest.raises(NoImageError) as err:
        synchronized_frames([("front", front), ("wrist", wrist)], max_skew_s=0.1,
                            clock_ns=lambda: T0, wait_s=0.05)
    assert err.value.message == "no image received on camera 'wrist' yet (waited 0.05 s)"


def test_a_camera_that_starts_publishing_during_the_wait_is_used():
    front = history_with(T0)
    wrist: FrameHistory[str] = FrameHistory()
    waiting = Waiting()
    result = run_in_thread(
        synchronized_frames, [("front", front), ("wrist", wrist)], max_skew_s=0.1,
        clock_ns=lambda: T0, wait_s=60.0, should_stop=waiting)
    assert waiting.started.wait(NEVER_S)
    wrist.append("first wrist", T0 + 10 * MS, nbytes=1)
    assert stamps_of(result()) == {"front": T0, "wrist": T0 + 10 * MS}


def test_a_stale_camera_fails_at_once_with_image_too_old_naming_it():
    front = history_with(T0 + 900 * MS)
    wrist = history_with(T0)
    waiting = Waiting()
    with pytest.raises(ImageTooOldError) as err:
        synchronized_frames([("front", front), ("wrist", wrist)], max_skew_s=0.1,
                            clock_ns=lambda: T0 + NS, wait_s=60.0, max_age_s=0.5,
                            should_stop=waiting)
    assert err.value.message == "latest image of camera wrist 1.000 s old; max_image_age_s=0.5"
    assert waiting.calls == 0  # no wait: a stalled camera does not become fresh by waiting


def test_next_takes_the_earliest_matching_set_after_acceptance():
    accepted = T0 + 100 * MS
    front = history_with(T0, T0 + 90 * MS)  # both taken before the goal: never "next"
    wrist = history_with(T0 + 95 * MS)
    waiting = Waiting()
    result = run_in_thread(
        synchronized_frames, [("front", front), ("wrist", wrist)], max_skew_s=0.02,
        clock_ns=lambda: accepted, wait_s=60.0, after_ns=accepted, should_stop=waiting)
    assert waiting.started.wait(NEVER_S)
    wrist.append("w1", T0 + 130 * MS, nbytes=1, received_ns=T0 + 130 * MS)
    front.append("f1", T0 + 140 * MS, nbytes=1, received_ns=T0 + 140 * MS)
    front.append("f2", T0 + 150 * MS, nbytes=1, received_ns=T0 + 150 * MS)
    chosen = result()
    # The first pair after acceptance, whichever arrival the chooser saw it at.
    assert stamps_of(chosen) == {"front": T0 + 140 * MS, "wrist": T0 + 130 * MS}


def test_next_without_a_new_frame_of_one_camera_names_it():
    accepted = T0 + 100 * MS
    front = history_with(T0 + 120 * MS)
    wrist = history_with(T0 + 50 * MS)
    with pytest.raises(NoImageError) as err:
        synchronized_frames([("front", front), ("wrist", wrist)], max_skew_s=0.1,
                            clock_ns=lambda: accepted, wait_s=0.05, after_ns=accepted)
    assert err.value.message == "no new frame on camera 'wrist' within 0.05 s"


def test_a_stop_request_ends_the_wait_with_its_error():
    front = history_with(T0 + 200 * MS)
    wrist = history_with(T0)
    with pytest.raises(RequestCancelledError):
        synchronized_frames([("front", front), ("wrist", wrist)], max_skew_s=0.02,
                            clock_ns=lambda: T0 + 200 * MS, wait_s=60.0,
                            should_stop=lambda: RequestCancelledError("cancelled"))


def test_a_closed_history_ends_the_wait_instead_of_spinning():
    front = history_with(T0 + 200 * MS)
    wrist = history_with(T0)
    waiting = Waiting()
    result = run_in_thread(
        synchronized_frames, [("front", front), ("wrist", wrist)], max_skew_s=0.02,
        clock_ns=lambda: T0 + 200 * MS, wait_s=60.0, should_stop=waiting)
    assert waiting.started.wait(NEVER_S)
    # A loaded machine may let the chooser wait several 50 ms slices before the close: count
    # only what it does after.
    calls_before_close = waiting.calls
    wrist.close()  # the lagging camera's history: the node is going away
    with pytest.raises(NoImageError):
        result()
    # At most the check it was about to make and one more after the wake-up, then it gave up
    # (a chooser that spun on the closed history would ask until wait_s, 60 s, ran out).
    assert waiting.calls - calls_before_close <= 2


def test_hardware_synchronised_cameras_match_with_zero_skew():
    front = history_with(T0, T0 + 100 * MS)
    wrist = history_with(T0, T0 + 100 * MS)
    chosen = synchronized_frames([("front", front), ("wrist", wrist)], max_skew_s=0.0,
                                 clock_ns=lambda: T0 + 100 * MS, wait_s=0.0)
    assert stamps_of(chosen) == {"front": T0 + 100 * MS, "wrist": T0 + 100 * MS}
