"""Contract: OpenAI's Responses API (``/v1/responses``) as vLLM 0.32 serves it without its
response store (``vllm/entrypoints/openai/responses``): its body, its events, its errors.

The real model's answer may end before ``max_output_tokens``; each test holds for either
ending.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
from tests.contract.contract_kit import MAX_MODEL_LEN, Upstream, stream_named_events

# vLLM's field order (its pydantic model's).
RESPONSE_KEYS = [
    "id", "created_at", "incomplete_details", "instructions", "metadata", "model", "object",
    "output", "parallel_tool_calls", "temperature", "tool_choice", "tools", "top_p",
    "background", "max_output_tokens", "max_tool_calls", "previous_response_id", "prompt",
    "reasoning", "service_tier", "status", "text", "top_logprobs", "truncation", "usage",
    "user", "presence_penalty", "frequency_penalty", "kv_transfer_params",
    "ec_transfer_params", "input_messages", "output_messages",
]  # fmt: skip
ITEM_KEYS = ["id", "content", "role", "status", "type", "phase"]
PART_KEYS = ["annotations", "text", "type", "logprobs"]
USAGE_KEYS = [
    "input_tokens", "input_tokens_details", "output_tokens", "output_tokens_details",
    "total_tokens",
]  # fmt: skip
OPEN = ["response.created", "response.in_progress"]
ITEM_OPEN = ["response.output_item.added", "response.content_part.added"]
ITEM_CLOSE = [
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]


def request(upstream: Upstream, **body: Any) -> dict[str, Any]:
    return {
        "model": upstream.model,
        "instructions": "Be brief.",
        "input": "Name a colour.",
        "max_output_tokens": 4,
        **body,
    }


def check_ending(response: dict[str, Any], max_output_tokens: int) -> None:
    """``completed``, or ``incomplete`` at ``max_output_tokens``; usage that adds up."""
    usage = response["usage"]
    assert list(usage) == USAGE_KEYS
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert 0 < usage["output_tokens"] <= max_output_tokens
    if response["status"] == "incomplete":
        assert response["incomplete_details"] == {"reason": "max_output_tokens"}
        assert usage["output_tokens"] == max_output_tokens
    else:
        assert (response["status"], response["incomplete_details"]) == ("completed", None)


def test_a_response_has_the_responses_api_fields(http: httpx.Client, upstream: Upstream) -> None:
    answer = http.post("/v1/responses", json=request(upstream, temperature=0.5))
    assert answer.status_code == 200
    body = answer.json()
    assert list(body) == RESPONSE_KEYS
    assert re.fullmatch(r"resp_[0-9a-f]{16}", body["id"])
    assert (body["object"], body["model"]) == ("response", upstream.model)
    # The request's settings, echoed.
    assert (body["instructions"], body["max_output_tokens"]) == ("Be brief.", 4)
    assert (body["temperature"], body["top_p"], body["background"]) == (0.5, 1.0, False)
    [item] = body["output"]
    assert list(item) == ITEM_KEYS
    assert re.fullmatch(r"msg_[0-9a-f]{16}", item["id"])
    assert (item["role"], item["status"], item["type"]) == ("assistant", "completed", "message")
    [part] = item["content"]
    assert list(part) == PART_KEYS
    assert (part["type"], part["annotations"], part["logprobs"]) == ("output_text", [], None)
    check_ending(body, 4)


def test_its_input_runs_as_a_chat_instructions_first(
    http: httpx.Client, upstream: Upstream
) -> None:
    items = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello there"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "More"}]},
    ]
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello there"},
        {"role": "user", "content": "More"},
    ]
    response = http.post("/v1/responses", json=request(upstream, input=items)).json()
    completion = http.post(
        "/v1/chat/completions", json={"model": upstream.model, "messages": chat, "max_tokens": 1}
    ).json()
    assert response["usage"]["input_tokens"] == completion["usage"]["prompt_tokens"]
    # Without a cap, the answer may take what the context leaves, as the stream's first
    # event says (read no further: a sampled answer may run to the end of the context).
    capped = http.post("/v1/responses", json=request(upstream)).json()
    uncapped = request(upstream, max_output_tokens=None, stream=True)
    with http.stream("POST", "/v1/responses", json=uncapped) as answer:
        lines = answer.iter_lines()
        name, data = next(lines), next(lines)
    assert name == "event: response.created"
    data = data.removeprefix("data: ")
    left = MAX_MODEL_LEN - capped["usage"]["input_tokens"]
    assert json.loads(data)["response"]["max_output_tokens"] == left


def test_a_response_stream_has_the_responses_events(http: httpx.Client, upstream: Upstream) -> None:
    sent = stream_named_events(http, "/v1/responses", request(upstream, stream=True))
    names = [name for name, _ in sent]
    deltas = [data["delta"] for name, data in sent if name == "response.output_text.delta"]
    assert names == OPEN + ITEM_OPEN + ["response.output_text.delta"] * len(deltas) + (
        ITEM_CLOSE + ["response.completed"]
    )
    assert [data["sequence_number"] for _, data in sent] == list(range(len(sent)))
    created = sent[0][1]["response"]
    assert list(created) == RESPONSE_KEYS
    assert (created["status"], created["output"], created["usage"]) == ("in_progress", [], None)
    assert sent[1][1]["response"] == created
    item_id = sent[2][1]["item"]["id"]
    assert sent[2][1]["item"] == {
        "id": item_id, "content": [], "role": "assistant", "status": "in_progress",
        "type": "message", "phase": None,
    }  # fmt: skip
    assert sent[3][1]["part"] == {
        "annotations": [],
        "text": "",
        "type": "output_text",
        "logprobs": [],
    }
    for _, data in sent[2:-1]:
        assert (data.get("item_id", item_id), data["output_index"]) == (item_id, 0)
    text = "".join(deltas)
    assert sent[-4][1]["text"] == text
    assert sent[-3][1]["part"]["text"] == text
    done = sent[-1][1]["response"]
    assert list(done) == RESPONSE_KEYS
    assert done["id"] == created["id"]
    assert done["output"] == [sent[-2][1]["item"]]
    assert done["output"][0]["content"][0]["text"] == text
    check_ending(done, 4)
    # One delta a token, but an end-of-sequence token, which sends none.
    assert len(deltas) in (done["usage"]["output_tokens"], done["usage"]["output_tokens"] - 1)


def check_error(answer: httpx.Response, status: int, type_: str, param: str) -> str:
    assert answer.status_code == status
    error = answer.json()["error"]
    assert list(error) == ["message", "type", "param", "code"]
    assert (error["type"], error["param"], error["code"]) == (type_, param, status)
    return str(error["message"])


def test_its_errors_have_the_chat_completions_shape(http: httpx.Client, upstream: Upstream) -> None:
    other = http.post("/v1/responses", json=request(upstream, model="nope"))
    assert check_error(other, 404, "NotFoundError", "model").startswith(
        "The model `nope` does not exist."
    )
    over = http.post("/v1/responses", json=request(upstream, max_output_tokens=5000))
    assert check_error(over, 400, "BadRequestError", "max_output_tokens").startswith(
        f"max_output_tokens=5000 cannot be greater than max_model_len={MAX_MODEL_LEN}."
    )
    long = http.post("/v1/responses", json=request(upstream, input="word " * 2100))
    check_error(long, 400, "BadRequestError", "input_tokens")
    none = http.post("/v1/responses", json=request(upstream, max_output_tokens=0))
    assert check_error(none, 400, "BadRequestError", "max_tokens").startswith(
        "max_tokens must be at least 1, got 0."
    )
    schema = http.post("/v1/responses", json={"model": upstream.model})
    check_error(schema, 400, "Bad Request", "body.input")


def test_what_needs_the_response_store_is_refused_without_it(
    http: httpx.Client, upstream: Upstream
) -> None:
    background = http.post("/v1/responses", json=request(upstream, background=True))
    assert "VLLM_ENABLE_RESPONSES_API_STORE" in check_error(
        background, 400, "invalid_request_error", "background"
    )
    follow = http.post("/v1/responses", json=request(upstream, previous_response_id="resp_x"))
    message = "Response with id 'resp_x' not found."
    assert check_error(follow, 404, "invalid_request_error", "response_id") == message
    stored = http.get("/v1/responses/resp_x")
    assert check_error(stored, 404, "invalid_request_error", "response_id") == message
    turns = [
        {"role": "user", "content": "Name a colour."},
        {"type": "item_reference", "id": "msg_x"},
    ]
    reference = http.post("/v1/responses", json=request(upstream, input=turns))
    assert check_error(reference, 400, "BadRequestError", "input") == (
        "Unsupported input item type: item_reference (parameter=input)"
    )


def test_an_output_item_sent_back_as_it_came_is_the_assistants_turn(
    http: httpx.Client, upstream: Upstream
) -> None:
    # What a client sends instead of a reference (the gateway too, filling one in).
    first = http.post("/v1/responses", json=request(upstream))
    assert first.status_code == 200, first.text
    [item] = first.json()["output"]
    said = item["content"][0]["text"]
    turns = [{"role": "user", "content": "Name a colour."}, item]
    same = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": said}]
    again = [http.post("/v1/responses", json=request(upstream, input=t)) for t in (turns, same)]
    assert [r.status_code for r in again] == [200, 200], again[0].text
    used = [r.json()["usage"]["input_tokens"] for r in again]
    assert used[0] == used[1] > first.json()["usage"]["input_tokens"]
