"""The gateway as a real process in front of the emulator, driven over real sockets."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from herdless.gateway.wire import parse_chat_request
from herdless.launch.servers import (
    ServerProcess,
    emulator_process,
    free_port,
    gateway_process,
)

pytestmark = [pytest.mark.integration, pytest.mark.server]

ADMIN = {"authorization": "Bearer admin-secret"}
ENV = {"HERDLESS_GATEWAY_ADMIN_TOKEN": "admin-secret", "HERDLESS_GATEWAY_API_KEYS": "k1,k2"}
AUTH = {"authorization": "Bearer k1"}
JSON = ("--log-format", "json")


def body(**extra: object) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": "hello there"}], **extra}


def wait_for(condition, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    """Poll ``condition()`` until true (bounded)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


def metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith((name + " ", name + "{")):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exposed")


@pytest.fixture(scope="module")
def vllm() -> Iterator[ServerProcess]:
    with emulator_process(speed=50, max_num_seqs=64) as server:
        yield server


@pytest.fixture(scope="module")
def gateway(vllm: ServerProcess) -> Iterator[ServerProcess]:
    server = ServerProcess(
        ["serve", "--upstream", vllm.url, "--max-concurrency", "8", "--max-queue", "4", *JSON],
        ready_path="/readyz",
        env=ENV,
    )
    with server:
        yield server


def test_openai_client_streams_through_the_gateway(gateway: ServerProcess) -> None:
    with openai.OpenAI(base_url=gateway.url + "/v1", api_key="k1", max_retries=0) as client:
        model = client.models.list().data[0].id
        stream = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Tell me about herds."}],
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text
        assert chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens <= 12
        answer = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=5
        )
        assert answer.choices[0].message.content


@pytest.mark.parametrize("usage", [True, False], ids=["usage asked", "no usage asked"])
def test_sse_bytes_are_those_of_the_emulator(
    gateway: ServerProcess, vllm: ServerProcess, usage: bool
) -> None:
    # Without usage asked, the gateway asks for it (to settle the price) and gives its
    # client the stream vLLM sends to a client that did not ask.
    request = body(stream=True, max_tokens=4, seed=7, temperature=1.0)
    if usage:
        request["stream_options"] = {"include_usage": True}
    direct = httpx.post(vllm.url + "/v1/chat/completions", json=request)
    proxied = httpx.post(gateway.url + "/v1/chat/completions", json=request, headers=AUTH)
    assert proxied.status_code == 200

    def same(raw: str) -> str:  # ids and timestamps differ per request
        return re.sub(r'"id":"[^"]+","object":"([^"]+)","created":\d+', r"\1", raw)

    assert same(proxied.text) == same(direct.text)
    assert ('"usage":' in proxied.text) is usage
    assert proxied.text.endswith("data: [DONE]\n\n")


def test_overload_gets_staggered_429s_and_the_rest_is_served(vllm: ServerProcess) -> None:
    # Static limits, from the guess of 1 s a run: this engine's runs take milliseconds, and
    # told from them (what a gateway reading it does) the callers refused a moment apart
    # share their millisecond.
    static = {"sizing": "static", "max_concurrency": 2, "max_queue": 2}
    with gateway_process(upstream=vllm.url, **static) as gateway:

        async def crowd() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
                calls = [
                    client.post("/v1/chat/completions", json=body(max_tokens=64)) for _ in range(12)
                ]
                return await asyncio.gather(*calls)

        responses = asyncio.run(crowd())
    codes = sorted(r.status_code for r in responses)
    assert codes.count(200) >= 4
    refused = [r for r in responses if r.status_code == 429]
    assert refused
    waits = sorted(int(r.headers["retry-after-ms"]) for r in refused)
    assert len(set(waits)) == len(waits)  # each refused caller got its own time
    assert all(r.json()["error"]["code"] == "queue_full" for r in refused)


def test_client_disconnect_frees_the_upstream_sequence_and_is_charged_what_it_used() -> None:
    with (
        emulator_process(speed=1, answer_min_tokens=2000, answer_max_tokens=2000) as vllm,
        gateway_process(upstream=vllm.url) as gateway,
    ):
        asked = body(stream=True, max_tokens=2000)
        with httpx.stream(
            "POST", gateway.url + "/v1/chat/completions", json=asked, timeout=30
        ) as response:
            lines = response.iter_lines()  # kept: a dropped generator closes the response
            got = 0
            while got < 5:
                got += next(lines).startswith("data: {")
            wait_for(lambda: metric(vllm.url, "vllm:num_requests_running") == 1)
        # Closing our side mid-stream must abort the emulated sequence, not let it run on.
        wait_for(lambda: metric(vllm.url, "vllm:num_requests_running") == 0)
        wait_for(lambda: metric(gateway.url, "herdless_gateway_inflight") == 0)
        # It is charged the events vLLM sent (about a token each), not its 2,000 tokens.
        made = metric(vllm.url, "vllm:generation_tokens_total")
        served = metric(gateway.url, 'herdless_gateway_tokens_served_total{class="interactive"}')
        prompt = parse_chat_request(json.dumps(asked).encode()).prompt_tokens  # its estimate
        assert 5 <= served - prompt <= made + 1  # the first event carries no token


def test_a_body_not_streamed_whose_client_left_is_charged_what_the_engine_made() -> None:
    """A client that gives up on an answer not streamed (a timeout, an SDK's deadline or
    hedge) sees no token of it, nor does the gateway: it is charged the tokens the
    engine's measured decode rate made while it ran, not its 2,000."""
    with (
        emulator_process(speed=1, answer_min_tokens=2000, answer_max_tokens=2000) as vllm,
        gateway_process(upstream=vllm.url) as gateway,
    ):
        asked = body(max_tokens=2000)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(gateway.url + "/v1/chat/completions", json=asked, timeout=1.5)
        wait_for(lambda: metric(vllm.url, "vllm:num_requests_running") == 0)
        wait_for(lambda: metric(gateway.url, "herdless_gateway_inflight") == 0)
        made = metric(vllm.url, "vllm:generation_tokens_total")
        served = metric(gateway.url, 'herdless_gateway_tokens_served_total{class="interactive"}')
        prompt = parse_chat_request(json.dumps(asked).encode()).prompt_tokens
        assert 0 < made < 1000  # aborted when its client left, long before its end
        assert made / 2 <= served - prompt <= made * 1.5 + 10


def test_a_request_vllm_refuses_costs_its_key_and_user_nothing() -> None:
    """vLLM's 400 (a prompt past the context) and 404 (a model it does not serve) ran
    nothing: the key's tokens per minute and the user's share keep all of it (each was
    charged its price, 6,154 tokens here: the key's second such request got the gateway's
    429)."""
    with (
        emulator_process(speed=50, max_model_len=4096) as vllm,
        gateway_process(upstream=vllm.url, tokens_per_minute=12_000) as gateway,
    ):
        # vLLM 0.32 cuts an answer at the context's end: only the prompt past it is a 400.
        too_long = {"messages": [{"role": "user", "content": "hi " * 4200}], "max_tokens": 3000}
        asked = [too_long] * 3 + [too_long | {"model": "not-served"}] * 3
        url = gateway.url + "/v1/chat/completions"
        statuses = [httpx.post(url, json=one, timeout=30).status_code for one in asked]
        assert statuses == [400] * 3 + [404] * 3
        served = metric(gateway.url, 'herdless_gateway_tokens_served_total{class="interactive"}')
        assert served == 0
        assert httpx.post(url, json=body(max_tokens=5), timeout=30).status_code == 200


def test_a_request_of_about_the_whole_kv_cache_runs_alone_at_once() -> None:
    """A context about as long as the engine's whole KV cache (vLLM starts only if its
    cache holds one): beyond the self-sized budget, so it waits for the gateway's own
    requests to end, never for ever. Before, it waited its 30 s hold for a 429."""
    with (
        emulator_process(speed=50, kv_cache_tokens=4096, max_model_len=4096) as vllm,
        gateway_process(upstream=vllm.url) as gateway,
    ):
        wait_for(lambda: metric(gateway.url, 'herdless_gateway_sizing_mode{mode="engine"}') == 1)
        url = gateway.url + "/v1/chat/completions"
        whole = {"messages": [{"role": "user", "content": "abc " * 4060}], "max_tokens": 16}
        assert parse_chat_request(json.dumps(whole).encode()).price(0) > 4096 * 0.99
        answered = httpx.post(url, json=whole, timeout=10)
        assert answered.status_code == 200, answered.text
        assert answered.json()["usage"]["completion_tokens"] == 16


def test_upstream_down_then_loading_then_ready() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with gateway_process(upstream=url, health_interval=0.1) as gateway:
        down = httpx.post(gateway.url + "/v1/chat/completions", json=body())
        assert httpx.get(gateway.url + "/readyz").status_code == 503
        loading = ServerProcess(["emulate", "--startup-delay", "0.5", "--speed", "50"], port=port)
        with loading.start(wait=False):
            loading.wait_ready()
            wait_for(lambda: httpx.get(gateway.url + "/readyz").status_code == 200)
            up = httpx.post(gateway.url + "/v1/chat/completions", json=body(max_tokens=3))
    assert down.status_code == 503
    assert down.json()["error"]["code"] == "upstream_unavailable"
    assert int(down.headers["retry-after"]) >= 1
    assert up.status_code == 200


def test_keys_and_admin_drain_and_resume(gateway: ServerProcess) -> None:
    url = gateway.url
    assert httpx.post(url + "/v1/chat/completions", json=body()).status_code == 401
    assert httpx.post(url + "/admin/drain").status_code == 401
    assert httpx.post(url + "/admin/drain", headers=AUTH).status_code == 403
    assert httpx.post(url + "/admin/drain", headers=ADMIN).json()["draining"] is True
    try:
        drained = httpx.post(url + "/v1/chat/completions", json=body(), headers=AUTH)
        assert drained.status_code == 503
        assert drained.headers["x-herdless-drain"] == "1"
        assert drained.json()["error"]["code"] == "draining"
        assert httpx.get(url + "/readyz").status_code == 503
    finally:
        assert httpx.post(url + "/admin/resume", headers=ADMIN).status_code == 200
    served = httpx.post(url + "/v1/chat/completions", json=body(max_tokens=2), headers=AUTH)
    assert served.status_code == 200
    logs = gateway.logs(tail=10**8)  # whole lines only
    assert "k1" not in logs.replace("key-", "")
    # One format on the stream: every line is a JSON object with a time, uvicorn's too.
    lines = [json.loads(line) for line in logs.splitlines() if line.strip()]
    assert all(line["ts"].endswith("Z") for line in lines)
    assert any(line["logger"] == "uvicorn.error" for line in lines)
    # The audit trail: who drained and resumed, and who tried without the token.
    audit = [line for line in lines if line["logger"] == "herdless.gateway.audit"]
    outcomes = [(line["action"], line["outcome"]) for line in audit]
    assert ("drain", "denied 401") in outcomes
    assert ("drain", "denied 403") in outcomes
    assert outcomes[-2:] == [("drain", "done"), ("resume", "done")]
    assert all(
        line["caller"].startswith("127.0.0.1:") and line["at"].endswith("Z") for line in audit
    )
    assert "admin-secret" not in logs


def test_sigterm_lets_the_running_stream_finish_then_exits(vllm: ServerProcess) -> None:
    with gateway_process(upstream=vllm.url) as gateway:
        request = body(stream=True, max_tokens=200)
        with httpx.stream(
            "POST", gateway.url + "/v1/chat/completions", json=request, timeout=30
        ) as response:
            chunks = response.iter_raw()
            first = next(chunks)
            assert gateway.process is not None
            gateway.process.send_signal(signal.SIGTERM)
            rest = b"".join(chunks)
        assert (first + rest).endswith(b"data: [DONE]\n\n")
        gateway.wait_exit(timeout=15)
