"""Contract: Anthropic's Messages API (``/v1/messages``, ``/v1/messages/count_tokens``), as
vLLM 0.32 serves it (``vllm/entrypoints/anthropic``): its bodies, its events, its errors.

The Messages API has no ``ignore_eos`` nor ``logit_bias``: the real model's answer may
end before ``max_tokens``; each test holds for either ending.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
from tests.contract.contract_kit import Upstream, stream_named_events

BODY_KEYS = {"id", "type", "role", "content", "model", "stop_reason", "usage"}
USAGE_KEYS = {"input_tokens", "output_tokens"}
STOP_REASONS = {"end_turn", "max_tokens"}


def message(upstream: Upstream, **body: Any) -> dict[str, Any]:
    return {**upstream.chat("Name a colour."), "max_tokens": 4, "system": "Be brief.", **body}


def check_usage(usage: dict[str, Any], stop_reason: str, max_tokens: int) -> None:
    assert set(usage) == USAGE_KEYS
    assert usage["input_tokens"] > 0
    assert 0 < usage["output_tokens"] <= max_tokens
    if stop_reason == "max_tokens":
        assert usage["output_tokens"] == max_tokens


def test_a_message_has_the_messages_api_fields(http: httpx.Client, upstream: Upstream) -> None:
    response = http.post("/v1/messages", json=message(upstream))
    assert response.status_code == 200
    body = response.json()
    assert set(body) == BODY_KEYS  # no stop_sequence: vLLM leaves out what is null
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{16}", body["id"])
    assert (body["type"], body["role"], body["model"]) == ("message", "assistant", upstream.model)
    [block] = body["content"]
    assert set(block) == {"type", "text"}
    assert block["type"] == "text"
    assert body["stop_reason"] in STOP_REASONS
    check_usage(body["usage"], body["stop_reason"], 4)


def test_a_message_stream_has_the_messages_events(http: httpx.Client, upstream: Upstream) -> None:
    sent = stream_named_events(http, "/v1/messages", message(upstream, stream=True))
    names = [name for name, _ in sent]
    assert (names[0], names[-2:]) == ("message_start", ["message_delta", "message_stop"])
    texts = [data for name, data in sent if name == "content_block_delta"]
    assert names[1:-2] == (
        ["content_block_start"] + ["content_block_delta"] * len(texts) + ["content_block_stop"]
    )
    start = sent[0][1]["message"]
    assert (start["content"], start["stop_reason"], start["stop_sequence"]) == ([], None, None)
    assert start["usage"]["output_tokens"] == 0
    assert sent[1][1] == {
        "type": "content_block_start",
        "content_block": {"type": "text", "text": ""},
        "index": 0,
    }
    assert all(set(d["delta"]) == {"type", "text"} and d["index"] == 0 for d in texts)
    assert sent[-3][1] == {"type": "content_block_stop", "index": 0}
    end = sent[-2][1]
    assert set(end["delta"]) == {"stop_reason", "stop_sequence"}
    assert end["delta"]["stop_reason"] in STOP_REASONS
    check_usage(end["usage"], end["delta"]["stop_reason"], 4)
    assert end["usage"]["input_tokens"] == start["usage"]["input_tokens"]
    assert sent[-1][1] == {"type": "message_stop"}


def test_count_tokens_is_a_messages_input_tokens(http: httpx.Client, upstream: Upstream) -> None:
    asked = message(upstream)
    used = http.post("/v1/messages", json=asked).json()["usage"]["input_tokens"]
    prompt = {k: v for k, v in asked.items() if k != "max_tokens"}
    counted = http.post("/v1/messages/count_tokens", json=prompt)
    assert counted.status_code == 200
    assert counted.json() == {
        "input_tokens": used,
        "context_management": {"original_input_tokens": used},
    }


@pytest.mark.parametrize(
    ("change", "status"),
    [({"model": "nope"}, 404), ({"max_tokens": 5000}, 400)],
    ids=["another model", "max_tokens over the context"],
)
def test_a_messages_errors_have_its_shape(
    http: httpx.Client, upstream: Upstream, change: dict[str, Any], status: int
) -> None:
    response = http.post("/v1/messages", json=message(upstream, **change))
    assert response.status_code == status
    body = response.json()
    assert body["type"] == "error"
    assert set(body) == {"type", "error"}
    assert set(body["error"]) == {"type", "message"}
    if status == 404:
        assert body["error"]["type"] == "NotFoundError"
        assert body["error"]["message"] == (
            f"The model `nope` does not exist. Valid aliases: {upstream.model}."
        )


def test_a_message_that_fails_the_schema_gets_vllms_usual_400(
    http: httpx.Client, upstream: Upstream
) -> None:
    no_cap = {k: v for k, v in message(upstream).items() if k != "max_tokens"}
    response = http.post("/v1/messages", json=no_cap)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("Bad Request", "body.max_tokens", 400)
