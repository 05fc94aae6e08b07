"""The emulator's counters and their Prometheus text, under vLLM's metric names.

Hand-written rather than prometheus-client: a dozen series, rendered on demand,
and the engine must stay importable and fast without the ``prometheus`` extra.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Protocol

__all__ = ["EngineMetrics", "EngineView", "Histogram", "render"]

# vLLM's own bucket bounds for these histograms (seconds), trimmed.
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 60.0)


class Histogram:
    """A cumulative-at-render histogram: ``observe`` is one bisect and two adds."""

    __slots__ = ("_counts", "bounds", "count", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self._counts = [0] * (len(bounds) + 1)  # the last slot is +Inf
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float, count: int = 1) -> None:
        """Record ``count`` observations of ``value`` (seconds)."""
        if count <= 0:
            return
        self._counts[bisect_left(self.bounds, value)] += count
        self.count += count
        self.sum += value * count

    def cumulative(self) -> list[tuple[str, int]]:
        """``(le, cumulative count)`` pairs, ``+Inf`` last."""
        out, total = [], 0
        for bound, n in zip((*map(repr, self.bounds), "+Inf"), self._counts, strict=True):
            total += n
            out.append((bound, total))
        return out


class EngineMetrics:
    """What the engine counts; the app adds admission rejections."""

    __slots__ = (
        "e2e",
        "finished",
        "generation_tokens",
        "itl",
        "preemptions",
        "prompt_tokens",
        "rejected",
        "ttft",
        "waiting",
    )

    def __init__(self) -> None:
        self.waiting = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.preemptions = 0
        self.rejected = 0
        # "abort" stays 0: vLLM 0.32 shows the series but counts no aborted request in it.
        self.finished = {"stop": 0, "length": 0, "abort": 0}
        self.ttft = Histogram(_TTFT_BUCKETS)
        self.itl = Histogram(_ITL_BUCKETS)
        self.e2e = Histogram(_E2E_BUCKETS)


class EngineView(Protocol):
    """What ``render`` reads of the engine (``herdless.emulator.engine.Engine``, which
    imports this module for its counters: a protocol here, not an import back)."""

    @property
    def metrics(self) -> EngineMetrics: ...
    @property
    def num_running(self) -> int: ...
    @property
    def num_waiting(self) -> int: ...
    def kv_usage(self) -> float: ...


def render(engine: EngineView, model: str) -> str:
    """The Prometheus text exposition of ``engine``'s state, labelled like vLLM's."""
    m = engine.metrics
    label = f'engine="0",model_name="{model}"'
    lines: list[str] = []

    def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} {kind}")
        for suffix_labels, value in samples:
            lines.append(f"{name}{suffix_labels} {value}")

    def hist(name: str, help_: str, h: Histogram) -> None:
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} histogram")
        for le, n in h.cumulative():
            lines.append(f'{name}_bucket{{{label},le="{le}"}} {n}')
        lines.append(f"{name}_count{{{label}}} {h.count}")
        lines.append(f"{name}_sum{{{label}}} {h.sum}")

    plain = f"{{{label}}}"
    metric("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
           [(plain, engine.num_running)])  # fmt: skip
    metric("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
           [(plain, engine.num_waiting)])  # fmt: skip
    metric("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
           [(plain, engine.kv_usage())])  # fmt: skip
    metric("vllm:num_preemptions_total", "counter", "Cumulative number of preemptions.",
           [(plain, m.preemptions)])  # fmt: skip
    metric("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
           [(plain, m.prompt_tokens)])  # fmt: skip
    metric("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
           [(plain, m.generation_tokens)])  # fmt: skip
    # vLLM's waiting requests by reason: "capacity" (no slot or KV yet) and "deferred"
    # (waiting on something else, never the case here).
    metric("vllm:num_requests_waiting_by_reason", "gauge", "Waiting requests by reason.",
           [(f'{{{label},reason="capacity"}}', engine.num_waiting),
            (f'{{{label},reason="deferred"}}', 0)])  # fmt: skip
    finished = {**m.finished, "error": 0, "repetition": 0}  # reasons vLLM has and we never give
    metric("vllm:request_success_total", "counter", "Count of finished requests by reason.",
           [(f'{{{label},finished_reason="{r}"}}', n) for r, n in finished.items()])  # fmt: skip
    # vLLM counts admission rejections per frontend, not per engine: no engine label.
    model_label = f'model_name="{model}"'
    metric("vllm:admission_rejections_total", "counter", "Requests refused at admission.",
           [(f'{{{model_label},reason="max_num_queued_reqs"}}', m.rejected),
            (f'{{{model_label},reason="max_num_queued_tokens"}}', 0)])  # fmt: skip
    hist("vllm:time_to_first_token_seconds", "Histogram of time to first token.", m.ttft)
    hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency.", m.itl)
    hist("vllm:e2e_request_latency_seconds", "Histogram of end-to-end latency.", m.e2e)
    return "\n".join(lines) + "\n"
