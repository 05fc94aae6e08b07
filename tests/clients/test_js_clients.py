"""Real JavaScript clients from npm against a real gateway, each with its defaults.

openai-node, the Vercel ``ai`` SDK (openai-compatible provider), LangChain.js, one
plain ``fetch`` (no retry, as Open WebUI's backend sends it), Anthropic's SDK
(Claude Code's client, on ``/v1/messages``), and openai-node and the Vercel ``ai`` SDK's
OpenAI provider on ``/v1/responses``, run by
``herdless/bench/js/run.mjs`` in node, against ``herdless serve --max-concurrency 8
--max-queue 16`` in front of an emulator of 8 sequences: real processes on free ports.
What they pin is today's behaviour; docs/clients.md says what each client retries.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from herdless.bench.js_clients import (
    CHAT_CLIENTS,
    CLIENTS,
    CallResult,
    Client,
    Scenario,
    run_clients,
    run_clients_async,
)
from herdless.launch.servers import ServerProcess, emulator_process, free_port, gateway_process
from herdless.launch.vllm import read_metric

pytestmark = [pytest.mark.clients, pytest.mark.server]

RETRYING: tuple[Client, ...] = (
    "openai",
    "vercel",
    "langchain",
    "anthropic",
    "responses",
    "vercel-responses",
)
OVERLOAD: tuple[Client, ...] = (*CHAT_CLIENTS, "anthropic")
OVERLOAD_RETRYING = tuple(c for c in OVERLOAD if c in RETRYING)
MODEL = "emulated"  # the served name of every emulator here (conftest's too)


def scenario(client: Client, url: str, **options: Any) -> Scenario:
    return Scenario(client=client, base_url=url, api_key="sk-test", model=MODEL, **options)


def failures(results: list[CallResult]) -> list[str]:
    return [f"{r.index}: {r.statuses} {r.headers} {r.error}" for r in results if not r.ok]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("client", CLIENTS)
def test_each_client_gets_its_answers_through_the_gateway(
    js_clients: Path, gateway: ServerProcess, client: Client, stream: bool
) -> None:
    sent = scenario(client, gateway.url, calls=4, concurrency=2, max_tokens=24, stream=stream)
    results = run_clients(sent, directory=js_clients)
    assert [r.index for r in results] == [0, 1, 2, 3]
    assert failures(results) == []
    for r in results:
        assert (r.client, r.status, r.attempts, r.statuses) == (client, 200, 1, (200,))
        assert r.model == MODEL
        # Usage: in the answer, or in the stream's last chunk (each client asks for it).
        assert r.usage is not None
        assert r.usage.prompt_tokens
        assert 0 < (r.usage.completion_tokens or 0) <= 24
        assert r.first_byte_s is not None
        assert 0 < r.first_byte_s <= r.total_s
        if stream:
            assert r.chunks > 1  # text arrived in pieces, the first before the end
            assert r.first_byte_s < r.total_s
        else:
            assert r.chunks == 0


@pytest.mark.parametrize("client", CHAT_CLIENTS)  # a Messages stream always has its usage
def test_a_stream_that_asks_for_no_usage_is_settled_on_the_engines(
    js_clients: Path, client: Client
) -> None:
    # openai-node asks for a stream's usage only when told, the Vercel AI SDK without
    # includeUsage never: the gateway asks vLLM for it, settles each call's price
    # (prompt + max_tokens 2000) on it, and gives the client the stream it asked for.
    with (
        emulator_process(max_num_seqs=8, model=MODEL) as vllm,
        gateway_process(upstream=vllm.url) as gateway,
    ):
        sent = scenario(client, gateway.url, calls=4, concurrency=2, max_tokens=2000,
                        stream=True, usage=False)  # fmt: skip
        results = run_clients(sent, directory=js_clients)
        served = read_metric(gateway.url, "herdless_gateway_tokens_served_total")
        used = sum(read_metric(vllm.url, f"vllm:{kind}_tokens_total")
                   for kind in ("prompt", "generation"))  # fmt: skip
    assert failures(results) == []
    for r in results:
        assert (r.status, r.attempts, r.chunks > 1) == (200, 1, True)
        assert r.usage is None or r.usage.completion_tokens is None  # none in its stream
    assert served == used > 0  # not 4 x (prompt + 2000)


def test_anthropics_client_is_known_by_its_api_key_and_shown_the_gateways_refusal(
    js_clients: Path,
) -> None:
    # Claude Code's ANTHROPIC_API_KEY: the SDK sends it as x-api-key (vLLM reads only a
    # bearer token). A wrong one is a 401 it does not retry, and shows its message.
    keys = {"HERDLESS_GATEWAY_API_KEYS": "sk-test"}
    with (
        emulator_process(model=MODEL) as vllm,
        gateway_process(upstream=vllm.url, env=keys) as gateway,
    ):
        known = run_clients(scenario("anthropic", gateway.url, calls=2), directory=js_clients)
        wrong = Scenario(client="anthropic", base_url=gateway.url, api_key="sk-no", model=MODEL)
        [refused] = run_clients(wrong, directory=js_clients)
    assert failures(known) == []
    assert (refused.ok, refused.statuses) == (False, (401,))
    assert refused.error is not None
    assert "a valid API key is required" in refused.error  # the body's error.message


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_the_ai_sdks_openai_provider_holds_a_conversation_through_the_gateway(
    js_clients: Path, gateway: ServerProcess, stream: bool
) -> None:
    # Its default model sends an earlier answer as a reference to the stored item
    # ({"type": "item_reference"}): vLLM stores none and refuses it, so every second turn
    # failed; the gateway writes it out from the answers it relayed.
    sent = scenario("vercel-responses", gateway.url, calls=2, turns=3, stream=stream)
    results = run_clients(sent, directory=js_clients)
    assert failures(results) == []
    assert [r.statuses for r in results] == [(200, 200, 200)] * 2
    with emulator_process(model=MODEL) as vllm:  # vLLM alone
        [alone] = run_clients(
            scenario("vercel-responses", vllm.url, turns=2, stream=stream), directory=js_clients
        )
    assert (alone.ok, alone.statuses) == (False, (200, 400))
    assert alone.error is not None
    assert "item_reference" in alone.error


def test_a_conversation_is_for_the_ai_sdks_clients() -> None:
    with pytest.raises(ValueError, match="turns"):
        scenario("openai", "http://127.0.0.1:1", turns=2)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_under_overload_the_retrying_clients_get_every_answer(
    js_clients: Path, own_gateway: ServerProcess, stream: bool
) -> None:
    # As measured in issue 25, and Anthropic's client beside them: the five at once, 48
    # calls each, 24 at a time (120 in flight for 8 running and 16 queued), starting
    # together whatever their import time. (The Responses API's clients meet a full
    # queue below: two more node processes would be CPU this 2-core test does not have.)
    # Its own gateway, as the clients bench has: the module's gateway has learned the
    # earlier tests' run times, and the times a crowd is told run on from them (seen
    # past the plain fetch's 30 s hold: 1 of its 48 calls refused in one run here, 22 in
    # another, 24 in CI).
    gateway = own_gateway
    start_at = time.time() + 5.0
    runs = await asyncio.gather(
        *(
            run_clients_async(
                scenario(
                    client,
                    gateway.url,
                    calls=48,
                    concurrency=24,
                    max_tokens=(32, 64),
                    stream=stream,
                    start_at=start_at,
                ),
                directory=js_clients,
            )
            for client in OVERLOAD
        )
    )
    by_client = dict(zip(OVERLOAD, runs, strict=True))
    for client in OVERLOAD:
        for r in by_client[client]:
            # Only 429s before the end, which is an answer or a 429 with both hints.
            assert len(r.statuses) == r.attempts, r
            assert set(r.statuses[:-1]) <= {429}, (client, r.statuses)
            if r.ok:
                assert r.statuses[-1] == 200
            else:
                assert_hinted_429(r)
    # The plain fetch sends each request once: the gateway keeps it waiting for a place,
    # its 429 would be an error on a screen (it shows it: Node's fetch, user agent "node").
    assert all(r.attempts == 1 for r in by_client["single"])
    assert failures(by_client["single"]) == []
    # Which client meets the full queue depends on arrival order; one of them does.
    assert any(r.retried for client in OVERLOAD_RETRYING for r in by_client[client])
    # A retry waits out a full queue in the gateway, up to its hold (30 s, all its waits
    # together): openai-node's and Anthropic's say so (X-Stainless-Retry-Count), Vercel's
    # and LangChain.js's say nothing but send the same request again.
    assert {client: failures(by_client[client]) for client in OVERLOAD_RETRYING} == {
        client: [] for client in OVERLOAD_RETRYING
    }


def assert_hinted_429(r: CallResult) -> None:
    """A 429 with both hints, consistent: Retry-After is the hint in seconds, rounded up."""
    assert r.statuses[-1] == 429, r
    seconds, ms = int(r.headers["retry-after"]), float(r.headers["retry-after-ms"])
    assert 0 < ms <= seconds * 1000
    assert 1 <= seconds <= 59


async def queue_depth(url: str, client: httpx.AsyncClient) -> float:
    for line in (await client.get(url + "/metrics")).text.splitlines():
        if line.startswith("herdless_gateway_queue_depth "):
            return float(line.split()[1])
    raise AssertionError("herdless_gateway_queue_depth not exposed")


@pytest.mark.parametrize("client", CLIENTS)
async def test_a_full_gateway_says_when_to_come_back_and_the_retrying_clients_do(
    js_clients: Path, gateway: ServerProcess, client: Client
) -> None:
    # The client's calls leave at start_at; a second before, 24 long requests fill the
    # 8 running places and the 16 queued ones (about 4 s a wave), so each first attempt
    # meets a full queue. No answer of the wave has ended yet: the hints come from the
    # engine's decode rate, no earlier than the wave's predicted end. Openai-node, Vercel
    # and Anthropic's retry twice: told a fraction of a second, they ran out before it ended.
    # The plain fetch never retries (user agent "node"): the gateway keeps it instead.
    start_at = time.time() + 4.0
    # A prompt of its own: the gateway remembers the overload case's refusals, and the
    # same request again is a retry, kept (no 429 at once).
    prompt = "Tell me about the sea in one paragraph."
    sent = scenario(client, gateway.url, calls=4, concurrency=4, start_at=start_at, prompt=prompt)
    run = asyncio.create_task(run_clients_async(sent, directory=js_clients))
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 300}
    async with httpx.AsyncClient(timeout=120) as http:
        await asyncio.sleep(start_at - 1.0 - time.time())
        fill = [
            asyncio.create_task(http.post(gateway.url + "/v1/chat/completions", json=body))
            for _ in range(24)
        ]
        for _ in range(100):  # 5 s at most
            if await queue_depth(gateway.url, http) >= 16:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the 24 long requests did not fill the gateway's queue")
        results = await run
        assert [r.status_code for r in await asyncio.gather(*fill)] == [200] * 24
    for r in results:
        if client == "single":  # it never retries, and shows it: kept for its place
            assert (r.ok, r.attempts, r.statuses) == (True, 1, (200,)), r
            continue
        assert r.statuses[0] == 429, r
        # The hints name the wave's end, and one place past it: each call gets its
        # answer, after a burst of short answers too (this runs after the overload case).
        assert r.ok, r
        assert r.attempts >= 2, r  # the 429, then a retry at its hint
        assert set(r.statuses[:-1]) <= {429}, r.statuses
        assert r.statuses[-1] == 200


async def test_a_restart_no_one_knows_the_length_of_costs_no_call(js_clients: Path) -> None:
    # vLLM restarts: its port opens once its model is loaded (8 s), behind a gateway that
    # never saw a load, so it cannot tell when. The five at once, 24 calls each, meanwhile.
    port = free_port()
    vllm = ServerProcess(
        ["emulate", "--max-num-seqs", "8", "--model", MODEL, "--startup-delay", "8"],
        port=port,
        ready_timeout=60,
    )
    upstream = f"http://127.0.0.1:{port}"
    with gateway_process(upstream=upstream, max_concurrency=8, max_queue=16) as gateway:
        vllm.start(wait=False)
        with vllm:
            start_at = time.time() + 1.0
            runs = await asyncio.gather(
                *(
                    run_clients_async(
                        scenario(client, gateway.url, calls=24, concurrency=24, start_at=start_at),
                        directory=js_clients,
                    )
                    for client in CLIENTS
                )
            )
    by_client = dict(zip(CLIENTS, runs, strict=True))
    # A 503 would be an error on a screen: the plain fetch waits for vLLM in the gateway.
    assert failures(by_client["single"]) == []
    assert all(r.attempts == 1 for r in by_client["single"])
    # A retrying client is told at once (it may decide), and its retry waits for vLLM.
    assert any(r.statuses[0] == 503 for client in RETRYING for r in by_client[client])
    assert {client: failures(by_client[client]) for client in RETRYING} == {
        client: [] for client in RETRYING
    }


@pytest.fixture(scope="module")
def refusing_vllm() -> Iterator[ServerProcess]:
    """An emulator that answers every completion 429 with no Retry-After (as vLLM may)."""
    with emulator_process(model=MODEL, error_rate=1.0, error_status=429) as server:
        yield server


# Each client's default retries of a 429 that carries no Retry-After (docs/clients.md).
ATTEMPTS_ON_A_BARE_429 = {
    "openai": 3,
    "vercel": 3,
    "langchain": 1,
    "single": 1,
    "anthropic": 3,
    "responses": 3,
    "vercel-responses": 3,
}


@pytest.mark.parametrize("client", CLIENTS)
def test_the_runner_counts_every_request_a_client_sends(
    js_clients: Path, refusing_vllm: ServerProcess, client: Client
) -> None:
    sent = scenario(client, refusing_vllm.url, calls=2, concurrency=2)
    results = run_clients(sent, directory=js_clients)
    expected = ATTEMPTS_ON_A_BARE_429[client]
    for r in results:
        assert not r.ok
        assert r.status == 429
        assert r.error
        assert r.attempts == expected
        assert r.statuses == (429,) * expected
        assert r.first_byte_s is None
        assert "retry-after" not in r.headers
