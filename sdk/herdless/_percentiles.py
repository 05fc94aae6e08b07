"""Percentiles, computed in one place for the client, the demo and the bench (pure).

Two definitions, each for its readers:

- ``nearest_rank``: a value that was observed, one index into data already sorted.
  ``client.stats()`` reports its latency percentiles this way, and the hedge's
  ``after="auto"`` takes its 95th percentile so (the maximum while fewer than 20 times
  are known: the cautious side). Both sort a bounded window of recent times.
- ``percentile``: linear interpolation between the closest ranks (numpy's default),
  for the demo's summary and the benchmarks' tables, where a few dozen samples would
  make rank steps coarse.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["nearest_rank", "percentile"]


def nearest_rank(ordered: Sequence[float], fraction: float) -> float:
    """The value at rank ``int(fraction * n)`` of ``ordered`` (sorted, not empty), clipped
    to the last: ``nearest_rank([1, 2, 3, 4], 0.5) == 3``.

    Raises:
        ValueError: ``fraction`` outside [0, 1], or ``ordered`` empty.
    """
    if not 0 <= fraction <= 1:
        raise ValueError(f"fraction must be in [0, 1], got {fraction!r}")
    if not ordered:
        raise ValueError("nearest_rank of no values")
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation between closest ranks.

    ``nan`` for an empty sequence. Same definition as numpy's default ("linear").

    Raises:
        ValueError: ``q`` outside [0, 100].
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
