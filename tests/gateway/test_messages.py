"""/v1/messages (Anthropic's Messages API, which vLLM serves) and its count_tokens through
admission: pricing, refusals, the fairness unit, usage settlement (in process, a fake
vLLM behind that answers as vLLM 0.32 does)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from tests.gateway.fakes import (
    MESSAGE,
    MESSAGE_SSE,
    MESSAGE_TOKENS,
    FakeVllm,
    GatewayFactory,
    RefusingTransport,
    message_body,
    until,
)

from herdless.gateway.core.decisions import Ticket
from herdless.gateway.relay import settle
from herdless.gateway.routes import parse_message_request, parse_message_tokens_request
from herdless.gateway.usage import UsageSniffer
from herdless.gateway.wire import BadRequest

pytestmark = [pytest.mark.server]

MESSAGES = "/v1/messages"
COUNT = "/v1/messages/count_tokens"


def encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


# -- pricing (pure) ---------------------------------------------------------------------


def test_a_message_is_priced_by_its_system_messages_and_tools_plus_max_tokens() -> None:
    bare = parse_message_request(encode(message_body()))
    assert (bare.max_tokens, bare.generates, bare.stream, bare.open_ended) == (
        50,
        True,
        False,
        False,
    )
    assert bare.adds_usage is False  # its stream ends with its usage, asked for or not
    assert bare.price(512) == bare.prompt_tokens + 50
    system = parse_message_request(encode(message_body(system="s" * 400)))
    assert system.prompt_tokens == bare.prompt_tokens + 100
    blocks = [{"type": "text", "text": "s" * 200}, {"type": "text", "text": "s" * 200}]
    assert parse_message_request(encode(message_body(system=blocks))).prompt_tokens == (
        bare.prompt_tokens + 100
    )
    tools = [{"name": "read", "input_schema": {"type": "object", "description": "x" * 400}}]
    with_tools = parse_message_request(encode(message_body(tools=tools)))
    assert with_tools.prompt_tokens > bare.prompt_tokens + 100  # a tool's JSON costs its tokens
    read = {"type": "tool_result", "tool_use_id": "t1", "content": "x" * 4_000}
    call = {"type": "tool_use", "id": "t1", "name": "read", "input": {"path": "a.py"}}
    turns = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": [{"type": "text", "text": "reading"}, call]},
        {"role": "user", "content": [read, {"type": "image", "source": {"data": "y" * 8_000}}]},
    ]
    tooled = parse_message_request(encode(message_body(messages=turns))).prompt_tokens
    # The file the tool read counts (an image does not, as in a chat).
    assert 1_000 < tooled - bare.prompt_tokens < 1_100
    streamed = parse_message_request(encode(message_body(stream=True, metadata={"user_id": "ann"})))
    assert (streamed.stream, streamed.user, streamed.adds_usage) == (True, "ann", False)


def test_a_messages_prefix_follows_its_system_and_messages() -> None:
    def links(**extra: Any) -> tuple[int, ...]:
        return parse_message_request(encode(message_body(**extra))).prefix

    system = "You are the company's assistant. " * 40
    one = links(system=system, messages=[{"role": "user", "content": "a" * 300}])
    two = links(system=system, messages=[{"role": "user", "content": "b" * 300}])
    other = links(system="Another. " * 150, messages=[{"role": "user", "content": "a" * 300}])
    assert all(len(chain) > 1 for chain in (one, two, other))
    assert one[0] == two[0]  # the same system prompt: the same first blocks
    assert one[0] != other[0]
    assert one[-1] != two[-1]


def test_count_tokens_is_priced_by_its_prompt_alone() -> None:
    body = message_body()
    del body["max_tokens"]
    counted = parse_message_tokens_request(encode(body))
    assert (counted.generates, counted.max_tokens) == (False, None)
    assert counted.price(512) == counted.prompt_tokens
    assert counted.prompt_tokens == parse_message_request(encode(message_body())).prompt_tokens


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": "5"}, "max_tokens"),
        ({"messages": []}, "messages"),
        ({"messages": [{"content": "no role"}]}, "messages[0]"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"system": 5}, "system"),
        ({"metadata": "ann"}, "metadata"),
        ({"metadata": {"user_id": 5}}, "metadata.user_id"),
        ({"stream": "yes"}, "stream"),
    ],
)
def test_what_cannot_be_priced_is_a_bad_request_naming_the_field(
    change: dict[str, Any], param: str
) -> None:
    body = message_body() | change
    body = {name: value for name, value in body.items() if value is not None}
    with pytest.raises(BadRequest) as caught:
        parse_message_request(encode(body))
    assert caught.value.param == param


def test_a_max_tokens_over_the_cap_is_too_large() -> None:
    with pytest.raises(BadRequest) as caught:
        parse_message_request(encode(message_body(max_tokens=9_000)), max_tokens_cap=8_192)
    assert (caught.value.param, caught.value.code) == ("max_tokens", "request_too_large")


def test_a_stream_cut_short_is_charged_its_events_not_its_starts_usage() -> None:
    """A Messages stream's first event carries a usage of 0 output tokens; a client that
    leaves after two tokens is charged its events, as a chat stream's is."""

    class Recorder:
        def __init__(self) -> None:
            self.released: dict[str, Any] = {}

        def release(self, ticket: Ticket, **usage: Any) -> None:
            self.released = usage

    events = MESSAGE_SSE.split(b"\n\n")
    sniffer = UsageSniffer()
    sniffer.feed(b"\n\n".join(events[:4]) + b"\n\n")  # start, block start, two tokens
    gate = Recorder()
    ticket = Ticket(id=1, key_id="k", price=60, offered_at=0.0, prompt=10)
    settle(gate, ticket, sniffer, whole=False)  # type: ignore[arg-type]
    assert gate.released["completion_tokens"] == 4
    assert gate.released["prompt_tokens"] == 10
    assert gate.released["whole"] is False
    whole = UsageSniffer()
    whole.feed(MESSAGE_SSE)
    settle(gate, ticket, whole, whole=True)  # type: ignore[arg-type]
    assert (gate.released["prompt_tokens"], gate.released["completion_tokens"]) == (10, 3)


# -- over HTTP --------------------------------------------------------------------------


async def test_messages_are_proxied_as_vllm_wrote_them_and_settled_on_their_usage(
    gateway: GatewayFactory, fake_vllm: FakeVllm
) -> None:
    async with gateway() as (client, runtime):
        whole = await client.post(MESSAGES, json=message_body(metadata={"user_id": "ann"}))
        stream = await client.post(
            MESSAGES, json=message_body(stream=True, metadata={"user_id": "bob"})
        )
        question = [{"role": "user", "content": "hello"}]
        counted = await client.post(
            COUNT, json={"model": "m", "messages": question, "metadata": {"user_id": "cy"}}
        )
        queue, admission = runtime.gate.admission.queue, runtime.gate.admission
        # vLLM's usage, weighted (input 1, output 2): 10 + 3 * 2; a count runs on no GPU.
        assert queue.counter("interactive", f"anonymous/{runtime.users('ann')}") == 16
        assert queue.counter("interactive", f"anonymous/{runtime.users('bob')}") == 16
        assert queue.counter("interactive", f"anonymous/{runtime.users('cy')}") is None
        assert admission.inflight_tokens == 0
    assert (whole.status_code, whole.content) == (200, MESSAGE)
    assert (stream.status_code, stream.content) == (200, MESSAGE_SSE)  # nothing left out
    assert (counted.status_code, counted.content) == (200, MESSAGE_TOKENS)
    assert fake_vllm.paths == [MESSAGES, MESSAGES, COUNT]
    sent = [json.loads(body) for _, body in fake_vllm.received]
    assert "stream_options" not in sent[1]  # the Messages API has none to ask for
    assert sent[1]["metadata"] == {"user_id": "bob"}


async def test_a_count_goes_to_vllm_past_a_full_gateway_and_takes_no_place(
    gateway: GatewayFactory, fake_vllm: FakeVllm
) -> None:
    """vLLM counts without the GPU: a count never waits behind the chats, nor is refused
    for their full queue."""
    held = fake_vllm.hold = asyncio.Event()
    question = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
    async with gateway(max_concurrency=1, max_queue=1, sizing="static") as (client, runtime):
        admission = runtime.gate.admission
        chats = [asyncio.create_task(client.post(MESSAGES, json=message_body())) for _ in "ab"]
        # One chat held by vLLM, one waiting here.
        await until(
            lambda: (admission.inflight, admission.queue_depth, len(fake_vllm.paths)) == (1, 1, 1)
        )
        full = await client.post(MESSAGES, json=message_body())
        fake_vllm.hold = None  # what comes next is answered; the running chat stays held
        counted = await client.post(COUNT, json=question)
        unread = await client.post(COUNT, content=b"{", headers={"content-type": "x"})
        after = (admission.inflight, admission.queue_depth, admission.inflight_tokens > 0)
        held.set()
        answers = await asyncio.gather(*chats)
    assert full.status_code == 429  # the chats' queue is full
    assert (counted.status_code, counted.content) == (200, MESSAGE_TOKENS)
    assert counted.headers["x-request-id"]
    assert unread.status_code == 400  # what vLLM would refuse is still read first
    assert after == (1, 1, True)  # the count took no place
    assert [a.status_code for a in answers] == [200, 200]
    assert fake_vllm.paths == [MESSAGES, COUNT, MESSAGES]  # ahead of the queued chat


async def test_a_count_while_vllm_is_unreachable_is_a_503_with_its_hints(
    gateway: GatewayFactory,
) -> None:
    async with gateway(transport=RefusingTransport()) as (client, _):
        answer = await client.post(COUNT, json=message_body())
    assert answer.status_code == 503
    assert answer.json()["error"]["type"] == "service_unavailable"
    assert float(answer.headers["retry-after"]) > 0


async def test_a_message_without_max_tokens_is_a_400_vllm_never_sees(
    gateway: GatewayFactory, fake_vllm: FakeVllm
) -> None:
    body = message_body()
    del body["max_tokens"]
    async with gateway(api_keys="k1") as (client, _):
        auth = {"authorization": "Bearer k1"}
        response = await client.post(MESSAGES, json=body, headers=auth)
        no_key = await client.post(MESSAGES, json=message_body())
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "max_tokens"
    assert "Messages API" in response.json()["error"]["message"]
    assert no_key.status_code == 401
    assert fake_vllm.paths == []


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"x-api-key": "k1"}, 200),  # Anthropic's clients, given an API key
        ({"authorization": "Bearer k1"}, 200),  # given an auth token, and the OpenAI ones
        ({"x-api-key": "k2"}, 401),
        ({"authorization": "Bearer k2", "x-api-key": "k1"}, 401),  # the bearer token wins
        ({"authorization": "Basic k1"}, 401),
        ({}, 401),
    ],
    ids=["x-api-key", "bearer", "wrong x-api-key", "wrong bearer", "basic", "none"],
)
async def test_the_key_is_the_bearer_token_else_x_api_key_and_never_forwarded(
    gateway: GatewayFactory, fake_vllm: FakeVllm, headers: dict[str, str], status: int
) -> None:
    async with gateway(api_keys="k1") as (client, _):
        answer = await client.post(MESSAGES, json=message_body(), headers=headers)
        models = await client.get("/v1/models", headers=headers)
    assert (answer.status_code, models.status_code) == (status, status)
    if status == 401:
        assert answer.json()["error"]["message"] == (
            "a valid API key is required (Authorization: Bearer <key>, or x-api-key)"
        )
        assert fake_vllm.received == []
        return
    [(forwarded, _)] = fake_vllm.received
    assert {"x-api-key", "authorization"}.isdisjoint(forwarded)
