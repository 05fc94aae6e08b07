"""The OpenAI chat-completions wire format, encoded and decoded without I/O.

Request bodies go out as compact JSON. Answers come back as one JSON document, or, for
``stream=True``, as server-sent events: ``data: {json}`` blocks separated by a blank line
and ended by ``data: [DONE]`` (vLLM's framing; see ``docs/wire.md``). Streams ask for
``stream_options.include_usage`` so that the final usage chunk arrives.

The SSE decoder is written here rather than taken from ``httpx-sse`` for two reasons.
The core SDK depends only on httpx and pydantic-settings. And the
decoder is on the per-token path of every stream: it takes the body's bytes as they
arrive, decodes each chunk once, and splits a chunk of whole vLLM-framed events in one
pass, where httpx-sse (0.4.2) finds line ends by walking every character in Python.
Line splitting itself is no longer a reason: httpx's ``iter_lines`` splits on U+2028
and friends, which vLLM writes unescaped inside JSON strings, and httpx-sse used it
until 0.4.2, which splits on ``\\r\\n``, ``\\r`` and ``\\n`` only, as the decoder here does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final, NamedTuple

from herdless._fields import BODY_FIELDS, unknown_argument
from herdless._types import (
    Chunk,
    FunctionCall,
    FunctionCallDelta,
    ToolCall,
    ToolCallDelta,
    Usage,
)

__all__ = [
    "DONE",
    "Completion",
    "SSEDecoder",
    "build_body",
    "encode_body",
    "parse_chunk",
    "parse_completion",
    "with_model",
]

DONE: Final = "[DONE]"
"""The data of the event that ends an OpenAI stream."""

_STREAM_OPTIONS: Final = {"include_usage": True}

_RESERVED: Final = frozenset({"model", "messages", "stream"})


def build_body(
    messages: Sequence[Mapping[str, Any]],
    *,
    max_tokens: int | None,
    temperature: float | None,
    stream: bool,
    extra: Mapping[str, Any],
    extra_body: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The chat-completions body without ``model`` (each backend gets its own).

    ``extra`` holds the other OpenAI and vLLM fields ``chat()`` knows (``BODY_FIELDS``),
    sent unchanged; ``extra_body`` any other field, sent unchanged and last (as
    openai-python's ``extra_body``). A stream asks for the usage chunk
    (``stream_options.include_usage``) unless the caller set ``include_usage`` themselves.

    Raises:
        TypeError: ``messages`` is not a list of mappings; ``extra`` holds a field
            ``chat()`` does not know (the message names the closest one); or
            ``extra_body`` sets ``model``, ``messages`` or ``stream``, which have their
            own arguments.
    """
    if not isinstance(messages, list | tuple):
        raise TypeError("messages must be a list of dicts like {'role': 'user', 'content': ...}")
    body: dict[str, Any] = {"messages": [_message(m) for m in messages]}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if temperature is not None:
        body["temperature"] = temperature
    if extra:
        unknown = extra.keys() - BODY_FIELDS
        if unknown:
            raise TypeError(unknown_argument(min(unknown)))
        body.update(extra)
    if extra_body:
        if not isinstance(extra_body, Mapping):
            raise TypeError("extra_body must be a mapping of request fields")
        clash = _RESERVED & extra_body.keys()
        if clash:
            raise TypeError(
                f"pass {', '.join(sorted(clash))} as chat() arguments, not in extra_body"
            )
        body.update(extra_body)
    if stream:
        body["stream"] = True
        options = body.get("stream_options")
        if options is None:
            body["stream_options"] = _STREAM_OPTIONS
        elif isinstance(options, Mapping) and "include_usage" not in options:
            # Token accounting needs the usage chunk; the caller's other options stay.
            body["stream_options"] = {**options, "include_usage": True}
    return body


def _message(message: Mapping[str, Any]) -> dict[str, Any]:
    # A plain dict goes as is (the common case, and the cheapest); json needs a dict.
    if type(message) is dict:
        return message
    if not isinstance(message, Mapping):
        raise TypeError("messages must be a list of dicts like {'role': 'user', 'content': ...}")
    return dict(message)


def with_model(body: Mapping[str, Any], model: str | None) -> dict[str, Any]:
    """``body`` with ``model`` first, as OpenAI clients send it (omitted when ``None``)."""
    return {"model": model, **body} if model is not None else dict(body)


def encode_body(body: Mapping[str, Any]) -> bytes:
    """Compact UTF-8 JSON, the way vLLM itself writes it."""
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def _usage(data: Mapping[str, Any]) -> Usage | None:
    usage = data.get("usage")
    if type(usage) is not dict:  # json.loads makes dicts: a cheap exact check
        return None
    return Usage(
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        total_tokens=int(usage.get("total_tokens") or 0),
    )


def _first_choice(data: Mapping[str, Any]) -> Mapping[str, Any]:
    choices = data.get("choices")
    if type(choices) is list and choices and type(choices[0]) is dict:
        return choices[0]
    return {}


def _object(text: str | bytes) -> dict[str, Any]:
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    return data


class Completion(NamedTuple):
    """A decoded non-streaming answer (its first choice)."""

    content: str
    model: str | None
    usage: Usage | None
    finish_reason: str | None
    raw: dict[str, Any]
    tool_calls: tuple[ToolCall, ...] = ()


def _str(value: Any) -> str | None:
    return value if type(value) is str else None


def _tool_calls(value: Any) -> tuple[ToolCall, ...]:
    """A message's ``tool_calls``; entries that are not function calls are left to ``raw``."""
    if type(value) is not list:
        return ()
    calls = []
    for item in value:
        function = item.get("function") if type(item) is dict else None
        if type(function) is dict and _str(function.get("name")) is not None:
            calls.append(
                ToolCall(
                    id=_str(item.get("id")) or "",
                    type=_str(item.get("type")) or "function",
                    function=FunctionCall(
                        name=function["name"], arguments=_str(function.get("arguments")) or ""
                    ),
                )
            )
    return tuple(calls)


def _tool_call_deltas(value: Any) -> tuple[ToolCallDelta, ...]:
    """A stream delta's ``tool_calls`` pieces (malformed ones are left to ``raw``)."""
    if type(value) is not list:
        return ()
    deltas = []
    for position, item in enumerate(value):
        if type(item) is not dict:
            continue
        index = item.get("index")
        function = item.get("function")
        deltas.append(
            ToolCallDelta(
                index=index if type(index) is int else position,
                id=_str(item.get("id")),
                type=_str(item.get("type")),
                function=FunctionCallDelta(
                    name=_str(function.get("name")), arguments=_str(function.get("arguments"))
                )
                if type(function) is dict
                else None,
            )
        )
    return tuple(deltas)


def parse_completion(body: bytes) -> Completion:
    """Decode a non-streaming answer.

    Raises:
        ValueError: the body is not a JSON object.
    """
    data = _object(body)
    choice = _first_choice(data)
    message = choice.get("message")
    content = message.get("content") if type(message) is dict else None
    model = data.get("model")
    calls = message.get("tool_calls") if type(message) is dict else None
    return Completion(
        content if isinstance(content, str) else "",
        model if isinstance(model, str) else None,
        _usage(data),
        choice.get("finish_reason"),
        data,
        _tool_calls(calls) if calls else (),
    )


def parse_chunk(data: str) -> Chunk:
    """Decode one SSE ``data`` payload of a stream into a ``Chunk``.

    Raises:
        ValueError: the payload is not a JSON object, or it is an error object
            (vLLM reports failures inside a started stream as ``{"error": {...}}``).
    """
    # Once per chunk of every stream: the helpers above, inlined.
    obj = json.loads(data)
    if type(obj) is not dict:
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    if "error" in obj:
        error = obj["error"]
        message = error.get("message") if isinstance(error, Mapping) else error
        raise ValueError(f"the server reported an error in the stream: {message}")
    choices = obj.get("choices")
    calls = None
    if type(choices) is list and choices and type(choices[0]) is dict:
        choice = choices[0]
        delta = choice.get("delta")
        if type(delta) is dict:
            content = delta.get("content")
            calls = delta.get("tool_calls")
        else:
            content = None
        finish_reason = choice.get("finish_reason")
    else:
        content = finish_reason = None
    return Chunk(
        content=content if type(content) is str else "",
        finish_reason=finish_reason,
        usage=_usage(obj) if obj.get("usage") is not None else None,  # the last chunk only
        tool_calls=_tool_call_deltas(calls) if calls else (),
        raw=obj,
    )


class SSEDecoder:
    """Turns the bytes of a ``text/event-stream`` body into event ``data`` strings.

    Feed it the body's chunks as they arrive, in any sizes; it returns the data of
    every event completed so far. Lines end with ``\\r\\n``, ``\\n`` or ``\\r`` only
    (the SSE specification; httpx's ``iter_lines`` also splits on U+2028 and friends,
    which vLLM writes unescaped inside JSON strings), found on bytes, once per chunk.
    Comment lines (``:``) and fields other than ``data`` are ignored; several ``data``
    lines of one event are joined by ``\\n``.

    >>> decoder = SSEDecoder()
    >>> decoder.feed(b"data: {}"), decoder.feed(b"\\n\\n")
    ([], ['{}'])
    """

    __slots__ = ("_data", "_partial")

    def __init__(self) -> None:
        self._partial = b""  # the unfinished last line
        self._data: list[str] = []  # data lines of the unfinished event

    def feed(self, chunk: bytes) -> list[str]:
        """Consume one chunk of the body; return the data of the events it completed."""
        buffer = self._partial + chunk
        # A trailing \r may be the first half of \r\n: wait for the next chunk to tell.
        held = b"\r" if buffer.endswith(b"\r") else b""
        if held:
            buffer = buffer[:-1]
        cut = max(buffer.rfind(b"\n"), buffer.rfind(b"\r")) + 1
        self._partial = buffer[cut:] + held
        if not cut:
            return []
        # Decoded once for all the complete lines: a line end is one ASCII byte, never
        # inside a UTF-8 sequence, so cutting at the last one splits no character.
        text = buffer[:cut].decode("utf-8", "replace")
        data = self._data
        if not data and text.endswith("\n\n") and "\r" not in text:
            # vLLM's framing, whole events of one "data: " line each: split on the blank
            # lines at once (a stream's chunks are small: this loop ran per line).
            # Every line end is in a blank-line pair, and every event starts "data: ".
            blocks = text[:-2].split("\n\n")
            n = len(blocks)
            if (
                text.count("\n") == 2 * n
                and text.startswith("data: ")
                and text.count("\n\ndata: ") == n - 1
            ):
                return [block[6:] for block in blocks]
        lines = _LINE_END.split(text)
        lines.pop()  # the empty text after the last line end
        events = []
        for line in lines:
            if not line:  # an event ends; vLLM's have one data line each: no join
                if data:
                    events.append(data[0] if len(data) == 1 else "\n".join(data))
                    data.clear()
                continue
            name, _, value = line.partition(":")
            if name == "data":
                # One optional space after the colon belongs to the framing, not the value.
                data.append(value[1:] if value.startswith(" ") else value)
        return events

    def flush(self) -> list[str]:
        """At the end of the body: the events a server left unterminated."""
        events = self.feed(b"\n") if self._partial else []
        return (events + self.feed(b"\n")) if self._data else events  # end the open event


_LINE_END = re.compile("\r\n|\r|\n")
