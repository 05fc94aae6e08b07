"""The official ``openai`` client, which nobody here wrote, against a real emulator process."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from herdless.launch.servers import ServerProcess

pytestmark = [pytest.mark.integration, pytest.mark.server]

HELLO = [{"role": "user", "content": "Say hello."}]


@pytest.fixture
def client(emulator_server: ServerProcess) -> Iterator[openai.OpenAI]:
    url = emulator_server.url + "/v1"
    with openai.OpenAI(base_url=url, api_key="unused", max_retries=0) as client:
        yield client


def test_models(client: openai.OpenAI) -> None:
    [model] = client.models.list().data
    assert model.id == "emulated"
    assert model.owned_by == "vllm"


def test_completion(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model="emulated", messages=HELLO, max_tokens=6)  # type: ignore[arg-type]
    assert reply.id.startswith("chatcmpl-")
    choice = reply.choices[0]
    assert choice.finish_reason in {"stop", "length"}
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert reply.usage is not None
    assert reply.usage.completion_tokens <= 6
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_stream_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="emulated",
        messages=HELLO,  # type: ignore[arg-type]
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    with stream:
        chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length"
    assert text
    usage = chunks[-1].usage
    assert usage is not None
    assert usage.completion_tokens == 5


async def test_async_stream(emulator_server: ServerProcess) -> None:
    client = openai.AsyncOpenAI(base_url=emulator_server.url + "/v1", api_key="x", max_retries=0)
    async with client:
        stream = await client.chat.completions.create(
            model="emulated",
            messages=HELLO,  # type: ignore[arg-type]
            max_tokens=4,
            stream=True,
        )
        pieces = [c.choices[0].delta.content async for c in stream if c.choices]
    assert len(pieces) >= 2  # the role chunk, then text


def test_errors_map_to_openai_exceptions(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as not_found:
        client.chat.completions.create(model="nope", messages=HELLO)  # type: ignore[arg-type]
    assert "does not exist" in str(not_found.value)
    with pytest.raises(openai.BadRequestError, match="max_model_len"):
        client.chat.completions.create(model="emulated", messages=HELLO, max_tokens=10**6)  # type: ignore[arg-type]


def test_text_completion(client: openai.OpenAI) -> None:
    reply = client.completions.create(model="emulated", prompt="Once upon a time", max_tokens=4)
    assert reply.object == "text_completion"
    assert reply.choices[0].text
    assert reply.usage is not None
    assert reply.usage.completion_tokens <= 4
