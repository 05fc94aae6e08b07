"""One shared herdless client, a crowd at once, in front of real vLLM: nothing wasted.

A process shares one client among all its requests. 100 chats at once, against real
vLLM (four sequences at a time), two ways: through the gateway (4 running + 4 waiting),
and straight at vLLM, whose own queue cap (``--max-num-queued-reqs 4``) answers a bare
503 when full. Either way every call is served, with at most 1.2 attempts per call, in
at most 1.2x the time the same 100 take when nobody is ever refused (a gateway whose
queue holds all of them, measured in the same run before and after the two ways: this
2-core machine's pace drifts within a minute, 8.4-13.3 s for the same baseline while
other jobs ran, and one baseline set beside a slower minute reads as a slow client).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

import herdless
from herdless.launch.servers import gateway_process
from herdless.launch.vllm import MODEL_NAME, forced_answer

pytestmark = [pytest.mark.vllm]

CALLS = 100
SEQS = 4  # vLLM's --max-num-seqs in this session (herdless.launch.vllm_pytest.VLLM_ARGS)
ANSWER = forced_answer(4, ending="length")  # every answer is exactly 4 tokens long
MESSAGES = [{"role": "user", "content": "Write a short status update."}]


def _counting(sent: list[int]) -> dict[str, Any]:
    async def count(request: httpx.Request) -> None:
        sent[0] += 1

    return {"request": [count]}


async def _unrefused_makespan(url: str) -> float:
    """100 at once held by a queue that never refuses: vLLM busy without a gap."""
    body = {"model": MODEL_NAME, "messages": MESSAGES, **ANSWER}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        start = time.monotonic()
        responses = await asyncio.gather(
            *(client.post(f"{url}/v1/chat/completions", json=body) for _ in range(CALLS))
        )
        elapsed = time.monotonic() - start
    assert [r.status_code for r in responses] == [200] * CALLS
    return elapsed


async def _shared_crowd(base_url: str) -> tuple[float, float, herdless.ClientStats]:
    """100 at once from one herdless client: (attempts per call, makespan, stats)."""
    sent = [0]
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    http = httpx.AsyncClient(event_hooks=_counting(sent), limits=limits)
    async with (
        http,
        herdless.AsyncClient(
            primary=herdless.Backend(name="gpu", base_url=base_url, model=MODEL_NAME),
            deadline=600,
            http_client=http,
        ) as client,
    ):
        start = time.monotonic()
        results = await asyncio.gather(*(client.chat(MESSAGES, **ANSWER) for _ in range(CALLS)))
        elapsed = time.monotonic() - start
        stats = client.stats()
    assert [r.backend for r in results] == ["gpu"] * CALLS
    assert {r.usage.completion_tokens for r in results if r.usage} == {4}
    return sent[0] / CALLS, elapsed, stats


async def test_one_shared_client_serves_a_crowd_without_waste(vllm_url: str) -> None:
    with gateway_process(
        upstream=vllm_url, max_concurrency=SEQS, max_queue=CALLS, queue_timeout=600
    ) as roomy:
        before = await _unrefused_makespan(roomy.url)
        with gateway_process(
            upstream=vllm_url, max_concurrency=SEQS, max_queue=SEQS, queue_timeout=600
        ) as gateway:
            via_gateway = await _shared_crowd(f"{gateway.url}/v1")
        straight = await _shared_crowd(f"{vllm_url}/v1")
        after = await _unrefused_makespan(roomy.url)
    baseline = (before + after) / 2
    report = (
        f"baseline {baseline:.2f} s ({before:.2f} before, {after:.2f} after); "
        f"through the gateway {via_gateway[:2]}; "
        f"straight at vLLM {straight[:2]} (attempts per call, makespan s)"
    )
    print(report)
    for attempts, makespan, stats in (via_gateway, straight):
        assert attempts <= 1.2, report
        assert makespan <= 1.2 * baseline, report
        assert stats.succeeded == CALLS
        assert stats.breakers == {"gpu": "closed"}
