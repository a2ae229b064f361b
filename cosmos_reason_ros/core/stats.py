"""Order statistics shared by the node's diagnostics, the bench and the replay report.

Nearest-rank percentiles (no interpolation: the value reported is one that was measured) and
the median; both skip None and NaN and return NaN when nothing is left.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float | None], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of ``values``; NaN when empty."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q={q!r} must be within 0..100")
    data = sorted(v for v in values if v is not None and not math.isnan(v))
    if not data:
        return math.nan
    rank = max(0, min(len(data) - 1, math.ceil(q / 100 * len(data)) - 1))
    return data[rank]


def median(values: Sequence[float | None]) -> float:
    """Median (mean of the two middle values for an even count); NaN when empty."""
    data = sorted(v for v in values if v is not None and not math.isnan(v))
    if not data:
        return math.nan
    mid = len(data) // 2
    return data[mid] if len(data) % 2 else (data[mid - 1] + data[mid]) / 2
