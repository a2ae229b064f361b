"""GcPauses times real collections; freeze_heap moves live objects out of the collector's view."""

from __future__ import annotations

import gc

from cosmos_reason_ros.ros.gcwatch import GcPauses, GcStats, freeze_heap


def _make_cycles(n: int = 1000) -> None:
    for _ in range(n):
        a: list = []
        a.append(a)


def test_counts_collections_and_full_ones_until_uninstalled() -> None:
    watch = GcPauses().install()
    try:
        _make_cycles()
        gc.collect()  # a full (generation 2) collection
        gc.collect(0)
        s = watch.stats()
        assert s.collections >= 2 and s.full_collections >= 1
        assert 0 < s.pause_total_s and 0 < s.pause_max_ms <= s.pause_total_s * 1e3 + 1e-9
    finally:
        watch.uninstall()
    before = watch.stats()
    gc.collect()
    assert watch.stats() == before


def test_slow_threshold_and_reset() -> None:
    watch = GcPauses(slow_s=0.0).install()  # every pause counts as slow
    try:
        gc.collect()
        assert watch.stats().slow_pauses == watch.stats().collections >= 1
        watch.reset()
        assert watch.stats() == GcStats()
    finally:
        watch.uninstall()


def test_install_twice_times_each_collection_once() -> None:
    watch = GcPauses().install().install()
    try:
        gc.collect()
        assert gc.callbacks.count(watch._on_gc) == 1
        assert watch.stats().collections >= 1
    finally:
        watch.uninstall()


def test_freeze_heap_freezes_live_objects() -> None:
    try:
        frozen, took_s = freeze_heap()
        # Frozen objects can only go (another thread of the process frees some), not come.
        assert frozen > 1000 and 0 < gc.get_freeze_count() <= frozen and took_s >= 0
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0
