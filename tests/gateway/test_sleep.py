"""Sleep mode in-process: the gate holds arrivals while the engine sleeps, the watcher
does not read a sleeping engine's empty KV cache as room."""

from __future__ import annotations

import asyncio

import pytest
from tests.gateway.fakes import FakeVllm, GatewayFactory, chat_body, until
from tests.gateway.test_watcher import VLLM

pytestmark = [pytest.mark.server]

ASLEEP = VLLM.replace(
    'vllm:kv_cache_usage_perc{engine="0",model_name="SmolLM2-135M-Instruct"} 0.25',
    'vllm:kv_cache_usage_perc{engine="0",model_name="SmolLM2-135M-Instruct"} 0.0',
) + (
    'vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="awake"} 0.0\n'
    'vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="weights_offloaded"} 1.0\n'
)


async def test_the_watcher_skips_an_engine_that_says_it_sleeps(
    gateway: GatewayFactory, fake_vllm: FakeVllm
) -> None:
    fake_vllm.metrics = ASLEEP
    async with gateway() as (client, runtime):
        watcher = client._transport.app.state.watcher  # type: ignore[attr-defined]
        assert await watcher.read_once() is None
        assert not runtime.gate.admission.sizing.sized  # its empty KV was not taken as room


async def test_a_request_while_asleep_waits_for_the_wake_and_never_reaches_the_engine(
    gateway: GatewayFactory, fake_vllm: FakeVllm
) -> None:
    async with gateway() as (client, runtime):
        woken: list[bool] = []
        runtime.gate.pause()
        runtime.gate.on_held = lambda: woken.append(True)
        pending = asyncio.create_task(client.post("/v1/chat/completions", json=chat_body()))
        await until(lambda: bool(woken))
        assert runtime.gate.admission.queue_depth == 1
        assert fake_vllm.paths == []  # held in the gateway, not sent to a sleeping engine
        assert "herdless_gateway_upstream_asleep 1" in (await client.get("/metrics")).text
        runtime.gate.unpause()
        assert (await pending).status_code == 200
        assert fake_vllm.paths == ["/v1/chat/completions"]
