"""Anthropic's Messages API through a real gateway in front of the real emulator, with the
official ``anthropic`` client given its key as an API key (sent as ``x-api-key``)."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from herdless.launch.servers import emulator_process, gateway_process
from herdless.launch.vllm import read_metric

pytestmark = [pytest.mark.integration, pytest.mark.server]

MODEL = "emulated"
ASKED: list[anthropic.types.MessageParam] = [{"role": "user", "content": "Name three rivers."}]


def test_messages_whole_streamed_and_counted_are_served_and_settled_on_their_usage() -> None:
    env = {"HERDLESS_GATEWAY_API_KEYS": "k1"}
    with (
        emulator_process(speed=200, model=MODEL) as vllm,
        gateway_process(upstream=vllm.url, env=env) as gateway,
        anthropic.Anthropic(base_url=gateway.url, api_key="k1", max_retries=0) as client,
    ):
        whole = client.messages.create(
            model=MODEL, system="Be brief.", messages=ASKED, max_tokens=20
        )
        with client.messages.stream(model=MODEL, messages=ASKED, max_tokens=20) as stream:
            texts = list(stream.text_stream)
            final = stream.get_final_message()
        counted = client.messages.count_tokens(model=MODEL, messages=ASKED)
        wrong = httpx.post(
            gateway.url + "/v1/messages",
            json={"model": MODEL, "messages": ASKED, "max_tokens": 5},
            headers={"x-api-key": "k2"},
        )
        served = read_metric(gateway.url, "herdless_gateway_tokens_served_total")
        used = sum(
            read_metric(vllm.url, f"vllm:{kind}_tokens_total") for kind in ("prompt", "generation")
        )
    assert whole.model == MODEL
    block = final.content[0]
    assert whole.content[0].type == block.type == "text"
    assert 0 < whole.usage.output_tokens <= 20
    assert len(texts) > 1
    assert isinstance(block, anthropic.types.TextBlock)
    assert "".join(texts) == block.text
    assert final.usage.input_tokens == counted.input_tokens
    assert whole.usage.input_tokens > counted.input_tokens  # its system prompt counts
    assert wrong.status_code == 401
    # Each answer is settled on the usage the engine reported; a count, which no engine
    # runs, is not admitted and so not charged.
    messages = [whole.usage, final.usage]
    assert served == used
    assert used == sum(u.input_tokens + u.output_tokens for u in messages)
