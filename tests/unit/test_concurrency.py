"""Threads and tasks hammering one client: one half-open probe, whatever the concurrency.

The real drivers over ``httpx.MockTransport``: the primary's handler holds the probe
open until every other call has been served by the fallback, then lets it answer.
No sockets, no sleeping: a ``FakeClock`` moves past the breaker's open period.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter

import httpx

from herdless import AsyncClient, Backend, BreakerPolicy, Client, RetryPolicy
from herdless.testing import FakeClock

PRIMARY = "http://gpu.test/v1"
HOSTED = Backend(name="hosted", base_url="http://hosted.test/v1", model="mini")
HI = [{"role": "user", "content": "hi"}]
CALLS = 24
ANSWER = {
    "id": "x",
    "object": "chat.completion",
    "model": "m",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
    ],
}
ONE_FAILURE_OPENS = BreakerPolicy(consecutive_failures=1, open_for=5.0)


def _answer() -> httpx.Response:
    return httpx.Response(
        200, content=json.dumps(ANSWER).encode(), headers={"content-type": "application/json"}
    )


def test_threads_send_one_probe_to_a_half_open_primary() -> None:
    clock = FakeClock()
    seen: Counter[str] = Counter()
    lock = threading.Lock()
    others_done = threading.Event()
    failing = True

    def handler(request: httpx.Request) -> httpx.Response:
        host = request.url.host
        with lock:
            seen[host] += 1
        if host == "gpu.test":
            if failing:
                return httpx.Response(500)
            others_done.wait(10)  # hold the probe in flight (bounded)
        return _answer()

    with Client(
        primary=PRIMARY,
        fallback=HOSTED,
        model="m",
        breaker=ONE_FAILURE_OPENS,
        retry=RetryPolicy(max_attempts=1),
        clock=clock,
        sleep=clock.sleep,
        transport=httpx.MockTransport(handler),
        env_file=None,
    ) as client:
        client.chat(HI)  # the 500 opens the breaker
        failing = False
        clock.advance(60)
        seen.clear()
        results: list[str] = []
        fallbacks = threading.Barrier(CALLS - 1, action=others_done.set)

        def call() -> None:
            result = client.chat(HI)
            results.append(result.backend)
            if result.backend == "hosted":
                fallbacks.wait(10)

        threads = [threading.Thread(target=call) for _ in range(CALLS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert client.stats().breakers["primary"] == "closed"
    assert seen["gpu.test"] == 1
    assert sorted(results) == ["hosted"] * (CALLS - 1) + ["primary"]


async def test_tasks_send_one_probe_to_a_half_open_primary() -> None:
    clock = FakeClock()
    seen: Counter[str] = Counter()
    release = asyncio.Event()
    failing = True

    async def handler(request: httpx.Request) -> httpx.Response:
        seen[request.url.host] += 1
        if request.url.host == "gpu.test":
            if failing:
                return httpx.Response(500)
            await release.wait()  # hold the probe in flight
        return _answer()

    async with AsyncClient(
        primary=PRIMARY,
        fallback=HOSTED,
        model="m",
        breaker=ONE_FAILURE_OPENS,
        retry=RetryPolicy(max_attempts=1),
        clock=clock,
        sleep=clock.asleep,
        transport=httpx.MockTransport(handler),
        env_file=None,
    ) as client:
        await client.chat(HI)
        failing = False
        clock.advance(60)
        seen.clear()
        probe = asyncio.create_task(client.chat(HI))
        for _ in range(1000):  # let the probe reach the primary (yields, no real sleep)
            if seen["gpu.test"]:
                break
            await asyncio.sleep(0)
        others = await asyncio.wait_for(
            asyncio.gather(*(client.chat(HI) for _ in range(CALLS - 1))), 10
        )
        release.set()
        first = await asyncio.wait_for(probe, 10)
        assert client.stats().breakers["primary"] == "closed"
    assert seen["gpu.test"] == 1
    assert first.backend == "primary"
    assert {r.backend for r in others} == {"hosted"}
    assert {r.fallback_reason for r in others} == {"breaker_open"}
