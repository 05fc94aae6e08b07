"""Chats from the official openai client and from herdless's SDK, through the gateway, to vLLM.

What the model would say differs from one CPU to another (vLLM picks its bf16
kernels by the processor's features), so every request here decides its own
answer with ``forced_answer``: a known text and a known ending. The tests check
that the gateway carries the request's fields to vLLM and the answer back
unchanged, with the finish reason and the token counts that answer implies.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

import herdless
from herdless.gateway.wire import parse_chat_request
from herdless.launch.servers import ServerProcess
from herdless.launch.vllm import FORCED_TEXT, MODEL_NAME, forced_answer, read_metric

pytestmark = [pytest.mark.vllm]

HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture
def client(gateway: ServerProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0) as client:
        yield client


def test_openai_client_chat_through_the_gateway(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL_NAME, messages=HI, extra_body=forced_answer(3, ending="stop")
    )
    assert reply.model == MODEL_NAME
    [choice] = reply.choices
    assert choice.message.content == FORCED_TEXT * 3
    assert choice.finish_reason == "stop"
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 3 + 1  # the EOS counts
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 3 + 1


def test_openai_client_stream_through_the_gateway(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=MODEL_NAME,
            messages=HI,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=forced_answer(5, ending="length"),
        )
    )
    *answer, usage = chunks
    assert all(chunk.model == MODEL_NAME for chunk in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in answer) == FORCED_TEXT * 5
    # The finish rides on the chunk with the last token's text, before the usage chunk.
    assert [c.choices[0].finish_reason for c in answer][-1] == "length"
    assert answer[-1].choices[0].delta.content
    assert all(c.choices[0].finish_reason is None for c in answer[:-1])
    assert usage.choices == []
    assert usage.usage is not None
    assert usage.usage.completion_tokens == 5


def test_sdk_chat_and_stream_through_the_gateway(gateway: ServerProcess) -> None:
    with herdless.Client(primary=f"{gateway.url}/v1", model=MODEL_NAME) as sdk:
        result = sdk.chat(HI, **forced_answer(4, ending="length"))
        assert result.content == FORCED_TEXT * 4
        assert result.finish_reason == "length"
        assert result.fallback_reason is None
        assert result.model == MODEL_NAME
        assert result.usage is not None
        assert result.usage.completion_tokens == 4
        with sdk.chat(HI, stream=True, **forced_answer(2, ending="stop")) as stream:
            text = "".join(chunk.content for chunk in stream)
            assert stream.finish_reason == "stop"
            assert stream.usage is not None
            assert stream.usage.completion_tokens == 2 + 1  # the SDK asks for usage
    assert text == FORCED_TEXT * 2


def test_completions_and_responses_pass_admission_and_settle_their_usage(
    client: openai.OpenAI, gateway: ServerProcess
) -> None:
    served = "herdless_gateway_tokens_served_total"
    before = read_metric(gateway.url, served, **{"class": "interactive"})
    text = client.completions.create(
        model=MODEL_NAME, prompt="Hi", max_tokens=3, extra_body={"ignore_eos": True}
    )
    answer = client.responses.create(model=MODEL_NAME, input="Hi", max_output_tokens=3)
    after = read_metric(gateway.url, served, **{"class": "interactive"})
    assert text.object == "text_completion"
    assert text.usage is not None
    assert text.usage.completion_tokens == 3
    assert answer.object == "response"
    assert answer.usage is not None
    assert 1 <= answer.usage.output_tokens <= 3
    assert answer.usage.input_tokens >= 1
    # The gateway read both usages (the Responses API names its counts input_tokens and
    # output_tokens) and served exactly those tokens, not its estimates.
    assert after - before == text.usage.total_tokens + answer.usage.total_tokens


def test_a_stream_without_usage_is_settled_on_it_and_streamed_as_vllm_streams_it(
    client: openai.OpenAI, gateway: ServerProcess
) -> None:
    # The gateway asks vLLM for the usage its client did not ask for: it settles the
    # price (its estimate of the prompt plus max_tokens) on it, and the client gets the
    # stream vLLM sends when not asked (no usage chunk; the fingerprint on the last one).
    served = "herdless_gateway_tokens_served_total"
    whole = client.chat.completions.create(
        model=MODEL_NAME, messages=HI, extra_body=forced_answer(3, ending="stop", max_tokens=64)
    )
    before = read_metric(gateway.url, served, **{"class": "interactive"})
    chunks = list(
        client.chat.completions.create(
            model=MODEL_NAME,
            messages=HI,
            stream=True,
            extra_body=forced_answer(3, ending="stop", max_tokens=64),
        )
    )
    after = read_metric(gateway.url, served, **{"class": "interactive"})
    assert all(chunk.choices for chunk in chunks)
    assert all(chunk.usage is None for chunk in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == FORCED_TEXT * 3
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert chunks[-1].system_fingerprint
    assert whole.usage is not None
    assert after - before == whole.usage.total_tokens  # the usage, not the price


def test_a_stream_its_client_stops_is_charged_the_tokens_vllm_sent_not_its_max_tokens(
    gateway: ServerProcess, vllm_url: str
) -> None:
    # An employee presses stop after 5 tokens of an answer that may run to 400: vLLM
    # aborts it, and the gateway settles it on the events vLLM sent (about a token each).
    served = "herdless_gateway_tokens_served_total"
    body = {"model": MODEL_NAME, "messages": HI, "stream": True}
    body |= forced_answer(400, ending="length")
    before = read_metric(gateway.url, served, **{"class": "interactive"})
    made = read_metric(vllm_url, "vllm:generation_tokens_total")
    with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()  # kept: a dropped generator closes the response
        got = -1  # the first event names the role
        while got < 5:
            got += next(lines).startswith("data: {")
    deadline = time.monotonic() + 60
    while read_metric(gateway.url, "herdless_gateway_inflight") > 0:
        assert time.monotonic() < deadline, "the stopped stream is still running"
        time.sleep(0.1)
    made = read_metric(vllm_url, "vllm:generation_tokens_total") - made
    charged = read_metric(gateway.url, served, **{"class": "interactive"}) - before
    prompt = parse_chat_request(json.dumps(body).encode()).prompt_tokens  # its estimate
    assert 5 <= charged - prompt <= made + 1 < 400


def test_an_answer_not_streamed_whose_client_left_is_charged_what_vllm_made(
    gateway: ServerProcess, vllm_url: str
) -> None:
    # A client gives up after 2 s on an answer not streamed that may run to 400 tokens:
    # vLLM aborts it, and the gateway, which saw no token of it, settles it on what its
    # reading of vLLM's decode rate says vLLM made in its run.
    served = "herdless_gateway_tokens_served_total"
    body = {"model": MODEL_NAME, "messages": HI} | forced_answer(400, ending="length")
    before = read_metric(gateway.url, served, **{"class": "interactive"})
    made = read_metric(vllm_url, "vllm:generation_tokens_total")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=2.0)
    deadline = time.monotonic() + 60
    while read_metric(gateway.url, "herdless_gateway_inflight") > 0:
        assert time.monotonic() < deadline, "the abandoned answer is still running"
        time.sleep(0.1)
    time.sleep(0.5)  # vLLM's counter takes the aborted request's last tokens
    made = read_metric(vllm_url, "vllm:generation_tokens_total") - made
    charged = read_metric(gateway.url, served, **{"class": "interactive"}) - before
    prompt = parse_chat_request(json.dumps(body).encode()).prompt_tokens  # its estimate
    assert 0 < made < 400
    assert made / 2 <= charged - prompt <= made * 1.5 + 10


def test_a_request_vllm_refuses_is_charged_nothing(gateway: ServerProcess) -> None:
    # vLLM answers 400 to an answer longer than its context (2,048 tokens here): nothing
    # ran, so neither the key's tokens per minute nor the user's share pay its price.
    served = "herdless_gateway_tokens_served_total"
    before = read_metric(gateway.url, served, **{"class": "interactive"})
    body = {"model": MODEL_NAME, "messages": HI, "max_tokens": 4000}
    refused = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=60)
    assert refused.status_code == 400
    assert refused.headers["x-herdless-backend"] == "upstream"  # vLLM's own answer
    assert read_metric(gateway.url, served, **{"class": "interactive"}) == before
