"""Unit tests of the shared order statistics (node diagnostics, bench, replay report)."""

from __future__ import annotations

import math

import pytest

from cosmos_reason_ros.core import stats


def test_percentile_is_nearest_rank_and_skips_missing_values() -> None:
    values = [float(v) for v in range(1, 101)]
    assert stats.percentile(values, 50) == 50
    assert stats.percentile(values, 95) == 95
    assert stats.percentile(values, 100) == 100
    assert stats.percentile([3.0, None, math.nan, 1.0], 0) == 1.0  # type: ignore[list-item]
    assert math.isnan(stats.percentile([], 95))
    with pytest.raises(ValueError, match="q=101"):
        stats.percentile(values, 101)


def test_median_even_and_odd_counts() -> None:
    assert stats.median([3.0, 1.0, 2.0]) == 2.0
    assert stats.median([4.0, 1.0, 2.0, 3.0]) == 2.5
    assert math.isnan(stats.median([]))
