"""The engine watcher: vLLM's /metrics read into the sizing rule, and what it shows."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from tests.gateway.fakes import FakeVllm, GatewayFactory, chat_body, rendered, until

from herdless.gateway.watcher import parse_metrics, tokenize_body

pytestmark = [pytest.mark.server]

# vLLM 0.32's exposition, trimmed to a few series of each kind (same names, labels, types).
VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="SmolLM2-135M-Instruct"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="SmolLM2-135M-Instruct"} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="SmolLM2-135M-Instruct"} 0.25
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="SmolLM2-135M-Instruct"} 7.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="SmolLM2-135M-Instruct"} 1234.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="SmolLM2-135M-Instruct"} 4096.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="SmolLM2-135M-Instruct"} 0.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="SmolLM2-135M-Instruct"} 12.0
# HELP vllm:request_inference_time_seconds Histogram of time spent in RUNNING phase for request.
# TYPE vllm:request_inference_time_seconds histogram
vllm:request_inference_time_seconds_sum{engine="0",model_name="SmolLM2-135M-Instruct"} 9.5
vllm:request_inference_time_seconds_bucket{engine="0",le="0.3",model_name="SmolLM2-135M-Instruct"} 2.0
vllm:request_inference_time_seconds_bucket{engine="0",le="+Inf",model_name="SmolLM2-135M-Instruct"} 12.0
vllm:request_inference_time_seconds_count{engine="0",model_name="SmolLM2-135M-Instruct"} 12.0
# HELP vllm:request_generation_tokens Number of generation tokens processed.
# TYPE vllm:request_generation_tokens histogram
vllm:request_generation_tokens_sum{engine="0",model_name="SmolLM2-135M-Instruct"} 1200.0
vllm:request_generation_tokens_bucket{engine="0",le="100.0",model_name="SmolLM2-135M-Instruct"} 12.0
vllm:request_generation_tokens_count{engine="0",model_name="SmolLM2-135M-Instruct"} 12.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="2912",prefix_caching_hash_algo="sha256"} 1.0
"""  # noqa: E501 (the exposition's own lines)


def test_vllms_metrics_give_every_signal() -> None:
    reading = parse_metrics(VLLM, 5.0)
    assert reading.sizable
    assert (reading.kv_capacity, reading.block_size) == (2912 * 16, 16)
    assert (reading.kv_usage, reading.running, reading.waiting) == (0.25, 3, 1)
    assert (reading.preemptions, reading.generation_tokens, reading.at) == (7, 1234, 5.0)
    assert reading.prefix_hits == 4096
    assert (reading.run_seconds, reading.runs) == (9.5, 12)
    assert (reading.answer_tokens, reading.answers) == (1200.0, 12)


def test_a_server_without_the_signals_is_not_sizable() -> None:
    other = "# TYPE http_requests_total counter\nhttp_requests_total 3\n"
    reading = parse_metrics(other, 0.0)
    assert not reading.sizable
    assert reading.kv_capacity is None
    assert reading.running is None
    # An old vLLM: running and waiting, no cache_config_info.
    old = "vllm:num_requests_running 2\nvllm:gpu_cache_usage_perc 0.5\n"
    assert parse_metrics(old, 0.0).kv_usage == 0.5
    assert not parse_metrics(old, 0.0).sizable


def test_data_parallel_engines_add_up() -> None:
    two = VLLM + VLLM.replace('engine="0"', 'engine="1"').replace("0.25", "0.75")
    reading = parse_metrics(two, 0.0)
    assert reading.kv_capacity == 2 * 2912 * 16
    assert (reading.kv_usage, reading.running, reading.waiting) == (0.5, 6, 2)
    assert (reading.run_seconds, reading.runs) == (19.0, 24)
    assert (reading.answer_tokens, reading.answers) == (2400.0, 24)


def test_garbage_lines_are_skipped() -> None:
    text = 'vllm:num_requests_running{engine="0"} NaN\nvllm:num_requests_waiting x\n'
    text += 'vllm:cache_config_info{block_size="16"} 1.0\n'
    reading = parse_metrics(text, 0.0)
    assert (reading.running, reading.waiting, reading.kv_capacity) == (None, None, None)


async def test_the_gateway_sizes_itself_from_the_engine_and_says_so(
    gateway: GatewayFactory, fake_vllm: FakeVllm, caplog: pytest.LogCaptureFixture
) -> None:
    fake_vllm.metrics = VLLM.replace(
        'vllm:num_requests_waiting{engine="0",model_name="SmolLM2-135M-Instruct"} 1.0',
        'vllm:num_requests_waiting{engine="0",model_name="SmolLM2-135M-Instruct"} 0.0',
    )
    caplog.set_level(logging.INFO, logger="herdless.gateway")
    async with gateway() as (client, runtime):
        sizing = runtime.gate.admission.sizing
        assert (sizing.sized, sizing.kv_capacity) == (True, 2912 * 16)
        text = (await client.get("/metrics")).text
        assert 'herdless_gateway_sizing_mode{mode="engine"} 1' in text
        assert f"herdless_gateway_dispatch_limit {sizing.limit}" in text
        assert f"herdless_gateway_engine_kv_capacity_tokens {2912 * 16}" in text
        assert "herdless_gateway_engine_kv_usage 0.25" in text
        assert 'herdless_gateway_dispatch_held{reason="kv"} 0' in text
        assert "herdless_gateway_engine_shared_prompt_tokens 0" in text  # no prefix cache
        response = await client.post("/v1/chat/completions", json=chat_body(max_tokens=8))
        assert response.status_code == 200
        assert int(response.headers["x-herdless-capacity"]) == runtime.gate.admission.key_capacity
    logged = rendered(caplog.records)
    assert "engine sized from its metrics" in logged
    assert f"kv_capacity_tokens={2912 * 16}" in logged


async def test_an_engine_without_metrics_is_served_with_static_limits(
    gateway: GatewayFactory, fake_vllm: FakeVllm, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="herdless.gateway")
    async with gateway() as (client, runtime):
        watcher = client._transport.app.state.watcher  # type: ignore[attr-defined]
        await watcher.read_once()
        assert not runtime.gate.admission.sizing.sized
        assert runtime.gate.admission.limit == 64
        text = (await client.get("/metrics")).text
        assert 'herdless_gateway_sizing_mode{mode="static"} 1' in text
        assert "herdless_gateway_dispatch_limit 64" in text
    said = [r for r in caplog.records if "static limits" in r.getMessage()]
    assert len(said) == 1  # once, not at every read


async def test_failed_reads_go_stale_then_come_back(
    gateway: GatewayFactory, fake_vllm: FakeVllm, caplog: pytest.LogCaptureFixture
) -> None:
    fake_vllm.metrics = VLLM
    caplog.set_level(logging.INFO, logger="herdless.gateway")
    async with gateway() as (client, runtime):
        watcher = client._transport.app.state.watcher  # type: ignore[attr-defined]
        sizing = runtime.gate.admission.sizing
        good = sizing.limit
        fake_vllm.metrics_status = 500
        sizing._good_at -= 1e6
        assert await watcher.read_once() is None
        assert sizing.stale
        assert (watcher.failures, sizing.limit) == (1, good)
        text = (await client.get("/metrics")).text
        assert "herdless_gateway_engine_readings_stale 1" in text
        fake_vllm.metrics_status = 200
        assert await watcher.read_once() is not None
        assert not sizing.stale
    logged = rendered(caplog.records)
    assert "engine readings stale" in logged
    assert "engine readings back" in logged


def test_what_the_engine_is_asked_to_count_is_text_the_estimate_counts_alike() -> None:
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 9}
    assert tokenize_body(json.dumps(chat).encode()) == {"model": "m", "messages": chat["messages"]}
    assert tokenize_body(b'{"prompt": "once upon"}') == {"prompt": "once upon"}
    texts = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]  # text parts
    assert tokenize_body(json.dumps({"messages": texts}).encode()) == {"messages": texts}
    parts = [{"type": "image_url", "image_url": {"url": "data:,"}}]
    for other in (
        {"model": "m", "messages": [{"role": "user", "content": parts}]},  # an image
        {"model": "m", "messages": chat["messages"], "tools": [{"type": "function"}]},
        {"model": "m", "messages": chat["messages"], "system": "be brief", "max_tokens": 5},
        {"model": "m", "prompt": [1, 2, 3]},  # token ids
        {"model": "m", "input": "an embedding"},
        ["not", "an", "object"],
    ):
        assert tokenize_body(json.dumps(other).encode()) is None, other
    assert tokenize_body(b"{not json") is None


async def test_a_running_prompt_is_counted_by_the_engine_before_any_answer_ends(
    gateway: GatewayFactory, fake_vllm: FakeVllm
) -> None:
    fake_vllm.metrics = VLLM
    fake_vllm.token_count = 30
    fake_vllm.hold = asyncio.Event()  # the answer does not end: no usage calibrates
    body = chat_body(max_tokens=8) | {"messages": [{"role": "user", "content": "x" * 400}]}
    async with gateway() as (client, runtime):
        watcher = client._transport.app.state.watcher  # type: ignore[attr-defined]
        sizing = runtime.gate.admission.sizing
        assert not sizing.prompt_counted
        call = asyncio.create_task(client.post("/v1/chat/completions", json=body))
        await until(lambda: len(fake_vllm.received) == 1)
        assert sizing.prompt_sample is not None
        estimate = sizing.prompt_sample[1]  # 400 characters / 4 + 4 for the message
        assert estimate == 104
        [running] = sizing._runs._runs.values()
        assert running.prompt == estimate  # as estimated: nothing counted yet
        await watcher.read_once()
        assert fake_vllm.tokenized == [{"model": "m", "messages": body["messages"]}]
        assert sizing.prompt_counted
        assert sizing.prompt_sample is None
        # The count replaces the guess, for the request running on it too.
        assert sizing._prompt_ratio == pytest.approx(30 / 104)
        assert running.prompt == pytest.approx(30)
        await watcher.read_once()
        assert len(fake_vllm.tokenized) == 1  # counted: nothing more is asked
        fake_vllm.hold.set()
        assert (await call).status_code == 200


async def test_a_request_that_names_no_max_tokens_runs_open_ended(
    gateway: GatewayFactory, fake_vllm: FakeVllm
) -> None:
    """What the gateway starts carries whether its body named a ``max_tokens``: the
    sizing predicts one without past the default its price assumed."""
    fake_vllm.metrics = VLLM
    fake_vllm.hold = asyncio.Event()
    async with gateway() as (client, runtime):
        sizing = runtime.gate.admission.sizing
        bodies = (chat_body(max_tokens=8), chat_body(), chat_body(max_completion_tokens=9))
        calls = [
            asyncio.create_task(client.post("/v1/chat/completions", json=body)) for body in bodies
        ]
        await until(lambda: len(fake_vllm.received) == 3)
        runs = sorted((run.budget, run.open_ended) for run in sizing._runs._runs.values())
        assert runs == [(8, False), (9, False), (512, True)]  # the default: 512
        fake_vllm.hold.set()
        assert [(await call).status_code for call in calls] == [200] * 3


async def test_an_engine_without_tokenize_is_asked_three_times_at_most(
    gateway: GatewayFactory, fake_vllm: FakeVllm
) -> None:
    fake_vllm.metrics = VLLM
    async with gateway() as (client, runtime):
        watcher = client._transport.app.state.watcher  # type: ignore[attr-defined]
        sizing = runtime.gate.admission.sizing
        for _ in range(5):
            sizing.sample_prompt(json.dumps(chat_body()).encode(), 6)
            await watcher.read_once()
        assert len(fake_vllm.tokenized) == 3
        assert watcher.tokenize_failures == 3
        assert not sizing.prompt_counted
