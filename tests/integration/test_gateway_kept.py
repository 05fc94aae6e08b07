"""A crowd of clients that never retry (curl), as real processes: the gateway in front of
the emulator, 8 running and 16 waiting, so a full queue keeps half of the crowd waiting
in the gateway for the places its 429s would have named.

A fresh gateway has measured no answers per second yet: the times it tells are a guess,
here about three times too late. A kept request that slept its whole time left the GPU
to the few that came back on time once the queue ran dry; where the queue is empty, each
end now wakes the kept request told the earliest time. A gateway that reads the engine
(the default) takes its guess from what the engine ran before it started.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import re
import statistics
from collections.abc import Callable

import httpx
import pytest

from herdless.gateway.watcher import parse_metrics
from herdless.launch.servers import ServerProcess, gateway_process
from herdless.launch.vllm import sample_metrics

pytestmark = [pytest.mark.integration, pytest.mark.server]

CROWD = 48
RUNNING = 8
CURL = {"user-agent": "curl/8.5.0"}  # a client that never retries: a full queue keeps it


def _gauge(text: str, name: str) -> float:
    found = re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)", text, re.MULTILINE)
    return float(found[1]) if found else 0.0


async def _crowd(gateway: str) -> tuple[list[int], list[tuple[int, float]], float]:
    """The crowd's statuses; the gateway's running count, sampled with how many of the
    crowd were not answered yet; and the refusals it waited out."""
    rng = random.Random(1)
    left = CROWD
    samples: list[tuple[int, float]] = []
    done = asyncio.Event()

    async def watch() -> None:
        async for text in sample_metrics(gateway, done, every=0.05):
            samples.append((left, _gauge(text, "herdless_gateway_inflight")))

    async with httpx.AsyncClient(timeout=120.0, limits=httpx.Limits(max_connections=100)) as c:
        watcher = asyncio.create_task(watch())

        async def one(i: int) -> int:
            nonlocal left
            body = {
                "messages": [{"role": "user", "content": f"question {i}: " + "word " * 20}],
                "max_tokens": rng.randint(32, 64),
                "ignore_eos": True,
            }
            status = await c.post(f"{gateway}/v1/chat/completions", json=body, headers=CURL)
            left -= 1
            return status.status_code

        statuses = await asyncio.gather(*(one(i) for i in range(CROWD)))
        done.set()
        await watcher
        metrics = (await c.get(f"{gateway}/metrics")).text
    return list(statuses), samples, _gauge(metrics, "herdless_gateway_waited_out_total")


def _body(i: int, rng: random.Random) -> dict[str, object]:
    return {
        "messages": [{"role": "user", "content": f"question {i}: " + "word " * 20}],
        "max_tokens": rng.randint(32, 64),
        "ignore_eos": True,
    }


async def _told(url: str, calls: int) -> list[float]:
    """``calls`` at once, each sent once by a client that retries (httpx's user agent):
    the seconds each 429 named (``retry-after-ms``)."""
    rng = random.Random(2)
    async with httpx.AsyncClient(timeout=120.0, limits=httpx.Limits(max_connections=100)) as c:
        answers = await asyncio.gather(
            *(c.post(f"{url}/v1/chat/completions", json=_body(i, rng)) for i in range(calls))
        )
    return [int(r.headers["retry-after-ms"]) / 1000 for r in answers if r.status_code == 429]


def test_a_fresh_gateway_spaces_its_refusals_by_what_the_engine_ran(
    start_emulator: Callable[..., ServerProcess],
) -> None:
    engine = start_emulator(speed=2.0, max_num_seqs=RUNNING)
    asyncio.run(_told(engine.url, 2 * RUNNING))  # it served before the gateway started
    ran = parse_metrics(httpx.get(f"{engine.url}/metrics", timeout=10).text, 0.0)
    assert ran.runs == 2 * RUNNING
    assert ran.run_seconds is not None
    mean = ran.run_seconds / ran.runs  # about 0.3 s here, against the guess of 1 s
    # Read once at its start (an interval past the crowd): no answer of its own yet.
    with gateway_process(
        upstream=engine.url,
        access_log=False,
        max_concurrency=RUNNING,
        max_queue=2 * RUNNING,
        metrics_interval=30,
    ) as gw:
        told = sorted(asyncio.run(_told(gw.url, CROWD)))
    assert len(told) >= RUNNING
    # One place frees every mean run time over the 8 running: the k-th refused is told
    # k of those gaps (1 s / 8 apart on the tree before, the guess).
    gaps = [later - earlier for earlier, later in itertools.pairwise(told)]
    assert statistics.median(gaps) == pytest.approx(mean / RUNNING, rel=0.25, abs=0.002)


def test_a_kept_crowd_keeps_the_gpu_busy_when_the_queue_runs_dry(
    start_emulator: Callable[..., ServerProcess],
) -> None:
    engine = start_emulator(speed=2.0, max_num_seqs=RUNNING)
    with gateway_process(
        upstream=engine.url,
        access_log=False,
        sizing="static",
        max_concurrency=RUNNING,
        max_queue=2 * RUNNING,
    ) as gw:
        statuses, samples, waited_out = asyncio.run(_crowd(gw.url))
    assert statuses == [200] * CROWD  # no 429 for a client that would show it as an error
    assert waited_out >= RUNNING  # the crowd past 8 + 16 was kept (24-26 a run here)
    full = next(i for i, (_, running) in enumerate(samples) if running == RUNNING)
    busy = [running for left, running in samples[full:] if left >= 2 * RUNNING]
    assert len(busy) >= 5, samples
    # Once the GPU was full, and while at least 16 were unanswered, it had work for its
    # 8 places: 8 in every sample in the runs here; on the tree before, whose kept
    # requests slept their time, 1 to 6 in 8 to 10 samples of about 30.
    idle = [running for running in busy if running < RUNNING - 1]
    assert len(idle) <= 2, busy  # (a sample may fall between an end and the wake)
