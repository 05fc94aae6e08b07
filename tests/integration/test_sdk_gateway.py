"""The SDK through the real gateway: a drain switches to the fallback at once, a crowd
refused by a full queue is still served in full (Retry-After honoured, no herd), and batch
work displaced by chats waits for the GPU."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest
from tests.integration.sdk_harness import HI, SPEED, TIMEOUTS, client_for, hosted_backend

from herdless import AsyncClient, BreakerPolicy, FallbackPolicy, RetryPolicy
from herdless.events import Event
from herdless.launch.servers import ServerProcess, emulator_process

pytestmark = [pytest.mark.integration, pytest.mark.server]

ADMIN = {"authorization": "Bearer admin-secret"}


@pytest.fixture(scope="module")
def gpu() -> Iterator[ServerProcess]:
    with emulator_process(speed=SPEED) as server:
        yield server


@pytest.fixture(scope="module")
def hosted() -> Iterator[ServerProcess]:
    with emulator_process(speed=SPEED, model="hosted-mini") as server:
        yield server


def _gateway(upstream: str, **flags: str) -> ServerProcess:
    argv = ["serve", "--upstream", upstream]
    for name, value in flags.items():
        argv += ["--" + name.replace("_", "-"), value]
    return ServerProcess(
        argv,
        ready_path="/readyz",
        env={"HERDLESS_GATEWAY_ADMIN_TOKEN": "admin-secret"},
    )


@pytest.fixture
def gateway(gpu: ServerProcess) -> Iterator[ServerProcess]:
    with _gateway(gpu.url, drain_retry_after="1") as server:
        yield server


def test_a_drain_moves_every_call_to_the_fallback_at_once(
    gateway: ServerProcess, hosted: ServerProcess
) -> None:
    with client_for(gateway.url + "/v1", hosted) as client:
        assert client.chat(HI, max_tokens=8).backend == "primary"
        httpx.post(gateway.url + "/admin/drain", headers=ADMIN, timeout=5).raise_for_status()
        first = client.chat(HI, max_tokens=8)
        second = client.chat(HI, max_tokens=8)
        stats = client.stats()
    assert (first.backend, first.fallback_reason) == ("hosted", "draining")
    assert [(a.backend, a.status) for a in first.attempts] == [("primary", 503), ("hosted", 200)]
    # The second call knows of the drain already: it does not touch the primary.
    assert [a.backend for a in second.attempts] == ["hosted"]
    assert second.fallback_reason == "draining"
    assert stats.breakers["primary"] == "open"


def test_calls_return_after_the_drain_ends(gateway: ServerProcess, hosted: ServerProcess) -> None:
    with client_for(gateway.url + "/v1", hosted) as client:
        httpx.post(gateway.url + "/admin/drain", headers=ADMIN, timeout=5).raise_for_status()
        assert client.chat(HI, max_tokens=8).fallback_reason == "draining"
        httpx.post(gateway.url + "/admin/resume", headers=ADMIN, timeout=5).raise_for_status()
        backends = []
        # Bounded in time, not in calls: the hosted model answers in milliseconds, and
        # the drain's Retry-After (one second, jittered) must pass before the probe.
        give_up = time.monotonic() + 10.0
        while time.monotonic() < give_up:
            backends.append(client.chat(HI, max_tokens=8).backend)
            if backends[-1] == "primary":
                break
            time.sleep(0.05)
    assert backends[-1] == "primary", backends


async def test_a_crowd_refused_by_a_full_queue_is_served_in_full(gpu: ServerProcess) -> None:
    events: list[Event] = []
    # A cold gateway does not know the service time yet and may ask for long waits;
    # capping its Retry-After keeps the test short without changing what it proves.
    with _gateway(gpu.url, max_concurrency="2", max_queue="2", max_retry_after="1") as gateway:
        async with AsyncClient(
            primary=gateway.url + "/v1",
            model="emulated-llama-3-8b",
            timeouts=TIMEOUTS,
            deadline=30.0,
            retry=RetryPolicy(max_attempts=20),
            # 429s are not failures; the breaker stays out of this.
            breaker=BreakerPolicy(),
            on_event=events.append,
            env_file=None,
        ) as client:
            results = await asyncio.gather(*(client.chat(HI, max_tokens=32) for _ in range(24)))
            stats = client.stats()
    assert len(results) == 24
    assert {r.backend for r in results} == {"primary"}
    assert stats.by_backend["primary"].get("status_429", 0) > 0  # the queue did refuse
    assert stats.failed == 0
    assert stats.waits > 0


async def test_batch_work_displaced_by_chats_is_served_by_the_gpu_not_the_fallback(
    hosted: ServerProcess,
) -> None:
    """End to end: priority="batch" reaches the gateway, chats (the user field) displace
    waiting batch calls, which come back at their reservation: none spills outside."""
    with (
        emulator_process(speed=4, max_num_seqs=1) as slow_gpu,
        _gateway(slow_gpu.url, max_concurrency="1", max_queue="2", max_retry_after="1") as gw,
    ):
        url = gw.url + "/v1"
        async with (
            httpx.AsyncClient(base_url=gw.url, timeout=5) as http,
            AsyncClient(
                primary=url,
                model="emulated-llama-3-8b",
                fallback=hosted_backend(hosted),
                fallback_policy=FallbackPolicy(on_backpressure="fallback"),
                priority="batch",
                deadline=60.0,
                env_file=None,
            ) as jobs,
            AsyncClient(primary=url, model="emulated-llama-3-8b", env_file=None) as chats,
        ):
            batch = asyncio.gather(*(jobs.chat(HI, max_tokens=64, user="etl") for _ in range(4)))
            waiting = 'herdless_gateway_class_queue_depth{class="batch"} 2'
            for _ in range(1000):  # until the batch calls fill the queue (bounded: 10 s)
                if waiting in (await http.get("/metrics")).text:
                    break
                await asyncio.sleep(0.01)
            answers = await asyncio.gather(
                *(chats.chat(HI, max_tokens=8, user=f"employee-{n}") for n in range(2))
            )
            done = await batch
            text = (await http.get("/metrics")).text
    assert {r.backend for r in done} == {"primary"}  # waited for the GPU, never spilled
    assert {r.backend for r in answers} == {"primary"}
    assert any(a.status == 429 for r in done for a in r.attempts)  # displaced, then served
    lines = text.splitlines()
    (displaced,) = [x for x in lines if x.startswith("herdless_gateway_displacements_total ")]
    assert float(displaced.split()[-1]) >= 1
    served = {x.split()[0]: float(x.split()[1]) for x in lines if "tokens_served_total{" in x}
    assert served['herdless_gateway_tokens_served_total{class="batch"}'] > 0
    assert served['herdless_gateway_tokens_served_total{class="interactive"}'] > 0
    assert any('user="anonymous/u-' in x for x in lines)
