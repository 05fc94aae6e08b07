"""A stream whose client asks for no usage: the gateway asks vLLM for it, settles on it,
and leaves the usage event out of what the client gets (in process, a fake vLLM behind)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from tests.gateway.fakes import (
    COMPLETION,
    SSE,
    TEXT_SSE,
    FakeVllm,
    GatewayFactory,
    chat_body,
    without_usage,
)

from herdless.gateway.routes import (
    Priced,
    parse_completion_request,
    parse_embedding_request,
    parse_response_request,
)
from herdless.gateway.usage import UsageSniffer, asking_usage
from herdless.gateway.wire import parse_chat_request

pytestmark = [pytest.mark.server]

CHAT = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
TEXT = {"prompt": "hi", "stream": True}
ASKED = {"include_usage": True}


@pytest.mark.parametrize(
    ("parse", "body", "adds"),
    [
        (parse_chat_request, CHAT, True),
        (parse_chat_request, CHAT | {"stream_options": None}, True),
        (parse_chat_request, CHAT | {"stream_options": {}}, True),
        (parse_chat_request, CHAT | {"stream_options": {"include_usage": False}}, True),
        (parse_chat_request, CHAT | {"stream_options": ASKED}, False),
        (parse_chat_request, CHAT | {"stream_options": "usage"}, False),  # vLLM's 400
        (parse_chat_request, CHAT | {"stream": False}, False),
        (parse_chat_request, {"messages": CHAT["messages"]}, False),
        (parse_completion_request, TEXT, True),
        (parse_completion_request, TEXT | {"stream_options": ASKED}, False),
        (parse_completion_request, TEXT | {"stream": False}, False),
        (parse_response_request, {"input": "hi", "stream": True}, False),  # ends with usage
        (parse_embedding_request, {"input": "hi"}, False),
    ],
)
def test_the_gateway_asks_for_the_usage_of_a_stream_whose_client_did_not(
    parse: Callable[..., Priced], body: dict[str, Any], adds: bool
) -> None:
    assert parse(json.dumps(body).encode()).adds_usage is adds


def test_asking_for_usage_keeps_the_rest_of_the_body() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "안녕하세요"}],
        "stream": True,
        "stream_options": {"continuous_usage_stats": True, "x": 1},
        "max_tokens": 9,
    }
    sent = asking_usage(json.dumps(body).encode())
    # Usage on the last event only: continuous usage was moot without it.
    assert json.loads(sent) == body | {"stream_options": {"x": 1, "include_usage": True}}
    # A lone surrogate (a string cut in an emoji, as JavaScript escapes it) stays JSON.
    cut = asking_usage(b'{"messages":[{"role":"user","content":"\\ud83d"}],"stream":true}')
    assert json.loads(cut)["messages"][0]["content"] == "\ud83d"


def _split(data: bytes, at: int) -> list[bytes]:
    return [data[:at], data[at:]]


@pytest.mark.parametrize("events", [SSE, SSE.replace(b"\n\n", b"\r\n\r\n"), TEXT_SSE])
def test_the_usage_event_is_left_out_wherever_the_chunks_split(events: bytes) -> None:
    expected = without_usage(events, b"\r\n\r\n" if b"\r\n" in events else b"\n\n")
    for at in range(len(events) + 1):
        sniffer = UsageSniffer(omit=True)
        passed = b"".join(sniffer.feed(chunk) for chunk in _split(events, at)) + sniffer.end()
        assert passed == expected, at
        assert sniffer.total_tokens is not None  # read all the same


def test_only_the_usage_event_is_left_out() -> None:
    # A text that speaks of usage, and usage on an event with choices (vLLM's continuous
    # usage): both pass, as does an event that is not JSON.
    talk = b'data: {"choices":[{"delta":{"content":"\\"usage\\":{}"}}]}\n\n'
    riding = b'data: {"choices":[{"delta":{}}],"usage":{"total_tokens":5}}\n\n'
    odd = b'event: note\ndata: "usage" {\n\n'
    sniffer = UsageSniffer(omit=True)
    assert sniffer.feed(talk + riding + odd) == talk + riding + odd


FINISH = b'data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}'
USAGE = b'data: {"id":"c","choices":[],"usage":{"total_tokens":3},"system_fingerprint":"vllm-0.32"}'
DONE = b"data: [DONE]\n\n"


def test_the_fingerprint_goes_back_where_vllm_puts_it_without_usage() -> None:
    sniffer = UsageSniffer(omit=True)
    assert sniffer.feed(FINISH + b"\n\n") == b""  # held: the usage event may follow
    assert sniffer.feed(USAGE + b"\n\n" + DONE) == (
        FINISH[:-1] + b',"system_fingerprint":"vllm-0.32"}\n\n' + DONE
    )
    assert sniffer.total_tokens == 3


@pytest.mark.parametrize("then", [DONE, b""], ids=["another event", "the end"])
def test_a_finishing_event_held_passes_on_unchanged_when_no_usage_follows(then: bytes) -> None:
    sniffer = UsageSniffer(omit=True)
    assert sniffer.feed(FINISH + b"\n\n") + sniffer.feed(then) + sniffer.end() == (
        FINISH + b"\n\n" + then
    )


def test_a_cut_event_is_passed_on_at_the_end() -> None:
    sniffer = UsageSniffer(omit=True)
    assert sniffer.feed(b'data: {"choices":[{"delta":{"content":"Hi"}}]}\n\ndata: {"cho') == (
        b'data: {"choices":[{"delta":{"content":"Hi"}}]}\n\n'
    )
    assert sniffer.end() == b'data: {"cho'
    assert sniffer.end() == b""


@pytest.mark.parametrize("omit", [True, False])
def test_the_events_of_a_stream_are_counted_as_they_come(omit: bool) -> None:
    sniffer = UsageSniffer(omit=omit)
    sniffer.feed(b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n')
    sniffer.feed(b'data: {"choices":[{"delta":{"content":"Hi"}}]}\n\ndata: {"cho')
    assert (sniffer.events, sniffer.total_tokens) == (3, None)  # a stream cut short
    assert UsageSniffer(omit=omit).events == 0
    body = UsageSniffer(omit=omit)
    body.feed(COMPLETION)
    assert body.events == 0  # not a stream


def test_a_body_that_is_not_an_event_stream_passes_on_as_it_comes() -> None:
    sniffer = UsageSniffer(omit=True)
    big = b"x" * 70_000
    assert sniffer.feed(big[:60_000]) == b""  # an event may be this long
    assert sniffer.feed(big[60_000:]) == big  # no event is: it passes on from now on
    assert sniffer.feed(b"tail\n\n") == b"tail\n\n"
    assert sniffer.end() == b""


def test_without_omit_every_byte_passes_at_once() -> None:
    sniffer = UsageSniffer()
    assert [sniffer.feed(c) for c in _split(SSE, 10)] == _split(SSE, 10)
    assert sniffer.end() == b""


async def _streamed(client: Any, path: str, body: dict[str, Any]) -> bytes:
    async with client.stream("POST", path, json=body) as response:
        assert response.status_code == 200
        return b"".join([chunk async for chunk in response.aiter_raw()])


@pytest.mark.parametrize(
    ("path", "events", "body"),
    [
        ("/v1/chat/completions", SSE, chat_body(stream=True, max_tokens=500)),
        (
            "/v1/chat/completions",
            SSE,
            chat_body(stream=True, max_tokens=500, stream_options={"include_usage": False}),
        ),
        ("/v1/completions", TEXT_SSE, {"model": "m", "prompt": "hello", "stream": True,
                                       "max_tokens": 500}),
    ],
)  # fmt: skip
async def test_a_stream_without_usage_is_settled_on_the_usage_the_gateway_asked_for(
    gateway: GatewayFactory,
    fake_vllm: FakeVllm,
    path: str,
    events: bytes,
    body: dict[str, Any],
) -> None:
    # Each is priced at its prompt + 500 tokens and uses 8 or 13: with 600 tokens a minute,
    # the second fits only if the first was settled on its usage.
    async with gateway(tokens_per_minute=600) as (client, runtime):
        first = await _streamed(client, path, body)
        second = await _streamed(client, path, body)
        served = runtime.gate.admission.queue.served_tokens["interactive"]
    assert first == second == without_usage(events)
    usage = json.loads(events.split(b"\n\n")[-3].removeprefix(b"data: "))["usage"]
    assert served == 2 * usage["total_tokens"]  # not the prices
    sent = json.loads(fake_vllm.received[0][1])
    assert sent["stream_options"] == {"include_usage": True}
    assert {k: v for k, v in sent.items() if k != "stream_options"} == {
        k: v for k, v in body.items() if k != "stream_options"
    }


async def test_an_error_answer_to_a_stream_passes_unchanged(
    gateway: GatewayFactory, fake_vllm: FakeVllm
) -> None:
    payload = {"error": {"message": "bad", "type": "BadRequestError", "param": None, "code": 400}}
    fake_vllm.error = (400, payload)
    async with gateway() as (client, _):
        response = await client.post("/v1/chat/completions", json=chat_body(stream=True))
    assert (response.status_code, response.json()) == (400, payload)
