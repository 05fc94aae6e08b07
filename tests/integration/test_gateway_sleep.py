"""Sleep mode on real processes: the gateway puts an idle emulator to sleep, wakes it on demand."""

from __future__ import annotations

import time

import httpx
import pytest

from herdless.launch.servers import emulator_process, gateway_process

pytestmark = [pytest.mark.integration, pytest.mark.server]

WAKE = 1.0  # seconds the emulator takes to wake
BODY = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "stream": True}


def asleep(url: str) -> int:
    level: int = httpx.get(url + "/_emulator/sleep").json()["level"]
    return level


def wait_until(condition, timeout: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.05)


def test_an_idle_engine_sleeps_and_the_next_request_waits_for_the_wake() -> None:
    with (
        emulator_process(speed=50, wake_time=WAKE) as vllm,
        gateway_process(upstream=vllm.url, upstream_sleep=1, metrics_interval=0.1) as gateway,
    ):
        assert httpx.post(gateway.url + "/v1/chat/completions", json=BODY).status_code == 200
        wait_until(lambda: asleep(vllm.url) == 1)  # idle for 1 s: put to sleep
        assert "herdless_gateway_upstream_asleep 1" in httpx.get(gateway.url + "/metrics").text
        time.sleep(0.5)  # readings while asleep must not size the gateway up
        start = time.monotonic()
        with httpx.stream("POST", gateway.url + "/v1/chat/completions", json=BODY) as answer:
            assert answer.status_code == 200
            chunks = answer.iter_bytes()
            first = next(chunks)
            first_byte = time.monotonic() - start
            rest = first + b"".join(chunks)
        assert first
        assert rest.endswith(b"data: [DONE]\n\n")
        assert WAKE <= first_byte <= WAKE + 0.2 + 0.3, first_byte  # + a CPU's scheduling slack
        report = httpx.get(vllm.url + "/_emulator/sleep").json()
        assert report == {"level": 0, "reached_asleep": 0}  # none reached it asleep
        assert "upstream awake" in gateway.logs()
