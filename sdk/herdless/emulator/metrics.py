"""The emulator's counters and their Prometheus text, under vLLM's metric names and
labels (written by :mod:`herdless._exposition`, as the gateway's are)."""

from __future__ import annotations

from typing import Protocol

from herdless._exposition import Exposition, Histogram, labels

__all__ = ["EngineMetrics", "EngineView", "render"]

# vLLM's own bucket bounds for these histograms (seconds), trimmed.
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 60.0)


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
    out = Exposition()
    base = {"engine": "0", "model_name": model}
    plain = labels(**base)

    def one(name: str, kind: str, help: str, value: float) -> None:
        out.family(name, kind, help, [(plain, value)])

    one("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
        engine.num_running)  # fmt: skip
    one("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
        engine.num_waiting)  # fmt: skip
    one("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
        engine.kv_usage())  # fmt: skip
    one("vllm:num_preemptions_total", "counter", "Cumulative number of preemptions.",
        m.preemptions)  # fmt: skip
    one("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
        m.prompt_tokens)  # fmt: skip
    one("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
        m.generation_tokens)  # fmt: skip
    # vLLM's waiting requests by reason: "capacity" (no slot or KV yet) and "deferred"
    # (waiting on something else, never the case here).
    out.family("vllm:num_requests_waiting_by_reason", "gauge", "Waiting requests by reason.",
               [(labels(**base, reason="capacity"), engine.num_waiting),
                (labels(**base, reason="deferred"), 0)])  # fmt: skip
    finished = {**m.finished, "error": 0, "repetition": 0}  # reasons vLLM has and we never give
    out.family("vllm:request_success_total", "counter", "Count of finished requests by reason.",
               [(labels(**base, finished_reason=r), n) for r, n in finished.items()])  # fmt: skip
    # vLLM counts admission rejections per frontend, not per engine: no engine label.
    out.family("vllm:admission_rejections_total", "counter", "Requests refused at admission.",
               [(labels(model_name=model, reason="max_num_queued_reqs"), m.rejected),
                (labels(model_name=model, reason="max_num_queued_tokens"), 0)])  # fmt: skip
    out.histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token.",
                  m.ttft, **base)  # fmt: skip
    out.histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency.",
                  m.itl, **base)  # fmt: skip
    out.histogram("vllm:e2e_request_latency_seconds", "Histogram of end-to-end latency.",
                  m.e2e, **base)  # fmt: skip
    return out.text()
