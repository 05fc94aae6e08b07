"""The emulator's counters and their Prometheus text, under vLLM's metric names,
labels, types and help texts (written by :mod:`herdless._exposition`, as the
gateway's are), as vLLM 0.32's ``PrometheusStatLogger`` declares them
(``vllm/v1/metrics/loggers.py``).

``vllm:cache_config_info`` is vLLM's "info" metric: a gauge set to 1.0 whose labels
are every field of its ``CacheConfig``, as strings (``CacheConfig.metrics_info``
in ``vllm/config/cache.py``: ``str(value)`` of each item of the instance's
``__dict__``, in declaration order), then ``engine``; no ``model_name``. A reader
takes the KV capacity from it: ``num_gpu_blocks * block_size`` tokens.
"""

from __future__ import annotations

from typing import Protocol

from herdless._exposition import Exposition, Histogram, labels

__all__ = ["EngineMetrics", "EngineView", "cache_config_labels", "render"]

# vLLM's own bucket bounds for these histograms (seconds), trimmed.
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
_WAITING_BY_REASON_HELP = (
    "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
    "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, "
    "KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting."
)
_REJECTIONS_HELP = "Number of admission attempts rejected by a queue limit, by reason."
_HELP = {
    "ttft": "Histogram of time to first token in seconds.",
    "itl": "Histogram of inter-token latency in seconds.",
    "e2e": "Histogram of e2e request latency in seconds.",
    "inference": "Histogram of time spent in RUNNING phase for request.",
    "answers": "Number of generation tokens processed.",
}
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 60.0)
# vLLM's 1-2-5 bounds for token counts (it stops them at max_model_len).
_TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000, 20_000)


class EngineMetrics:
    """What the engine counts (the scheduler its preemptions); the app adds admission
    rejections. Gauges (running, waiting, KV) are read from the engine itself."""

    __slots__ = (
        "answers",
        "e2e",
        "finished",
        "generation_tokens",
        "inference",
        "itl",
        "preemptions",
        "prefix_hits",
        "prefix_queries",
        "prompt_tokens",
        "rejected",
        "ttft",
    )

    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.preemptions = 0
        # Prompt tokens of new requests looked up in the prefix cache, and those found.
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.rejected = 0
        # "abort" stays 0: vLLM 0.32 shows the series but counts no aborted request in it.
        self.finished = {"stop": 0, "length": 0, "abort": 0}
        self.ttft = Histogram(_TTFT_BUCKETS)
        self.itl = Histogram(_ITL_BUCKETS)
        self.e2e = Histogram(_E2E_BUCKETS)
        self.inference = Histogram(_E2E_BUCKETS)  # from its first step to its end
        self.answers = Histogram(_TOKEN_BUCKETS)  # tokens each finished request generated


class EngineView(Protocol):
    """What ``render`` reads of the engine (``herdless.emulator.engine.Engine``, which
    imports this module for its counters: a protocol here, not an import back)."""

    @property
    def metrics(self) -> EngineMetrics: ...
    @property
    def num_running(self) -> int: ...
    @property
    def num_waiting(self) -> int: ...
    @property
    def num_gpu_blocks(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def prefix_caching(self) -> bool: ...
    def kv_usage(self) -> float: ...


def cache_config_labels(
    *,
    num_gpu_blocks: int,
    block_size: int,
    max_model_len: int | None,
    prefix_caching: bool = False,
) -> dict[str, str]:
    """The labels of ``vllm:cache_config_info``: vLLM 0.32's ``CacheConfig`` fields, in
    its order, as its API server shows them once the engine is up, then ``engine``.

    The set of names is vLLM's exactly (a contract test compares it with a real
    server's). The values are vLLM's defaults, but for what the emulator knows
    better: its blocks, the tokens they hold, the concurrency at ``max_model_len``
    (``num_gpu_blocks / ceil(max_model_len / block_size)``) and
    ``enable_prefix_caching``.
    """
    tokens = num_gpu_blocks * block_size
    concurrency = (
        None if max_model_len is None else num_gpu_blocks / -(-max_model_len // block_size)
    )
    fields: dict[str, object] = {
        "block_size": block_size,
        "user_specified_block_size": block_size != 16,  # 16: vLLM's default
        "kv_cache_layout": None,
        "prefix_match_unit": None,
        "gpu_memory_utilization": 0.92,
        "cache_dtype": "auto",
        "is_attention_free": False,
        "num_gpu_blocks_override": None,
        "sliding_window": None,
        "enable_prefix_caching": prefix_caching,
        "prefix_caching_hash_algo": "sha256",
        "prefix_cache_retention_interval": 0,
        "kv_cache_dtype_skip_layers": [],
        "mamba_page_size_padded": None,
        "skip_page_size_padded": None,
        "mamba_block_size": None,
        "mamba_cache_dtype": "auto",
        "mamba_ssm_cache_dtype": "auto",
        "mamba_cache_mode": "none",
        "enable_mamba_shared_prefix_checkpoint": False,
        "replayssm_buffer_len": 16,
        "use_replayssm": False,
        "use_kda_recoverssm": False,
        "num_gpu_blocks": num_gpu_blocks,
        "num_cpu_blocks": None,
        "effective_attention_block_size": block_size,
        "kv_cache_size_tokens": tokens,
        "kv_cache_max_concurrency": concurrency,
        "hash_block_size": None,
        "cache_hit_alignment_tokens": None,
        "kv_sharing_fast_prefill": False,
        "swa_bounded_replay": True,
        "kv_cache_memory_bytes": None,
        "kv_offloading_size": None,
        "kv_offloading_backend": "native",
        "_block_size_resolved": True,
        "engine": "0",
    }
    return {name: str(value) for name, value in fields.items()}


def render(engine: EngineView, model: str, *, max_model_len: int | None = None) -> str:
    """The Prometheus text exposition of ``engine``'s state, labelled like vLLM's
    (``max_model_len`` feeds ``cache_config_info``'s ``kv_cache_max_concurrency``)."""
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
    one("vllm:num_preemptions_total", "counter",
        "Cumulative number of preemption from the engine.", m.preemptions)  # fmt: skip
    one("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
        m.prompt_tokens)  # fmt: skip
    one("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
        m.generation_tokens)  # fmt: skip
    one("vllm:prefix_cache_queries_total", "counter",
        "Prefix cache queries, in terms of number of queried tokens.",
        m.prefix_queries)  # fmt: skip
    one("vllm:prefix_cache_hits_total", "counter",
        "Prefix cache hits, in terms of number of cached tokens.", m.prefix_hits)  # fmt: skip
    # vLLM's waiting requests by reason: "capacity" (no slot or KV yet) and "deferred"
    # (waiting on something else, never the case here).
    out.family("vllm:num_requests_waiting_by_reason", "gauge", _WAITING_BY_REASON_HELP,
               [(labels(**base, reason="capacity"), engine.num_waiting),
                (labels(**base, reason="deferred"), 0)])  # fmt: skip
    finished = {**m.finished, "error": 0, "repetition": 0}  # reasons vLLM has and we never give
    out.family("vllm:request_success_total", "counter", "Count of successfully processed requests.",
               [(labels(**base, finished_reason=r), n) for r, n in finished.items()])  # fmt: skip
    # vLLM counts admission rejections per frontend, not per engine: no engine label.
    out.family("vllm:admission_rejections_total", "counter", _REJECTIONS_HELP,
               [(labels(model_name=model, reason="max_num_queued_reqs"), m.rejected),
                (labels(model_name=model, reason="max_num_queued_tokens"), 0)])  # fmt: skip
    out.histogram("vllm:time_to_first_token_seconds", _HELP["ttft"], m.ttft, **base)
    out.histogram("vllm:inter_token_latency_seconds", _HELP["itl"], m.itl, **base)
    out.histogram("vllm:e2e_request_latency_seconds", _HELP["e2e"], m.e2e, **base)
    out.histogram("vllm:request_inference_time_seconds", _HELP["inference"], m.inference, **base)
    out.histogram("vllm:request_generation_tokens", _HELP["answers"], m.answers, **base)
    info = cache_config_labels(
        num_gpu_blocks=engine.num_gpu_blocks, block_size=engine.block_size,
        max_model_len=max_model_len, prefix_caching=engine.prefix_caching,
    )  # fmt: skip
    out.family("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig",
               [(labels(**info), 1.0)])  # fmt: skip
    return out.text()
