"""Statistics for the ``bench`` tool: summaries, p95s, ratios, paired intervals, time budgets.

Pure Python (no rclpy, no vLLM, no numpy needed): the bench collects samples as plain dicts
(one per request, every field a number, a string or None) and this module turns them into the
figures that ``bench/report.py`` writes into ``results.md``. Ratios are always computed from
medians of samples taken side by side in one run, so machine drift between modes cancels out.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cosmos_reason_ros.core.stats import median, percentile

Sample = Mapping[str, Any]


@dataclass(frozen=True)
class Summary:
    """Median, p95 and count of one metric over one group of samples."""

    n: int
    median: float
    p95: float

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Summary:
        """Summarize the finite values (None and NaN are skipped)."""
        data = [float(v) for v in values if v is not None and not math.isnan(float(v))]
        return cls(len(data), median(data), percentile(data, 95))


def group(samples: Iterable[Sample], keys: Sequence[str],
          where: Callable[[Sample], bool] | None = None) -> dict[tuple[Any, ...], list[Sample]]:
    """Group successful, measured samples by the values of ``keys``, in first-seen order.

    Failed samples (``ok`` false) and warm-up samples (``warmup`` true) are left out.
    """
    out: dict[tuple[Any, ...], list[Sample]] = defaultdict(list)
    for s in samples:
        if not s.get("ok", False) or s.get("warmup") or (where is not None and not where(s)):
            continue
        out[tuple(s.get(k) for k in keys)].append(s)
    return dict(out)


def summarize(samples: Iterable[Sample], keys: Sequence[str], metric: str,
              where: Callable[[Sample], bool] | None = None) -> dict[tuple[Any, ...], Summary]:
    """``Summary`` of ``metric`` per group of ``keys``."""
    return {k: Summary.of(s.get(metric) for s in group_samples)
            for k, group_samples in group(samples, keys, where).items()}


def ratio(numerator: float, denominator: float) -> float:
    """``numerator / denominator``; NaN when either is missing or the denominator is 0."""
    if any(v is None or math.isnan(v) for v in (numerator, denominator)) or denominator == 0:
        return math.nan
    return numerator / denominator


@dataclass(frozen=True)
class Overhead:
    """What a mode adds on top of a reference mode (both medians of paired rounds).

    ``deltas_ms`` are the per-round differences (mode - reference), for :func:`decide`.
    """

    reference_ms: float
    mode_ms: float
    deltas_ms: tuple[float, ...] = field(default=(), compare=False, repr=False)

    @property
    def ms(self) -> float:
        """Added time in milliseconds."""
        return self.mode_ms - self.reference_ms

    @property
    def percent(self) -> float:
        """Added time as a percentage of the mode's own end-to-end time."""
        return 100.0 * ratio(self.ms, self.mode_ms)


def paired_overhead(samples: Iterable[Sample], mode: Any, reference: Any, metric: str,
                    keys: Sequence[str] = ("size", "length"),
                    where: Callable[[Sample], bool] | None = None,
                    same: str | None = "output_tokens", by: str = "mode",
                    ) -> dict[tuple[Any, ...], tuple[Overhead, Summary]]:
    """Per group: medians of ``mode`` and ``reference``, and the median of per-round deltas.

    Samples of the two modes taken in the same round (same ``round`` and group) are paired;
    the delta distribution (mode - reference, ms) is robust to drift across rounds. With
    ``same`` set, only pairs that agree on that field count (e.g. the same number of output
    tokens: a generation that stopped early is not comparable), and the medians are taken
    over the paired samples only. ``by`` names the field ``mode`` and ``reference`` are values
    of (e.g. ``cameras``: two cameras against one, per mode in ``keys``).
    """
    by_key: dict[tuple[Any, ...], dict[Any, dict[Any, Sample]]] = defaultdict(
        lambda: defaultdict(dict))
    for s in samples:
        if not s.get("ok") or s.get("warmup") or s.get(by) not in (mode, reference) \
                or s.get(metric) is None or (where is not None and not where(s)):
            continue
        k = tuple(s.get(x) for x in keys)
        by_key[k][s[by]][s.get("round")] = s
    out = {}
    for k, modes in by_key.items():
        ref, mod = modes.get(reference, {}), modes.get(mode, {})
        rounds = [r for r in mod if r in ref
                  and (same is None or mod[r].get(same) == ref[r].get(same))]
        if not rounds:
            continue
        ref_ms = [float(ref[r][metric]) * 1e3 for r in rounds]
        mod_ms = [float(mod[r][metric]) * 1e3 for r in rounds]
        deltas = [m - f for m, f in zip(mod_ms, ref_ms, strict=True)]
        out[k] = (Overhead(median(ref_ms), median(mod_ms), tuple(deltas)), Summary.of(deltas))
    return out


def median_interval(values: Iterable[float], confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free confidence interval of the median; NaNs when there are too few values.

    The order statistics x(k) and x(n + 1 - k), with the largest k for which a Binomial(n, 1/2)
    count below k has probability <= (1 - confidence) / 2. It assumes nothing about the
    distribution's shape: latency deltas are skewed, with a long tail. At 95 % it needs 6
    values (then it is their range).
    """
    data = sorted(float(v) for v in values if v is not None and not math.isnan(float(v)))
    n = len(data)
    tail = (1.0 - confidence) / 2.0
    k, below = 0, 0.0  # below = P(count <= k - 1)
    while k < n // 2:
        p_k = math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
                       + n * math.log(0.5))
        if below + p_k > tail:
            break
        below += p_k
        k += 1
    if k == 0:
        return math.nan, math.nan
    return data[k - 1], data[n - k]


@dataclass(frozen=True)
class Decision:
    """Whether paired deltas meet a limit: their median's 95 % interval against it."""

    verdict: str  # "met" (the whole interval within), "MISSED" (all above) or "undecided"
    low: float
    high: float
    pairs: int
    pairs_needed: int | None  # undecided: about how many pairs would decide; None: unknown

    def text(self, unit: str = "ms") -> str:
        """Say the verdict with its interval (a report's check column)."""
        if math.isnan(self.low):
            return f"undecided: {self.pairs} pairs, a 95 % interval needs 6"
        interval = f"95 % interval {fmt(self.low)} to {fmt(self.high)} {unit}, {self.pairs} pairs"
        if self.verdict != "undecided":
            return f"{self.verdict} ({interval})"
        more = "" if self.pairs_needed is None else f"; about {self.pairs_needed} pairs decide"
        return f"undecided ({interval}{more})"


def decide(deltas: Sequence[float], limit: float) -> Decision:
    """Judge ``median(deltas) <= limit`` from the median's 95 % interval.

    Undecided while the interval holds the limit. An interval's width shrinks about as
    1 / sqrt(pairs), so the pairs that would put its edge at the limit are estimated as
    ``pairs * (half-width / |median - limit|)^2`` (None when the median is at the limit).
    """
    low, high = median_interval(deltas)
    n = sum(1 for d in deltas if d is not None and not math.isnan(d))
    if math.isnan(low):
        return Decision("undecided", low, high, n, 6)
    if high <= limit:
        return Decision("met", low, high, n, None)
    if low > limit:
        return Decision("MISSED", low, high, n, None)
    margin = abs(median(deltas) - limit)
    needed = math.ceil(n * ((high - low) / 2.0 / margin) ** 2) if margin > 0 else None
    return Decision("undecided", low, high, n, needed)


def throughput(batches: Iterable[Sample], keys: Sequence[str] = ("mode", "concurrency"),
               phase: str | None = None) -> dict[tuple[Any, ...], Summary]:
    """Output tokens per second per ``keys`` (default (mode, concurrency)), from batch samples.

    A batch sample carries ``concurrency``, ``wall_s`` (first submit to last result) and
    ``output_tokens`` (sum over the batch's requests); only those of ``phase`` count (``None``:
    the concurrency phase's, which carry no phase).
    """
    values: dict[tuple[Any, ...], list[float]] = defaultdict(list)
    for b in batches:
        if not b.get("ok") or b.get("warmup") or not b.get("wall_s") \
                or b.get("phase") != phase:
            continue
        values[tuple(b.get(k) for k in keys)].append(b["output_tokens"] / b["wall_s"])
    return {k: Summary.of(v) for k, v in values.items()}


def scaling(tput: Mapping[tuple[Any, ...], Summary], mode: str) -> dict[int, float]:
    """N-way throughput divided by 1-way throughput (medians) for ``mode``."""
    one = tput.get((mode, 1))
    if one is None:
        return {}
    return {n: ratio(s.median, one.median) for (m, n), s in sorted(tput.items(),
                                                                   key=lambda kv: str(kv[0]))
            if m == mode}


def growth(series: Sequence[tuple[float, float]], skip_fraction: float = 0.1) -> float:
    """Growth of a (x, value) series: median of the last 10% minus median after warm-up.

    The first ``skip_fraction`` of the points is warm-up (allocator pools, caches filling);
    medians instead of single points keep one noisy sample from deciding the result.
    """
    if len(series) < 2:
        return math.nan
    values = [v for _, v in series]
    start = int(len(values) * skip_fraction)
    tail = max(1, len(values) // 10)
    base = values[start:start + tail] or values[:1]
    return median(values[-tail:]) - median(base)


# --- time budget ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Slice:
    """The share of the remaining time one phase may use."""

    name: str
    weight: float


def plan_slices(remaining_s: float, phases: Sequence[Slice]) -> dict[str, float]:
    """Split ``remaining_s`` among phases in proportion to their weights."""
    if remaining_s < 0:
        remaining_s = 0.0
    total = sum(p.weight for p in phases if p.weight > 0)
    if total <= 0:
        return {p.name: 0.0 for p in phases}
    return {p.name: remaining_s * max(0.0, p.weight) / total for p in phases}


def rounds_that_fit(slice_s: float, round_s: float, wanted: int, minimum: int = 1) -> int:
    """How many rounds of ``round_s`` fit in ``slice_s``, between ``minimum`` and ``wanted``."""
    if wanted <= 0:
        return 0
    if round_s <= 0 or math.isnan(round_s):
        return wanted
    return max(min(minimum, wanted), min(wanted, int(slice_s // round_s)))


def fmt(value: float | None, digits: int = 1) -> str:
    """Format a number for a table cell; a dash when missing."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}f}"
