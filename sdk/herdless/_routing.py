"""Which backends a call may use, in which order: primaries, then fallbacks.

- **Data guard**: a call with ``allow_fallback=False`` never reaches a fallback, and
  never any backend marked ``external=True``; a client whose ``FallbackPolicy`` has
  ``allow_external=False`` never reaches an external backend at all. Backends kept
  out this way are listed in ``Route.refused`` so the error can say so.
- **Batch work** (``priority="batch"``) waits for the GPU: it never spills to an
  external fallback (an external primary is still its primary). Not a guard the caller
  set, so those fallbacks are left out quietly, not listed as refused.
- **Several primaries** (several GPU servers behind their gateways): the first one is
  chosen per call by the *power of two choices*: two random healthy primaries, the one
  with fewer calls in flight wins. "Healthy" means its breaker lets a call through and
  no Retry-After window is running. The other primaries follow, healthy ones first,
  then the fallbacks in their given order.

What may spill to external backends (the share of calls, their count per minute, the
tokens and money they used) is capped apart, by the spend guard (``herdless._spend``),
from the caps ``FallbackPolicy`` sets.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from herdless._backend import Backend
from herdless._bounds import require

__all__ = ["FallbackPolicy", "Route", "plan_route"]


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
        require(
            self,
            ">= 0",
            "max_external_per_minute",
            "max_busy_wait",
            "max_external_tokens",
            "max_external_cost",
            optional=True,
        )
        require(self, "> 0", "spend_window")
        require(self, ">= 0", "min_attempt", "degraded_interval")


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
    batch: bool = False,
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
        elif batch and backend.external and backend in fallbacks:
            continue
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
