"""A batch job whose requests share their instructions, on a real vLLM with a small cache.

vLLM's prefix cache holds the shared prompt blocks once. Once a reading shows vLLM's
queue empty, the job's requests sent before the reading before hold their text's links,
and the gateway counts a new one that begins with the same text past the blocks they
share (``tests/integration/test_gateway_prefix.py`` is the same on the emulator).
``--num-gpu-blocks-override 40`` gives 40 blocks of 128 tokens (5,120): counted whole,
about three of these 1,450-token requests fit.
"""

from __future__ import annotations

import asyncio
import re
import statistics
from collections.abc import Iterator

import httpx
import pytest

from herdless.gateway.watcher import parse_metrics
from herdless.launch.servers import ServerProcess, gateway_process
from herdless.launch.vllm import MODEL_NAME, VllmServer, read_metric, sample_metrics

pytestmark = [pytest.mark.vllm]

JOB = 40
ANSWER = 32
INSTRUCTIONS = "You are a careful assistant. " + " ".join(
    f"rule{i} applies." for i in range(250)
)  # about 1,400 tokens


@pytest.fixture(scope="module")
def small_vllm(vllm_server: VllmServer) -> Iterator[VllmServer]:
    flags = ["--num-gpu-blocks-override", "40", "--max-num-seqs", "64"]
    with VllmServer(vllm_server.home, extra_args=flags) as server:
        yield server


@pytest.fixture(scope="module")
def sized_gateway(small_vllm: VllmServer) -> Iterator[ServerProcess]:
    with gateway_process(
        upstream=small_vllm.url, access_log=False, max_queue=256, queue_timeout=600.0
    ) as server:
        yield server
        print(f"----- log of {server} -----\n{server.logs()}")


def _messages(question: object) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "user", "content": f"question {question}: what is that rule?"},
    ]


async def _job(url: str, vllm_url: str) -> tuple[list[int], list[int], list[int]]:
    """The job's statuses, the gateway's running count and vLLM's waiting count, sampled."""
    running: list[int] = []
    waiting: list[int] = []
    done = asyncio.Event()

    async def watch() -> None:
        async for text in sample_metrics(vllm_url, done):
            waiting.append(parse_metrics(text, 0.0).waiting or 0)

    async def watch_gateway() -> None:
        async for text in sample_metrics(url, done):
            found = re.search(r"^herdless_gateway_inflight (\d+)", text, re.MULTILINE)
            if found:
                running.append(int(found[1]))

    async with httpx.AsyncClient(timeout=600.0) as client:
        watchers = [asyncio.create_task(watch()), asyncio.create_task(watch_gateway())]

        async def one(i: int) -> int:
            body = {"model": MODEL_NAME, "messages": _messages(i), "max_tokens": ANSWER}
            answer = await client.post(
                f"{url}/v1/chat/completions", json=body | {"ignore_eos": True}
            )
            return answer.status_code

        statuses = await asyncio.gather(*(one(i) for i in range(JOB)))
        done.set()
        await asyncio.gather(*watchers)
    return list(statuses), running, waiting


def test_shared_instructions_are_counted_once_the_engine_has_taken_them_in(
    small_vllm: VllmServer, sized_gateway: ServerProcess
) -> None:
    capacity = parse_metrics(httpx.get(f"{small_vllm.url}/metrics").text, 0.0).kv_capacity
    assert capacity == 40 * 128
    # The job's steady state: its instructions already in the cache (a long job's first
    # requests read them; its thousands after find them there).
    warm = {"model": MODEL_NAME, "messages": _messages("warm"), "max_tokens": 1}
    httpx.post(f"{small_vllm.url}/v1/chat/completions", json=warm, timeout=600).raise_for_status()
    before = read_metric(small_vllm.url, "vllm:num_preemptions_total")
    statuses, running, waiting = asyncio.run(_job(sized_gateway.url, small_vllm.url))
    assert statuses == [200] * JOB
    # Counted whole (1,450 + 32 + a block each), 3 fit in 99 % of 5,120 (4 before any is
    # measured); once the engine has taken one in, each new one is counted past the
    # shared blocks: their 1,280 tokens or so less. vLLM alone runs about 27.
    assert max(running) >= 8, running
    assert read_metric(small_vllm.url, "vllm:prefix_cache_hits_total") > 0
    assert read_metric(small_vllm.url, "vllm:num_preemptions_total") == before
    assert statistics.median(waiting) <= 2, waiting
