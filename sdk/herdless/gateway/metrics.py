"""The gateway's Prometheus metrics, rendered at scrape time by the shared writer.

Counters and histograms live on one :class:`GatewayMetrics` per gateway (two gateways
in one process, as in the tests and the demo, share nothing); the text is written by
:mod:`herdless._exposition` (why not prometheus-client: there).

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
  (gauge: Jain's index over the users that waited throughout the last window);
* ``build_info{version,python}`` (always 1) and the standard ``process_*`` series
  (CPU seconds, resident and virtual memory, open and maximum file descriptors, start
  time: :func:`herdless._exposition.process_metrics`).
"""

from __future__ import annotations

import heapq
import platform
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from herdless._exposition import CONTENT_TYPE, Exposition, Histogram, labels, process_metrics
from herdless._version import __version__

__all__ = ["CONTENT_TYPE", "Fairness", "GatewayMetrics", "top_users"]

_PREFIX = "herdless_gateway_"
_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_GAUGES = {
    "queue_depth": "Requests waiting in the admission queue.",
    "inflight": "Requests running upstream.",
    "inflight_tokens": "Tokens (prompt + max_tokens) of the running requests.",
}
_HISTOGRAMS = {
    "queue_wait": ("queue_wait_seconds", "Time spent in the admission queue."),
    "ttfb": ("ttfb_seconds", "Time from admission to the upstream's first byte."),
    "duration": ("request_duration_seconds", "Time from arrival to the end."),
}


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
        self.queue_wait = Histogram(_LATENCY_BUCKETS)
        self.ttfb = Histogram(_LATENCY_BUCKETS)
        self.duration = Histogram(_LATENCY_BUCKETS)

    def render(self) -> str:
        """The whole exposition text."""
        out = Exposition()
        p = _PREFIX
        out.by(
            p + "requests_total",
            "counter",
            "Answered requests by HTTP status.",
            "code",
            {str(code): n for code, n in sorted(self.requests.items())},
        )
        out.by(
            p + "rejections_total",
            "counter",
            "Refused requests by reason.",
            "reason",
            dict(sorted(self.rejections.items())),
        )
        out.by(
            p + "connections_closed_total",
            "counter",
            "Connections closed by the gateway's limits, by reason.",
            "reason",
            dict(sorted(self.connections_closed.items())),
        )
        for name, value in self.gauges().items():
            out.one(p + name, "gauge", _GAUGES.get(name, name), value)
        if self.fairness is not None:
            self._fair_share(out, self.fairness())
        for attribute, (name, help) in _HISTOGRAMS.items():
            out.histogram(p + name, help, getattr(self, attribute))
        build = labels(version=__version__, python=platform.python_version())
        out.family(
            p + "build_info", "gauge", "The herdless version serving, always 1.", [(build, 1)]
        )
        process_metrics(out)
        return out.text()

    def _fair_share(self, out: Exposition, fair: Fairness) -> None:
        p = _PREFIX
        out.by(p + "class_queue_depth", "gauge", "Requests waiting, by class.", "class", fair.depth)
        out.by(
            p + "tokens_served_total",
            "counter",
            "Tokens (prompt + completion) of the finished requests, by class.",
            "class",
            fair.served,
        )
        out.one(
            p + "displacements_total",
            "counter",
            "Batch waiters displaced by interactive arrivals.",
            fair.displacements,
        )
        out.by(
            p + "user_weighted_tokens",
            "gauge",
            "Weighted tokens charged to the top users over the last window; the rest as other.",
            "user",
            dict(top_users(fair.users, self.top)),
        )
        out.by(
            p + "fairness_jain",
            "gauge",
            "Jain's index over the users that waited throughout the last window, by class.",
            "class",
            fair.jain,
        )
