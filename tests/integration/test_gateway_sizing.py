"""Self-sizing as real processes: the gateway in front of the emulator, sized by its /metrics.

The emulated GPU holds 16,000 tokens of KV and runs up to 256 sequences; a burst of 30
prompts of 1,500 tokens with 300-token answers needs 54,000. Straight at the emulator it
admits by the prompts that fit and preempts as the answers grow; behind the gateway with
no sizing flag nothing is preempted and the emulator's own queue stays near empty.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Callable

import httpx
import pytest

from herdless.gateway.watcher import parse_metrics
from herdless.launch.servers import ServerProcess, gateway_process

pytestmark = [pytest.mark.integration, pytest.mark.server]

KV = 16_000
BURST = 30


def _metric(text: str, name: str) -> float:
    (line,) = [line for line in text.splitlines() if line.startswith(name + " ")]
    return float(line.rsplit(" ", 1)[1])


async def _burst(url: str, engine: str) -> tuple[list[int], list[int]]:
    """The burst at ``url``; returns the statuses and the engine's waiting count, sampled."""
    words = "word " * 1_500
    waiting: list[int] = []
    done = asyncio.Event()
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=120.0, limits=limits) as client:

        async def watch() -> None:
            while not done.is_set():
                text = (await client.get(f"{engine}/metrics")).text
                waiting.append(parse_metrics(text, 0.0).waiting or 0)
                await asyncio.sleep(0.05)

        async def one(i: int) -> int:
            messages = [{"role": "user", "content": f"{i} {words}"}]
            body = {"messages": messages, "max_tokens": 300, "ignore_eos": True}
            return (await client.post(f"{url}/v1/chat/completions", json=body)).status_code

        watcher = asyncio.create_task(watch())
        statuses = await asyncio.gather(*(one(i) for i in range(BURST)))
        done.set()
        await watcher
    return list(statuses), waiting


def _preemptions(engine: ServerProcess) -> float:
    text = httpx.get(f"{engine.url}/metrics", timeout=10).text
    return parse_metrics(text, 0.0).preemptions or 0.0


def test_the_gateway_sizes_itself_and_keeps_the_burst_out_of_the_engines_queue(
    start_emulator: Callable[..., ServerProcess],
) -> None:
    engine = start_emulator(kv_cache_tokens=KV, speed=20.0)
    with gateway_process(upstream=engine.url, access_log=False, metrics_interval=0.1) as gw:
        shown = httpx.get(f"{gw.url}/metrics", timeout=10).text
        assert _metric(shown, "herdless_gateway_engine_kv_capacity_tokens") == KV
        assert 'herdless_gateway_sizing_mode{mode="engine"} 1' in shown

        before = _preemptions(engine)
        statuses, _ = asyncio.run(_burst(engine.url, engine.url))
        alone = _preemptions(engine) - before
        assert statuses == [200] * BURST
        assert alone > 0, "the burst did not fill the emulator's KV cache"

        before = _preemptions(engine)
        statuses, waiting = asyncio.run(_burst(gw.url, engine.url))
        assert statuses == [200] * BURST
        assert _preemptions(engine) - before == 0
        assert statistics.median(waiting) <= 2, waiting
        # What held the backlog back was the KV, and the limit followed the engine.
        shown = httpx.get(f"{gw.url}/metrics", timeout=10).text
        limit = _metric(shown, "herdless_gateway_dispatch_limit")
        assert 1 <= limit < BURST
