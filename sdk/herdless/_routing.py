"""Which backends a call may use, in which order: primaries, then fallbacks.

- **Data guard**: a call with ``allow_fallback=False`` never reaches a fallback, and
  never any backend marked ``external=True``; a client whose ``FallbackPolicy`` has
  ``allow_external=False`` never reaches an external backend at all. Backends kept
  out this way are listed in ``Route.refused`` so the error can say so.
- **Several primaries** (several GPU servers behind their gateways): the first one is
  chosen per call by the *power of two choices*: two random healthy primaries, the one
  with fewer calls in flight wins. "Healthy" means its breaker lets a call through and
  no Retry-After window is running. The other primaries follow, healthy ones first,
  then the fallbacks in their given order.
- **Spend guard**: ``SpendGuard`` caps what may spill to external backends: the share
  of calls, or their count per minute; the tokens they used, or what those cost
  (``Backend.price``), over ``FallbackPolicy.spend_window``.
"""

from __future__ import annotations

import math
import random
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from herdless._backend import Backend
from herdless._clock import Clock

__all__ = ["FallbackPolicy", "Route", "SpendGuard", "SpendLimit", "plan_route"]

_SPEND_WINDOW = 60.0  # seconds: "per minute", and the window the share is measured over


@dataclass(frozen=True, slots=True, kw_only=True)
class FallbackPolicy:
    """When a call leaves a backend for the next one, and where it may not go.

    Args:
        reserve: share of the call's deadline kept for the backends after the current one.
            A primary that hangs uses at most ``1 - reserve`` of the deadline.
        on_backpressure: when a busy backend gives a call a time to come back and a
            fallback exists: ``"wait"`` (if the wait fits the deadline; the primary is
            cheaper) or ``"fallback"`` (go now; latency first). A drain or an outage
            always falls back now.
        max_busy_wait: seconds; the longest a call waits for a busy backend (in the
            client's queue, or for the server's reservation) before it spills to the next
            backend, measured as the wait it expects. ``None`` (the default): as long as the
            deadline, less ``reserve``, allows. A call with no backend after the busy one
            waits as long as its deadline allows, whatever this says.
        allow_external: ``False`` keeps every call of the client off ``external`` backends.
        max_external_share: at most this share of the calls of the last minute may be
            served by external backends (``None``: no cap).
        max_external_per_minute: at most this many calls per minute may go to external
            backends; past it calls wait for a slot if the deadline allows (``None``: no cap).
        max_external_tokens: at most this many tokens (prompt + completion) used by
            external backends over the last ``spend_window`` seconds (``None``: no cap).
        max_external_cost: at most this much money spent at external backends over the
            last ``spend_window`` seconds, priced by each backend's ``Price`` (a backend
            without one costs nothing; ``None``: no cap).
        spend_window: seconds; the sliding window of ``max_external_tokens`` and
            ``max_external_cost`` (default: an hour).
        min_attempt: seconds; a wait is taken only if at least this much of the deadline is
            left for the attempt after it.
        degraded_interval: seconds between two ``PrimaryDegraded`` events while fallbacks serve.
    """

    reserve: float = 0.4
    on_backpressure: Literal["wait", "fallback"] = "wait"
    max_busy_wait: float | None = None
    allow_external: bool = True
    max_external_share: float | None = None
    max_external_per_minute: int | None = None
    max_external_tokens: int | None = None
    max_external_cost: float | None = None
    spend_window: float = 3600.0
    min_attempt: float = 0.5
    degraded_interval: float = 60.0

    def __post_init__(self) -> None:
        if not 0 <= self.reserve < 1:
            raise ValueError(f"FallbackPolicy.reserve must be in [0, 1), got {self.reserve!r}")
        if self.on_backpressure not in ("wait", "fallback"):
            raise ValueError(
                "FallbackPolicy.on_backpressure must be 'wait' or 'fallback', "
                f"got {self.on_backpressure!r}"
            )
        share = self.max_external_share
        if share is not None and not 0 <= share <= 1:
            raise ValueError(f"FallbackPolicy.max_external_share must be in [0, 1], got {share!r}")
        per_minute = self.max_external_per_minute
        if per_minute is not None and per_minute < 0:
            raise ValueError(
                f"FallbackPolicy.max_external_per_minute must be >= 0, got {per_minute!r}"
            )
        if self.max_busy_wait is not None and not self.max_busy_wait >= 0:
            raise ValueError(
                f"FallbackPolicy.max_busy_wait must be >= 0, got {self.max_busy_wait!r}"
            )
        for name in ("max_external_tokens", "max_external_cost"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ValueError(f"FallbackPolicy.{name} must be >= 0, got {value!r}")
        if not self.spend_window > 0:
            raise ValueError(f"FallbackPolicy.spend_window must be > 0, got {self.spend_window!r}")
        for name in ("min_attempt", "degraded_interval"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"FallbackPolicy.{name} must be >= 0, got {getattr(self, name)!r}")


@dataclass(frozen=True, slots=True)
class Route:
    """The backends a call may try, in order, and those the data guard kept out."""

    backends: tuple[Backend, ...]
    refused: tuple[Backend, ...] = ()


def plan_route(
    primaries: Sequence[Backend],
    fallbacks: Sequence[Backend],
    *,
    allow_fallback: bool,
    allow_external: bool,
    healthy: Callable[[Backend], bool],
    in_flight: Callable[[Backend], int],
    rng: random.Random,
) -> Route:
    """Order the backends for one call (see the module docstring for the rules)."""
    ordered = [*_order_primaries(primaries, healthy, in_flight, rng), *fallbacks]
    allowed: list[Backend] = []
    refused: list[Backend] = []
    for backend in ordered:
        guarded = backend.external and not (allow_fallback and allow_external)
        if guarded or (not allow_fallback and backend in fallbacks):
            refused.append(backend)
        else:
            allowed.append(backend)
    return Route(tuple(allowed), tuple(refused))


def _order_primaries(
    primaries: Sequence[Backend],
    healthy: Callable[[Backend], bool],
    in_flight: Callable[[Backend], int],
    rng: random.Random,
) -> list[Backend]:
    if len(primaries) < 2:
        return list(primaries)
    up = [backend for backend in primaries if healthy(backend)]
    down = [backend for backend in primaries if backend not in up]
    if len(up) >= 2:
        first, second = rng.sample(up, 2)
        chosen = second if in_flight(second) < in_flight(first) else first
        rest = sorted((b for b in up if b is not chosen), key=in_flight)
        return [chosen, *rest, *down]
    return [*up, *down]


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
