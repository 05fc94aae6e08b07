"""The OpenAI wire format: request bodies, answers and vLLM's SSE framing."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from herdless._types import Usage
from herdless._wire import (
    DONE,
    SSEDecoder,
    build_body,
    encode_body,
    parse_chunk,
    parse_completion,
    with_model,
)

# Captured from vLLM 0.32 (VLLM_WIRE.md), trimmed of fields herdless ignores.
VLLM_COMPLETION = (
    b'{"id":"chatcmpl-8efc10f78de2ce37","object":"chat.completion","created":1795962386,'
    b'"model":"SmolLM2-135M-Instruct","choices":[{"index":0,"message":{"role":"assistant",'
    b'"content":"How may I","refusal":null},"logprobs":null,"finish_reason":"length",'
    b'"stop_reason":null}],"usage":{"prompt_tokens":32,"total_tokens":35,"completion_tokens":3,'
    b'"prompt_tokens_details":null}}'
)
VLLM_STREAM = (
    'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":'
    '{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'
    'data: {"id":"c","choices":[{"index":0,"delta":{"content":"C"},"finish_reason":null}]}\n\n'
    'data: {"id":"c","choices":[{"index":0,"delta":{"content":"rystal"},"finish_reason":null}]}'
    "\n\n"
    'data: {"id":"c","choices":[{"index":0,"delta":{"content":" sc"},"finish_reason":"length"}]}'
    "\n\n"
    'data: {"id":"c","choices":[],"usage":{"prompt_tokens":32,"total_tokens":35,'
    '"completion_tokens":3}}\n\n'
    "data: [DONE]\n\n"
)


def _events(text: str, size: int = 7) -> list[str]:
    """Feed ``text`` in pieces of ``size`` bytes, as a network would cut it."""
    data = text.encode()
    decoder = SSEDecoder()
    events = []
    for start in range(0, len(data), size):
        events += decoder.feed(data[start : start + size])
    return events + decoder.flush()


def test_body_passes_extra_through_and_leaves_model_out() -> None:
    body = build_body(
        [{"role": "user", "content": "hi"}],
        max_tokens=5,
        temperature=0.0,
        stream=False,
        extra={"seed": 7, "stop": ["\n"]},
    )
    assert body == {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 5,
        "temperature": 0.0,
        "seed": 7,
        "stop": ["\n"],
    }


def test_stream_body_asks_for_usage_unless_the_caller_chose() -> None:
    msgs = [{"role": "user", "content": "hi"}]
    body = build_body(msgs, max_tokens=None, temperature=None, stream=True, extra={})
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    mine = {"include_usage": False}
    body = build_body(
        msgs, max_tokens=None, temperature=None, stream=True, extra={"stream_options": mine}
    )
    assert body["stream_options"] == mine


@pytest.mark.parametrize(
    ("messages", "extra"),
    [
        ("hello", {}),
        ([("user", "hi")], {}),
        ([{"role": "user", "content": "hi"}], {"model": "x"}),
        ([{"role": "user", "content": "hi"}], {"stream": True}),
    ],
)
def test_body_refuses_bad_arguments(messages: object, extra: dict[str, object]) -> None:
    with pytest.raises(TypeError):
        build_body(messages, max_tokens=None, temperature=None, stream=False, extra=extra)  # type: ignore[arg-type]


def test_model_goes_first_and_none_is_left_out() -> None:
    assert list(with_model({"messages": []}, "m")) == ["model", "messages"]
    assert with_model({"messages": []}, None) == {"messages": []}


def test_encoding_is_compact_utf8() -> None:
    assert encode_body({"a": "é", "b": [1, 2]}) == '{"a":"é","b":[1,2]}'.encode()


def test_vllm_completion_is_decoded() -> None:
    done = parse_completion(VLLM_COMPLETION)
    assert done.content == "How may I"
    assert done.model == "SmolLM2-135M-Instruct"
    assert done.usage == Usage(prompt_tokens=32, completion_tokens=3, total_tokens=35)
    assert done.finish_reason == "length"
    assert done.raw["id"] == "chatcmpl-8efc10f78de2ce37"


@pytest.mark.parametrize("body", [b"<html>", b"[1]", b'"x"', b""])
def test_a_completion_that_is_not_a_json_object_is_refused(body: bytes) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 -- the driver maps any ValueError to "protocol"
        parse_completion(body)


def test_a_completion_without_choices_has_empty_content() -> None:
    done = parse_completion(b'{"choices":[],"model":"m"}')
    assert (done.content, done.usage, done.finish_reason) == ("", None, None)


def test_vllm_stream_decodes_to_deltas_finish_and_usage() -> None:
    events = _events(VLLM_STREAM)
    assert events[-1] == DONE
    chunks = [parse_chunk(e) for e in events[:-1]]
    assert [c.content for c in chunks] == ["", "C", "rystal", " sc", ""]
    assert chunks[3].finish_reason == "length"
    assert chunks[4].usage == Usage(prompt_tokens=32, completion_tokens=3, total_tokens=35)
    assert all(c.usage is None for c in chunks[:4])


def test_sse_framing_details() -> None:
    text = ": keep-alive comment\r\nevent: message\r\ndata:{}\r\nid: 3\r\n\r\n\r\n"
    text += "data: line one\ndata: line two\n\ndata: tail without blank line"
    assert _events(text) == ["{}", "line one\nline two", "tail without blank line"]


@pytest.mark.parametrize("size", [1, 2, 3, 1000])
def test_events_split_anywhere_decode_the_same(size: int) -> None:
    assert _events(VLLM_STREAM, size) == _events(VLLM_STREAM, len(VLLM_STREAM))


def test_unicode_line_separators_inside_json_do_not_split_lines() -> None:
    # vLLM writes U+2028 / U+0085 unescaped; httpx's iter_lines would cut the JSON there.
    text = 'data: {"choices":[{"delta":{"content":"a\u2028b\x85c"}}]}\n\n'
    [event] = _events(text, 5)
    assert parse_chunk(event).content == "a\u2028b\x85c"


def test_an_error_inside_a_stream_is_refused() -> None:
    with pytest.raises(ValueError, match="out of memory"):
        parse_chunk('{"error":{"message":"out of memory","type":"InternalServerError"}}')


@settings(max_examples=40)  # a busy 2-core machine: enough to cover the framing cases
@given(
    st.lists(st.text(alphabet=st.characters(blacklist_characters="\r\n", codec="utf-8"))),
    st.integers(min_value=1, max_value=9),
)
def test_any_data_survives_the_framing(payloads: list[str], size: int) -> None:
    text = "".join(f"data: {p}\r\n\r\n" for p in payloads)
    # An empty payload still makes an event: "data: " sets the data field to "".
    assert _events(text, size) == payloads


_LINES = st.sampled_from(
    ["data: a", "data:b", "data: ", "data: data: c", ": note", "id: 1", "event: x", "", "d"]
)


@settings(max_examples=60)
@given(
    st.lists(st.tuples(_LINES, st.sampled_from(["\n", "\r\n", "\r"])), max_size=12),
    st.integers(min_value=1, max_value=7),
)
def test_whole_body_and_pieces_decode_the_same(lines: list[tuple[str, str]], size: int) -> None:
    # A body fed whole may take the decoder's shortcut for vLLM's framing; fed in small
    # pieces it goes line by line. Any body must give the same events either way.
    text = "".join(line + end for line, end in lines)
    assert _events(text, max(len(text.encode()), 1)) == _events(text, size)
    assert _events(text + "\n\n", max(len(text.encode()) + 2, 1)) == _events(text + "\n\n", 1)


def test_chunk_raw_is_the_json() -> None:
    data = json.dumps({"choices": [{"delta": {"content": "x"}}], "id": "k"})
    assert parse_chunk(data).raw["id"] == "k"
