"""A job whose requests share their instructions, as real processes: the gateway in front
of the emulator with its prefix cache on, then off (``tests/vllm/test_shared_prefix.py``
is the same on a real vLLM).

The emulated GPU holds 4,096 tokens of KV in blocks of 16. Each request is about 1,450
tokens of instructions, a question and a 64-token answer: counted whole, two fit. With
the prefix cache on, the engine holds the instructions once, and once a reading shows it
found them the gateway counts each new request past them: many run at once, none is
preempted. With it off the engine holds each request whole, and so does the gateway.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable

import httpx
import pytest

from herdless.gateway.watcher import parse_metrics
from herdless.launch.servers import ServerProcess, gateway_process
from herdless.launch.vllm import sample_metrics

pytestmark = [pytest.mark.integration, pytest.mark.server]

KV = 4_096
JOB = 32
INSTRUCTIONS = "You are a careful assistant. " + " ".join(f"rule{i} applies." for i in range(240))


def _messages(question: object) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "user", "content": f"question {question}: what is that rule?"},
    ]


def _gauge(text: str, name: str) -> int:
    found = re.search(rf"^{name} (\S+)", text, re.MULTILINE)
    return int(float(found[1])) if found else 0


async def _job(gateway: str) -> tuple[list[int], list[int], list[int]]:
    """The job's statuses, and the gateway's running count and shared prompt tokens,
    sampled."""
    running: list[int] = []
    shared: list[int] = []
    done = asyncio.Event()

    async def watch() -> None:
        async for text in sample_metrics(gateway, done, every=0.05):
            running.append(_gauge(text, "herdless_gateway_inflight"))
            shared.append(_gauge(text, "herdless_gateway_engine_shared_prompt_tokens"))

    async with httpx.AsyncClient(timeout=120.0) as client:
        watcher = asyncio.create_task(watch())

        async def one(i: int) -> int:
            body = {"messages": _messages(i), "max_tokens": 64, "ignore_eos": True}
            return (await client.post(f"{gateway}/v1/chat/completions", json=body)).status_code

        statuses = await asyncio.gather(*(one(i) for i in range(JOB)))
        done.set()
        await watcher
    return list(statuses), running, shared


def _run(engine: ServerProcess) -> tuple[list[int], list[int], list[int], float]:
    """The job through a fresh gateway in front of ``engine``, its instructions already in
    the engine's cache (a long job's steady state); and the engine's preemptions."""
    warm = {"messages": _messages("warm"), "max_tokens": 1}
    httpx.post(f"{engine.url}/v1/chat/completions", json=warm, timeout=30).raise_for_status()
    with gateway_process(
        upstream=engine.url, access_log=False, metrics_interval=0.1, max_queue=256
    ) as gw:
        statuses, running, shared = asyncio.run(_job(gw.url))
    metrics = parse_metrics(httpx.get(f"{engine.url}/metrics", timeout=10).text, 0.0)
    return statuses, running, shared, metrics.preemptions or 0.0


def test_shared_instructions_are_counted_once_where_the_engine_caches_them(
    start_emulator: Callable[..., ServerProcess],
) -> None:
    cached = start_emulator(
        kv_cache_tokens=KV, max_model_len=2_048, speed=2.0, enable_prefix_caching=True
    )
    statuses, running, shared, preempted = _run(cached)
    assert statuses == [200] * JOB
    assert preempted == 0
    assert max(shared) > 0, shared
    assert max(running) >= 12, running  # 26 and 28 in two runs here; all 32 fit

    plain = start_emulator(kv_cache_tokens=KV, max_model_len=2_048, speed=2.0)
    statuses, running, shared, preempted = _run(plain)
    assert statuses == [200] * JOB
    assert preempted == 0
    assert max(shared) == 0, shared
    assert max(running) <= 4, running  # two whole requests fit (3 in two runs here)
