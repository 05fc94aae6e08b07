"""The client's shared state: what its calls learn and share, one per client, never global.

``ClientConfig`` (``herdless._config``) is what the client was told: frozen. This is
what it learns while it works: per backend a breaker, a retry budget, a window (flow
control) and a pacer; client-wide the backend holds (``herdless._holds``), the spend
guard, the hedge budget and the counters behind ``stats()``. Two clients in one process
share none of it. Each object guards itself with its own lock, so threads (``Client``)
and tasks (``AsyncClient``) share one client safely.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any, TypeAlias

from herdless._backend import Backend
from herdless._breaker import CircuitBreaker
from herdless._budget import RetryBudget
from herdless._clock import SYSTEM_CLOCK, Clock
from herdless._config import ClientConfig
from herdless._hedge import Hedging
from herdless._holds import BackendHolds
from herdless._pacing import Pacer
from herdless._routing import Route, plan_route
from herdless._spend import SpendGuard
from herdless._stats import ClientStats, DegradedTracker, StatsRecorder
from herdless._window import Window

__all__ = ["BackendParts", "ClientState"]

BackendParts: TypeAlias = tuple[CircuitBreaker, RetryBudget, Window, Pacer | None]
"""One backend's objects in a client: breaker, retry budget, window, pacer."""


class ClientState:
    """One client's shared, mutable state, built from its configuration.

    Args:
        config: the client's frozen configuration.
        clock: the monotonic clock (a ``FakeClock`` in tests).
        rng: the random source (seeded in tests); one per client.
        wall: Unix time, used only to read an HTTP-date ``Retry-After``.
    """

    def __init__(
        self,
        config: ClientConfig,
        *,
        clock: Clock = SYSTEM_CLOCK,
        rng: random.Random | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.clock = clock
        self.rng = rng or random.Random()
        self.wall = wall
        # Names, not Backends: a dataclass's == builds tuples, and this is asked per call.
        self.primary_names = frozenset(b.name for b in config.primaries)
        self.fallback_names = frozenset(b.name for b in config.fallbacks)
        self.keep_events = True
        """Whether calls keep their events for the driver's hook (``Call.take_events``);
        a client without ``on_event`` turns it off. Stats see every event either way."""
        self.holds = BackendHolds(clock=clock)
        self.spend = SpendGuard(config.fallback_policy, clock=clock)
        self.counts = StatsRecorder()
        """What ``stats()`` reports; calls count every event they emit here."""
        names = [backend.name for backend in config.backends]
        retry = config.retry
        self._breakers = {
            name: CircuitBreaker(config.breaker, clock=clock, rng=self.rng) for name in names
        }
        self._budgets = {
            name: RetryBudget(
                ratio=retry.budget_ratio,
                floor=retry.budget_floor,
                window=retry.budget_window,
                clock=clock,
            )
            for name in names
        }
        self._windows = {name: Window(config.window, clock=clock) for name in names}
        pacing = config.pacing
        self._pacers = {name: Pacer(pacing, clock=clock) for name in names} if pacing else {}
        self.hedging = Hedging(config.hedge) if config.hedge is not None else None
        """The hedge budget and first-byte times (``HedgePolicy``); ``None``: no hedging."""
        self._degraded = DegradedTracker(config.fallback_policy.degraded_interval)
        self.parts: dict[str, BackendParts] = {
            b.name: (
                self._breakers[b.name],
                self._budgets[b.name],
                self._windows[b.name],
                self._pacers.get(b.name),
            )
            for b in config.backends
        }
        """Per backend name: its breaker, retry budget, window and pacer."""
        self._routes = self.plan_routes()

    def stats(self) -> ClientStats:
        """Counts by backend and outcome, fallbacks by reason, retries, waits, breaker
        states, window sizes and latency percentiles."""
        errors = {name: w.wait_error() for name, w in self._windows.items()}
        return self.counts.snapshot(
            {name: b.state for name, b in self._breakers.items()},
            {name: w.size for name, w in self._windows.items()},
            {name: error for name, error in errors.items() if error},
        )

    def breaker(self, backend: Backend) -> CircuitBreaker:
        """The breaker of ``backend``."""
        return self._breakers[backend.name]

    def budget(self, backend: Backend) -> RetryBudget:
        """The retry budget of ``backend``."""
        return self._budgets[backend.name]

    def window(self, backend: Backend) -> Window:
        """The window (flow control) of ``backend``."""
        return self._windows[backend.name]

    def pacer(self, backend: Backend) -> Pacer | None:
        """The pacer of ``backend``, when pacing is on."""
        return self._pacers.get(backend.name)

    def route(self, *, allow_fallback: bool, batch: bool = False) -> Route:
        """The backends one call may try, in order (``batch``: a batch call's)."""
        if len(self.config.primaries) == 1:  # nothing to choose per call: plan once
            return self._routes[allow_fallback, batch]
        return self._plan(allow_fallback, batch)

    def served(self, backend: Backend, reason: str | None, *, now: float) -> dict[str, Any] | None:
        """A call was served at ``now``; ``PrimaryDegraded`` fields when one is due."""
        return self._degraded.served(
            primary=self.config.primaries[0].name,
            by_fallback=backend.name not in self.primary_names,
            reason=reason,
            now=now,
        )

    def plan_routes(self) -> dict[tuple[bool, bool], Route]:
        """The routes of a one-primary client, planned once: by ``(allow_fallback, batch)``."""
        pairs = [(allowed, batch) for allowed in (True, False) for batch in (False, True)]
        return {pair: self._plan(*pair) for pair in pairs}

    def _plan(self, allow_fallback: bool, batch: bool) -> Route:
        config = self.config
        return plan_route(
            config.primaries,
            config.fallbacks,
            allow_fallback=allow_fallback,
            allow_external=config.fallback_policy.allow_external,
            batch=batch,
            healthy=self._healthy,
            in_flight=lambda backend: self._windows[backend.name].in_use,
            rng=self.rng,
        )

    def _healthy(self, backend: Backend) -> bool:
        return self.breaker(backend).state != "open" and self.holds.held(backend.name)[0] == 0

    def __repr__(self) -> str:
        return f"ClientState(backends={[b.name for b in self.config.backends]!r})"
