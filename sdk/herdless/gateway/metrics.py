"""The gateway's Prometheus metrics, rendered at scrape time by the shared writer.

Counters and histograms live on one :class:`GatewayMetrics` per gateway (two gateways
in one process, as in the tests and the demo, share nothing); the text is written by
:mod:`herdless._exposition` (why not prometheus-client: there).

Exposed (all names prefixed ``herdless_gateway_``):

* ``requests_total{code}``: answered requests by HTTP status;
* ``rejections_total{reason}``: refusals by reason (``queue_full``, ...);
* ``waited_out_total{reason}``: the full queue's refusals not sent: a request whose
  client does not retry (its key's ``retries = false``, or a client that shows it), or
  a refused one come back, waited here for the place each named;
* ``comebacks_total``: requests known as a refused one sent again (the same key, client
  address and body as a refusal: a retry that says nothing of itself), kept;
* ``connections_closed_total{reason}``: connections the gateway closed before a
  request reached a route (``head_too_large``, ``too_many_headers``,
  ``head_timeout``, ``peer_limit``; see :mod:`herdless.gateway.protocol`);
* ``spills_total{key,reason,outcome}``: requests answered by the hosted fallback
  (``outcome="served"``), or not because its spend cap was reached (``spend_cap``) or
  it failed too (``failed``), by key id and the refusal they spilled instead of
  (``draining``, ``queue_full``, ``deadline_unattainable``, ...);
  ``spill_tokens_total{key,kind}``: the tokens the hosted model reported (``prompt``,
  ``completion``);
* ``queue_depth``, ``inflight``, ``inflight_tokens``: gauges read at scrape time;
* ``queue_wait_seconds``, ``ttfb_seconds`` (time to the upstream's first byte),
  ``request_duration_seconds``: histograms;
* fair share (read from the admission core at scrape time, see :class:`Fairness`):
  ``class_queue_depth{class}`` (gauge), ``tokens_served_total{class}`` (counter),
  ``displacements_total`` (counter), ``user_weighted_tokens{user}`` (gauge: the
  weighted tokens charged to each of the top users over the last window, the rest
  summed as ``user="other"``: a bounded label set) and ``fairness_jain{class}``
  (gauge: Jain's index over the users that waited throughout the last window);
* self-sizing (read from the sizing rule at scrape time, see :class:`SizingFigures`):
  ``dispatch_limit`` (requests the gateway lets run upstream now), ``sizing_mode{mode}``
  (1 for ``engine`` or ``static``: static when the engine publishes no size),
  ``dispatch_held{reason}`` (1 for what holds the next waiter back now: ``cap``, ``kv``,
  ``reserve``, ``spacing``, ``seqs``, ``engine_waiting``, ``stale``), ``engine_kv_capacity_tokens``,
  ``engine_kv_usage``, ``engine_running``, ``engine_waiting`` (as last read),
  ``engine_kv_fill`` (the share of the KV the rule fills, lowered by preemptions),
  ``engine_shared_prompt_tokens`` (prompt tokens of the running requests counted as
  found in the engine's prefix cache),
  ``engine_preemptions_total`` (preemptions seen), ``engine_readings_stale`` (1 while
  the limit is the last good one);
* the Responses API's kept output items (read from :class:`~herdless.gateway.items.ItemMemory`
  at scrape time): ``item_memory_bytes``, ``item_memory_items`` (gauges),
  ``item_memory_dropped_total`` (items dropped for newer ones) and
  ``item_references_total{outcome}`` (``written``, ``not_held``);
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
from typing import TYPE_CHECKING

from herdless._exposition import CONTENT_TYPE, Exposition, Histogram, labels, process_metrics
from herdless._version import __version__

if TYPE_CHECKING:
    from herdless.gateway.items import ItemMemory

__all__ = ["CONTENT_TYPE", "HOLDS", "Fairness", "GatewayMetrics", "SizingFigures", "top_users"]

_PREFIX = "herdless_gateway_"
_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_GAUGES = {
    "queue_depth": "Requests waiting in the admission queue.",
    "inflight": "Requests running upstream.",
    "inflight_tokens": "Tokens (prompt + max_tokens) of the running requests.",
    "draining": "1 while the gateway drains for maintenance (POST /admin/drain).",
    "upstream_ready": "1 while the upstream answers its health polls.",
    "upstream_asleep": "1 while the gateway has put the engine to sleep (--upstream-sleep).",
    "upstream_load_seconds": "Seconds the upstream took to load, last measured.",
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
        displacements: waiters displaced so far (a counter).
        users: weighted tokens per user (``key`` or ``key/user``) over the last window.
        jain: Jain's index per class over the users that waited the whole window.
    """

    depth: Mapping[str, int]
    served: Mapping[str, int]
    displacements: int
    users: Mapping[str, float]
    jain: Mapping[str, float]


HOLDS = ("cap", "kv", "reserve", "spacing", "seqs", "engine_waiting", "stale")
"""What may hold the next waiter back (``dispatch_held{reason}``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SizingFigures:
    """The self-sizing figures of one scrape (``None``: not read from the engine).

    Attributes:
        limit: requests the gateway lets run upstream now.
        mode: ``engine`` (sized from its readings) or ``static``.
        held: what holds the next waiter back now, or ``None``.
        kv_capacity: the engine's KV capacity in tokens.
        kv_usage: the engine's KV use as last read, 0 to 1.
        running: requests the engine ran, as last read.
        waiting: requests waiting in the engine's queue, as last read.
        fill: share of the KV capacity the rule fills now.
        preemptions: preemptions seen in the readings (a counter).
        stale: whether the readings are stale (the last good limit holds).
        shared_prompt: prompt tokens of the running requests counted as found in the
            engine's prefix cache.
    """

    limit: int
    mode: str
    held: str | None
    kv_capacity: int | None
    kv_usage: float | None
    running: int | None
    waiting: int | None
    fill: float
    preemptions: int
    stale: bool
    shared_prompt: float = 0.0


def top_users(users: Mapping[str, float], top: int) -> list[tuple[str, float]]:
    """The ``top`` users by service, largest first, then ``("other", the rest)``."""
    best = heapq.nlargest(top, users.items(), key=lambda item: item[1])
    rest = sum(users.values()) - sum(value for _, value in best)
    return [*best, ("other", max(0.0, rest))]


class GatewayMetrics:
    """All the gateway's metrics; gauges are read from ``gauges`` (and ``fairness``)
    at scrape time."""

    __slots__ = (
        "comebacks",
        "connections_closed",
        "drain_held",
        "duration",
        "fairness",
        "gauges",
        "held",
        "items",
        "queue_wait",
        "rejections",
        "requests",
        "sizing",
        "spill_tokens",
        "spills",
        "top",
        "ttfb",
        "waited_out",
    )

    def __init__(
        self,
        gauges: Callable[[], dict[str, float]],
        *,
        fairness: Callable[[], Fairness] | None = None,
        sizing: Callable[[], SizingFigures] | None = None,
        top: int = 10,
    ) -> None:
        self.gauges = gauges
        self.fairness = fairness
        self.sizing = sizing
        self.top = top
        self.held = 0
        """Requests that waited in the queue and then ran."""
        self.drain_held = 0
        """Requests still waiting when a drain ended (held through the window)."""
        self.comebacks = 0
        """Requests known as a refused one sent again by its body (see ``Comebacks``)."""
        self.requests: Counter[int] = Counter()
        self.rejections: Counter[str] = Counter()
        self.connections_closed: Counter[str] = Counter()
        self.spills: Counter[tuple[str, str, str]] = Counter()
        self.spill_tokens: Counter[tuple[str, str]] = Counter()
        self.waited_out: Counter[str] = Counter()
        """Refusals not sent: a request of a key whose clients do not retry waited for
        the place each named, by reason."""
        self.items: ItemMemory | None = None
        """The Responses API's kept output items, where the gateway keeps them."""
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
        out.one(p + "held_total", "counter", "Requests that waited, then ran.", self.held)
        out.by(
            p + "waited_out_total",
            "counter",
            "Refusals waited out here for clients that do not retry (again), by reason.",
            "reason",
            dict(sorted(self.waited_out.items())),
        )
        out.one(
            p + "comebacks_total",
            "counter",
            "Requests known by their body as a refused one sent again, kept to wait here.",
            self.comebacks,
        )
        out.one(
            p + "drain_held_total",
            "counter",
            "Requests held through a maintenance window, waiting at its resume.",
            self.drain_held,
        )
        out.by(
            p + "connections_closed_total",
            "counter",
            "Connections closed by the gateway's limits, by reason.",
            "reason",
            dict(sorted(self.connections_closed.items())),
        )
        out.family(
            p + "spills_total",
            "counter",
            "Requests spilled to the hosted fallback, by key, reason and outcome.",
            [
                (labels(key=key, reason=reason, outcome=outcome), n)
                for (key, reason, outcome), n in sorted(self.spills.items())
            ],
        )
        out.family(
            p + "spill_tokens_total",
            "counter",
            "Tokens the hosted fallback reported, by key and kind (prompt, completion).",
            [
                (labels(key=key, kind=kind), n)
                for (key, kind), n in sorted(self.spill_tokens.items())
            ],
        )
        for name, value in self.gauges().items():
            out.one(p + name, "gauge", _GAUGES.get(name, name), value)
        if self.fairness is not None:
            self._fair_share(out, self.fairness())
        if self.sizing is not None:
            self._sizing(out, self.sizing())
        if self.items is not None:
            self._items(out, self.items)
        for attribute, (name, help) in _HISTOGRAMS.items():
            out.histogram(p + name, help, getattr(self, attribute))
        build = labels(version=__version__, python=platform.python_version())
        out.family(
            p + "build_info", "gauge", "The herdless version serving, always 1.", [(build, 1)]
        )
        process_metrics(out)
        return out.text()

    def _sizing(self, out: Exposition, size: SizingFigures) -> None:
        p = _PREFIX
        out.one(p + "dispatch_limit", "gauge", "Requests let run upstream now.", size.limit)
        out.by(
            p + "sizing_mode",
            "gauge",
            "1 for how the limit is found: engine (its metrics) or static.",
            "mode",
            {mode: int(mode == size.mode) for mode in ("engine", "static")},
        )
        out.by(
            p + "dispatch_held",
            "gauge",
            "1 for what holds the next waiter back now.",
            "reason",
            {reason: int(reason == size.held) for reason in HOLDS},
        )
        engine = {
            "engine_kv_capacity_tokens": ("The engine's KV capacity, tokens.", size.kv_capacity),
            "engine_kv_usage": ("The engine's KV use as last read, 0 to 1.", size.kv_usage),
            "engine_running": ("Requests the engine ran, as last read.", size.running),
            "engine_waiting": ("Requests in the engine's own queue, as last read.", size.waiting),
        }
        for name, (help, value) in engine.items():
            if value is not None:
                out.one(p + name, "gauge", help, value)
        out.one(p + "engine_kv_fill", "gauge", "Share of the KV the rule fills now.", size.fill)
        out.one(
            p + "engine_shared_prompt_tokens",
            "gauge",
            "Prompt tokens of the running requests found in the engine's prefix cache.",
            size.shared_prompt,
        )
        out.one(
            p + "engine_preemptions_total",
            "counter",
            "Preemptions seen in the engine's readings.",
            size.preemptions,
        )
        out.one(
            p + "engine_readings_stale",
            "gauge",
            "1 while the readings are stale and the last good limit holds.",
            int(size.stale),
        )

    @staticmethod
    def _items(out: Exposition, memory: ItemMemory) -> None:
        p = _PREFIX
        out.one(
            p + "item_memory_bytes", "gauge", "Bytes the kept output items cost.", memory.held_bytes
        )
        out.one(p + "item_memory_items", "gauge", "Output items kept for references.", len(memory))
        out.one(
            p + "item_memory_dropped_total",
            "counter",
            "Kept output items dropped for newer ones within --item-memory-bytes.",
            memory.dropped,
        )
        out.by(
            p + "item_references_total",
            "counter",
            "item_reference inputs: written out as their item, or refused (not_held).",
            "outcome",
            memory.references,
        )

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
            "Waiters displaced by arrivals in a full queue.",
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
