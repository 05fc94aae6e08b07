"""See every decision the client takes: logs, OpenTelemetry traces, Prometheus metrics.

    python examples/observability/observed.py --metrics-port 9464
    curl localhost:9464/metrics     # in another terminal

- **Logs**: herdless logs every event on the ``herdless`` logger (no handler by default:
  the app decides). Breaker changes, failed calls and ``PrimaryDegraded`` are WARNING,
  other decisions INFO, routine steps DEBUG; the event's fields are in ``record.herdless``.
- **Traces**: ``herdless.otel.OpenTelemetryHook`` makes one span per call with a span
  event per decision, on the app's tracer provider.
- **Metrics**: ``herdless.prometheus.PrometheusHook`` counts attempts, failures,
  fallbacks, retries, waits and breaker states, labelled by backend.

A client takes one ``on_event`` hook; :func:`fan_out` gives it several.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import threading
from collections.abc import Callable
from typing import Any

import herdless
from herdless.events import Event
from herdless.otel import OpenTelemetryHook
from herdless.prometheus import PrometheusHook

Hook = Callable[[Event], Any]


def fan_out(*hooks: Hook) -> Hook:
    """One hook that calls each of ``hooks`` in turn (herdless logs one that raises)."""

    def hook(event: Event) -> None:
        for each in hooks:
            each(event)

    return hook


class JsonFormatter(logging.Formatter):
    """One JSON object per line, with the event's fields: ready for Loki or Elastic."""

    def format(self, record: logging.LogRecord) -> str:
        line = {"level": record.levelname, "logger": record.name, "message": record.getMessage()}
        fields = getattr(record, "herdless", None)
        if isinstance(fields, dict):
            line.update(fields)
        return json.dumps(line, default=str)


def setup_logging(level: int = logging.INFO) -> logging.Handler:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("herdless")
    logger.addHandler(handler)
    logger.setLevel(level)
    return handler


def build_client(
    *, tracer_provider: Any = None, registry: Any = None, **options: Any
) -> herdless.Client:
    """A client whose events go to OpenTelemetry and Prometheus (logs go by themselves)."""
    hook = fan_out(
        OpenTelemetryHook(tracer_provider=tracer_provider),
        PrometheusHook(registry),
    )
    return herdless.Client(on_event=hook, **options)


def main(argv: list[str] | None = None) -> None:
    """One call through an observed client, then its metrics page until Ctrl-C."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
    from prometheus_client import start_http_server

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--metrics-port", type=int, default=9464, help="default: 9464")
    port = parser.parse_args(argv).metrics_port
    setup_logging()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    trace.set_tracer_provider(provider)
    with build_client() as client:
        print(client.chat([{"role": "user", "content": "Hello"}]).content, flush=True)
        # Opened after the call, so the first scrape already shows it.
        start_http_server(port, addr="127.0.0.1")
        print(f"metrics on http://127.0.0.1:{port}/metrics; Ctrl-C to quit", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":
    main()
