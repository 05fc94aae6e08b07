"""Self-sizing in front of a real vLLM: its metrics read, and a burst that fills its KV cache.

This module starts a vLLM of its own: ``--max-num-seqs 64`` (the session's vLLM runs 4
sequences, which a burst cannot fill a KV cache with) and the smallest KV space this
CPU build takes, ``VLLM_CPU_KVCACHE_SPACE=1`` (46,592 tokens). A burst of 40 prompts of
about 1,400 tokens with 300-token answers needs about 68,000 tokens: more than the
cache, so vLLM alone admits by the prompts that fit and preempts as the answers grow.
"""

from __future__ import annotations

import asyncio
import re
import statistics
import time
from collections.abc import Iterator

import httpx
import pytest

from herdless.gateway.watcher import parse_metrics
from herdless.launch.servers import ServerProcess, gateway_process
from herdless.launch.vllm import MODEL_NAME, VllmServer, read_metric, sample_metrics

pytestmark = [pytest.mark.vllm]

BURST = 40
PROMPT_WORDS = 1_400
ANSWER = 300
# Alone, vLLM reads the burst's prompts about twice (each preempted one is read again):
# some 80 prompt reads within the time a request may take. An AVX2-only EPYC reads one
# in 7 s in fp32 (each arm took 9-10 minutes); in bf16, 36 s: past this, it cannot end.
MOST_READ_S = 10.0
REQUEST_TIMEOUT_S = 900.0


@pytest.fixture(scope="module")
def roomy_vllm(vllm_server: VllmServer) -> Iterator[VllmServer]:
    """A second vLLM whose KV cache, not its sequence count, is what a burst fills."""
    server = VllmServer(vllm_server.home, extra_args=["--max-num-seqs", "64"], kv_cache_gib=1)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def sized_gateway(roomy_vllm: VllmServer) -> Iterator[ServerProcess]:
    """``herdless serve`` with no sizing flag: it sizes itself from vLLM's /metrics."""
    # No sizing flag; the queue holds the burst as long as this slow CPU takes to serve it.
    with gateway_process(
        upstream=roomy_vllm.url,
        access_log=False,
        max_queue=256,
        queue_timeout=REQUEST_TIMEOUT_S,
    ) as server:
        yield server
        print(f"----- log of {server} -----\n{server.logs()}")


def _logged_capacity(server: VllmServer) -> int:
    """The KV capacity vLLM printed at start-up ("KV cache size: 46,592 tokens")."""
    found = re.findall(r"KV cache size: ([\d,]+) tokens", server.log_tail(lines=100_000))
    assert found, "vLLM printed no KV cache size"
    return int(found[-1].replace(",", ""))


def test_the_watcher_reads_the_capacity_vllm_logged(
    roomy_vllm: VllmServer, sized_gateway: ServerProcess
) -> None:
    reading = parse_metrics(httpx.get(f"{roomy_vllm.url}/metrics", timeout=10).text, 0.0)
    assert reading.sizable
    assert reading.kv_capacity == _logged_capacity(roomy_vllm)
    assert (reading.running, reading.waiting, reading.preemptions) == (0, 0, 0)
    shown = httpx.get(f"{sized_gateway.url}/metrics", timeout=10).text
    assert f"herdless_gateway_engine_kv_capacity_tokens {reading.kv_capacity}" in shown
    assert 'herdless_gateway_sizing_mode{mode="engine"} 1' in shown


async def _burst(url: str, vllm_url: str) -> tuple[list[int], list[float]]:
    """Send the burst at ``url``; returns the statuses and vLLM's waiting count, sampled."""
    words = "word " * PROMPT_WORDS
    waiting: list[float] = []
    done = asyncio.Event()

    async def watch() -> None:
        async for text in sample_metrics(vllm_url, done):
            waiting.append(parse_metrics(text, 0.0).waiting or 0)

    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as client:
        watcher = asyncio.create_task(watch())

        async def one(i: int) -> int:
            messages = [{"role": "user", "content": f"{i} {words}"}]
            body = {"model": MODEL_NAME, "messages": messages, "max_tokens": ANSWER}
            response = await client.post(
                f"{url}/v1/chat/completions", json=body | {"ignore_eos": True}
            )
            return response.status_code

        statuses = await asyncio.gather(*(one(i) for i in range(BURST)))
        done.set()
        await watcher
    return list(statuses), waiting


def _read_time(url: str) -> float:
    """Seconds vLLM takes to read one of the burst's prompts (and answer one token)."""
    messages = [{"role": "user", "content": "read " + "word " * PROMPT_WORDS}]
    body = {"model": MODEL_NAME, "messages": messages, "max_tokens": 1}
    start = time.monotonic()
    httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60.0).raise_for_status()
    return time.monotonic() - start


async def test_a_burst_that_fills_the_kv_cache_preempts_alone_and_not_behind_the_gateway(
    roomy_vllm: VllmServer, sized_gateway: ServerProcess
) -> None:
    url = roomy_vllm.url
    read = _read_time(url)
    if read > MOST_READ_S:
        pytest.skip(
            f"this CPU reads one of the burst's prompts in {read:.1f} s (over {MOST_READ_S} s):"
            f" the burst could not end within its {REQUEST_TIMEOUT_S:.0f} s here"
        )
    before = read_metric(url, "vllm:num_preemptions_total")
    statuses, _ = await _burst(url, url)
    alone = read_metric(url, "vllm:num_preemptions_total") - before
    assert statuses == [200] * BURST
    assert alone > 0, "the burst did not fill vLLM's KV cache: the test needs a larger one"

    before = read_metric(url, "vllm:num_preemptions_total")
    statuses, waiting = await _burst(sized_gateway.url, url)
    behind = read_metric(url, "vllm:num_preemptions_total") - before
    assert statuses == [200] * BURST
    assert behind == 0, f"{behind} preemptions behind the gateway ({alone} alone)"
    assert statistics.median(waiting) <= 2, waiting
