"""The gateway's Prometheus metrics, written in the text exposition format by hand.

Why not prometheus-client: it lives in the ``prometheus`` extra while the gateway
needs only ``server``; its default registry is process-global, and two gateways
in one process (tests, the demo) must not share counters. The gateway exposes
a handful of counters, three gauges and three histograms: a small, fixed
writer is shorter than the glue to a custom registry.

Exposed (all names prefixed ``herdless_gateway_``):

* ``requests_total{code}``: answered requests by HTTP status;
* ``rejections_total{reason}``: refusals by reason (``queue_full``, ...);
* ``connections_closed_total{reason}``: connections the gateway closed before a
  request reached a route (``head_too_large``, ``too_many_headers``,
  ``head_timeout``, ``peer_limit``; see :mod:`herdless.gateway.protocol`);
* ``queue_depth``, ``inflight``, ``inflight_tokens``: gauges read at scrape time;
* ``queue_wait_seconds``, ``ttfb_seconds`` (time to the upstream's first byte),
  ``request_duration_seconds``: histograms.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Sequence

__all__ = ["CONTENT_TYPE", "GatewayMetrics", "Histogram"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_PREFIX = "herdless_gateway_"
_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Histogram:
    """A cumulative Prometheus histogram over fixed upper bounds (seconds)."""

    __slots__ = ("_bounds", "_counts", "_sum", "help", "name")

    def __init__(self, name: str, help: str, bounds: Sequence[float] = _LATENCY_BUCKETS) -> None:
        self.name = name
        self.help = help
        self._bounds = tuple(bounds)
        self._counts = [0] * (len(self._bounds) + 1)  # the last one is +Inf
        self._sum = 0.0

    def observe(self, value: float) -> None:
        """Record one observation."""
        self._counts[bisect.bisect_left(self._bounds, value)] += 1
        self._sum += value

    @property
    def count(self) -> int:
        """Observations so far."""
        return sum(self._counts)

    def render(self) -> list[str]:
        """The exposition lines of this histogram."""
        full = _PREFIX + self.name
        lines = [f"# HELP {full} {self.help}", f"# TYPE {full} histogram"]
        cumulative = 0
        for bound, count in zip((*self._bounds, None), self._counts, strict=True):
            cumulative += count
            le = "+Inf" if bound is None else repr(float(bound))
            lines.append(f'{full}_bucket{{le="{le}"}} {cumulative}')
        lines.append(f"{full}_sum {self._sum!r}")
        lines.append(f"{full}_count {cumulative}")
        return lines


class GatewayMetrics:
    """All the gateway's metrics; gauges are read from ``gauges`` at scrape time."""

    __slots__ = (
        "connections_closed",
        "duration",
        "gauges",
        "queue_wait",
        "rejections",
        "requests",
        "ttfb",
    )

    def __init__(self, gauges: Callable[[], dict[str, float]]) -> None:
        self.gauges = gauges
        self.requests: Counter[int] = Counter()
        self.rejections: Counter[str] = Counter()
        self.connections_closed: Counter[str] = Counter()
        self.queue_wait = Histogram("queue_wait_seconds", "Time spent in the admission queue.")
        self.ttfb = Histogram("ttfb_seconds", "Time from admission to the upstream's first byte.")
        self.duration = Histogram("request_duration_seconds", "Time from arrival to the end.")

    def render(self) -> str:
        """The whole exposition text."""
        lines = _counter(
            "requests_total", "Answered requests by HTTP status.", "code", self.requests
        )
        lines += _counter(
            "rejections_total", "Refused requests by reason.", "reason", self.rejections
        )
        lines += _counter(
            "connections_closed_total",
            "Connections closed by the gateway's limits, by reason.",
            "reason",
            self.connections_closed,
        )
        gauge_help = {
            "queue_depth": "Requests waiting in the admission queue.",
            "inflight": "Requests running upstream.",
            "inflight_tokens": "Tokens (prompt + max_tokens) of the running requests.",
        }
        for name, value in self.gauges().items():
            full = _PREFIX + name
            lines += [f"# HELP {full} {gauge_help.get(name, name)}", f"# TYPE {full} gauge"]
            lines.append(f"{full} {value!r}")
        for histogram in (self.queue_wait, self.ttfb, self.duration):
            lines += histogram.render()
        return "\n".join(lines) + "\n"


def _counter(name: str, help: str, label: str, values: Counter[int] | Counter[str]) -> list[str]:
    full = _PREFIX + name
    lines = [f"# HELP {full} {help}", f"# TYPE {full} counter"]
    # Label values are status codes and fixed reason codes: nothing to escape.
    lines += [f'{full}{{{label}="{key}"}} {count}' for key, count in sorted(values.items())]
    return lines
