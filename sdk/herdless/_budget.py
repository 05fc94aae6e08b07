"""The retry budget: per backend, failing retries stay a fraction of recent calls.

When a backend is overloaded for good, per-call retries multiply the load exactly
when it hurts (three callers retrying twice is nine attempts). The budget keeps
attempts toward a backend near one per call, over a sliding window::

    failed_retries_in_window + retries_pending < ratio * calls_in_window + floor

A retry takes budget when it is *scheduled* (it then waits in backoff, then flies),
not when it is sent: a crowd that all failed at once cannot all schedule retries
first and overdraw it. A retry that **succeeds** gives its unit back: it did not add
to a storm, it was served. Only failed retries stay counted for the window. So a
backend that is down for good sees about ``1 + ratio`` attempts per call, while a
brief blip that refused a crowd (the gateway's queue was full for a moment) lets
the crowd through as fast as its retries succeed, and every call is served.

The budget bounds attempts, not outcomes: a call that finds it spent waits behind
for budget, or goes to the fallback (the flow decides). Pure: no sleeping,
no I/O; one lock makes it safe across threads and tasks.
"""

from __future__ import annotations

import threading
from collections import deque

from herdless._clock import Clock

__all__ = ["RetryBudget"]


class RetryBudget:
    """One backend's retry budget.

    Args:
        ratio: retries allowed per call in the window.
        floor: retries always allowed in the window, however few the calls.
        window: seconds of history.
        clock: the monotonic clock.

    >>> from herdless.testing import FakeClock
    >>> budget = RetryBudget(ratio=0.0, floor=1, window=10.0, clock=FakeClock())
    >>> budget.try_acquire(), budget.try_acquire()
    (True, False)
    """

    __slots__ = ("_calls", "_clock", "_floor", "_lock", "_ratio", "_retries", "_waiting", "_window")

    def __init__(self, *, ratio: float, floor: int, window: float, clock: Clock) -> None:
        self._ratio = ratio
        self._floor = floor
        self._window = window
        self._clock = clock
        self._lock = threading.Lock()
        self._calls: deque[float] = deque()
        self._retries: deque[float] = deque()
        self._waiting = 0  # retries reserved: waiting in backoff or in flight

    def record_call(self, now: float | None = None) -> None:
        """A call's first attempt at this backend, at ``now`` (the clock's when not given)."""
        with self._lock:
            self._calls.append(self._clock.monotonic() if now is None else now)
            # Drop what left the window here too: a backend that never fails never asks
            # try_acquire, and its history must not grow without bound.
            horizon = self._calls[-1] - self._window
            while self._calls[0] < horizon:
                self._calls.popleft()

    def try_acquire(self) -> bool:
        """Reserve one retry; ``False`` when the budget is spent. A reserved retry must end
        with ``settle`` (it was sent and answered) or ``cancel`` (it was not sent)."""
        with self._lock:
            self._prune()
            allowed = self._ratio * len(self._calls) + self._floor
            if len(self._retries) + self._waiting + 1 > allowed:  # +1: this one
                return False
            self._waiting += 1
            return True

    def settle(self, *, failed: bool) -> None:
        """A reserved retry was sent and answered; a failed one stays counted for the window."""
        with self._lock:
            self._waiting = max(0, self._waiting - 1)
            if failed:
                self._retries.append(self._clock.monotonic())

    def cancel(self) -> None:
        """A reserved retry ends without an answer (not sent, or abandoned in flight)."""
        with self._lock:
            self._waiting = max(0, self._waiting - 1)

    def _prune(self) -> None:
        horizon = self._clock.monotonic() - self._window
        for entries in (self._calls, self._retries):
            while entries and entries[0] < horizon:
                entries.popleft()

    def __repr__(self) -> str:
        with self._lock:
            return (
                f"RetryBudget(calls={len(self._calls)}, retries={len(self._retries)}, "
                f"waiting={self._waiting})"
            )
