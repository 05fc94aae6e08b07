"""Optional client-side pacing: a rate the client never exceeds toward one backend.

A token bucket per backend (``burst`` tokens, refilled at the current rate) whose rate
adapts AIMD-style, as TCP does: halved (``decrease``) on each 429, raised back by
``increase * rate`` on each success, never below ``min_rate`` nor above ``rate``::

    wait = max(0, (1 - tokens) / current_rate)      # tokens refilled since the last send

Pure and clock-injected like the other policies: ``reserve()`` books the next slot and
returns how long to wait for it; the flow yields that ``Sleep``. (aiolimiter's
``AsyncLimiter`` implements the same leaky bucket, but it awaits on the event loop
itself, so the sans-I/O flow shared with the sync client cannot use it.)
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from herdless._bounds import require
from herdless._clock import Clock

__all__ = ["Pacer", "PacingPolicy"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PacingPolicy:
    """How fast one client may send to each backend.

    Args:
        rate: requests per second the client never exceeds toward one backend.
        burst: requests that may go at once after a quiet period.
        min_rate: the rate never drops below this, however many 429s.
        decrease: the rate is multiplied by this on each 429.
        increase: each success adds ``increase * rate`` back, up to ``rate``.
    """

    rate: float
    burst: int = 1
    min_rate: float = 0.5
    decrease: float = 0.5
    increase: float = 0.05

    def __post_init__(self) -> None:
        require(self, "> 0", "rate", "min_rate", "increase")
        require(self, ">= 1", "burst")
        if not 0 < self.decrease < 1:
            raise ValueError(f"PacingPolicy.decrease must be in (0, 1), got {self.decrease!r}")
        if self.min_rate > self.rate:
            raise ValueError("PacingPolicy.min_rate must be <= rate")


class Pacer:
    """One backend's adaptive token bucket. Thread- and task-safe.

    >>> from herdless.testing import FakeClock
    >>> pacer = Pacer(PacingPolicy(rate=2.0), clock=FakeClock())
    >>> pacer.reserve(), pacer.reserve(), pacer.reserve()
    (0.0, 0.5, 1.0)
    """

    __slots__ = ("_clock", "_last", "_lock", "_policy", "_rate", "_tokens")

    def __init__(self, policy: PacingPolicy, *, clock: Clock) -> None:
        self._policy = policy
        self._clock = clock
        self._lock = threading.Lock()
        self._rate = policy.rate
        self._tokens = float(policy.burst)
        self._last = clock.monotonic()

    @property
    def rate(self) -> float:
        """The current rate, requests per second."""
        return self._rate

    def reserve(self) -> float:
        """Book the next send; return the seconds to wait before it (0 when a token is there).

        Tokens may go negative: each booking queues behind the previous ones, so callers
        that arrive together are spread ``1 / rate`` apart instead of all waking at once.
        """
        with self._lock:
            now = self._clock.monotonic()
            self._tokens = min(self._policy.burst, self._tokens + (now - self._last) * self._rate)
            self._last = now
            self._tokens -= 1.0
            return 0.0 if self._tokens >= 0 else -self._tokens / self._rate

    def refund(self) -> None:
        """Give back the last booking: it was not used (a hedge that did not start)."""
        with self._lock:
            self._tokens = min(self._policy.burst, self._tokens + 1.0)

    def throttled(self) -> None:
        """The backend answered 429: halve the rate."""
        with self._lock:
            self._rate = max(self._policy.min_rate, self._rate * self._policy.decrease)

    def succeeded(self) -> None:
        """The backend answered: raise the rate a little, back toward the ceiling."""
        with self._lock:
            policy = self._policy
            self._rate = min(policy.rate, self._rate + policy.increase * policy.rate)
