"""OpenTelemetry spans and metrics for a herdless client, from its events (the ``otel`` extra).

    from herdless.otel import OpenTelemetryHook

    client = herdless.Client(..., on_event=OpenTelemetryHook())

One CLIENT span per call, named ``chat {model}`` as the GenAI semantic conventions ask,
from its first attempt to its result (to the end of a stream), with
``gen_ai.operation.name``, ``gen_ai.request.model``, ``error.type`` on failure, and
herdless's own ``herdless.backend``, ``herdless.attempts``, ``herdless.fallback_reason``.
Every decision inside the call (attempt failed, retry scheduled, wait, backpressure,
breaker change, fallback) is a span event. The histogram
``gen_ai.client.operation.duration`` (seconds) records each call. The providers default
to the global ones, so the application's OpenTelemetry set-up decides where all of it goes.
"""

from __future__ import annotations

import threading
from dataclasses import fields
from typing import Any

try:
    from opentelemetry import metrics, trace
except ImportError as error:  # pragma: no cover -- the extra is installed in the test envs
    raise ImportError(
        "herdless.otel needs opentelemetry-api: pip install 'herdless[otel]'"
    ) from error

from herdless._version import __version__
from herdless.events import AttemptStarted, CallFailed, CallFinished, Event

__all__ = ["OpenTelemetryHook"]

# A stream the application never finishes leaves its span open; keep at most this many.
_MAX_OPEN_SPANS = 10_000


class OpenTelemetryHook:
    """An ``on_event`` hook that turns a client's events into spans and a duration metric.

    Args:
        tracer_provider: where spans go (default: the global provider).
        meter_provider: where the metric goes (default: the global provider).
    """

    def __init__(
        self,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
    ) -> None:
        self._tracer = trace.get_tracer("herdless", __version__, tracer_provider)
        meter = metrics.get_meter("herdless", __version__, meter_provider)
        self._duration = meter.create_histogram(
            "gen_ai.client.operation.duration", unit="s", description="GenAI operation duration."
        )
        self._lock = threading.Lock()
        self._spans: dict[str, tuple[trace.Span, str | None]] = {}

    def __call__(self, event: Event) -> None:
        call_id = event.call_id
        if call_id is None:
            return
        if isinstance(event, AttemptStarted):
            self._start(call_id, event.model)
        with self._lock:
            span, model = self._spans.get(call_id, (None, None))
        if isinstance(event, CallFinished | CallFailed):
            if span is None:  # failed before any attempt (deadline, guards)
                span, model = self._start(call_id, None), None
            self._end(call_id, span, model, event)
        elif span is not None and not isinstance(event, AttemptStarted):
            span.add_event(type(event).__name__, _attributes(event))

    def _start(self, call_id: str, model: str | None) -> trace.Span:
        with self._lock:
            if call_id in self._spans:
                return self._spans[call_id][0]
            span = self._tracer.start_span(
                f"chat {model}" if model else "chat",
                kind=trace.SpanKind.CLIENT,
                attributes={"gen_ai.operation.name": "chat", "herdless.request_id": call_id}
                | ({"gen_ai.request.model": model} if model else {}),
            )
            self._spans[call_id] = (span, model)
            if len(self._spans) > _MAX_OPEN_SPANS:
                oldest = next(iter(self._spans))
                self._spans.pop(oldest)[0].end()
            return span

    def _end(
        self, call_id: str, span: trace.Span, model: str | None, event: CallFinished | CallFailed
    ) -> None:
        with self._lock:
            self._spans.pop(call_id, None)
        attributes: dict[str, Any] = {"gen_ai.operation.name": "chat"}
        if model:
            attributes["gen_ai.request.model"] = model
        if event.backend:
            attributes["herdless.backend"] = event.backend
        span.set_attribute("herdless.attempts", event.attempts)
        if isinstance(event, CallFailed):
            attributes["error.type"] = event.error
            span.set_status(trace.Status(trace.StatusCode.ERROR, event.error))
        elif event.fallback_reason:
            span.set_attribute("herdless.fallback_reason", event.fallback_reason)
        span.set_attributes(attributes)
        span.end()
        self._duration.record(event.latency, attributes)


def _attributes(event: Event) -> dict[str, Any]:
    """The event's own fields as span-event attributes (OTel values: no ``None``)."""
    out: dict[str, Any] = {}
    for field in fields(event):
        value = getattr(event, field.name)
        if field.name not in ("call_id", "at") and value is not None:
            out[f"herdless.{field.name}"] = value
    return out
