"""Hedged requests: what the user sets (``HedgePolicy``) and what the client learns
(``Hedging``: the hedge budget and the first-byte times behind ``after="auto"``).

A hedge sends a late attempt's request again, to the next backend the call may use, and
keeps whichever answers first (``herdless._call.race`` holds that rule). It trades a little
extra load for a shorter tail: "The Tail at Scale" (Dean and Barroso, 2013) defers the
second request until the first has been outstanding longer than the 95th percentile of
its kind, so that about 5 % of requests are sent twice.

- **When** (``after``): a fixed number of seconds, or ``"auto"``: the 95th percentile of
  the first-byte times the backend showed lately (its last ``_SAMPLES`` answers), never
  below ``HedgePolicy.min_after``; before ``_WARMUP`` answers are known, ``_START``
  seconds (the slowest attempts answer last, so the first answers are the fast ones).
- **How often** (``max_share``): a token bucket over calls. Every call adds ``max_share``
  of a token, up to ``max_share * _BUCKET_CALLS`` (at least one); a hedge takes one
  token. So over any run of ``n`` calls at most ``max_share * (n + _BUCKET_CALLS)``
  hedge, and a primary that is late for everyone is hedged for ``max_share`` of the
  calls, not all of them (the others see its timeouts, and its breaker opens).
"""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass
from typing import Final, Literal

from herdless._percentiles import nearest_rank

__all__ = ["FirstByteTimes", "HedgeBudget", "HedgePolicy", "Hedging"]

_QUANTILE: Final = 0.95
"""``after="auto"``: this quantile of the backend's recent first-byte times."""
_SAMPLES: Final = 200
"""First-byte times kept per backend."""
_REFRESH: Final = 20
"""The quantile is computed again every this many new times, not at every answer (a
quantile that moves a little late is still the backend's); at every new time while
fewer are known."""
_WARMUP: Final = 5
"""Below this many first-byte times, ``"auto"`` uses ``_START``. A few suffice: until
twenty are known the quantile is their maximum, the cautious side (fewer hedges)."""
_START: Final = 1.0
"""Seconds ``"auto"`` waits before it has measured the backend."""
_BUCKET_CALLS: Final = 100
"""The hedge budget holds the hedges of this many calls: a burst it allows."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HedgePolicy:
    """Send a late attempt again to the next backend; keep the first answer.

    After ``after`` seconds without a first byte from the route's first backend, the
    same request goes to the next backend the call may use (never one the data guard
    keeps out, never when the deadline cannot leave it time to answer). The first
    attempt to deliver its answer (a stream: its first chunk) wins; the other is
    cancelled at once, its connection closed.

    >>> HedgePolicy(after=2.0).max_share
    0.05
    >>> HedgePolicy(after="auto", max_share=0.15).after
    'auto'

    Args:
        after: seconds without a first byte before the hedge is sent, or ``"auto"``: the
            95th percentile of the backend's recent first-byte times (a stream's first
            chunk, a whole answer's body), at least ``min_after``.
        max_share: at most this share of calls hedge (a token bucket over calls, which
            also allows a burst of ``max_share * 100`` hedges).
        min_after: seconds; the least delay ``"auto"`` uses (a fast backend's jitter is
            no reason to send everything twice).

    Raises:
        ValueError: a value is out of range.
    """

    after: float | Literal["auto"]
    max_share: float = 0.05
    min_after: float = 0.1

    def __post_init__(self) -> None:
        after = self.after
        if after != "auto":
            # Checked at run time too: the environment and untyped callers reach here.
            number = isinstance(after, int | float) and not isinstance(after, bool)  # type: ignore[redundant-expr]
            if not number or not 0 < after < math.inf:
                raise ValueError(
                    f"HedgePolicy.after must be seconds > 0 or 'auto', got {self.after!r}"
                )
        if not 0 < self.max_share <= 1:
            raise ValueError(f"HedgePolicy.max_share must be in (0, 1], got {self.max_share!r}")
        if not 0 <= self.min_after < math.inf:
            raise ValueError(f"HedgePolicy.min_after must be >= 0, got {self.min_after!r}")


class HedgeBudget:
    """The token bucket that caps hedges at ``max_share`` of calls. Thread-safe.

    >>> budget = HedgeBudget(max_share=0.01)  # holds 1 token, starts full
    >>> budget.try_take(), budget.try_take()
    (True, False)
    """

    __slots__ = ("_capacity", "_lock", "_share", "_tokens")

    def __init__(self, *, max_share: float) -> None:
        self._share = max_share
        self._capacity = max(1.0, max_share * _BUCKET_CALLS)
        self._tokens = self._capacity  # a client's first calls may hedge too
        self._lock = threading.Lock()

    def deposit(self) -> None:
        """A call started: ``max_share`` of a token more (up to the capacity)."""
        with self._lock:
            self._tokens = min(self._capacity, self._tokens + self._share)

    def try_take(self) -> bool:
        """Take a token for one hedge; ``False`` when none is left."""
        with self._lock:
            # A hair under 1: twenty deposits of 0.05 add up to 0.9999999999999999.
            if self._tokens < 1.0 - 1e-9:
                return False
            self._tokens -= 1.0
            return True

    def refund(self) -> None:
        """Give back a token taken for a hedge that did not start."""
        with self._lock:
            self._tokens = min(self._capacity, self._tokens + 1.0)

    @property
    def tokens(self) -> float:
        """Tokens left now."""
        return self._tokens


class FirstByteTimes:
    """One backend's recent first-byte times, and their 95th percentile. Thread-safe.

    Only attempts that delivered a first byte are measured: one cancelled because a hedge
    won is not (it would pull the percentile toward ``after`` itself, and from there
    upward). The slowest attempts hedged away are therefore missing: the percentile is
    of the answers that came, which is what the hedge delay is compared with.
    """

    __slots__ = ("_fresh", "_lock", "_quantile", "_times")

    def __init__(self) -> None:
        self._times: deque[float] = deque(maxlen=_SAMPLES)
        self._fresh = 0  # times added since the quantile was computed
        self._quantile: float | None = None
        self._lock = threading.Lock()

    def add(self, seconds: float) -> None:
        """The backend delivered a first byte ``seconds`` after the attempt was sent."""
        with self._lock:
            self._times.append(seconds)
            self._fresh += 1
            known = len(self._times)
            if known >= _WARMUP and (known <= _REFRESH or self._fresh >= _REFRESH):
                ordered = sorted(self._times)
                self._quantile = nearest_rank(ordered, _QUANTILE)
                self._fresh = 0

    @property
    def quantile(self) -> float | None:
        """The 95th percentile of the recent times (their maximum while fewer than 20 are
        known); ``None`` before ``_WARMUP`` of them."""
        return self._quantile


class Hedging:
    """One client's hedging state: its budget and, for ``"auto"``, the backends' times.

    Args:
        policy: the client's ``HedgePolicy``.
    """

    __slots__ = ("_times", "budget", "policy")

    def __init__(self, policy: HedgePolicy) -> None:
        self.policy = policy
        self.budget = HedgeBudget(max_share=policy.max_share)
        self._times: dict[str, FirstByteTimes] = {}

    def delay(self, backend: str) -> float:
        """Seconds an attempt at ``backend`` waits for its first byte before it is hedged."""
        policy = self.policy
        if policy.after != "auto":
            return float(policy.after)
        times = self._times.get(backend)
        quantile = None if times is None else times.quantile
        return max(policy.min_after, _START if quantile is None else quantile)

    def answered(self, backend: str, seconds: float) -> None:
        """An attempt at ``backend`` delivered its first byte after ``seconds``."""
        if self.policy.after != "auto":
            return  # nothing to learn: the delay is fixed
        times = self._times.get(backend)
        if times is None:
            times = self._times.setdefault(backend, FirstByteTimes())
        times.add(seconds)

    def __repr__(self) -> str:
        return f"Hedging({self.policy!r}, tokens={self.budget.tokens:g})"
