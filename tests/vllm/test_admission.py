"""The gateway's admission in front of real vLLM: refusals, disconnects, outage, restart."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

import httpx
import pytest
from tests.vllm.conftest import CONCURRENCY, QUEUE

import herdless
from herdless.launch.servers import ServerProcess, emulator_process, gateway_process
from herdless.launch.vllm import (
    MODEL_NAME,
    VllmServer,
    read_metric,
    sample_metrics,
    wait_for_metric,
)

pytestmark = [pytest.mark.vllm]

RUNNING = "vllm:num_requests_running"


def chat(max_tokens: int, **extra: object) -> dict[str, object]:
    # ignore_eos: every answer is exactly max_tokens long, so the load is known.
    messages = [{"role": "user", "content": "Tell me a story."}]
    return {"model": MODEL_NAME, "messages": messages, "max_tokens": max_tokens,
            "ignore_eos": True, **extra}  # fmt: skip


async def test_a_burst_is_refused_with_429s_and_vllm_never_runs_more_than_admitted(
    gateway: ServerProcess, vllm_url: str
) -> None:
    rejected_before = read_metric(vllm_url, "vllm:admission_rejections_total")
    peak = 0.0
    done = asyncio.Event()

    async def watch() -> None:
        nonlocal peak
        async for text in sample_metrics(vllm_url, done, every=0.05):
            for line in text.splitlines():
                if line.startswith(RUNNING + "{"):
                    peak = max(peak, float(line.rsplit(" ", 1)[1]))

    async with httpx.AsyncClient(timeout=120.0) as client:
        watcher = asyncio.create_task(watch())
        burst = [
            client.post(f"{gateway.url}/v1/chat/completions", json=chat(24)) for _ in range(10)
        ]
        responses = await asyncio.gather(*burst)
        done.set()
        await watcher

    statuses = sorted(r.status_code for r in responses)
    assert statuses.count(200) >= CONCURRENCY + QUEUE, statuses
    refused = [r for r in responses if r.status_code == 429]
    assert refused, statuses
    assert set(statuses) == {200, 429}
    for response in refused:
        assert response.json()["error"]["code"] == "queue_full"
        millis = int(response.headers["retry-after-ms"])
        assert millis > 0
        assert int(response.headers["retry-after"]) == math.ceil(millis / 1000)
    assert 1 <= peak <= CONCURRENCY
    # vLLM itself never had to refuse anything: the gateway kept it within its limits.
    assert read_metric(vllm_url, "vllm:admission_rejections_total") == rejected_before


async def test_a_client_that_disconnects_frees_vllms_sequence(
    gateway: ServerProcess, vllm_url: str
) -> None:
    # As long an answer as the context allows (2048 less the prompt): even at a few
    # tokens a second it still runs when the client leaves.
    body = chat(1900, stream=True)
    started = time.monotonic()
    events: list[float] = []  # when each SSE event arrived, for the failure message
    async with (
        httpx.AsyncClient(base_url=gateway.url, timeout=60.0) as client,
        client.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                events.append(round(time.monotonic() - started, 2))
            if len(events) >= 3:  # the role and two tokens: the sequence runs
                break
        running = wait_for_metric(vllm_url, RUNNING, 1)
        assert running == 1, f"vLLM runs {running:g}; the events arrived at {events} s"
    # Leaving the block closed the connection; the gateway closes its upstream request
    # and vLLM aborts the sequence (within ~2 s).
    assert wait_for_metric(vllm_url, RUNNING, 0) == 0


def _ready(gateway: ServerProcess) -> int:
    return httpx.get(f"{gateway.url}/readyz", timeout=5.0).status_code


def _wait_for(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_outage_gives_fast_503s_fallback_and_readiness_follows_vllm_loading(
    vllm_server: VllmServer,
) -> None:
    """Stop vLLM mid-run, then start it again: the gateway and the SDK follow it."""
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    options = {"health_interval": 0.25, "upstream_retry_after": 2.0, "max_concurrency": 2}
    with (
        emulator_process(model="hosted-model", speed=50) as hosted,
        gateway_process(upstream=vllm_server.url, **options) as gateway,
    ):
        hosted_backend = herdless.Backend(
            name="hosted", base_url=f"{hosted.url}/v1", model="hosted-model", external=True
        )

        def sdk() -> herdless.Client:
            # A new client each time: one's breaker may still hold the primary open.
            return herdless.Client(
                primary=f"{gateway.url}/v1", model=MODEL_NAME, fallback=hosted_backend
            )

        with sdk() as client:
            assert client.chat(messages, max_tokens=16).fallback_reason is None
        try:
            vllm_server.stop()
            assert _wait_for(lambda: _ready(gateway) == 503, timeout=5.0)
            started = time.monotonic()
            response = httpx.post(f"{gateway.url}/v1/chat/completions", json=chat(8), timeout=30)
            elapsed = time.monotonic() - started
            assert response.status_code == 503
            assert response.json()["error"]["code"] == "upstream_unavailable"
            assert int(response.headers["retry-after"]) >= 1
            # Refused at admission, not after a connect timeout (2 s): a generous bound.
            assert elapsed < 1.0, elapsed
            with sdk() as client:
                result = client.chat(messages, max_tokens=16)
            assert result.backend == "hosted"
            assert result.fallback_reason is not None

            vllm_server.start(wait=False)
            # While vLLM loads the model, the gateway is not ready and refuses.
            assert _ready(gateway) == 503
            # Another request: the one refused above, sent again, is its retry, and waits
            # for vLLM in the gateway (its load time is not known here), up to its hold.
            loading = httpx.post(f"{gateway.url}/v1/chat/completions", json=chat(7))
            assert loading.status_code == 503
            vllm_server.wait_ready()
            assert _wait_for(lambda: _ready(gateway) == 200, timeout=5.0)
            with sdk() as client:
                assert client.chat(messages, max_tokens=16).fallback_reason is None
        finally:
            if not vllm_server.running:
                vllm_server.start()
