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
  ``request_duration_seconds``: histograms;
* fair share (read from the admission core at scrape time, see :class:`Fairness`):
  ``class_queue_depth{class}`` (gauge), ``tokens_served_total{class}`` (counter),
  ``displacements_total`` (counter), ``user_weighted_tokens{user}`` (gauge: the
  weighted tokens charged to each of the top users over the last window, the rest
  summed as ``user="other"``: a bounded label set) and ``fairness_jain{class}``
  (gauge: Jain's index over the users that waited throughout the last window).
"""

from __future__ import annotations

import bisect
import heapq
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["CONTENT_TYPE", "Fairness", "GatewayMetrics", "Histogram", "top_users"]

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


@dataclass(frozen=True, slots=True, kw_only=True)
class Fairness:
    """The fair-share figures of one scrape.

    Attributes:
        depth: requests waiting, per class.
        served: tokens of the finished requests, per class (a counter).
        displacements: batch waiters displaced so far (a counter).
        users: weighted tokens per user (``key`` or ``key/user``) over the last window.
        jain: Jain's index per class over the users that waited the whole window.
    """

    depth: Mapping[str, int]
    served: Mapping[str, int]
    displacements: int
    users: Mapping[str, float]
    jain: Mapping[str, float]


def top_users(users: Mapping[str, float], top: int) -> list[tuple[str, float]]:
    """The ``top`` users by service, largest first, then ``("other", the rest)``."""
    best = heapq.nlargest(top, users.items(), key=lambda item: item[1])
    rest = sum(users.values()) - sum(value for _, value in best)
    return [*best, ("other", max(0.0, rest))]


class GatewayMetrics:
    """All the gateway's metrics; gauges are read from ``gauges`` (and ``fairness``)
    at scrape time."""

    __slots__ = (
        "connections_closed",
        "duration",
        "fairness",
        "gauges",
        "queue_wait",
        "rejections",
        "requests",
        "top",
        "ttfb",
    )

    def __init__(
        self,
        gauges: Callable[[], dict[str, float]],
        *,
        fairness: Callable[[], Fairness] | None = None,
        top: int = 10,
    ) -> None:
        self.gauges = gauges
        self.fairness = fairness
        self.top = top
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
        if self.fairness is not None:
            lines += self._fair_share(self.fairness())
        for histogram in (self.queue_wait, self.ttfb, self.duration):
            lines += histogram.render()
        return "\n".join(lines) + "\n"

    def _fair_share(self, fair: Fairness) -> list[str]:
        lines = _labelled(
            "class_queue_depth", "gauge", "Requests waiting, by class.", "class", fair.depth
        )
        lines += _labelled(
            "tokens_served_total",
            "counter",
            "Tokens (prompt + completion) of the finished requests, by class.",
            "class",
            fair.served,
        )
        full = _PREFIX + "displacements_total"
        lines += [
            f"# HELP {full} Batch waiters displaced by interactive arrivals.",
            f"# TYPE {full} counter",
            f"{full} {fair.displacements}",
        ]
        lines += _labelled(
            "user_weighted_tokens",
            "gauge",
            "Weighted tokens charged to the top users over the last window; the rest as other.",
            "user",
            dict(top_users(fair.users, self.top)),
        )
        lines += _labelled(
            "fairness_jain",
            "gauge",
            "Jain's index over the users that waited throughout the last window, by class.",
            "class",
            fair.jain,
        )
        return lines


def _counter(name: str, help: str, label: str, values: Counter[int] | Counter[str]) -> list[str]:
    full = _PREFIX + name
    lines = [f"# HELP {full} {help}", f"# TYPE {full} counter"]
    # Label values are status codes and fixed reason codes: nothing to escape.
    lines += [f'{full}{{{label}="{key}"}} {count}' for key, count in sorted(values.items())]
    return lines


def _labelled(
    name: str, kind: str, help: str, label: str, values: Mapping[str, float] | Mapping[str, int]
) -> list[str]:
    full = _PREFIX + name
    lines = [f"# HELP {full} {help}", f"# TYPE {full} {kind}"]
    # Label values are class names, key ids and user hashes: nothing to escape.
    lines += [f'{full}{{{label}="{key}"}} {value!r}' for key, value in values.items()]
    return lines
