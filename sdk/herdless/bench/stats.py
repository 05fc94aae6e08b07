"""Statistics for benchmark results: medians, percentiles, ratios (pure)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence

__all__ = ["median", "peak_rate", "percentile", "ratio"]


def median(values: Iterable[float]) -> float:
    """The median of ``values``; ``nan`` for none (a missing figure, not an error)."""
    data = [v for v in values if not math.isnan(v)]
    return statistics.median(data) if data else math.nan


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation between closest ranks.

    ``nan`` for an empty sequence. Same definition as numpy's default ("linear").
    """
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q!r}")
    if not values:
        return math.nan
    data = sorted(values)
    pos = (len(data) - 1) * q / 100
    low = math.floor(pos)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (pos - low)


def ratio(value: float, baseline: float) -> float:
    """``value / baseline``; ``nan`` when the baseline is zero or missing."""
    if baseline == 0 or math.isnan(baseline) or math.isnan(value):
        return math.nan
    return value / baseline


def peak_rate(times: Iterable[float], *, start: float, width: float = 1.0) -> float:
    """The most events in any window ``[t, t + width)`` with ``t >= start``, per second.

    A sliding window rather than the fixed first second after ``start``: a herd
    that returns at t=3 s is as much a herd as one that returns at t=1 s.
    """
    if width <= 0:
        raise ValueError(f"width must be > 0, got {width!r}")
    data = sorted(t for t in times if t >= start)
    best = 0
    low = 0
    for high, t in enumerate(data):
        while data[low] <= t - width:
            low += 1
        best = max(best, high - low + 1)
    return best / width
