"""Prometheus metrics for a herdless client, from its events (the ``prometheus`` extra).

    from prometheus_client import start_http_server
    from herdless.prometheus import PrometheusHook

    hook = PrometheusHook()              # registers on prometheus_client's default registry
    client = herdless.Client(..., on_event=hook)

Metrics (``herdless_client_`` prefix), labelled by backend:
``attempts_total``, ``attempt_failures_total{kind}`` (``status_503``, ``connect``,
``first_byte_timeout``, ``stream_cut``, ...), ``calls_total{outcome}`` (``ok``/``error``),
``call_duration_seconds`` (histogram), ``fallbacks_total{from_backend,reason}``,
``retries_total{reason}``, ``waits_seconds_total{reason}``, ``breaker_state`` (0 closed,
1 half-open, 2 open), ``primary_degraded_total``, ``tokens_total{type}`` (``input`` /
``output``: the prompt and completion tokens of each answer, from its ``usage``) and
``cost_total`` (what the answers of a backend with a ``Price`` cost, in its currency).
"""

from __future__ import annotations

from typing import TypedDict

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
except ImportError as error:  # pragma: no cover -- the extra is installed in the test envs
    raise ImportError(
        "herdless.prometheus needs prometheus-client: pip install 'herdless[prometheus]'"
    ) from error

from herdless.events import (
    AttemptFailed,
    AttemptStarted,
    BreakerStateChanged,
    CallFailed,
    CallFinished,
    Event,
    FallbackUsed,
    PrimaryDegraded,
    ResponseReceived,
    RetryScheduled,
    WaitScheduled,
)

__all__ = ["PrometheusHook"]


class _Where(TypedDict):
    """Where every metric of one hook goes."""

    namespace: str
    registry: CollectorRegistry


_STATE = {"closed": 0, "half_open": 1, "open": 2}
# LLM calls last from tens of milliseconds (a refusal) to minutes (a long answer).
_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 60, 120)


class PrometheusHook:
    """An ``on_event`` hook that counts a client's events as Prometheus metrics.

    Args:
        registry: where to register (default: prometheus_client's global registry). Give
            each hook its own registry, or one hook per process: metric names are unique
            per registry.
        namespace: prefix of every metric name.
    """

    def __init__(
        self, registry: CollectorRegistry | None = None, *, namespace: str = "herdless_client"
    ) -> None:
        registry = REGISTRY if registry is None else registry
        where = _Where(namespace=namespace, registry=registry)
        self.attempts = Counter("attempts", "HTTP attempts sent.", ["backend"], **where)
        self.failures = Counter(
            "attempt_failures", "Attempts without a usable answer.", ["backend", "kind"], **where
        )
        self.calls = Counter("calls", "Calls ended.", ["backend", "outcome"], **where)
        self.duration = Histogram(
            "call_duration_seconds",
            "Seconds from call start to result.",
            ["backend"],
            buckets=_BUCKETS,
            **where,
        )
        self.fallbacks = Counter(
            "fallbacks",
            "Calls moved to another backend.",
            ["backend", "from_backend", "reason"],
            **where,
        )
        self.retries = Counter("retries", "Retries scheduled.", ["backend", "reason"], **where)
        self.waits = Counter(
            "waits_seconds", "Seconds of waits scheduled.", ["backend", "reason"], **where
        )
        self.breaker = Gauge(
            "breaker_state", "0 closed, 1 half-open, 2 open.", ["backend"], **where
        )
        self.degraded = Counter(
            "primary_degraded", "PrimaryDegraded signals.", ["backend"], **where
        )
        self.tokens = Counter(
            "tokens",
            "Tokens of the answers, from their usage: input (prompt) or output (completion).",
            ["backend", "type"],
            **where,
        )
        self.cost = Counter(
            "cost",
            "What the answers cost, at the backend's Price (its currency).",
            ["backend"],
            **where,
        )

    def __call__(self, event: Event) -> None:
        backend = event.backend or "-"
        if isinstance(event, AttemptStarted):
            self.attempts.labels(backend).inc()
        elif isinstance(event, AttemptFailed):
            kind = f"status_{event.status}" if event.status is not None else event.kind
            self.failures.labels(backend, kind).inc()
        elif isinstance(event, CallFinished):
            self.calls.labels(backend, "ok").inc()
            self.duration.labels(backend).observe(event.latency)
        elif isinstance(event, CallFailed):
            self.calls.labels(backend, "error").inc()
        elif isinstance(event, FallbackUsed):
            self.fallbacks.labels(backend, event.from_backend, event.reason).inc()
        elif isinstance(event, RetryScheduled):
            self.retries.labels(backend, event.reason).inc()
            self.waits.labels(backend, "retry").inc(event.delay)
        elif isinstance(event, WaitScheduled):
            self.waits.labels(backend, event.reason).inc(event.delay)
        elif isinstance(event, BreakerStateChanged):
            self.breaker.labels(backend).set(_STATE[event.new])
        elif isinstance(event, PrimaryDegraded):
            self.degraded.labels(backend).inc()
        elif isinstance(event, ResponseReceived):
            if event.input_tokens is not None:
                self.tokens.labels(backend, "input").inc(event.input_tokens)
            if event.output_tokens is not None:
                self.tokens.labels(backend, "output").inc(event.output_tokens)
            if event.cost is not None:
                self.cost.labels(backend).inc(event.cost)
