"""One fallback, seen three ways: a JSON log line, a span with events, Prometheus counters."""

from __future__ import annotations

import json
import logging

import pytest
from observed import JsonFormatter, build_client, fan_out
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

import herdless
from herdless.testing import connect_error, ok

pytest_plugins = ["herdless.testing.pytest_plugin"]

GPU, HOSTED = "http://gpu.test/v1", "http://hosted.test/v1"


@pytest.fixture
def observed(herdless_backends, herdless_clock):
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    registry = CollectorRegistry()
    hosted = herdless.Backend(name="hosted", base_url=HOSTED, model="mini", external=True)
    gpu = herdless_backends(GPU).script(connect_error())
    herdless_backends(HOSTED).script(ok("from the hosted model"))
    with build_client(
        tracer_provider=provider,
        registry=registry,
        primary=GPU,
        model="gemma-4",
        fallback=hosted,
        clock=herdless_clock,
        sleep=herdless_clock.sleep,
    ) as client:
        yield client, spans, registry, gpu


def test_a_fallback_is_a_span_with_its_decisions(observed):
    client, spans, _, _ = observed
    client.chat([{"role": "user", "content": "Hello"}])
    (span,) = spans.get_finished_spans()
    assert span.name == "chat gemma-4"
    assert span.attributes["herdless.backend"] == "hosted"
    assert "FallbackUsed" in {event.name for event in span.events}


def test_a_fallback_is_counted_for_prometheus(observed):
    client, _, registry, _ = observed
    client.chat([{"role": "user", "content": "Hello"}])
    fallbacks = [
        sample
        for metric in registry.collect()
        for sample in metric.samples
        if sample.name == "herdless_client_fallbacks_total"
    ]
    assert fallbacks
    assert fallbacks[0].labels["from_backend"] == "primary"
    assert fallbacks[0].value == 1


def test_a_fallback_is_a_json_log_line(observed, caplog):
    client, _, _, _ = observed
    with caplog.at_level(logging.INFO, logger="herdless"):
        client.chat([{"role": "user", "content": "Hello"}])
    lines = [json.loads(JsonFormatter().format(record)) for record in caplog.records]
    fallback = next(line for line in lines if line["message"].startswith("FallbackUsed"))
    assert fallback["backend"] == "hosted"
    assert fallback["from_backend"] == "primary"
    assert not [line for line in lines if "sk-" in json.dumps(line)]


def test_fan_out_calls_every_hook():
    seen: list[str] = []
    hook = fan_out(lambda e: seen.append("a"), lambda e: seen.append("b"))
    hook(object())  # type: ignore[arg-type]
    assert seen == ["a", "b"]
