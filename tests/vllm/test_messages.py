"""Anthropic's Messages API (what Claude Code and the Anthropic SDKs send) through the
gateway to vLLM, from the official ``anthropic`` client.

The model's words differ from one CPU to the next: these tests check the protocol (the
message's shape, its stop reason, its usage within ``max_tokens``) and what the gateway
did with it (each call settled on the usage vLLM reported, nothing left running).
"""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import httpx
import pytest

from herdless.launch.servers import ServerProcess
from herdless.launch.vllm import MODEL_NAME

pytestmark = [pytest.mark.vllm]

HI: list[anthropic.types.MessageParam] = [{"role": "user", "content": "Say hello."}]
MAX_TOKENS = 8


@pytest.fixture
def client(gateway: ServerProcess) -> Iterator[anthropic.Anthropic]:
    # auth_token: the Authorization header a gateway with keys (and vLLM) reads.
    with anthropic.Anthropic(base_url=gateway.url, auth_token="unused", max_retries=0) as client:
        yield client


def charged(gateway: ServerProcess) -> float:
    """Weighted tokens (input 1, output 2) the gateway charged its users so far."""
    text = httpx.get(f"{gateway.url}/metrics", timeout=10.0).raise_for_status().text
    lines = text.splitlines()
    samples = [line for line in lines if line.startswith("herdless_gateway_user_weighted_tokens{")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in samples)


def settled(gateway: ServerProcess, before: float, message: anthropic.types.Message) -> None:
    """The gateway charged ``message`` its usage since ``before``, and runs nothing."""
    assert 1 <= message.usage.output_tokens <= MAX_TOKENS
    used = message.usage.input_tokens + 2 * message.usage.output_tokens
    assert charged(gateway) - before == used
    ready = httpx.get(f"{gateway.url}/readyz", timeout=10.0).json()
    assert (ready["inflight"], ready["queue_depth"]) == (0, 0)


def test_a_message_through_the_gateway_is_settled_on_its_usage(
    client: anthropic.Anthropic, gateway: ServerProcess
) -> None:
    before = charged(gateway)
    message = client.messages.create(
        model=MODEL_NAME, max_tokens=MAX_TOKENS, messages=HI, metadata={"user_id": "ann"}
    )
    assert (message.type, message.role, message.model) == ("message", "assistant", MODEL_NAME)
    assert [block.type for block in message.content] == ["text"]
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.input_tokens > 0
    settled(gateway, before, message)


def test_a_message_stream_through_the_gateway_is_settled_on_its_usage(
    client: anthropic.Anthropic, gateway: ServerProcess
) -> None:
    before = charged(gateway)
    with client.messages.stream(
        model=MODEL_NAME, max_tokens=MAX_TOKENS, messages=HI, system="You answer briefly."
    ) as stream:
        kinds = [event.type for event in stream]
        message = stream.get_final_message()
    assert kinds[0] == "message_start"
    assert "content_block_delta" in kinds
    assert kinds[-1] == "message_stop"
    assert message.stop_reason in ("end_turn", "max_tokens")
    settled(gateway, before, message)


def test_count_tokens_through_the_gateway_counts_what_the_message_uses(
    client: anthropic.Anthropic, gateway: ServerProcess
) -> None:
    before = charged(gateway)
    counted = client.messages.count_tokens(model=MODEL_NAME, messages=HI)
    assert charged(gateway) == before  # vLLM counts without the GPU: nothing is charged
    message = client.messages.create(model=MODEL_NAME, max_tokens=1, messages=HI)
    assert counted.input_tokens == message.usage.input_tokens
    settled(gateway, before, message)


def test_a_message_without_max_tokens_is_refused_by_the_gateway(gateway: ServerProcess) -> None:
    response = httpx.post(
        f"{gateway.url}/v1/messages",
        json={"model": MODEL_NAME, "messages": HI},
        timeout=10.0,
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "max_tokens"
