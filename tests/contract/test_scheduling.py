"""Contract: the scheduler seen from outside: batching, abort, vLLM's own queue cap."""

from __future__ import annotations

import asyncio
import time

import httpx
from tests.contract.contract_kit import Upstream

from herdless.launch.vllm import forced_answer, read_metric, wait_for_metric

RUNNING = "vllm:num_requests_running"


async def test_concurrent_streams_interleave(upstream: Upstream) -> None:
    """Continuous batching: every stream has its first token before any has its last."""
    firsts: list[float] = []
    lasts: list[float] = []

    async def one(client: httpx.AsyncClient) -> None:
        # Every token has text (a token of the model's own could be a special token or
        # half a character, with empty content): the stamps count tokens.
        body = upstream.chat(stream=True, **forced_answer(24, ending="length"))
        stamps = []
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if (
                    line.startswith("data: {")
                    and '"content":"' in line
                    and '"content":""' not in line
                ):
                    stamps.append(time.monotonic())
        assert len(stamps) >= 2
        firsts.append(stamps[0])
        lasts.append(stamps[-1])

    async with httpx.AsyncClient(base_url=upstream.url, timeout=60.0) as client:
        await asyncio.gather(*(one(client) for _ in range(3)))
    assert max(firsts) < min(lasts)


async def test_a_client_that_disconnects_is_aborted(upstream: Upstream) -> None:
    before = read_metric(upstream.url, "vllm:request_success_total", finished_reason="abort")
    # As long an answer as the context allows: on a slow machine it still runs when we leave.
    body = upstream.chat("Tell me a long story.", max_tokens=1900, ignore_eos=True, stream=True)
    async with (
        httpx.AsyncClient(base_url=upstream.url, timeout=60.0) as client,
        client.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        events = 0
        async for line in response.aiter_lines():
            events += line.startswith("data: {")
            if events >= 3:  # the role and two tokens: the sequence is running
                break
        assert wait_for_metric(upstream.url, RUNNING, 1) == 1
    # Leaving the block closed the connection; the server must free the sequence (vLLM
    # takes up to ~2 s).
    assert wait_for_metric(upstream.url, RUNNING, 0) == 0
    # vLLM 0.32 does not count a disconnected stream as a finished request at all.
    after = read_metric(upstream.url, "vllm:request_success_total", finished_reason="abort")
    assert after == before


async def test_over_the_queue_cap_requests_get_503(upstream: Upstream) -> None:
    """``--max-num-queued-reqs 4``: a burst of 12 overflows it; vLLM sends no Retry-After."""
    metric = "vllm:admission_rejections_total"
    before = read_metric(upstream.url, metric, reason="max_num_queued_reqs")
    body = upstream.chat(max_tokens=16, ignore_eos=True)
    async with httpx.AsyncClient(base_url=upstream.url, timeout=60.0) as client:
        responses = await asyncio.gather(
            *(client.post("/v1/chat/completions", json=body) for _ in range(12))
        )
    statuses = [r.status_code for r in responses]
    assert set(statuses) == {200, 503}, statuses
    refused = [r for r in responses if r.status_code == 503]
    for response in refused:
        assert "retry-after" not in response.headers
        assert response.json() == {
            "error": {
                "message": "The engine is currently busy and cannot accept new requests. "
                "Please try again later or on a different instance.",
                "type": "Service Unavailable",
                "param": None,
                "code": 503,
            }
        }
    after = read_metric(upstream.url, metric, reason="max_num_queued_reqs")
    assert after == before + len(refused)
