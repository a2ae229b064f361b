import threading

import pytest
from waiting import NEVER_S

from cosmos_reason_ros.core.admission import GoalSlots
from cosmos_reason_ros.core.types import OverloadedError


def test_admission_refuses_beyond_running_plus_queued():
    slots = GoalSlots(max_running=2, max_queued=1)
    for _ in range(3):
        slots.admit()
    with pytest.raises(OverloadedError, match="max_concurrent_goals=2"):
        slots.admit()
    slots.leave()
    slots.admit()  # room again


def test_running_slots_are_handed_over_in_arrival_order():
    slots = GoalSlots(max_running=1, max_queued=3)
    for _ in range(3):
        slots.admit()
    assert slots.acquire(1.0)
    order: list[int] = []
    started = [threading.Event() for _ in range(2)]

    def waiter(i):
        started[i].set()
        assert slots.acquire(10.0)
        order.append(i)
        slots.release()

    threads = []
    for i in range(2):
        t = threading.Thread(target=waiter, args=(i,))
        t.start()
        started[i].wait(NEVER_S)
        # wait until the waiter is in line before starting the next one
        for _ in range(200):
            if slots._waiting and len(slots._waiting) == i + 1:
                break
            threading.Event().wait(0.005)
        threads.append(t)
    assert slots.queued == 2
    slots.release()
    for t in threads:
        t.join(NEVER_S)
    assert order == [0, 1]


def test_acquire_gives_up_on_stop_or_timeout():
    slots = GoalSlots(max_running=1, max_queued=1)
    slots.admit()
    slots.admit()
    assert slots.acquire(1.0)
    assert not slots.acquire(0.05)
    assert not slots.acquire(10.0, should_stop=lambda: True)
    assert slots.running == 1 and not slots._waiting


def test_a_stopped_goal_gets_no_slot_even_when_one_is_free():
    # Cancelled or shut down while it waited: handing it the slot would start a
    # generation nobody waits for.
    slots = GoalSlots(max_running=1, max_queued=1)
    assert not slots.acquire(10.0, should_stop=lambda: True)
    assert slots.running == 0
    assert slots.acquire(0.0)


def test_a_waiter_stopped_when_the_slot_frees_does_not_take_it():
    slots = GoalSlots(max_running=1, max_queued=2)
    assert slots.acquire(1.0)
    stop = threading.Event()
    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(slots.acquire(10.0, stop.is_set)))
    waiter.start()
    while not slots._waiting:
        pass
    stop.set()
    slots.release()
    waiter.join(NEVER_S)
    assert got == [False] and slots.running == 0
