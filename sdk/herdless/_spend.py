"""The spend guard: a cap on what may spill to external backends, per client.

``SpendGuard`` counts the calls of the last minute and those served by external
backends, and the tokens and money external answers used over
``FallbackPolicy.spend_window``; ``FallbackPolicy`` sets the caps (the share of calls,
their count per minute, the tokens, the cost priced by ``Backend.price``). A call that
would pass a cap waits for a place if its deadline allows, or ends with
``SpendLimitExceeded`` naming the cap (the ``spend`` check, ``herdless._call.checks``).
"""

from __future__ import annotations

import math
import threading
from collections import deque
from typing import Literal

from herdless._clock import Clock
from herdless._routing import FallbackPolicy

__all__ = ["SpendGuard", "SpendLimit"]

_SPEND_WINDOW = 60.0  # seconds: "per minute", and the window the share is measured over


SpendLimit = Literal["share", "calls", "tokens", "cost"]
"""Which cap of the spend guard keeps a call off the external backends."""


class SpendGuard:
    """Counts the calls of the last minute and those served by external backends, and
    the tokens and money external answers used over ``FallbackPolicy.spend_window``.

    ``admit()`` is asked before a call's first attempt at an external backend;
    ``record_usage()`` when an external answer is complete. The token and money caps
    are checked against answers already complete: calls in flight when a cap is reached
    may pass it by what they use themselves.
    """

    __slots__ = (
        "_calls",
        "_clock",
        "_count_calls",
        "_external",
        "_lock",
        "_max_cost",
        "_max_tokens",
        "_per_minute",
        "_share",
        "_spent",
        "_tokens",
        "_usage",
        "_window",
        "active",
    )

    def __init__(self, policy: FallbackPolicy, *, clock: Clock) -> None:
        self._share = policy.max_external_share
        self._per_minute = policy.max_external_per_minute
        self._max_tokens = policy.max_external_tokens
        self._max_cost = policy.max_external_cost
        self._window = policy.spend_window
        self._clock = clock
        self._lock = threading.Lock()
        self._calls: deque[float] = deque()
        self._external: deque[float] = deque()
        self._usage: deque[tuple[float, int, float]] = deque()  # (when, tokens, cost)
        self._tokens = 0  # sums over _usage
        self._spent = 0.0
        self._count_calls = self._share is not None or self._per_minute is not None
        self.active = any(
            cap is not None
            for cap in (self._share, self._per_minute, self._max_tokens, self._max_cost)
        )
        """Whether any cap is set."""

    def record_call(self) -> None:
        """One logical call started (the share's denominator)."""
        if self._count_calls:
            with self._lock:
                self._calls.append(self._clock.monotonic())

    def record_usage(self, tokens: int, cost: float | None) -> None:
        """An external answer is complete: it used ``tokens`` and cost ``cost``."""
        if self._max_tokens is None and self._max_cost is None:
            return
        with self._lock:
            self._usage.append((self._clock.monotonic(), tokens, cost or 0.0))
            self._tokens += tokens
            self._spent += cost or 0.0

    def admit(self) -> float:
        """``0.0`` and count the call when it may go external now; else the seconds until it
        may (``math.inf`` when waiting alone does not help: the share cap, or a cap of 0)."""
        if not self.active:
            return 0.0
        with self._lock:
            now = self._clock.monotonic()
            delay, _ = self._check(now)
            if delay <= 0:
                self._external.append(now)
            return delay

    def blocking(self) -> tuple[SpendLimit, str] | None:
        """Which cap keeps calls off the external backends now, and a sentence saying so
        (for ``SpendLimitExceeded``); ``None`` when none does."""
        if not self.active:
            return None
        with self._lock:
            return self._check(self._clock.monotonic())[1]

    def _check(self, now: float) -> tuple[float, tuple[SpendLimit, str] | None]:
        """(seconds until a call may go external, the cap in the way); under the lock."""
        for entries in (self._calls, self._external):
            while entries and entries[0] <= now - _SPEND_WINDOW:
                entries.popleft()
        usage = self._usage
        while usage and usage[0][0] <= now - self._window:
            _, tokens, cost = usage.popleft()
            self._tokens -= tokens
            self._spent -= cost
        used = len(self._external)
        per_minute = self._per_minute
        if per_minute is not None and used >= per_minute:
            why = (
                f"{used} calls went to external backends in the last minute, the cap is "
                f"{per_minute} (FallbackPolicy.max_external_per_minute)"
            )
            delay = self._external[used - per_minute] + _SPEND_WINDOW - now if per_minute else None
            return (math.inf if delay is None else delay), ("calls", why)
        share = self._share
        if share is not None and used + 1 > share * max(1, len(self._calls)):
            why = (
                f"{used} of the last minute's {len(self._calls)} calls went to external "
                f"backends, the cap is a share of {share:g} (FallbackPolicy.max_external_share)"
            )
            return math.inf, ("share", why)
        if self._max_tokens is not None and self._tokens >= self._max_tokens:
            why = (
                f"external backends used {self._tokens} tokens in the last "
                f"{self._window:g} s, the cap is {self._max_tokens} "
                "(FallbackPolicy.max_external_tokens)"
            )
            return self._until_below(now, 1, self._max_tokens), ("tokens", why)
        if self._max_cost is not None and self._spent >= self._max_cost:
            why = (
                f"external backends cost {self._spent:.6g} in the last {self._window:g} s, "
                f"the cap is {self._max_cost:g} (FallbackPolicy.max_external_cost)"
            )
            return self._until_below(now, 2, self._max_cost), ("cost", why)
        return 0.0, None

    def _until_below(self, now: float, column: int, cap: float) -> float:
        """Seconds until the answers leaving the window bring the sum of ``column`` below
        ``cap`` (``math.inf`` for a cap of 0: it never will)."""
        total = self._tokens if column == 1 else self._spent
        for entry in self._usage:
            total -= entry[column]
            if total < cap:
                return entry[0] + self._window - now
        return math.inf
