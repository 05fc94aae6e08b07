"""OpenTelemetry spans and metrics for a herdless client, from its events (the ``otel`` extra).

    from herdless.otel import OpenTelemetryHook

    client = herdless.Client(..., on_event=OpenTelemetryHook())

One CLIENT span per call, named ``chat {model}`` as the GenAI semantic conventions ask,
from its first attempt to its result (to the end of a stream), with the attributes the
conventions require or recommend for an inference call: ``gen_ai.operation.name``,
``gen_ai.provider.name``, ``gen_ai.request.model``, and, once the answer is complete
(``ResponseReceived``), ``gen_ai.response.model``, ``gen_ai.response.id``,
``gen_ai.response.finish_reasons``, ``gen_ai.usage.input_tokens``,
``gen_ai.usage.output_tokens``, ``server.address`` and ``server.port`` of the backend
that answered; ``error.type`` on failure. herdless adds ``herdless.backend``,
``herdless.attempts``, ``herdless.fallback_reason`` and ``herdless.cost``. Every
decision inside the call (attempt failed, retry scheduled, wait, backpressure, breaker
change, fallback) is a span event.

Metrics: the histograms ``gen_ai.client.operation.duration`` (seconds, each call) and
``gen_ai.client.token.usage`` (``{token}``, each answer's input and output tokens, told
apart by ``gen_ai.token.type``), with the conventions' advised bucket boundaries. The
providers default to the global ones, so the application's OpenTelemetry set-up decides
where all of it goes.

``gen_ai.provider.name`` is ``"openai"`` unless told otherwise: herdless speaks the
OpenAI API, and the conventions ask an OpenAI-compatible client to name the API it
speaks when it cannot know the system behind it. Name the system per backend with
``provider_name={"primary": "vllm", "hosted": "openai"}``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

try:
    from opentelemetry import metrics, trace
except ImportError as error:  # pragma: no cover -- the extra is installed in the test envs
    raise ImportError(
        "herdless.otel needs opentelemetry-api: pip install 'herdless[otel]'"
    ) from error

from herdless._version import __version__
from herdless.events import AttemptStarted, CallFailed, CallFinished, Event, ResponseReceived

__all__ = ["OpenTelemetryHook"]

# A stream the application never finishes leaves its span open; keep at most this many.
_MAX_OPEN_SPANS = 10_000
# The bucket boundaries the GenAI semantic conventions advise for each histogram.
_DURATION_BUCKETS = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
_TOKEN_BUCKETS = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)  # fmt: skip
_DEFAULT_PROVIDER = "openai"


@dataclass(slots=True)
class _Open:
    """One call's open span and what its metrics are labelled with."""

    span: trace.Span
    model: str | None
    labels: dict[str, Any] = field(default_factory=dict)


class OpenTelemetryHook:
    """An ``on_event`` hook that turns a client's events into spans and GenAI metrics.

    Args:
        tracer_provider: where spans go (default: the global provider).
        meter_provider: where the metrics go (default: the global provider).
        provider_name: ``gen_ai.provider.name``: one name for every backend, or one per
            backend name (``"openai"`` for a backend it does not name).
    """

    def __init__(
        self,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        provider_name: str | Mapping[str, str] = _DEFAULT_PROVIDER,
    ) -> None:
        self._tracer = trace.get_tracer("herdless", __version__, tracer_provider)
        meter = metrics.get_meter("herdless", __version__, meter_provider)
        self._duration = meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
        )
        self._tokens = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=_TOKEN_BUCKETS,
        )
        self._providers = provider_name
        self._lock = threading.Lock()
        self._spans: dict[str, _Open] = {}

    def _provider(self, backend: str | None) -> str:
        if isinstance(self._providers, str):
            return self._providers
        return self._providers.get(backend or "", _DEFAULT_PROVIDER)

    def __call__(self, event: Event) -> None:
        call_id = event.call_id
        if call_id is None:
            return
        if isinstance(event, AttemptStarted):
            self._start(call_id, event.model, event.backend)
        with self._lock:
            opened = self._spans.get(call_id)
        if isinstance(event, CallFinished | CallFailed):
            if opened is None:  # failed before any attempt (deadline, guards)
                opened = self._start(call_id, None, event.backend)
            self._end(call_id, opened, event)
        elif opened is not None and isinstance(event, ResponseReceived):
            self._response(opened, event)
        elif opened is not None and not isinstance(event, AttemptStarted):
            opened.span.add_event(type(event).__name__, _attributes(event))

    def _start(self, call_id: str, model: str | None, backend: str | None) -> _Open:
        with self._lock:
            if call_id in self._spans:
                return self._spans[call_id]
            labels: dict[str, Any] = {
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": self._provider(backend),
            }
            if model:
                labels["gen_ai.request.model"] = model
            span = self._tracer.start_span(
                f"chat {model}" if model else "chat",
                kind=trace.SpanKind.CLIENT,
                attributes={**labels, "herdless.request_id": call_id},
            )
            opened = self._spans[call_id] = _Open(span, model, labels)
            if len(self._spans) > _MAX_OPEN_SPANS:
                oldest = next(iter(self._spans))
                self._spans.pop(oldest).span.end()
            return opened

    def _response(self, opened: _Open, event: ResponseReceived) -> None:
        """The answer is complete: what it says about itself, and its token counts."""
        labels = opened.labels
        labels["gen_ai.provider.name"] = self._provider(event.backend)
        if event.model:
            labels["gen_ai.response.model"] = event.model
        if event.server_address:
            labels["server.address"] = event.server_address
            if event.server_port is not None:
                labels["server.port"] = event.server_port
        attributes: dict[str, Any] = dict(labels)
        if event.response_id:
            attributes["gen_ai.response.id"] = event.response_id
        if event.finish_reason:
            attributes["gen_ai.response.finish_reasons"] = [event.finish_reason]
        if event.input_tokens is not None:
            attributes["gen_ai.usage.input_tokens"] = event.input_tokens
            self._tokens.record(event.input_tokens, {**labels, "gen_ai.token.type": "input"})
        if event.output_tokens is not None:
            attributes["gen_ai.usage.output_tokens"] = event.output_tokens
            self._tokens.record(event.output_tokens, {**labels, "gen_ai.token.type": "output"})
        if event.cost is not None:
            attributes["herdless.cost"] = event.cost
        opened.span.set_attributes(attributes)

    def _end(self, call_id: str, opened: _Open, event: CallFinished | CallFailed) -> None:
        with self._lock:
            self._spans.pop(call_id, None)
        span, labels = opened.span, dict(opened.labels)
        if event.backend:
            labels["herdless.backend"] = event.backend
        span.set_attribute("herdless.attempts", event.attempts)
        if isinstance(event, CallFailed):
            labels["error.type"] = event.error
            span.set_status(trace.Status(trace.StatusCode.ERROR, event.error))
        elif event.fallback_reason:
            span.set_attribute("herdless.fallback_reason", event.fallback_reason)
        span.set_attributes(labels)
        span.end()
        self._duration.record(event.latency, labels)


def _attributes(event: Event) -> dict[str, Any]:
    """The event's own fields as span-event attributes (OTel values: no ``None``)."""
    out: dict[str, Any] = {}
    for item in fields(event):
        value = getattr(event, item.name)
        if item.name not in ("call_id", "at") and value is not None:
            out[f"herdless.{item.name}"] = value
    return out
