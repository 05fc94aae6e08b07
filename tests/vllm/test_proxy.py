"""Chats from the official openai client and from herdless's SDK, through the gateway, to vLLM."""

from __future__ import annotations

import openai
import pytest

import herdless
from herdless.testing.servers import ServerProcess
from herdless.testing.vllm import MODEL_NAME

pytestmark = [pytest.mark.vllm]

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture
def client(gateway: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)


def test_openai_client_chat_through_the_gateway(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL_NAME, messages=FRANCE, max_tokens=24, temperature=0
    )
    assert reply.model == MODEL_NAME
    assert "Paris" in (reply.choices[0].message.content or "")
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None
    assert reply.usage.completion_tokens > 0


def test_openai_client_stream_through_the_gateway(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=MODEL_NAME,
            messages=FRANCE,
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Paris" in text
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None


def test_sdk_chat_and_stream_through_the_gateway(gateway: ServerProcess) -> None:
    with herdless.Client(primary=f"{gateway.url}/v1", model=MODEL_NAME) as sdk:
        result = sdk.chat(FRANCE, max_tokens=24, temperature=0)
        assert "Paris" in result.content
        assert result.fallback_reason is None
        assert result.model == MODEL_NAME
        with sdk.chat(FRANCE, max_tokens=24, temperature=0, stream=True) as stream:
            text = "".join(chunk.content for chunk in stream)
    assert "Paris" in text
