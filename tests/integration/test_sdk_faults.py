"""The SDK against emulated vLLMs in real processes: hang, refuse, 5xx, slow, cut, recovery."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from tests.integration.sdk_harness import HI, SPEED, clear_faults, client_for, set_faults

from herdless import BreakerPolicy, RetryPolicy, ServiceUnavailableError, StreamInterrupted
from herdless.launch.servers import ServerProcess, emulator_process

pytestmark = [pytest.mark.integration, pytest.mark.server]


@pytest.fixture(scope="module")
def gpu() -> Iterator[ServerProcess]:
    with emulator_process(speed=SPEED) as server:
        yield server


@pytest.fixture(scope="module")
def hosted() -> Iterator[ServerProcess]:
    with emulator_process(speed=SPEED, model="hosted-mini") as server:
        yield server


@pytest.fixture(autouse=True)
def healthy(gpu: ServerProcess) -> Iterator[None]:
    clear_faults(gpu)
    yield
    clear_faults(gpu)


def test_healthy_primary_answers(gpu: ServerProcess, hosted: ServerProcess) -> None:
    with client_for(gpu.url + "/v1", hosted) as client:
        result = client.chat(HI, max_tokens=8)
    assert result.backend == "primary"
    assert result.fallback_reason is None
    assert result.content


def test_a_hanging_primary_is_skipped_once_the_breaker_opens(
    gpu: ServerProcess, hosted: ServerProcess
) -> None:
    set_faults(gpu, hang=True)
    with client_for(gpu.url + "/v1", hosted) as client:
        results = [client.chat(HI, max_tokens=8) for _ in range(4)]
        stats = client.stats()
    assert {r.backend for r in results} == {"hosted"}
    assert [r.fallback_reason for r in results] == [
        "timeout",
        "timeout",
        "breaker_open",
        "breaker_open",
    ]
    assert [a.kind for a in results[0].attempts] == ["first_byte_timeout", "ok"]
    assert stats.by_backend["primary"]["first_byte_timeout"] == 2
    assert stats.breakers["primary"] == "open"


def test_refused_connections_fall_back(gpu: ServerProcess, hosted: ServerProcess) -> None:
    set_faults(gpu, refuse_for=1.5)
    with client_for(gpu.url + "/v1", hosted) as client:
        result = client.chat(HI, max_tokens=8)
    assert result.backend == "hosted"
    assert {a.kind for a in result.attempts if a.backend == "primary"} <= {
        "connect",
        "skipped_breaker_open",
    }


def test_primary_5xx_retries_within_budget_then_falls_back(
    gpu: ServerProcess, hosted: ServerProcess
) -> None:
    set_faults(gpu, error_rate=1.0, error_status=502)
    never_opens = BreakerPolicy(consecutive_failures=10_000, min_calls=10_000)
    with client_for(gpu.url + "/v1", hosted, breaker=never_opens) as client:
        results = [client.chat(HI, max_tokens=8) for _ in range(30)]
        stats = client.stats()
    assert {r.backend for r in results} == {"hosted"}
    primary_attempts = stats.by_backend["primary"]["attempts"]
    floor = RetryPolicy().budget_floor
    assert primary_attempts <= 30 * 1.1 + floor  # the retry budget, not 5 attempts per call
    assert stats.fallbacks.get("budget_exhausted", 0) > 0


def test_primary_5xx_without_fallback_raises_after_retries(gpu: ServerProcess) -> None:
    set_faults(gpu, error_rate=1.0, error_status=502)
    with (
        client_for(gpu.url + "/v1", None, retry=RetryPolicy(max_attempts=3, base=0.01)) as client,
        pytest.raises(ServiceUnavailableError) as caught,
    ):
        client.chat(HI, max_tokens=8)
    assert [a.status for a in caught.value.attempts] == [502, 502, 502]


def test_a_slow_primary_times_out_to_the_fallback(
    gpu: ServerProcess, hosted: ServerProcess
) -> None:
    set_faults(gpu, extra_latency=3.0)
    with client_for(gpu.url + "/v1", hosted) as client:
        result = client.chat(HI, max_tokens=8)
    assert result.backend == "hosted"
    assert result.fallback_reason == "timeout"


def test_a_stream_cut_after_its_first_chunk_says_how_much_arrived(gpu: ServerProcess) -> None:
    set_faults(gpu, cut_after=4)
    with client_for(gpu.url + "/v1", None) as client:
        received = []
        with (
            pytest.raises(StreamInterrupted) as caught,
            client.chat(HI, max_tokens=64, stream=True) as stream,
        ):
            received.extend(chunk.content for chunk in stream)
        stats = client.stats()
    assert caught.value.delivered_chars == len("".join(received))
    assert stats.by_backend["primary"]["stream_cut"] == 1
    assert stats.failed == 1


def test_calls_return_to_the_primary_after_it_recovers(
    gpu: ServerProcess, hosted: ServerProcess
) -> None:
    set_faults(gpu, hang=True)
    with client_for(gpu.url + "/v1", hosted) as client:
        for _ in range(3):
            client.chat(HI, max_tokens=8)
        assert client.stats().breakers["primary"] == "open"
        clear_faults(gpu)
        backends = []
        # Bounded in time, not in calls: the hosted model answers in milliseconds, and
        # the breaker's open period (about a second, jittered) must pass before the probe.
        give_up = time.monotonic() + 15.0
        while time.monotonic() < give_up:
            backends.append(client.chat(HI, max_tokens=8).backend)
            if backends[-1] == "primary":
                break
            time.sleep(0.05)
        stats = client.stats()
    assert backends[-1] == "primary", backends[-5:]
    assert stats.breakers["primary"] == "closed"
