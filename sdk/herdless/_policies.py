"""The per-client bundle of policy objects that both drivers hold: one per client, never
global. Two clients in one process share no breaker, budget, gate or counter.

``Client`` / ``AsyncClient`` build one ``Policies`` from their keywords and make one
``CallFlow(policies, ...)`` per ``chat()``; everything the flow decides runs against it.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import Any

from herdless._backend import Backend, Timeouts
from herdless._breaker import BreakerPolicy, CircuitBreaker
from herdless._budget import RetryBudget
from herdless._clock import SYSTEM_CLOCK, Clock
from herdless._gate import BackpressureGate
from herdless._pacing import Pacer, PacingPolicy
from herdless._retry import RetryPolicy
from herdless._routing import FallbackPolicy, Route, SpendGuard, plan_route
from herdless._stats import ClientStats, DegradedTracker, StatsRecorder
from herdless.events import (
    AttemptStarted,
    BreakerStateChanged,
    CallFailed,
    CallFinished,
    Event,
    PrimaryDegraded,
)

__all__ = ["DEFAULT_DEADLINE", "Policies"]

logger = logging.getLogger("herdless")
# A library logs; the application decides where it goes. Without this, Python's
# last-resort handler would print herdless's warnings to stderr of every user.
logger.addHandler(logging.NullHandler())

# Seconds for a whole call, waits and fallback included. An LLM answer of a few hundred
# tokens takes seconds to tens of seconds; a minute leaves room for a slow primary and
# still bounds a caller that would otherwise wait forever.
DEFAULT_DEADLINE = 60.0

# Routine steps are DEBUG; what an operator must see (a breaker moving, a call failing,
# a primary hidden behind a fallback) is WARNING; every other decision is INFO.
_LEVELS: dict[type[Event], int] = {
    AttemptStarted: logging.DEBUG,
    CallFinished: logging.DEBUG,
    BreakerStateChanged: logging.WARNING,
    CallFailed: logging.WARNING,
    PrimaryDegraded: logging.WARNING,
}


def _as_list(value: Backend | Sequence[Backend] | None) -> tuple[Backend, ...]:
    if value is None:
        return ()
    if isinstance(value, Backend):
        return (value,)
    return tuple(value)


class Policies:
    """Everything one client decides with: policies (frozen) and their state (shared).

    Args:
        primary: the primary backend, or several (chosen per call, power of two choices).
        fallback: backends to fall back to, in order.
        model: the client's default model name.
        retry: retry, backoff and retry-budget policy.
        breaker: circuit-breaker policy (one breaker per backend).
        fallback_policy: reserve, data guard, spend guard, backpressure choice.
        pacing: an optional rate each backend is never sent faster than (``None``: no cap).
        timeouts: per-attempt limits for backends that set none.
        deadline: default seconds for a whole call.
        clock: the monotonic clock (a ``FakeClock`` in tests).
        rng: the random source (seeded in tests); one per client.
        wall: Unix time, used only to read an HTTP-date ``Retry-After``.
    """

    def __init__(
        self,
        *,
        primary: Backend | Sequence[Backend],
        fallback: Backend | Sequence[Backend] | None = None,
        model: str | None = None,
        retry: RetryPolicy | None = None,
        breaker: BreakerPolicy | None = None,
        fallback_policy: FallbackPolicy | None = None,
        pacing: PacingPolicy | None = None,
        timeouts: Timeouts | None = None,
        deadline: float = DEFAULT_DEADLINE,
        clock: Clock = SYSTEM_CLOCK,
        rng: random.Random | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.primaries = _as_list(primary)
        self.fallbacks = _as_list(fallback)
        # Names, not Backends: a dataclass's == builds tuples, and this is asked per call.
        self.primary_names = frozenset(b.name for b in self.primaries)
        self.fallback_names = frozenset(b.name for b in self.fallbacks)
        self.keep_events = True
        """Whether calls keep their events for the driver's hook (``CallFlow.take_events``);
        a client without ``on_event`` turns it off. Stats see every event either way."""
        if not self.primaries:
            raise ValueError("at least one primary backend is required")
        names = [backend.name for backend in (*self.primaries, *self.fallbacks)]
        if len(set(names)) != len(names):
            raise ValueError(f"backend names must be unique, got {names!r}")
        if not deadline > 0:
            raise ValueError(f"deadline must be > 0 seconds, got {deadline!r}")
        self.model = model
        self.retry = retry or RetryPolicy()
        self.breaker_policy = breaker or BreakerPolicy()
        self.fallback_policy = fallback_policy or FallbackPolicy()
        self.timeouts = timeouts or Timeouts()
        self.deadline = deadline
        self.clock = clock
        self.rng = rng or random.Random()
        self.wall = wall
        self.gate = BackpressureGate(clock=clock)
        self.spend = SpendGuard(self.fallback_policy, clock=clock)
        self._breakers = {
            name: CircuitBreaker(self.breaker_policy, clock=clock, rng=self.rng) for name in names
        }
        self._budgets = {
            name: RetryBudget(
                ratio=self.retry.budget_ratio,
                floor=self.retry.budget_floor,
                window=self.retry.budget_window,
                clock=clock,
            )
            for name in names
        }
        self._pacers = (
            {name: Pacer(pacing, clock=clock) for name in names} if pacing is not None else {}
        )
        self._in_flight = dict.fromkeys(names, 0)
        self.counts_in_flight = len(self.primaries) > 1
        """Whether attempts are counted in flight (``enter`` / ``leave``): only the choice
        among several primaries reads the count."""
        self._lock = threading.Lock()
        self.counts = StatsRecorder()
        """What ``stats()`` reports; the flow counts every event it emits here."""
        self._degraded = DegradedTracker(self.fallback_policy.degraded_interval)
        self._routes = {allowed: self._plan(allowed) for allowed in (True, False)}

    def stats(self) -> ClientStats:
        """Counts by backend and outcome, fallbacks by reason, retries, waits, breaker
        states and latency percentiles."""
        return self.counts.snapshot({name: b.state for name, b in self._breakers.items()})

    # -- used by the flow ------------------------------------------------------------

    def breaker(self, backend: Backend) -> CircuitBreaker:
        """The breaker of ``backend``."""
        return self._breakers[backend.name]

    def budget(self, backend: Backend) -> RetryBudget:
        """The retry budget of ``backend``."""
        return self._budgets[backend.name]

    def pacer(self, backend: Backend) -> Pacer | None:
        """The pacer of ``backend``, when pacing is on."""
        return self._pacers.get(backend.name)

    def route(self, *, allow_fallback: bool) -> Route:
        """The backends one call may try, in order."""
        if len(self.primaries) == 1:  # nothing to choose per call: plan once
            return self._routes[allow_fallback]
        return self._plan(allow_fallback)

    def _plan(self, allow_fallback: bool) -> Route:
        return plan_route(
            self.primaries,
            self.fallbacks,
            allow_fallback=allow_fallback,
            allow_external=self.fallback_policy.allow_external,
            healthy=self._healthy,
            in_flight=self.in_flight,
            rng=self.rng,
        )

    def in_flight(self, backend: Backend) -> int:
        """Attempts at ``backend`` sent and not answered yet."""
        return self._in_flight[backend.name]

    def enter(self, backend: Backend) -> None:
        """An attempt at ``backend`` starts."""
        with self._lock:
            self._in_flight[backend.name] += 1

    def leave(self, backend: Backend) -> None:
        """An attempt at ``backend`` ended."""
        with self._lock:
            self._in_flight[backend.name] -= 1

    def served(self, backend: Backend, reason: str | None, *, now: float) -> dict[str, Any] | None:
        """A call was served at ``now``; ``PrimaryDegraded`` fields when one is due."""
        return self._degraded.served(
            primary=self.primaries[0].name,
            by_fallback=backend.name not in self.primary_names,
            reason=reason,
            now=now,
        )

    def publishes(self, event_type: type[Event]) -> bool:
        """Whether an event of this type would reach anyone: the hook, or the log."""
        return self.keep_events or logger.isEnabledFor(_LEVELS.get(event_type, logging.INFO))

    def log(self, event: Event) -> None:
        """Log an event (structured; events never hold secrets)."""
        level = _LEVELS.get(type(event), logging.INFO)
        if logger.isEnabledFor(level):  # building the fields costs; skip when unused
            data = {f.name: getattr(event, f.name) for f in fields(event)}
            logger.log(level, "%s %s", type(event).__name__, data, extra={"herdless": data})

    def _healthy(self, backend: Backend) -> bool:
        return self.breaker(backend).state != "open" and self.gate.blocked(backend.name)[0] == 0

    def __repr__(self) -> str:
        names = [b.name for b in self.primaries] + [b.name for b in self.fallbacks]
        return f"Policies(backends={names!r})"
