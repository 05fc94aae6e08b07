"""herdless.testing's scripted backends and its pytest plugin, exercised with plain httpx."""

from __future__ import annotations

import json
import os
import random

import httpx
import pytest

from herdless.testing import (
    FakeClock,
    MockBackend,
    connect_error,
    draining,
    hang,
    ok,
    rate_limited,
    server_error,
    stream,
    unavailable,
)

pytest_plugins = ["herdless.testing.pytest_plugin"]

URL = "http://gpu.test/v1"
CHAT = f"{URL}/chat/completions"
BODY = {"model": "gemma-4", "messages": [{"role": "user", "content": "hi"}]}


def _events(text: str) -> list[str]:
    return [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]


def test_script_plays_in_order_then_repeats_the_last_reply(herdless_backends):
    gpu = herdless_backends(URL).script(rate_limited(1.5), ok("hi"))
    with httpx.Client() as http:
        statuses = [http.post(CHAT, json=BODY).status_code for _ in range(3)]
    assert statuses == [429, 200, 200]
    assert len(gpu.requests) == 3
    assert gpu.bodies[0]["model"] == "gemma-4"


def test_ok_echoes_the_requested_model_and_request_id(herdless_backends):
    herdless_backends(URL)  # the default script answers ok()
    with httpx.Client() as http:
        answer = http.post(CHAT, json=BODY, headers={"X-Request-ID": "req-1"}).json()
    assert answer["model"] == "gemma-4"
    assert answer["id"] == "req-1"
    assert answer["choices"][0]["message"]["content"] == "Hello from the mock."


@pytest.mark.parametrize(
    ("reply", "status", "code", "retry_after", "retry_after_ms"),
    [
        (rate_limited(1.2), 429, "queue_full", "2", "1200"),
        (rate_limited(3, code="token_budget"), 429, "token_budget", "3", "3000"),
        (unavailable(0.25), 503, "upstream_unavailable", "1", "250"),
        (draining(30), 503, "draining", "30", "30000"),
    ],
)
def test_refusals_carry_the_gateways_headers_and_error_body(
    reply, status, code, retry_after, retry_after_ms
):
    response = reply(httpx.Request("POST", CHAT))
    assert response.status_code == status
    assert response.headers["retry-after"] == retry_after
    assert response.headers["retry-after-ms"] == retry_after_ms
    assert response.json()["error"]["code"] == code
    assert (response.headers.get("x-herdless-drain") == "1") is (code == "draining")


def test_rate_limited_without_hint_sends_no_retry_after():
    response = rate_limited(None)(httpx.Request("POST", CHAT))
    assert "retry-after" not in response.headers
    assert "retry-after-ms" not in response.headers


def test_server_error_rejects_a_success_status():
    assert server_error(502)(httpx.Request("POST", CHAT)).status_code == 502
    with pytest.raises(ValueError, match="error status"):
        server_error(200)


@pytest.mark.parametrize(
    ("reply", "error"), [(hang(), httpx.ReadTimeout), (connect_error(), httpx.ConnectError)]
)
def test_network_failures_raise_what_httpx_raises(herdless_backends, reply, error):
    herdless_backends(URL).script(reply)
    with httpx.Client() as http, pytest.raises(error):
        http.post(CHAT, json=BODY)


def test_stream_sends_chunks_usage_and_done(herdless_backends):
    herdless_backends(URL).script(stream(["Hel", "lo"]))
    with httpx.Client() as http:
        events = _events(http.post(CHAT, json={**BODY, "stream": True}).text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    deltas = [c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]]
    assert "".join(deltas) == "Hello"
    assert chunks[-1]["usage"]["completion_tokens"] == 2


async def test_stream_cut_breaks_the_connection_after_n_chunks(herdless_backends):
    herdless_backends(URL).script(stream(["a", "b", "c"], cut_after=2))
    received: list[bytes] = []

    async def read_all(response: httpx.Response) -> None:
        async for raw in response.aiter_raw():
            received.append(raw)

    async with (
        httpx.AsyncClient() as http,
        http.stream("POST", CHAT, json={**BODY, "stream": True}) as response,
    ):
        assert response.status_code == 200
        with pytest.raises(httpx.RemoteProtocolError):
            await read_all(response)
    assert len(received) == 2  # the role chunk and "a"


def test_unmocked_hosts_fail_loudly(herdless_backends):
    herdless_backends(URL)
    with httpx.Client() as http, pytest.raises(Exception, match="not mocked"):
        http.post("http://elsewhere.test/v1/chat/completions", json=BODY)


def test_models_lists_the_backends_model(herdless_backends):
    herdless_backends(URL, model="gemma-4")
    with httpx.Client() as http:
        assert http.get(f"{URL}/models").json()["data"][0]["id"] == "gemma-4"


def test_script_needs_a_reply():
    import respx

    with respx.mock(assert_all_called=False) as router, pytest.raises(ValueError, match="at least"):
        MockBackend(router, URL).script()


def test_plugin_clock_and_rng_are_fresh_and_deterministic(herdless_clock, herdless_rng):
    assert isinstance(herdless_clock, FakeClock)
    herdless_clock.sleep(2.5)
    assert herdless_clock.monotonic() == 1002.5
    assert herdless_rng.random() == random.Random(0).random()


def test_plugin_env_clears_and_sets_herdless_variables(monkeypatch, herdless_env):
    assert not [name for name in os.environ if name.startswith("HERDLESS_")]
    herdless_env(primary_url="http://gpu.test/v1")
    assert os.environ["HERDLESS_PRIMARY_URL"] == "http://gpu.test/v1"
