"""The optional OpenTelemetry and Prometheus hooks, fed by real flows (skipped without extras)."""

from __future__ import annotations

import pytest
from tests.unit.flow_driver import make, ok, status

from herdless._breaker import BreakerPolicy
from herdless._retry import RetryPolicy
from herdless.events import Event


def _events() -> list[Event]:
    """One call retried then served by the fallback, and one that fails."""
    driver = make(
        [status(502), status(502), status(400)],
        [ok()],
        retry=RetryPolicy(max_attempts=2),
        breaker=BreakerPolicy(consecutive_failures=2),
    )
    driver.run(request_id="served")
    driver.script["primary"] = [status(400)]
    driver.clock.advance(60)
    with pytest.raises(Exception, match="400"):
        driver.run(request_id="refused")
    return driver.events


def test_prometheus_hook_counts() -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    from herdless.prometheus import PrometheusHook

    registry = prometheus_client.CollectorRegistry()
    hook = PrometheusHook(registry)
    for event in _events():
        hook(event)

    def value(name: str, **labels: str) -> float | None:
        sample: float | None = registry.get_sample_value(f"herdless_client_{name}", labels)
        return sample

    assert value("attempts_total", backend="primary") == 3
    assert value("attempt_failures_total", backend="primary", kind="status_502") == 2
    assert value("calls_total", backend="hosted", outcome="ok") == 1
    assert value("calls_total", backend="primary", outcome="error") == 1
    assert (
        value(
            "fallbacks_total", backend="hosted", from_backend="primary", reason="retries_exhausted"
        )
        == 1
    )
    assert value("retries_total", backend="primary", reason="status_502") == 1
    assert value("breaker_state", backend="primary") == 0  # opened, probed, closed again
    assert value("call_duration_seconds_count", backend="hosted") == 1
    assert value("primary_degraded_total", backend="primary") == 1


def test_opentelemetry_hook_spans_and_metric() -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind, StatusCode

    from herdless.otel import OpenTelemetryHook

    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    hook = OpenTelemetryHook(
        tracer_provider=tracer_provider, meter_provider=MeterProvider(metric_readers=[reader])
    )
    for event in _events():
        hook(event)

    served, refused = exporter.get_finished_spans()
    assert served.name == "chat llama"
    assert served.kind is SpanKind.CLIENT
    assert served.attributes is not None
    assert served.attributes["gen_ai.operation.name"] == "chat"
    assert served.attributes["gen_ai.request.model"] == "llama"
    assert served.attributes["herdless.backend"] == "hosted"
    assert served.attributes["herdless.fallback_reason"] == "retries_exhausted"
    names = [e.name for e in served.events]
    assert names.count("AttemptFailed") == 2
    assert {"RetryScheduled", "FallbackUsed", "BreakerStateChanged"} <= set(names)
    assert refused.status.status_code is StatusCode.ERROR
    assert refused.attributes is not None
    assert refused.attributes["error.type"] == "BadRequestError"

    data = reader.get_metrics_data()
    assert data is not None
    (metric,) = [
        m
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "gen_ai.client.operation.duration"
    ]
    counts = [getattr(point, "count", 0) for point in metric.data.data_points]
    assert sum(counts) == 2


def test_opentelemetry_hook_ends_a_call_that_never_sent() -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from herdless.events import CallFailed
    from herdless.otel import OpenTelemetryHook

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    hook = OpenTelemetryHook(tracer_provider=provider)
    hook(CallFailed(call_id="x", backend=None, at=0, attempts=0, latency=1.0, error="E"))
    (span,) = exporter.get_finished_spans()
    assert span.name == "chat"


def _served_events() -> list[Event]:
    """Events of real client calls: one whole answer from a priced external fallback
    (after the primary drained), one stream from the primary."""
    import httpx
    import respx

    import herdless
    from herdless.testing import FakeClock, MockBackend, draining, ok, stream

    router = respx.MockRouter(assert_all_called=False)
    gpu = MockBackend(router, "http://gpu.test:8000/v1")
    hosted = MockBackend(router, "https://hosted.test/v1")
    gpu.script(draining(), stream(["a", "b", "c"]))
    hosted.script(ok("four five six"))
    events: list[Event] = []
    clock = FakeClock()
    with herdless.Client(
        primary=herdless.Backend(name="primary", base_url="http://gpu.test:8000/v1"),
        fallback=herdless.Backend(
            name="hosted",
            base_url="https://hosted.test/v1",
            model="mini",
            external=True,
            price=herdless.Price(input=1.0, output=2.0),
        ),
        model="llama",
        on_event=events.append,
        clock=clock,
        sleep=clock.sleep,
        transport=httpx.MockTransport(router.handler),
        env_file=None,
    ) as client:
        client.chat([{"role": "user", "content": "hi"}])
        clock.advance(60)  # the drain's hold is over
        with client.chat([{"role": "user", "content": "hi"}], stream=True) as chunks:
            list(chunks)
    return events


def test_prometheus_hook_counts_tokens_and_cost() -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    from herdless.prometheus import PrometheusHook

    registry = prometheus_client.CollectorRegistry()
    hook = PrometheusHook(registry)
    for event in _served_events():
        hook(event)

    def value(name: str, **labels: str) -> float | None:
        sample: float | None = registry.get_sample_value(f"herdless_client_{name}", labels)
        return sample

    assert value("tokens_total", backend="hosted", type="input") == 1
    assert value("tokens_total", backend="hosted", type="output") == 3
    assert value("tokens_total", backend="primary", type="output") == 3  # the stream's usage
    assert value("cost_total", backend="hosted") == pytest.approx((1 * 1.0 + 3 * 2.0) / 1e6)
    assert value("cost_total", backend="primary") is None  # no price: no cost


def test_opentelemetry_hook_follows_the_genai_conventions() -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from herdless.otel import OpenTelemetryHook

    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    hook = OpenTelemetryHook(
        tracer_provider=tracer_provider,
        meter_provider=MeterProvider(metric_readers=[reader]),
        provider_name={"primary": "vllm"},
    )
    for event in _served_events():
        hook(event)

    whole, streamed = exporter.get_finished_spans()
    attributes = dict(whole.attributes or {})
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.provider.name"] == "openai"  # the backend that answered
    assert attributes["gen_ai.request.model"] == "llama"
    assert attributes["gen_ai.response.model"] == "mini"
    assert attributes["gen_ai.usage.input_tokens"] == 1
    assert attributes["gen_ai.usage.output_tokens"] == 3
    assert attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert (attributes["server.address"], attributes["server.port"]) == ("hosted.test", 443)
    assert attributes["herdless.cost"] == pytest.approx(7e-6)
    assert isinstance(attributes["gen_ai.response.id"], str)
    streamed_attributes = dict(streamed.attributes or {})
    assert streamed_attributes["gen_ai.provider.name"] == "vllm"
    assert streamed_attributes["server.port"] == 8000
    assert streamed_attributes["gen_ai.usage.output_tokens"] == 3

    data = reader.get_metrics_data()
    assert data is not None
    metrics = {
        m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    }
    usage = metrics["gen_ai.client.token.usage"]
    assert usage.unit == "{token}"
    by_type: dict[tuple[str, str], int] = {}
    for point in usage.data.data_points:
        point_attributes = dict(point.attributes or {})
        key = (
            str(point_attributes["gen_ai.provider.name"]),
            str(point_attributes["gen_ai.token.type"]),
        )
        by_type[key] = int(point.sum)  # type: ignore[union-attr]  # a histogram point
        assert point_attributes["gen_ai.operation.name"] == "chat"
        assert "gen_ai.response.model" in point_attributes
    assert by_type == {
        ("openai", "input"): 1,
        ("openai", "output"): 3,
        ("vllm", "input"): 1,
        ("vllm", "output"): 3,
    }
    durations = metrics["gen_ai.client.operation.duration"].data.data_points
    assert {dict(p.attributes or {}).get("server.address") for p in durations} == {
        "hosted.test",
        "gpu.test",
    }
