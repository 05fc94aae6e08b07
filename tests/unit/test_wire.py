"""The OpenAI wire format: request bodies, answers and vLLM's SSE framing."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from herdless._config import ChatOptions
from herdless._fields import BODY_FIELDS, CHAT_PARAMETERS, check_extra_headers, split_fields
from herdless._types import FunctionCall, FunctionCallDelta, ToolCall, ToolCallDelta, Usage
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
    # Other stream options keep the usage chunk: token accounting needs it.
    body = build_body(
        msgs,
        max_tokens=None,
        temperature=None,
        stream=True,
        extra={"stream_options": {"continuous_usage_stats": True}},
    )
    assert body["stream_options"] == {"continuous_usage_stats": True, "include_usage": True}


@pytest.mark.parametrize(
    ("name", "closest"),
    [
        ("temprature", "temperature"),
        ("max_token", "max_tokens"),
        ("top_pp", "top_p"),
        ("ignore_eso", "ignore_eos"),
        ("response_fromat", "response_format"),
        ("dedline", "deadline"),
    ],
)
def test_an_unknown_field_names_the_closest_known_one(name: str, closest: str) -> None:
    with pytest.raises(TypeError, match=f"'{name}'; did you mean '{closest}'") as caught:
        build_body([], max_tokens=None, temperature=None, stream=False, extra={name: 1})
    assert "extra_body=" in str(caught.value)


def test_the_known_fields_cover_openai_and_vllm_sampling() -> None:
    for name in ("seed", "stop", "response_format", "tools", "tool_choice", "top_p", "n"):
        assert name in BODY_FIELDS
    for name in ("user", "logit_bias", "min_tokens", "ignore_eos", "top_k", "min_p"):
        assert name in BODY_FIELDS
    assert "model" not in BODY_FIELDS  # chat()'s own argument
    assert "priority" not in BODY_FIELDS  # vLLM's int priority is not herdless's


def test_chat_options_list_every_parameter_and_known_field_once() -> None:
    # chat()'s options are written once, as ChatOptions: herdless's own and BODY_FIELDS.
    own = set(CHAT_PARAMETERS) - {"messages", "stream"}
    assert set(ChatOptions.__annotations__) == own | BODY_FIELDS


def test_the_known_fields_are_openais_own() -> None:
    params = pytest.importorskip("openai.types.chat.completion_create_params")
    import typing

    openai_fields = set(typing.get_type_hints(params.CompletionCreateParamsBase))
    # Every field openai's client sends, but those chat() takes as its own arguments.
    assert openai_fields - {"messages", "model", "stream"} <= BODY_FIELDS


def test_extra_body_goes_last_and_unchanged() -> None:
    body = build_body(
        [],
        max_tokens=5,
        temperature=None,
        stream=False,
        extra={"seed": 1},
        extra_body={"guided_json": {"type": "object"}, "seed": 2},
    )
    assert body == {"messages": [], "max_tokens": 5, "seed": 2, "guided_json": {"type": "object"}}


@pytest.mark.parametrize("name", ["model", "messages", "stream"])
def test_extra_body_may_not_set_chats_own_arguments(name: str) -> None:
    with pytest.raises(TypeError, match=name):
        build_body(
            [], max_tokens=None, temperature=None, stream=False, extra={}, extra_body={name: 1}
        )


def test_split_fields_keeps_the_known_ones_as_arguments() -> None:
    known, other = split_fields({"temperature": 0.1, "top_k": 5, "guided_regex": "a+"})
    assert known == {"temperature": 0.1, "top_k": 5}
    assert other == {"guided_regex": "a+"}


def test_extra_headers_may_not_replace_herdless_own() -> None:
    assert check_extra_headers(None) is None
    assert check_extra_headers({"X-Tenant": "a"}) == {"X-Tenant": "a"}
    for name in ("Authorization", "x-request-id", "Content-Type", "X-Herdless-Deadline-Ms"):
        with pytest.raises(ValueError, match=name):
            check_extra_headers({name: "x"})
    with pytest.raises(TypeError):
        check_extra_headers({"X-Count": 3})  # type: ignore[dict-item]


@pytest.mark.parametrize(
    ("messages", "extra"),
    [
        ("hello", {}),
        ([("user", "hi")], {}),
        ([{"role": "user", "content": "hi"}], {"model": "x"}),
        ([{"role": "user", "content": "hi"}], {"stream": True}),
        ([{"role": "user", "content": "hi"}], {"guided_json": {}}),
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


def test_tool_calls_of_a_whole_answer_are_typed() -> None:
    body = json.dumps(
        {
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "chatcmpl-tool-1",
                                "type": "function",
                                "function": {"name": "weather", "arguments": '{"city":"Seoul"}'},
                            },
                            {"id": "x", "type": "function", "function": {"no": "name"}},
                            "garbage",
                        ],
                    },
                    "finish_reason": "tool_calls",
                }
            ],
        }
    ).encode()
    completion = parse_completion(body)
    assert completion.content == ""
    assert completion.finish_reason == "tool_calls"
    assert completion.tool_calls == (
        ToolCall(
            id="chatcmpl-tool-1",
            function=FunctionCall(name="weather", arguments='{"city":"Seoul"}'),
        ),
    )


def test_tool_call_pieces_of_a_stream_are_typed() -> None:
    first = parse_chunk(
        '{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1",'
        '"type":"function","function":{"name":"weather","arguments":""}}]}}]}'
    )
    assert first.tool_calls == (
        ToolCallDelta(
            index=0,
            id="call_1",
            type="function",
            function=FunctionCallDelta(name="weather", arguments=""),
        ),
    )
    piece = parse_chunk(
        '{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,'
        '"function":{"arguments":"{\\"ci"}}]}}]}'
    )
    assert piece.tool_calls == (
        ToolCallDelta(index=1, function=FunctionCallDelta(arguments='{"ci')),
    )
    assert parse_chunk('{"choices":[{"index":0,"delta":{"content":"x"}}]}').tool_calls == ()
