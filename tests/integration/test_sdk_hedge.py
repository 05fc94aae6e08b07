"""A hedge over real sockets: when the hedge wins, the late attempt's connection is closed,
the gateway passes the disconnect on, and the emulated vLLM frees the sequence.

The primary is an emulator whose every completion is held 30 s before its first byte
(the ``slow`` fault) while its sequence runs (2000 tokens at real speed: about 24 s of
decoding), behind the gateway; the fallback is a fast emulator. Without the cancel, the
primary's ``vllm:num_requests_running`` would stay at 1 for tens of seconds; with it, it
drops within a second or two of the hedge's first chunk. Both clients: the sync one
cancels through its own HTTP client's watched sockets, the async one by cancelling a
task.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from tests.integration.sdk_harness import HI, hosted_backend

import herdless
from herdless.events import Event, HedgeFinished, HedgeStarted
from herdless.launch.servers import ServerProcess, emulator_process, gateway_process
from herdless.launch.vllm import read_metric, wait_for_metric

pytestmark = [pytest.mark.integration, pytest.mark.server]

RUNNING = "vllm:num_requests_running"


@pytest.fixture(scope="module")
def slow_gpu() -> Iterator[ServerProcess]:
    with emulator_process(
        speed=1,
        slow_rate=1.0,
        slow_latency=30,
        answer_min_tokens=2000,
        answer_max_tokens=2000,
    ) as server:
        yield server


@pytest.fixture(scope="module")
def gateway(slow_gpu: ServerProcess) -> Iterator[ServerProcess]:
    with gateway_process(upstream=slow_gpu.url) as server:
        yield server


@pytest.fixture(scope="module")
def hosted() -> Iterator[ServerProcess]:
    with emulator_process(speed=50, model="hosted-mini") as server:
        yield server


def _options(
    gpu: ServerProcess, gateway: ServerProcess, hosted: ServerProcess, seen: list[Event]
) -> dict[str, Any]:
    def record(event: Event) -> None:
        seen.append(event)
        if isinstance(event, HedgeStarted):  # the late attempt still runs: what does the GPU say?
            running.append(read_metric(gpu.url, RUNNING))

    running: list[float] = []
    record.running = running  # type: ignore[attr-defined]  # read back by the test
    return {
        "primary": gateway.url + "/v1",
        "fallback": hosted_backend(hosted),
        "model": "emulated-llama-3-8b",
        "deadline": 20.0,
        "hedge": herdless.HedgePolicy(after=0.5),
        "on_event": record,
    }


def _check(seen: list[Event], running_at_hedge: list[float], running_after: float) -> None:
    (started,) = [e for e in seen if isinstance(e, HedgeStarted)]
    (finished,) = [e for e in seen if isinstance(e, HedgeFinished)]
    assert started.after >= 0.5
    assert (finished.winner, finished.loser_cancelled) == ("hosted", True)
    assert running_at_hedge == [1]  # the late sequence was running on the GPU
    # Cancelled: the gateway passed the disconnect on and the sequence was aborted, long
    # before its hold (30 s) or its 2000 tokens (about 24 s) would have ended it. (Read
    # while the client is still open: closing it, or its event loop, would close the
    # connection anyway.)
    assert running_after == 0


def _running_after_the_cancel(gpu: ServerProcess) -> float:
    return wait_for_metric(gpu.url, RUNNING, 0, timeout=5.0)


def test_sync_a_winning_hedge_frees_the_late_sequence(
    slow_gpu: ServerProcess, gateway: ServerProcess, hosted: ServerProcess
) -> None:
    seen: list[Event] = []
    options = _options(slow_gpu, gateway, hosted, seen)
    with herdless.Client(**options) as client:
        stream = client.chat(HI, stream=True)
        assert (stream.backend, stream.fallback_reason) == ("hosted", "hedge")
        with stream:
            text = "".join(chunk.content for chunk in stream)
        assert text
        _check(seen, options["on_event"].running, _running_after_the_cancel(slow_gpu))
        assert client.stats().hedge_wins == {"hosted": 1}


def test_async_a_winning_hedge_frees_the_late_sequence(
    slow_gpu: ServerProcess, gateway: ServerProcess, hosted: ServerProcess
) -> None:
    seen: list[Event] = []
    options = _options(slow_gpu, gateway, hosted, seen)

    async def run() -> float:
        async with herdless.AsyncClient(**options) as client:
            stream = await client.chat(HI, stream=True)
            assert (stream.backend, stream.fallback_reason) == ("hosted", "hedge")
            async with stream:
                text = "".join([chunk.content async for chunk in stream])
            assert text
            return await asyncio.to_thread(_running_after_the_cancel, slow_gpu)

    running_after = asyncio.run(run())
    _check(seen, options["on_event"].running, running_after)
