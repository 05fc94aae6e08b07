"""The demo's bookkeeping: every client event, counted per second and in total (pure).

:meth:`Tally.record` is the clients' ``on_event`` hook; the live view, the final
summary and the timeline plot all read the same counts, so what the demo shows
is what the SDK reported. Times are the events' own ``at`` (the client's
monotonic clock) minus the day's start, binned to whole seconds.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from herdless._percentiles import percentile
from herdless.events import (
    AttemptFailed,
    BackpressureReceived,
    BreakerStateChanged,
    CallFailed,
    CallFinished,
    Event,
    FallbackUsed,
    RetryScheduled,
)

__all__ = ["Tally"]


@dataclass(slots=True)
class Tally:
    """Counts of one demo run.

    Attributes:
        start: monotonic time of the day's start (seconds).
        deadline: the clients' deadline per call (seconds): a call that ends later is late.
        served: per second, calls served by each backend.
        refused: per second, attempts refused with 429.
        failed: per second, calls that raised.
        served_total: calls served by each backend.
        failed_by: calls that raised, by error class.
        fallbacks_by: calls moved to a fallback, by reason.
        refusals_by: refused attempts by HTTP status.
        retries: retries scheduled.
        waited: seconds of backoff scheduled, in total.
        breakers: the latest state of each backend's breakers, by state.
        latencies: seconds per served call.
        late: calls that ended (served or failed) after ``deadline``: the SDK promises none.
        late_by: the most seconds a late call overran ``deadline`` (a timer that fires a
            few milliseconds late on a busy machine shows here, not as a lost call).
        attempts: attempts per finished call (served or failed).
        gauges: the latest value of external gauges (the gateway's queue depth).
        spilled: per second, calls that moved from the primary to a fallback.
        gpu_busy: per second, samples of the GPU's busy share (running sequences /
            ``max_num_seqs``, read from vLLM's ``vllm:num_requests_running``).
        frontend_started: requests the chat front-end's employees sent (once each).
        frontend: their outcomes: ``gpu``, ``held`` (the GPU's answer after a wait in
            the gateway), ``spilled`` (the hosted model's), ``refused``.
    """

    start: float
    deadline: float = math.inf
    served: defaultdict[str, Counter[int]] = field(default_factory=lambda: defaultdict(Counter))
    refused: Counter[int] = field(default_factory=Counter)
    failed: Counter[int] = field(default_factory=Counter)
    served_total: Counter[str] = field(default_factory=Counter)
    failed_by: Counter[str] = field(default_factory=Counter)
    fallbacks_by: Counter[str] = field(default_factory=Counter)
    refusals_by: Counter[int] = field(default_factory=Counter)
    retries: int = 0
    waited: float = 0.0
    drains_seen: int = 0
    breakers: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    late: int = 0
    late_by: float = 0.0
    attempts: list[int] = field(default_factory=list)
    gauges: dict[str, float] = field(default_factory=dict)
    spilled: Counter[int] = field(default_factory=Counter)
    gpu_busy: defaultdict[int, list[float]] = field(default_factory=lambda: defaultdict(list))
    frontend_started: int = 0
    frontend: Counter[str] = field(default_factory=Counter)
    maintenance: dict[str, object] | None = None
    """The maintenance window as ``herdless maintain`` reported it (``None``: none ran)."""
    _breaker_of: dict[tuple[int, str], str] = field(default_factory=dict)

    def record(self, event: Event, *, client: int = 0) -> None:
        """Count one event; ``client`` tells the crowd's clients (and their breakers) apart."""
        second = self.second(event.at)
        match event:
            case CallFinished(backend=backend, latency=latency, attempts=attempts):
                name = backend or "?"
                self.served[name][second] += 1
                self.served_total[name] += 1
                self.latencies.append(latency)
                self.attempts.append(attempts)
                self._ended(latency)
            case CallFailed(error=error, attempts=attempts, latency=latency):
                self._ended(latency)
                self.failed[second] += 1
                self.failed_by[error] += 1
                self.attempts.append(attempts)
            case AttemptFailed(status=status) if status is not None:
                self.refusals_by[status] += 1
                if status == 429:
                    self.refused[second] += 1
            case RetryScheduled(delay=delay):
                self.retries += 1
                self.waited += delay
            case FallbackUsed(reason=reason):
                self.fallbacks_by[reason] += 1
                self.spilled[second] += 1
            case BackpressureReceived(draining=True):
                self.drains_seen += 1
            case BreakerStateChanged(backend=backend, new=new):
                key = (client, backend or "?")
                old = self._breaker_of.get(key)
                if old is not None:
                    self.breakers[old] -= 1
                self._breaker_of[key] = new
                self.breakers[new] += 1
            case _:
                pass

    def sample_gpu(self, at: float, busy: float) -> None:
        """One reading of the GPU's busy share (0 to 1) at monotonic time ``at``."""
        self.gpu_busy[self.second(at)].append(busy)

    def busy_share(self, seconds: Iterable[int]) -> float:
        """The GPU's mean busy share over ``seconds`` (``nan`` without samples)."""
        samples = [b for s in seconds for b in self.gpu_busy.get(s, ())]
        return sum(samples) / len(samples) if samples else math.nan

    def _ended(self, latency: float) -> None:
        if latency > self.deadline:
            self.late += 1
            self.late_by = max(self.late_by, latency - self.deadline)

    def second(self, at: float) -> int:
        """The whole second of the day that monotonic time ``at`` falls in."""
        return max(0, math.floor(at - self.start))

    def rate(self, counts: Counter[int], now: float, window: int = 2) -> float:
        """Mean events per second over the last ``window`` whole seconds before ``now``."""
        last = self.second(now) - 1
        return sum(counts[s] for s in range(last - window + 1, last + 1)) / window

    @property
    def finished(self) -> int:
        """Calls that ended, served or failed."""
        return sum(self.served_total.values()) + sum(self.failed_by.values())

    def latency(self, q: float) -> float:
        """The ``q``-th percentile of served calls' latency, seconds (``nan`` if none)."""
        return percentile(self.latencies, q)

    def mean_attempts(self) -> float:
        """Attempts per finished call (``nan`` if none)."""
        return sum(self.attempts) / len(self.attempts) if self.attempts else math.nan
