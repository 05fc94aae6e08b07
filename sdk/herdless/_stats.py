"""``client.stats()``: what the client did, derived from the events it emitted.

Every event the flow emits is counted by ``StatsRecorder`` (whether or not the user
gave an ``on_event`` hook), so the numbers and the events never disagree: through
``record``, or, for the two events of every call, through ``attempt`` and ``finished``,
which the flow calls without building the event when nobody would see it.
``DegradedTracker`` turns "the fallback keeps serving" into a ``PrimaryDegraded``
event repeated every ``interval`` seconds, so that a primary dead for days cannot
hide behind a working fallback.
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from herdless._percentiles import nearest_rank
from herdless.events import (
    AttemptFailed,
    AttemptStarted,
    BreakerState,
    CallFailed,
    CallFinished,
    Event,
    FallbackUsed,
    HedgeFinished,
    HedgeStarted,
    ResponseReceived,
    RetryScheduled,
    WaitScheduled,
)

if TYPE_CHECKING:
    pass

__all__ = ["ClientStats", "DegradedTracker", "StatsRecorder"]

# Latency percentiles are computed over the most recent calls only: bounded memory
# for a client that lives for weeks, and recent numbers are the ones that matter.
_LATENCY_SAMPLES = 2048
_PERCENTILES = {"p50": 0.50, "p90": 0.90, "p99": 0.99}


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientStats:
    """A snapshot of one client's counters.

    Attributes:
        calls: calls that ended (``succeeded + failed``).
        succeeded: calls that returned a result (a stream: that ended complete).
        failed: calls that raised.
        by_backend: per backend name, counts by outcome: ``"attempts"`` sent, ``"ok"``
            (calls it served), and each failure (``"status_503"``, ``"connect"``,
            ``"first_byte_timeout"``, ``"stream_cut"``, ...).
        fallbacks: calls that moved to another backend, by reason.
        retries: retries scheduled.
        waits: waits of any kind (retry backoff, Retry-After windows, budget, breaker).
        waited: seconds of those waits, summed.
        queued: times a call waited in the client for a slot of a backend's window.
        queued_for: seconds of those waits in the client, summed.
        breakers: each backend's breaker state now.
        windows: each backend's window now: calls let through at once (flow control).
        latency: seconds from call start to result over the recent successful calls:
            ``p50``, ``p90``, ``p99``, ``max`` (empty before the first success).
        tokens: per backend name, ``"prompt_tokens"`` and ``"completion_tokens"`` of the
            answers it gave (from their ``usage``; a stream's comes in its last chunk).
        cost: per backend with a ``Price``, what its answers cost, in the price's currency.
        hedges: per backend, the hedges sent to it (``HedgePolicy``).
        hedge_wins: per backend, the hedge races it won (its answer came first): the
            hedge's backend, or the late attempt's when it answered first after all.
        wait_error: per backend whose calls waited in the client, how far the client's
            wait estimate was from the waits that followed, over its recent waiters:
            ``p50``, ``p90`` (``|predicted - actual wait| / max(actual wait, answer
            time)``; 0.2 is 20 %) and ``samples``.
    """

    calls: int = 0
    succeeded: int = 0
    failed: int = 0
    by_backend: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    fallbacks: Mapping[str, int] = field(default_factory=dict)
    retries: int = 0
    waits: int = 0
    waited: float = 0.0
    queued: int = 0
    queued_for: float = 0.0
    breakers: Mapping[str, BreakerState] = field(default_factory=dict)
    windows: Mapping[str, float] = field(default_factory=dict)
    latency: Mapping[str, float] = field(default_factory=dict)
    tokens: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    cost: Mapping[str, float] = field(default_factory=dict)
    hedges: Mapping[str, int] = field(default_factory=dict)
    hedge_wins: Mapping[str, int] = field(default_factory=dict)
    wait_error: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """Plain dicts and numbers, for JSON or a log line."""
        return {
            "calls": self.calls,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "by_backend": {name: dict(counts) for name, counts in self.by_backend.items()},
            "fallbacks": dict(self.fallbacks),
            "retries": self.retries,
            "waits": self.waits,
            "waited": self.waited,
            "queued": self.queued,
            "queued_for": self.queued_for,
            "breakers": dict(self.breakers),
            "windows": dict(self.windows),
            "latency": dict(self.latency),
            "tokens": {name: dict(counts) for name, counts in self.tokens.items()},
            "cost": dict(self.cost),
            "hedges": dict(self.hedges),
            "hedge_wins": dict(self.hedge_wins),
            "wait_error": {name: dict(error) for name, error in self.wait_error.items()},
        }


class StatsRecorder:
    """Folds events into counters. Thread-safe; one per client."""

    __slots__ = (
        "_by_backend",
        "_cost",
        "_failed",
        "_fallbacks",
        "_hedge_wins",
        "_hedges",
        "_latencies",
        "_lock",
        "_queued",
        "_queued_for",
        "_retries",
        "_succeeded",
        "_tokens",
        "_waited",
        "_waits",
    )

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_backend: defaultdict[str, Counter[str]] = defaultdict(Counter)
        self._fallbacks: Counter[str] = Counter()
        self._latencies: deque[float] = deque(maxlen=_LATENCY_SAMPLES)
        self._succeeded = self._failed = self._retries = self._waits = 0
        self._waited = 0.0
        self._queued = 0
        self._queued_for = 0.0
        self._tokens: dict[str, list[int]] = {}  # [prompt, completion]: no Counter per call
        self._cost: dict[str, float] = {}
        self._hedges: Counter[str] = Counter()
        self._hedge_wins: Counter[str] = Counter()

    def record(self, event: Event) -> None:
        """Count one event."""
        if isinstance(event, AttemptStarted):
            self.sent(event.backend or "-")
        elif isinstance(event, CallFinished):
            self.finished(event.backend or "-", event.latency)
        elif isinstance(event, ResponseReceived):
            self.response(event.backend or "-", event.input_tokens, event.output_tokens, event.cost)
        else:
            with self._lock:
                self._record(event)

    def sent(self, backend: str) -> None:
        """Count an ``AttemptStarted`` (the flow's fast path: the event may not exist)."""
        with self._lock:
            self._by_backend[backend]["attempts"] += 1

    def finished(self, backend: str, latency: float) -> None:
        """Count a ``CallFinished`` (the flow's fast path: the event may not exist)."""
        with self._lock:
            self._by_backend[backend]["ok"] += 1
            self._succeeded += 1
            self._latencies.append(latency)

    def response(
        self,
        backend: str,
        input_tokens: int | None,
        output_tokens: int | None,
        cost: float | None,
    ) -> None:
        """Count a ``ResponseReceived`` (the fast path: the event may not exist)."""
        if input_tokens is None and output_tokens is None:
            return
        with self._lock:
            tokens = self._tokens.get(backend)
            if tokens is None:
                tokens = self._tokens[backend] = [0, 0]
            tokens[0] += input_tokens or 0
            tokens[1] += output_tokens or 0
            if cost is not None:
                self._cost[backend] = self._cost.get(backend, 0.0) + cost

    def slot_waited(self, seconds: float) -> None:
        """A call got its slot after waiting ``seconds`` in the client (or gave up its place)."""
        with self._lock:
            self._queued += 1
            self._queued_for += seconds

    def _record(self, event: Event) -> None:
        backend = event.backend or "-"
        if isinstance(event, AttemptFailed):
            outcome = f"status_{event.status}" if event.status is not None else event.kind
            self._by_backend[backend][outcome] += 1
        elif isinstance(event, CallFailed):
            self._failed += 1
        elif isinstance(event, FallbackUsed):
            self._fallbacks[event.reason] += 1
        elif isinstance(event, RetryScheduled | WaitScheduled):
            self._retries += isinstance(event, RetryScheduled)
            self._waits += 1
            self._waited += event.delay
        elif isinstance(event, HedgeStarted):
            self._hedges[backend] += 1
        elif isinstance(event, HedgeFinished) and event.winner is not None:
            self._hedge_wins[event.winner] += 1

    def snapshot(
        self,
        breakers: Mapping[str, BreakerState],
        windows: Mapping[str, float],
        wait_error: Mapping[str, Mapping[str, float]] | None = None,
    ) -> ClientStats:
        """The counters now, with the breakers' states, the windows' sizes and their wait
        estimates' errors."""
        with self._lock:
            ordered = sorted(self._latencies)
            latency: dict[str, float] = {}
            if ordered:
                for name, q in _PERCENTILES.items():
                    latency[name] = nearest_rank(ordered, q)
                latency["max"] = ordered[-1]
            return ClientStats(
                calls=self._succeeded + self._failed,
                succeeded=self._succeeded,
                failed=self._failed,
                by_backend={name: dict(counts) for name, counts in self._by_backend.items()},
                fallbacks=dict(self._fallbacks),
                retries=self._retries,
                waits=self._waits,
                waited=self._waited,
                queued=self._queued,
                queued_for=self._queued_for,
                breakers=dict(breakers),
                windows=dict(windows),
                latency=latency,
                tokens={
                    name: {"prompt_tokens": prompt, "completion_tokens": completion}
                    for name, (prompt, completion) in self._tokens.items()
                },
                cost=dict(self._cost),
                hedges=dict(self._hedges),
                hedge_wins=dict(self._hedge_wins),
                wait_error=dict(wait_error or {}),
            )


class DegradedTracker:
    """Tracks a degraded period: calls served by fallbacks while the primary does not serve.

    ``served`` returns the fields of a ``PrimaryDegraded`` event when one is due: at the
    first fallback of a period, then at most once per ``interval`` while it lasts. A call
    served by a primary ends the period.
    """

    __slots__ = ("_count", "_interval", "_last", "_lock", "_since")

    def __init__(self, interval: float) -> None:
        self._interval = interval
        self._lock = threading.Lock()
        self._since: float | None = None
        self._last = 0.0
        self._count = 0

    def served(
        self, *, primary: str, by_fallback: bool, reason: str | None, now: float
    ) -> dict[str, Any] | None:
        """Note one served call; return ``PrimaryDegraded`` fields when one is due."""
        if not by_fallback and self._since is None:
            return None  # no degraded period: nothing to end (most calls; no lock needed)
        with self._lock:
            if not by_fallback:
                self._since = None
                return None
            if self._since is None:
                self._since, self._count, self._last = now, 0, -float("inf")
            self._count += 1
            if now - self._last < self._interval:
                return None
            self._last = now
            return {
                "backend": primary,
                "since": self._since,
                "fallbacks": self._count,
                "reason": reason or "fallback",
            }
