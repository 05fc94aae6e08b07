"""Contract: SSE framing of streamed chat completions, as vLLM 0.32 writes it.

- the first chunk carries ``delta: {"role": "assistant", "content": ""}``;
- ``finish_reason: "length"`` rides on the chunk with the last token's text;
- ``finish_reason: "stop"`` (EOS) comes in a chunk of its own with empty content,
  and ``completion_tokens`` counts the EOS token;
- with ``include_usage`` a last chunk has ``choices: []`` and the usage; then ``[DONE]``.

Each request decides its own ending (``forced_answer``): the real model's words,
and where greedy decoding stops, differ from one CPU to another. The emulator
ignores ``min_tokens`` and ``logit_bias``; its own answers (4 to 12 tokens, then
EOS) end the same way within the limits used here.
"""

from __future__ import annotations

from typing import Any

import httpx
from tests.contract.contract_kit import Upstream, decode_chunks, read_events

from herdless.launch.vllm import forced_answer

FIRST_KEYS = {"id", "object", "created", "model", "choices", "prompt_token_ids", "prompt_text"}
CHUNK_KEYS = {"id", "object", "created", "model", "choices"}
CHOICE_KEYS = {"index", "delta", "logprobs", "finish_reason", "token_ids"}
WITH_USAGE = {"stream_options": {"include_usage": True}}


def stream(
    http: httpx.Client, upstream: Upstream, content: str = "Hi", **body: Any
) -> list[dict[str, Any]]:
    payload = upstream.chat(content, stream=True, **body)
    with http.stream("POST", "/v1/chat/completions", json=payload) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
        return decode_chunks(read_events(response))


def check_opening(chunks: list[dict[str, Any]], upstream: Upstream) -> None:
    first = chunks[0]
    assert set(first) == FIRST_KEYS
    assert first["object"] == "chat.completion.chunk"
    assert first["model"] == upstream.model
    assert first["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
         "finish_reason": None}
    ]  # fmt: skip
    assert len({chunk["id"] for chunk in chunks}) == 1


def check_usage_chunk(chunk: dict[str, Any], completion_tokens: int) -> None:
    assert set(chunk) == CHUNK_KEYS | {"usage", "system_fingerprint"}
    assert chunk["choices"] == []
    usage = chunk["usage"]
    assert set(usage) == {"prompt_tokens", "total_tokens", "completion_tokens"}
    assert usage["completion_tokens"] == completion_tokens
    assert usage["total_tokens"] == usage["prompt_tokens"] + completion_tokens
    assert chunk["system_fingerprint"].startswith("vllm-")


def test_length_finish_rides_on_the_last_token(http: httpx.Client, upstream: Upstream) -> None:
    chunks = stream(http, upstream, **forced_answer(3, ending="length"), **WITH_USAGE)
    check_opening(chunks, upstream)
    *body, last, usage = chunks[1:]
    for chunk in body:
        assert set(chunk) == CHUNK_KEYS
        [choice] = chunk["choices"]
        assert set(choice) == CHOICE_KEYS
        assert choice["finish_reason"] is None
        assert set(choice["delta"]) == {"content"}
    [choice] = last["choices"]
    assert set(choice) == CHOICE_KEYS | {"stop_reason"}
    assert (choice["finish_reason"], choice["stop_reason"]) == ("length", None)
    assert choice["delta"]["content"] != ""
    check_usage_chunk(usage, completion_tokens=3)


def test_stop_finish_comes_alone_and_eos_is_counted(http: httpx.Client, upstream: Upstream) -> None:
    # vLLM: three tokens of text, then EOS. The emulator: its own 4 to 12, then EOS
    # (it ignores min_tokens and logit_bias), under the limit of 16.
    ending = forced_answer(3, ending="stop", max_tokens=16)
    chunks = stream(http, upstream, **ending, **WITH_USAGE)
    check_opening(chunks, upstream)
    *body, last, usage = chunks[1:]
    assert body, "no text before the EOS: nothing shows that the finish comes alone"
    for chunk in body:
        [choice] = chunk["choices"]
        assert choice["finish_reason"] is None
        assert choice["delta"]["content"]
    [choice] = last["choices"]
    assert choice["delta"] == {"content": ""}
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", None)
    check_usage_chunk(usage, completion_tokens=len(body) + 1)


def test_without_include_usage_the_fingerprint_rides_on_the_finish(
    http: httpx.Client, upstream: Upstream
) -> None:
    chunks = stream(http, upstream, **forced_answer(2, ending="length"))
    check_opening(chunks, upstream)
    last = chunks[-1]
    assert last["choices"][0]["finish_reason"] == "length"
    assert set(last) == CHUNK_KEYS | {"system_fingerprint"}
    assert all("usage" not in chunk for chunk in chunks)
