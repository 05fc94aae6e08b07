"""OpenAI's Responses API on the wire (pure): the request schema, the response body and
the stream's events, as vLLM 0.32 writes them (``vllm/entrypoints/openai/responses``: it
runs the input as a chat, ``instructions`` as its system message, and converts the
answer).

What the emulator acts on: ``instructions``, the ``input`` (a string, or items: a
message's text, other items as JSON, priced as a chat's messages), ``max_output_tokens``
(else what the context leaves), ``stream`` and ``model``; ``background``,
``previous_response_id`` and an ``item_reference`` input item are refused as vLLM
refuses them without its response store (the default). Errors have the chat
completions' shape. A body echoes the request's settings, in vLLM's field order;
``usage`` always comes.
"""

from __future__ import annotations

import json
import secrets
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from herdless.emulator.wire import GenerationRequest, Refusal, dumps, too_few_tokens

__all__ = ["ResponseEncoder", "ResponsesRequest", "not_found", "response_id"]


class _Item(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str = "message"
    role: str | None = None
    content: str | list[dict[str, Any]] | None = None

    def turn(self) -> tuple[str, str]:
        """``(role, text)`` of the chat message the item becomes: a message's text, any
        other item (a tool call, its output) as JSON."""
        if self.type != "message":
            return "tool", json.dumps(self.model_dump(), separators=(",", ":"))
        if isinstance(self.content, list):
            return self.role or "user", "".join(str(p.get("text") or "") for p in self.content)
        return self.role or "user", self.content or ""


class ResponsesRequest(GenerationRequest):
    """A ``/v1/responses`` request."""

    max_field: ClassVar[str] = "max_output_tokens"
    input: str | list[_Item]
    instructions: str | None = None
    max_output_tokens: int | None = None
    background: bool | None = False
    previous_response_id: str | None = None
    temperature: float | None = None
    top_p: float | None = None

    @property
    def max_answer(self) -> int | None:
        return self.max_output_tokens

    def refusal(self) -> Refusal | None:
        """What vLLM refuses without its response store: a background response, one
        that continues a stored one, a reference to a stored item; and an answer of no
        token."""
        if self.background:
            return (
                "This vLLM engine does not support `store=True` and therefore does not "
                "support the background mode. To enable these features, set the "
                "environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when launching "
                "the vLLM server.",
                "invalid_request_error",
                400,
                "background",
            )
        if self.previous_response_id is not None:
            return not_found(self.previous_response_id)
        if not isinstance(self.input, str) and (
            kind := next((i.type for i in self.input if i.type == "item_reference"), None)
        ):  # it stores no item to fill one in
            return (f"Unsupported input item type: {kind} (parameter=input)", "BadRequestError",
                    400, "input")  # fmt: skip
        if self.max_output_tokens is not None and self.max_output_tokens < 1:
            return too_few_tokens(self.max_output_tokens)
        return None

    def no_room(self, prompt_tokens: int, limit: int) -> Refusal | None:
        if prompt_tokens < limit:
            return None
        return (
            f"The engine prompt length {prompt_tokens} exceeds the max_model_len {limit}. "
            "Please reduce prompt.",
            "invalid_request_error",
            400,
            "input",
        )

    def turns(self) -> list[tuple[str, str]]:
        """``(role, text)`` of each chat message the request runs as."""
        head = [] if self.instructions is None else [("system", self.instructions)]
        if isinstance(self.input, str):
            return [*head, ("user", self.input)]
        return head + [item.turn() for item in self.input]

    def echo(self, max_output_tokens: int) -> dict[str, Any]:
        """The request's settings as a response repeats them (vLLM's defaults where
        absent)."""
        return {
            "instructions": self.instructions,
            "temperature": 1.0 if self.temperature is None else self.temperature,
            "top_p": 1.0 if self.top_p is None else self.top_p,
            "max_output_tokens": max_output_tokens,
        }


def not_found(response_id: str) -> Refusal:
    """No response is stored under ``response_id``."""
    return (
        f"Response with id '{response_id}' not found.",
        "invalid_request_error",
        404,
        "response_id",
    )


def response_id(prefix: str = "resp") -> str:
    """vLLM's response and item ids: ``resp_…``, ``msg_…``."""
    return f"{prefix}_{secrets.token_hex(8)}"


def _text_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [_part(text, None)]
    return {
        "id": item_id,
        "content": content,
        "role": "assistant",
        "status": status,
        "type": "message",
        "phase": None,
    }


def _part(text: str, logprobs: list[Any] | None) -> dict[str, Any]:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}


def _status(reason: str) -> str:
    """A response's status for the answer's finish reason."""
    return "incomplete" if reason == "length" else "completed"


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": 0,
            "cache_write_tokens": 0,
            "input_tokens_per_turn": [],
            "cached_tokens_per_turn": [],
        },
        "output_tokens": completion_tokens,
        "output_tokens_details": {
            "reasoning_tokens": 0,
            "tool_output_tokens": 0,
            "output_tokens_per_turn": [],
            "tool_output_tokens_per_turn": [],
        },
        "total_tokens": prompt_tokens + completion_tokens,
    }


class ResponseEncoder:
    """One response: the whole body, or the stream's events (``wire.Encoder``).

    The stream: ``response.created`` and ``response.in_progress``; at the first text,
    ``response.output_item.added`` and ``response.content_part.added``; a
    ``response.output_text.delta`` per token; at the end the text's, the part's and the
    item's ``done`` events (when an item was opened) and ``response.completed``. Every
    event carries its ``sequence_number``; no ``[DONE]``.
    """

    __slots__ = ("_created", "_echo", "_id", "_item", "_model", "_reason", "_seq", "_texts")
    has_role = True

    def __init__(self, echo: dict[str, Any], *, created: int, model: str) -> None:
        self._id, self._item = response_id(), response_id("msg")
        self._echo, self._created, self._model = echo, created, model
        self._seq = 0
        self._texts: list[str] | None = None  # the JSON strings sent, once an item opened
        self._reason = "stop"

    def _response(
        self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None
    ) -> dict[str, Any]:
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self._id,
            "created_at": self._created,
            "incomplete_details": incomplete,
            "instructions": self._echo["instructions"],
            "metadata": None,
            "model": self._model,
            "object": "response",
            "output": output,
            "parallel_tool_calls": True,
            "temperature": self._echo["temperature"],
            "tool_choice": "none",
            "tools": [],
            "top_p": self._echo["top_p"],
            "background": False,
            "max_output_tokens": self._echo["max_output_tokens"],
            "max_tool_calls": None,
            "previous_response_id": None,
            "prompt": None,
            "reasoning": None,
            "service_tier": "auto",
            "status": status,
            "text": None,
            "top_logprobs": None,
            "truncation": "disabled",
            "usage": usage,
            "user": None,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "input_messages": None,
            "output_messages": None,
        }

    def _event(self, name: str, fields: str) -> str:
        """One event: ``fields`` is the JSON object's members before ``sequence_number``
        (vLLM's keys are in alphabetical order but ``response``'s)."""
        seq, self._seq = self._seq, self._seq + 1
        return f'event: {name}\ndata: {{{fields},"sequence_number":{seq},"type":"{name}"}}\n\n'

    def role(self, prompt_tokens: int) -> str:
        """``response.created`` and ``response.in_progress``: the response, no output."""
        response = dumps(self._response("in_progress", [], None)).decode()
        return self._event("response.created", f'"response":{response}') + self._event(
            "response.in_progress", f'"response":{response}'
        )

    def _open(self) -> str:
        """``response.output_item.added`` and ``response.content_part.added``."""
        item = dumps(_text_item(self._item, None, "in_progress")).decode()
        part = dumps(_part("", [])).decode()
        return self._event("response.output_item.added", f'"item":{item},"output_index":0') + (
            self._event(
                "response.content_part.added",
                f'"content_index":0,"item_id":"{self._item}","output_index":0,"part":{part}',
            )
        )

    def token(self, text_json: str) -> str:
        if self._texts is None:
            opened, self._texts = self._open(), [text_json]
        else:
            opened = ""
            self._texts.append(text_json)
        where = f'"item_id":"{self._item}","logprobs":[],"output_index":0'
        return opened + self._event(
            "response.output_text.delta", f'"content_index":0,"delta":{text_json},{where}'
        )

    def finish(self, text_json: str, reason: str) -> str:
        """The last token's delta (the finish reason kept for the status); an EOS (empty
        text) sends nothing, as vLLM skips an empty delta."""
        self._reason = reason
        return "" if text_json == '""' else self.token(text_json)

    def end(self, prompt_tokens: int, completion_tokens: int) -> str:
        usage = _usage(prompt_tokens, completion_tokens)
        if self._texts is None:
            output: list[dict[str, Any]] = []
            closed = ""
        else:
            text = json.loads('"' + "".join(t[1:-1] for t in self._texts) + '"')
            item = _text_item(self._item, text, "completed")
            output = [item]
            at = f'"content_index":0,"item_id":"{self._item}"'
            closed = (
                self._event(
                    "response.output_text.done",
                    f'{at},"logprobs":[],"output_index":0,"text":{dumps(text).decode()}',
                )
                + self._event(
                    "response.content_part.done",
                    f'{at},"output_index":0,"part":{dumps(_part(text, None)).decode()}',
                )
                + self._event(
                    "response.output_item.done", f'"item":{dumps(item).decode()},"output_index":0'
                )
            )
        response = dumps(self._response(_status(self._reason), output, usage)).decode()
        return closed + self._event("response.completed", f'"response":{response}')

    def body(self, content: str, reason: str, prompt_tokens: int, completion_tokens: int) -> bytes:
        """The whole response."""
        output = [_text_item(self._item, content, "completed")]
        return dumps(
            self._response(_status(reason), output, _usage(prompt_tokens, completion_tokens))
        )
