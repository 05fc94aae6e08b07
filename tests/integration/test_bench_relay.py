"""The bare relay (the baseline of the gateway's CPU per request) relays as the gateway
does, and the overhead benchmark's latency phase counts each server's own CPU."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from herdless.bench.gateway_overhead import OverheadParams, _latency
from herdless.launch.servers import ServerProcess, emulator_process

pytestmark = [pytest.mark.integration, pytest.mark.server]

CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}


@pytest.fixture(scope="module")
def engine() -> Iterator[ServerProcess]:
    with emulator_process(speed=100) as server:
        yield server


@pytest.fixture(scope="module")
def relay(engine: ServerProcess) -> Iterator[ServerProcess]:
    server = ServerProcess(
        ["--upstream", engine.url], module="herdless.bench.relay", ready_path="/healthz"
    )
    with server:
        yield server


def test_the_relay_runs_as_its_own_process_with_its_own_log(relay: ServerProcess) -> None:
    assert relay.pid is not None
    assert relay.returncode() is None
    assert relay.log_path.name.startswith("herdless-relay-")


def test_the_relay_passes_answers_and_errors_through(
    engine: ServerProcess, relay: ServerProcess
) -> None:
    whole = httpx.post(relay.url + "/v1/chat/completions", json=CHAT, timeout=30)
    assert whole.status_code == 200
    assert whole.json()["usage"]["completion_tokens"] == 8
    with httpx.stream(
        "POST", relay.url + "/v1/chat/completions", json={**CHAT, "stream": True}, timeout=30
    ) as streamed:
        assert streamed.headers["content-type"].startswith("text/event-stream")
        body = b"".join(streamed.iter_raw())
    assert body.rstrip().endswith(b"data: [DONE]")
    bad = {"messages": "not a list"}
    refused = httpx.post(relay.url + "/v1/chat/completions", json=bad, timeout=30)
    direct = httpx.post(engine.url + "/v1/chat/completions", json=bad, timeout=30)
    assert (refused.status_code, refused.json()) == (direct.status_code, direct.json())


def test_each_arm_is_charged_its_own_servers_cpu(
    engine: ServerProcess, relay: ServerProcess
) -> None:
    params = OverheadParams(streams=4, requests_per_stream=3, repeats=2)
    figures, rounds = _latency({"direct": engine, "relay": relay}, params)
    for arm in ("direct", "relay"):
        assert figures[f"{arm}_failures"] == 0
        assert 0 < figures[f"{arm}_p50"] <= figures[f"{arm}_p99"]
        # CPU seconds per request, each round: above nothing, below a whole request's time.
        assert len(rounds[arm]) == 2
        assert all(0 < cpu < figures[f"{arm}_p99"] for cpu in rounds[arm])
        assert min(rounds[arm]) <= figures[f"{arm}_cpu"] <= max(rounds[arm])
