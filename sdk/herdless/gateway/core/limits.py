"""The gateway's limits (:class:`AdmissionConfig`) and its token bucket (pure, no I/O).

See :mod:`herdless.gateway.core.admission` for how they are applied and why the bucket
reserves a time for each refused caller instead of using aiolimiter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, Literal

from herdless._bounds import require

__all__ = [
    "CLASSES",
    "SCHEDULERS",
    "STATIC_CONCURRENCY",
    "AdmissionConfig",
    "Priority",
    "Scheduler",
    "SizingMode",
    "TokenBucket",
]

_NEVER = -math.inf

Priority = Literal["interactive", "batch"]
"""A request's class (``X-Herdless-Priority``): interactive work is dispatched first."""
CLASSES: Final[tuple[Priority, ...]] = ("interactive", "batch")
"""The priority classes, first served first."""

Scheduler = Literal["vtc", "round-robin", "fcfs"]
"""How the queue orders its waiters: token-fair (``vtc``), or the two reference orders."""
SCHEDULERS: Final[tuple[Scheduler, ...]] = ("vtc", "round-robin", "fcfs")
SizingMode = Literal["engine", "static"]
"""How the dispatch limit is found: from the engine's metrics, or the static limits only."""
STATIC_CONCURRENCY: Final = 64
"""Requests running at once while the engine has not said its size (no ``max_concurrency``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmissionConfig:
    """Limits of the gateway. ``None`` disables a limit. Times are in seconds.

    Attributes:
        max_concurrency: cap on the requests running upstream at once (``None``: sized
            from the engine, :mod:`herdless.gateway.core.sizing`; ``STATIC_CONCURRENCY``
            while the engine has not said its size).
        max_queue: requests waiting at once (0: refuse instead of waiting).
        queue_timeout: longest wait in the queue before a 429 ``queue_timeout``.
        rate: requests per second per key (token bucket refill).
        burst: requests a key may send at once (bucket size); defaults to
            ``max(1, ceil(rate))``.
        tokens_per_minute: LLM tokens (prompt + completion) per minute per key.
        max_inflight_tokens: cap on the KV budget: while static, the sum of the prices
            of the running requests; while sized, the peak KV they may reach.
        key_queue_share: fraction of the queue one key may hold (0 < share <= 1).
        initial_service_time: assumed run time of a request until one is measured.
        ewma_alpha: weight of the newest run time in the service-time average.
        max_retry_after: cap on any Retry-After (59 s: the clients that honour the header
            do so only below 60 s).
        drain_retry_after: Retry-After while draining with no announced window.
        upstream_retry_after: Retry-After while the upstream is not ready.
        scheduler: the order of the waiters: ``vtc`` (token-fair between keys, then
            between the users of a key, interactive before batch); ``round-robin`` (by
            requests, over the same units) and ``fcfs`` (one line) are reference
            orders that ignore the priority classes.
        prompt_weight: weight of a prompt token in a user's service (``vtc``).
        completion_weight: weight of a completion token in a user's service.
        max_users: most (class, user) flows the queue keeps a counter for; idle ones
            are forgotten, oldest first.
        interactive_reserve: slots batch work leaves free while interactive work was
            seen within ``reserve_window`` seconds (``None``: ``ceil(max_concurrency / 8)``).
        reserve_window: seconds after the last interactive request during which the
            reserve holds; afterwards batch may fill every slot.
        fair_window: seconds over which the service per user and the fairness index
            are measured (whole seconds).
        sizing: ``engine`` (the dispatch limit follows the engine's readings, under the
            caps) or ``static`` (the caps, or ``STATIC_CONCURRENCY``, only).
        stale_after: seconds without a reading of the engine before the limit falls
            back to the last good one.
    """

    max_concurrency: int | None = None
    max_queue: int = 256
    queue_timeout: float = 30.0
    rate: float | None = None
    burst: int | None = None
    tokens_per_minute: int | None = None
    max_inflight_tokens: int | None = None
    key_queue_share: float = 1.0
    initial_service_time: float = 1.0
    ewma_alpha: float = 0.2
    max_retry_after: float = 59.0
    drain_retry_after: float = 30.0
    upstream_retry_after: float = 2.0
    scheduler: Scheduler = "vtc"
    prompt_weight: float = 1.0
    completion_weight: float = 2.0
    max_users: int = 10_000
    interactive_reserve: int | None = None
    reserve_window: float = 30.0
    fair_window: float = 10.0
    sizing: SizingMode = "engine"
    stale_after: float = 1.0

    def __post_init__(self) -> None:
        require(self, ">= 0", "max_queue")
        require(
            self,
            "> 0",
            "queue_timeout",
            "initial_service_time",
            "max_retry_after",
            "drain_retry_after",
            "upstream_retry_after",
            "prompt_weight",
            "completion_weight",
            "max_users",
            "reserve_window",
            "stale_after",
        )
        limits = ("max_concurrency", "rate", "burst", "tokens_per_minute", "max_inflight_tokens")
        require(self, "> 0", *limits, optional=True)
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler must be one of {SCHEDULERS}, got {self.scheduler!r}")
        if self.sizing not in ("engine", "static"):
            raise ValueError(f"sizing must be 'engine' or 'static', got {self.sizing!r}")
        reserve = self.interactive_reserve
        if reserve is not None and not 0 <= reserve < self.static_concurrency:
            raise ValueError(
                f"interactive_reserve must be in [0, {self.static_concurrency}) "
                f"(the static concurrency), got {reserve!r}"
            )
        require(self, ">= 1", "fair_window")  # seconds
        if not 0 < self.key_queue_share <= 1:
            raise ValueError(f"key_queue_share must be in (0, 1], got {self.key_queue_share!r}")
        if not 0 < self.ewma_alpha <= 1:
            raise ValueError(f"ewma_alpha must be in (0, 1], got {self.ewma_alpha!r}")

    @property
    def effective_burst(self) -> int:
        """The request bucket's size: ``burst``, or ``max(1, ceil(rate))``."""
        if self.burst is not None:
            return self.burst
        return max(1, math.ceil(self.rate or 1))

    @property
    def static_concurrency(self) -> int:
        """Requests running at once while static: ``max_concurrency``, else 64."""
        return STATIC_CONCURRENCY if self.max_concurrency is None else self.max_concurrency

    @property
    def effective_reserve(self) -> int:
        """Slots batch leaves free for interactive work while static (see
        :meth:`reserve_for`)."""
        return self.reserve_for(self.static_concurrency)

    def reserve_for(self, limit: int) -> int:
        """Slots batch leaves free for interactive work at a limit of ``limit`` requests:
        ``interactive_reserve``, or ``ceil(limit / 8)``, at most ``limit - 1``."""
        if self.interactive_reserve is not None:
            return min(self.interactive_reserve, limit - 1)
        return min(limit - 1, math.ceil(limit / 8))

    @property
    def key_queue_limit(self) -> int:
        """Most requests one key may have waiting: ``ceil(max_queue * key_queue_share)``."""
        return math.ceil(self.max_queue * self.key_queue_share)

    def key_capacity(self, limit: int) -> int:
        """Most requests of one key the gateway holds at once, running or waiting, at a
        dispatch limit of ``limit``: ``limit + key_queue_limit``. Advertised to clients as
        ``X-Herdless-Capacity``, so that a herdless client sizes its window to it."""
        return limit + self.key_queue_limit


class TokenBucket:
    """A token bucket that refuses at once and reserves the k-th refused caller's time.

    ``level`` refills at ``refill`` tokens per second up to ``capacity``; a request
    costing ``cost`` passes when ``level >= min(cost, capacity)`` (so a price larger
    than the bucket still passes when it is full, and leaves a debt). On refusal,
    :meth:`reserve` returns the wait in seconds::

        retry_at = max(now + (cost - level) / refill, horizon + cost / refill)

    Why not aiolimiter here: ``AsyncLimiter`` is built to *wait* for capacity on the
    event loop's clock; the gateway must *refuse at once* and say when capacity will
    exist, for the k-th caller, on an injected clock that tests control. A token
    bucket with a reservation horizon is a dozen lines and gives exactly that.
    aiolimiter keeps the places where waiting is right (the benchmark's pacing).
    """

    __slots__ = ("_horizon", "_level", "_updated", "capacity", "refill")

    def __init__(self, *, capacity: float, refill: float, now: float) -> None:
        self.capacity = capacity
        self.refill = refill
        self._level = capacity
        self._updated = now
        self._horizon = _NEVER

    def level(self, now: float) -> float:
        """Tokens available at ``now`` (negative while in debt)."""
        self._refill(now)
        return self._level

    def allows(self, now: float, cost: float) -> bool:
        """Whether ``cost`` may be taken now (does not take it)."""
        return self.level(now) >= min(cost, self.capacity)

    def take(self, cost: float) -> None:
        """Take ``cost`` tokens (call after :meth:`allows`); the level may go negative."""
        self._level -= cost

    def settle(self, delta: float) -> None:
        """Give back (``delta > 0``) or charge more (``delta < 0``) after the fact."""
        self._level = min(self.capacity, self._level + delta)

    def reserve(self, now: float, cost: float) -> float:
        """Seconds until this refused caller may come back; moves the horizon."""
        cost = min(cost, self.capacity)
        ready = now + max(0.0, cost - self.level(now)) / self.refill
        at = max(ready, self._horizon + cost / self.refill)
        self._horizon = at
        return at - now

    def _refill(self, now: float) -> None:
        # Monotonic clocks never go back, but a max() keeps a skewed fake clock harmless.
        elapsed = max(0.0, now - self._updated)
        self._updated = now
        self._level = min(self.capacity, self._level + elapsed * self.refill)
