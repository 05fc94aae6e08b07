"""vLLM's Anthropic Messages API on the wire (pure): the request schema, the message body,
the stream's events and the error body, as vLLM 0.32 writes them
(``vllm/entrypoints/anthropic``: it runs the message as a chat completion and converts
the answer).

What the emulator acts on: the ``system`` prompt and the ``messages`` (their text, and
tool calls and results as JSON, priced as a chat's messages), the required
``max_tokens``, ``stream`` and ``model``; other fields are accepted. A stream always
carries its usage: ``message_start`` the prompt's (``output_tokens`` 0),
``message_delta`` the whole (vLLM asks its chat layer for continuous usage).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from herdless.emulator.wire import GenerationRequest, dumps

__all__ = ["CountTokensRequest", "MessageEncoder", "MessagesRequest", "error_body"]

# OpenAI finish reasons as the Messages API names them (vLLM's _to_anthropic_stop_reason).
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}


class _Block(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None

    def text_of(self) -> str:
        """What the block adds to the prompt: its text, a tool call or result as JSON;
        nothing for an image."""
        if self.type == "text":
            return self.text or ""
        if self.type in ("tool_use", "tool_result"):
            return json.dumps(self.model_extra, separators=(",", ":"))
        return ""


def _text(content: str | list[_Block] | None) -> str:
    if isinstance(content, list):
        return "".join(block.text_of() for block in content)
    return content or ""


class _Turn(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[_Block]


class CountTokensRequest(GenerationRequest):
    """A ``/v1/messages/count_tokens`` request: the prompt of a message, no answer."""

    model: str  # required here, optional in a chat
    messages: list[_Turn] = Field(min_length=1)
    system: str | list[_Block] | None = None

    def turns(self) -> list[tuple[str, str]]:
        """``(role, text)`` of each prompt message, the system prompt first: as vLLM
        hands the message to its chat template."""
        head = [] if self.system is None else [("system", _text(self.system))]
        return head + [(t.role, _text(t.content)) for t in self.messages]


class MessagesRequest(CountTokensRequest):
    """A ``/v1/messages`` request: ``max_tokens`` is required."""

    max_tokens: int = Field(ge=1)

    @property
    def max_answer(self) -> int:
        return self.max_tokens


def error_body(message: str, type_: str, status: int, param: str | None = None) -> bytes:
    """The Messages API's error: ``{"type":"error","error":{"type","message"}}`` (vLLM
    translates its own errors so; ``status`` and ``param`` are not in it)."""
    return dumps({"type": "error", "error": {"type": type_, "message": message}})


def _usage(prompt_tokens: int, completion_tokens: int) -> str:
    return f'{{"input_tokens":{prompt_tokens},"output_tokens":{completion_tokens}}}'


def _event(name: str, data: str) -> str:
    return f"event: {name}\ndata: {data}\n\n"


class MessageEncoder:
    """One message's answer: the whole body, or the stream's events (``wire.Encoder``).

    The stream: ``message_start``; at the first text, ``content_block_start`` (sent with
    that text's delta); a ``content_block_delta`` per token; at the end
    ``content_block_stop`` (when a block was opened), ``message_delta`` with the stop
    reason and the usage, and ``message_stop``. No ``[DONE]``.
    """

    __slots__ = ("_id", "_model", "_opened", "_reason")
    has_role = True

    def __init__(self, *, id_: str, created: int, model: str, include_usage: bool) -> None:
        self._id, self._model = id_, model
        self._opened = False  # a text block started
        self._reason = "end_turn"

    def role(self, prompt_tokens: int) -> str:
        """``message_start``: an empty message with the prompt's usage."""
        message: dict[str, Any] = {
            "id": self._id,
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": self._model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": prompt_tokens, "output_tokens": 0},
        }
        return _event(
            "message_start", dumps({"type": "message_start", "message": message}).decode()
        )

    def token(self, text_json: str) -> str:
        delta = (
            '{"type":"content_block_delta","delta":{"type":"text_delta","text":'
            f'{text_json}}},"index":0}}'
        )
        if self._opened:
            return _event("content_block_delta", delta)
        self._opened = True
        start = '{"type":"content_block_start","content_block":{"type":"text","text":""},"index":0}'
        return _event("content_block_start", start) + _event("content_block_delta", delta)

    def finish(self, text_json: str, reason: str) -> str:
        """The last token's delta (its stop reason kept for ``message_delta``); an EOS
        (empty text) sends nothing, as vLLM skips an empty delta."""
        self._reason = _STOP_REASONS.get(reason, "end_turn")
        return "" if text_json == '""' else self.token(text_json)

    def end(self, prompt_tokens: int, completion_tokens: int) -> str:
        stop = _event("content_block_stop", '{"type":"content_block_stop","index":0}')
        delta = (
            f'{{"type":"message_delta","delta":{{"stop_reason":"{self._reason}",'
            f'"stop_sequence":null}},"usage":{_usage(prompt_tokens, completion_tokens)}}}'
        )
        return (
            (stop if self._opened else "")
            + _event("message_delta", delta)
            + _event("message_stop", '{"type":"message_stop"}')
        )

    def body(self, content: str, reason: str, prompt_tokens: int, completion_tokens: int) -> bytes:
        """The whole message (vLLM leaves out the fields that are null)."""
        message: dict[str, Any] = {
            "id": self._id,
            "type": "message",
            "role": "assistant",
            "content": [{"type": "text", "text": content}],
            "model": self._model,
            "stop_reason": _STOP_REASONS.get(reason, "end_turn"),
            "usage": {"input_tokens": prompt_tokens, "output_tokens": completion_tokens},
        }
        return dumps(message)
