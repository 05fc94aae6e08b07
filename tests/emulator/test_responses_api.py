"""The emulator's Responses API (``/v1/responses``) in-process: vLLM 0.32's wire format,
run through the same engine as a chat completion (the contract tests check the shapes
against a real vLLM)."""

from __future__ import annotations

from typing import Any

import pytest
from tests.contract.contract_kit import named_events
from tests.emulator.test_app import HI, MODEL, emulator

pytestmark = [pytest.mark.server]

INSTRUCTIONS = "Answer briefly."


def asked(**extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "instructions": INSTRUCTIONS,
        "input": HI,
        "max_output_tokens": 5,
        **extra,
    }


async def test_a_response_is_the_chat_of_its_instructions_and_input() -> None:
    chat = {"messages": [{"role": "system", "content": INSTRUCTIONS}, *HI], "max_tokens": 5}
    async with emulator() as (client, state):
        answer = await client.post("/v1/responses", json=asked())
        same = (await client.post("/v1/chat/completions", json=chat)).json()
        ran = sum(state.engine.metrics.finished.values())
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/json"
    body = answer.json()
    [item] = body["output"]
    assert item["content"][0]["text"] == same["choices"][0]["message"]["content"]
    assert (body["status"], body["incomplete_details"]) == (
        "incomplete",
        {"reason": "max_output_tokens"},
    )
    assert body["usage"]["input_tokens"] == same["usage"]["prompt_tokens"]
    assert body["usage"]["output_tokens"] == 5
    assert ran == 2  # both ran on the engine


async def test_a_stream_opens_the_item_at_its_first_text_and_closes_it_with_the_text() -> None:
    async with emulator(answer_min_tokens=3, answer_max_tokens=3) as (client, _):
        answer = await client.post("/v1/responses", json=asked(stream=True, max_output_tokens=9))
    sent = named_events(answer.text)
    deltas = [data["delta"] for name, data in sent if name == "response.output_text.delta"]
    assert len(deltas) == 3  # the end-of-sequence token sends no delta
    done = sent[-1][1]["response"]
    assert (done["status"], done["usage"]["output_tokens"]) == ("completed", 4)
    assert done["output"][0]["content"][0]["text"] == "".join(deltas)
    assert [data["sequence_number"] for _, data in sent] == list(range(len(sent)))


async def test_other_items_are_in_the_prompt_as_json() -> None:
    call = {"type": "function_call_output", "call_id": "c1", "output": "many words " * 20}
    async with emulator() as (client, _):
        bare = (await client.post("/v1/responses", json=asked())).json()
        tools = (await client.post("/v1/responses", json=asked(input=[call, *HI]))).json()
    assert tools["usage"]["input_tokens"] > bare["usage"]["input_tokens"] + 40


async def test_an_answer_past_the_context_is_cut_and_the_cap_echoed() -> None:
    async with emulator(max_model_len=64, kv_cache_tokens=4096) as (client, _):
        body = (await client.post("/v1/responses", json=asked(max_output_tokens=64))).json()
        whole = (await client.post("/v1/responses", json=asked(input="word " * 70))).json()
    left = 64 - body["usage"]["input_tokens"]
    assert body["max_output_tokens"] == left
    assert whole["error"]["param"] == "input_tokens"
