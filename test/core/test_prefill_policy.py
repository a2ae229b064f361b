import threading

import numpy as np
import pytest

from cosmos_reason_ros.core import query
from cosmos_reason_ros.core.models import PROFILES
from cosmos_reason_ros.core.prefill import PrefillPolicy
from cosmos_reason_ros.core.types import Task


def test_starts_once_per_new_frame():
    policy = PrefillPolicy()
    assert policy.try_start(100, busy=False)
    policy.finished(100, "run")
    assert not policy.try_start(100, busy=False)  # same frame: nothing to do, not a skip
    assert policy.try_start(200, busy=False)
    assert policy.counts().skipped == 0 and policy.counts().run == 1


def test_never_two_in_flight_and_skips_are_counted_once_per_frame():
    policy = PrefillPolicy()
    assert policy.try_start(100, busy=False)
    assert not policy.try_start(200, busy=False)
    assert not policy.try_start(200, busy=False)  # a retry of the same frame
    assert policy.counts().skipped == 1 and policy.wants(200) and not policy.wants(100)
    policy.finished(100, "run")
    assert policy.try_start(200, busy=False)
    assert not policy.wants(200) and not policy.wants(None)


def test_busy_skips_unless_configured():
    assert not PrefillPolicy().try_start(100, busy=True)
    assert PrefillPolicy().counts().skipped == 0
    relaxed = PrefillPolicy(skip_while_busy=False)
    assert relaxed.try_start(100, busy=True)


def test_no_frame_is_not_a_skip():
    policy = PrefillPolicy()
    assert not policy.try_start(None, busy=False)
    assert policy.counts().skipped == 0


def test_goal_on_another_frame_aborts_but_its_own_frame_is_kept():
    policy = PrefillPolicy()
    assert policy.make_way_for(100) is None  # nothing in flight
    policy.try_start(100, busy=False)
    cancelled = []
    assert policy.attach(lambda: cancelled.append(100))
    assert policy.make_way_for(100) is None and not policy.abort_requested
    cancel = policy.make_way_for(99)
    assert policy.abort_requested and cancel is not None
    cancel()
    assert cancelled == [100]
    policy.finished(100, "aborted")
    assert not policy.in_flight and policy.counts().aborted == 1
    assert not policy.abort_requested  # the next prefill starts clean
    assert not policy.goal_frame(100)  # an aborted prefill is no hit


def test_an_abort_before_the_request_is_attached_is_not_lost():
    policy = PrefillPolicy()
    policy.try_start(100, busy=False)
    assert policy.make_way_for(99) is None  # not submitted yet: nothing to cancel ...
    assert policy.abort_requested  # ... so the worker skips submitting,
    assert not policy.attach(lambda: None)  # or, if it already did, cancels it itself
    policy.finished(100, "aborted")
    assert policy.try_start(101, busy=False) and policy.attach(lambda: None)


def test_hits_are_counted_for_completed_prefills_only():
    policy = PrefillPolicy(remember_frames=2)
    for stamp in (1, 2, 3):
        policy.try_start(stamp, busy=False)
        policy.finished(stamp, "run")
    assert policy.goal_frame(3) and policy.goal_frame(2)
    assert not policy.goal_frame(1)  # forgotten: bounded record
    assert policy.counts().goals_on_prefilled_frame == 2


def test_ready_frame_is_the_newest_prefilled_one_when_the_newest_is_not():
    policy = PrefillPolicy()
    assert policy.ready_frame([]) is None
    for stamp in (10, 20):
        policy.try_start(stamp, busy=False)
        policy.finished(stamp, "run")
    assert policy.ready_frame([20, 10]) is None  # the newest is prefilled: use it
    policy.try_start(30, busy=False)  # in flight, not done
    assert policy.ready_frame([30, 20, 10]) == 20
    assert policy.ready_frame([30]) is None  # nothing prefilled within the caller's window
    policy.finished(30, "aborted")
    assert policy.ready_frame([40, 30, 5]) is None  # aborted and unknown frames never count
    assert policy.counts().goals_on_ready_frame == 1


def test_failed_prefill_frees_the_slot():
    policy = PrefillPolicy()
    policy.try_start(5, busy=False)
    policy.finished(5, "failed")
    assert not policy.in_flight and policy.counts().failed == 1
    with pytest.raises(ValueError, match="outcome"):
        policy.finished(5, "maybe")


def test_concurrent_ticks_start_exactly_one():
    policy = PrefillPolicy()
    started = []
    barrier = threading.Barrier(8)

    def tick(stamp):
        barrier.wait()
        started.append(policy.try_start(stamp, busy=False))

    threads = [threading.Thread(target=tick, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert started.count(True) == 1 and policy.counts().skipped == 7


@pytest.mark.parametrize("family", sorted(PROFILES))
@pytest.mark.parametrize("reasoning", [False, True])
@pytest.mark.parametrize("task", [Task.VQA, Task.CAPTION, Task.GROUND, Task.POINT,
                                  Task.TRAJECTORY, Task.VERIFY])
def test_prefill_messages_and_pixels_are_the_start_of_every_goal(family, reasoning, task):
    profile = PROFILES[family]
    rgb = np.random.default_rng(0).integers(0, 255, (480, 640, 3), np.uint8)
    media = query.prepare_image(profile, rgb)
    prefill = query.build_prefill_request("p", profile, media, reasoning=reasoning)
    targets = ["red cup"] if task in (Task.GROUND, Task.POINT) else []
    spec = query.make_spec(profile, task=task, prompt="Is the cup on the table?",
                           targets=targets, reasoning=reasoning)
    goal = query.build_request("g", profile, spec, media)
    *goal_head, goal_user = goal.messages
    *prefill_head, prefill_user = prefill.messages
    assert goal_head == prefill_head  # system turn
    assert goal_user.content[:len(prefill_user.content)] == prefill_user.content
    assert [p.kind for p in prefill_user.content] == ["image"]
    assert prefill.images[0] is goal.images[0]
    assert prefill.sampling.max_tokens == 1 and prefill.json_schema is None
    assert prefill.priority == query.PREFILL_PRIORITY > 1  # below goals (0) and periodic (1)


def test_goal_cache_use_is_counted_for_diagnostics():
    policy = PrefillPolicy()
    assert (policy.counts().goals_last_cached_prompt_tokens,
            policy.counts().goals_with_cached_prompt) == (0, 0)
    policy.goal_served(96)
    policy.goal_served(0)  # a miss (another server behind the router, an evicted prefix)
    policy.goal_served(64)
    assert (policy.counts().goals_last_cached_prompt_tokens,
            policy.counts().goals_with_cached_prompt) == (64, 2)
