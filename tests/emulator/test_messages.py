"""The emulator's Anthropic Messages API (``/v1/messages``, ``/v1/messages/count_tokens``)
in-process: vLLM 0.32's wire format, run through the same engine as a chat completion."""

from __future__ import annotations

from typing import Any

import pytest
from tests.contract.contract_kit import named_events
from tests.emulator.test_app import HI, MODEL, emulator

pytestmark = [pytest.mark.server]

SYSTEM = "Answer briefly."


def message(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 5, "system": SYSTEM, "messages": HI, **extra}


async def test_a_message_is_a_chat_of_its_system_prompt_and_messages() -> None:
    chat = {"messages": [{"role": "system", "content": SYSTEM}, *HI], "max_tokens": 5}
    async with emulator() as (client, _):
        answer = await client.post("/v1/messages", json=message())
        same = (await client.post("/v1/chat/completions", json=chat)).json()
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/json"
    body = answer.json()
    # vLLM leaves out what is null (stop_sequence): model_dump(exclude_none=True)
    assert list(body) == ["id", "type", "role", "content", "model", "stop_reason", "usage"]
    assert body["id"].startswith("chatcmpl-")
    assert (body["type"], body["role"], body["model"]) == ("message", "assistant", MODEL)
    assert body["content"] == [{"type": "text", "text": same["choices"][0]["message"]["content"]}]
    assert body["stop_reason"] == "max_tokens"
    usage = same["usage"]
    assert body["usage"] == {"input_tokens": usage["prompt_tokens"], "output_tokens": 5}


async def test_a_stream_sends_the_messages_events_and_its_usage_twice() -> None:
    async with emulator(answer_min_tokens=3, answer_max_tokens=3) as (client, _):
        whole = (await client.post("/v1/messages", json=message(max_tokens=50))).json()
        r = await client.post("/v1/messages", json=message(max_tokens=50, stream=True))
    assert r.headers["content-type"].startswith("text/event-stream")
    assert "[DONE]" not in r.text
    events = named_events(r.text)
    names = [name for name, _ in events]
    assert names == [
        "message_start", "content_block_start", *["content_block_delta"] * 3,
        "content_block_stop", "message_delta", "message_stop",
    ]  # fmt: skip
    start = events[0][1]["message"]
    assert (start["content"], start["stop_reason"], start["stop_sequence"]) == ([], None, None)
    assert start["usage"] == {"input_tokens": whole["usage"]["input_tokens"], "output_tokens": 0}
    assert events[1][1] == {
        "type": "content_block_start",
        "content_block": {"type": "text", "text": ""},
        "index": 0,
    }
    text = "".join(data["delta"]["text"] for name, data in events if name == "content_block_delta")
    assert text == whole["content"][0]["text"]  # an EOS sends no empty delta
    end = events[-2][1]
    assert end["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert end["usage"] == whole["usage"] == {"input_tokens": 17, "output_tokens": 4}


async def test_a_stream_cut_at_max_tokens_says_so() -> None:
    async with emulator() as (client, _):
        r = await client.post("/v1/messages", json=message(max_tokens=2, stream=True))
    events = named_events(r.text)
    assert sum(name == "content_block_delta" for name, _ in events) == 2
    assert events[-2][1]["delta"]["stop_reason"] == "max_tokens"
    assert events[-2][1]["usage"]["output_tokens"] == 2


@pytest.mark.parametrize(
    "blocks",
    [
        [{"type": "text", "text": "hi"}],
        [{"type": "text", "text": "hi"}, {"type": "image", "source": {"type": "base64"}}],
    ],
    ids=["text", "an image counts nothing"],
)
async def test_count_tokens_is_the_messages_input_tokens(blocks: list[dict[str, Any]]) -> None:
    asked = message(messages=[{"role": "user", "content": blocks}])
    async with emulator() as (client, _):
        counted = await client.post("/v1/messages/count_tokens", json=prompt_of(asked))
        used = (await client.post("/v1/messages", json=asked)).json()["usage"]
        plain = await client.post("/v1/messages/count_tokens", json=prompt_of(message()))
    assert counted.json() == {
        "input_tokens": used["input_tokens"],
        "context_management": {"original_input_tokens": used["input_tokens"]},
    }
    assert used["input_tokens"] == plain.json()["input_tokens"]  # as "hi" given as a string


def prompt_of(body: dict[str, Any]) -> dict[str, Any]:
    """A count_tokens body: the message less its ``max_tokens``."""
    return {k: v for k, v in body.items() if k != "max_tokens"}


async def test_tool_calls_and_results_are_in_the_prompt() -> None:
    turns = [
        *HI,
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "t1", "name": "read", "input": {"path": "notes.txt"}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "many words " * 20},
        ]},
    ]  # fmt: skip
    async with emulator() as (client, _):
        bare = await client.post("/v1/messages/count_tokens", json={"model": MODEL, "messages": HI})
        tools = await client.post(
            "/v1/messages/count_tokens", json={"model": MODEL, "messages": turns}
        )
    assert tools.json()["input_tokens"] > bare.json()["input_tokens"] + 40


@pytest.mark.parametrize(
    ("payload", "status", "type_"),
    [
        (message(model="nope"), 404, "NotFoundError"),
        (message(max_tokens=5000), 400, "BadRequestError"),
        (message(messages=[{"role": "user", "content": "word " * 2100}]), 400, "BadRequestError"),
    ],
    ids=["another model", "max_tokens over the context", "a prompt over it"],
)
async def test_its_errors_have_the_messages_shape(
    payload: dict[str, Any], status: int, type_: str
) -> None:
    async with emulator(max_model_len=2048, kv_cache_tokens=4096) as (client, _):
        r = await client.post("/v1/messages", json=payload)
    assert r.status_code == status
    body = r.json()
    assert list(body) == ["type", "error"]
    assert body["type"] == "error"
    assert list(body["error"]) == ["type", "message"]
    assert body["error"]["type"] == type_


async def test_a_body_that_fails_the_schema_is_vllms_own_400() -> None:
    # vLLM validates the body before its Messages code runs: its usual error shape.
    async with emulator() as (client, _):
        r = await client.post("/v1/messages", json=prompt_of(message()))
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "body.max_tokens"


async def test_a_message_runs_on_the_engine_as_a_chat_does() -> None:
    async with emulator() as (client, state):
        await client.post("/v1/messages", json=message(max_tokens=7))
        metrics = (await client.get("/metrics")).text
    assert state.engine.metrics.generation_tokens == 7
    assert "vllm:generation_tokens_total" in metrics
