"""Statistics for benchmark results: medians, ratios, peak rates (pure).

Percentiles are ``herdless._percentiles.percentile``, which the demo shares.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable

__all__ = ["median", "peak_rate", "ratio"]


def median(values: Iterable[float]) -> float:
    """The median of ``values``; ``nan`` for none (a missing figure, not an error)."""
    data = [v for v in values if not math.isnan(v)]
    return statistics.median(data) if data else math.nan


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
