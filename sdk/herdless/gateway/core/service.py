"""Service measured: answers per second, the answers' average length, the service over a
sliding window and how evenly it is shared (pure).

The fair queue (:mod:`herdless.gateway.core.fairqueue`) charges each user's weighted tokens
to a :class:`ServiceWindow`; ``/metrics`` shows the last window per user and Jain's
index over the users that waited throughout it, and the fairness benchmark computes
the same index from its clients' records.
"""

from __future__ import annotations

import math
from collections import deque

__all__ = ["DRAIN_WINDOW", "DrainRate", "ServiceWindow", "average_answer", "jain_index"]

DRAIN_WINDOW = 10.0
"""Seconds over which the answers finished per second are measured."""
_DRAIN_SAMPLES = 4  # answers finished before the measured rate is believed
_STALE = 3.0  # gaps without an answer after which the measured rate is not believed
_EWMA = 0.2  # weight of the newest answer in an average (VTC's window of five)


class DrainRate:
    """Answers finished per second over the last ``DRAIN_WINDOW`` seconds, counted from
    the first answer of the current stretch: after a whole window with none (a quiet
    night), the first answers start a new measure, as a rate over the quiet would read
    the morning's rush at a fraction of what the GPU serves.

    A rate is believed while answers keep coming at it: none for three of its gaps
    says the requests now running are longer than the ones it counted (a wave of long
    answers after short ones), and told the short answers' pace their callers would come
    back many times before a place frees."""

    __slots__ = ("_first", "_times")

    def __init__(self) -> None:
        self._times: deque[float] = deque()
        self._first = math.inf

    def add(self, now: float) -> None:
        """An answer finished at ``now``."""
        times = self._times
        if not times or times[-1] < now - DRAIN_WINDOW:
            times.clear()
            self._first = now
        times.append(now)

    def rate(self, now: float) -> float | None:
        """Answers per second; ``None`` before four finished over a second at least, or
        when the last one is older than three of the rate's gaps."""
        times = self._times
        while times and times[0] < now - DRAIN_WINDOW:
            times.popleft()
        span = min(DRAIN_WINDOW, now - self._first)
        if len(times) < _DRAIN_SAMPLES or span < 1.0:
            return None
        rate = len(times) / span
        return None if (now - times[-1]) * rate > _STALE else rate


def average_answer(before: float | None, completion: int, max_tokens: float) -> float:
    """The EWMA of answers' lengths (tokens) after one more of ``completion`` tokens.

    An answer that reached its ``max_tokens`` was cut there: its own length is longer
    and unknown, so it raises the average and never lowers it. Counted as given, a
    burst of short capped answers (a probe, a title, a classification) would predict
    the next long ones short, and the queue would tell their refused callers a place
    long before one frees."""
    if before is None:
        return completion
    if completion >= max_tokens and completion < before:
        return before
    return before + _EWMA * (completion - before)


class ServiceWindow:
    """Weighted tokens charged per whole second over the last ``size`` seconds."""

    __slots__ = ("_seconds", "_tokens", "last")

    def __init__(self, size: int) -> None:
        self._seconds = [-1] * size
        self._tokens = [0.0] * size
        self.last = -math.inf  # the last second anything was added (skips idle flows)

    def add(self, now: float, tokens: float) -> None:
        """Charge ``tokens`` at ``now``."""
        second = math.floor(now)
        index = second % len(self._seconds)
        if self._seconds[index] != second:  # a slot of an older second: start it afresh
            self._seconds[index] = second
            self._tokens[index] = 0.0
        self._tokens[index] += tokens
        self.last = second

    def settle(self, charged_at: float, now: float, tokens: float) -> None:
        """Correct a charge made at ``charged_at`` by ``tokens``, in its own second: the
        window holds what the requests it saw start were charged, as settled. A charge
        already out of the window at ``now`` takes no correction (the correction alone
        would read as service the user gave back: a negative share)."""
        second = math.floor(charged_at)
        if second <= math.floor(now) - len(self._seconds):
            return
        index = second % len(self._seconds)
        if self._seconds[index] == second:  # else nothing was charged then to correct
            self._tokens[index] += tokens

    def total(self, now: float) -> float:
        """The tokens charged in the ``size`` seconds up to ``now``."""
        second = math.floor(now)
        oldest = second - len(self._seconds)
        if self.last <= oldest:
            return 0.0
        return sum(t for s, t in zip(self._seconds, self._tokens, strict=True) if s > oldest)


def jain_index(values: list[float]) -> float:
    """Jain's fairness index ``(sum x)^2 / (n * sum x^2)``: 1 when all are equal, ``1/n``
    when one takes everything; 1.0 for fewer than two values or all zero."""
    if len(values) < 2:
        return 1.0
    squares = sum(v * v for v in values)
    if squares == 0:
        return 1.0
    return sum(values) ** 2 / (len(values) * squares)
