"""vLLM's wire format (pure): request schema, response JSON, SSE chunks and error bodies.

Field sets, key order and compact separators follow the capture of a real vLLM
0.32 server in ``docs/wire.md``. The streaming encoder builds each chunk from
precomputed byte prefixes, because it runs once per token per stream.
"""

from __future__ import annotations

import json
import secrets
import zlib
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = [
    "VLLM_VERSION",
    "ChatEncoder",
    "ChatRequest",
    "CompletionRequest",
    "Encoder",
    "GenerationRequest",
    "TextEncoder",
    "TokenizeRequest",
    "chat_completion",
    "dumps",
    "error_body",
    "models_list",
    "new_completion_id",
    "schema_error",
    "system_fingerprint",
]

VLLM_VERSION = "0.32.0"
DONE = "data: [DONE]\n\n"


def dumps(obj: object) -> bytes:
    """Compact JSON, as vLLM writes it (no spaces)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


class _Part(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[_Part] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text or "" for p in self.content if p.type == "text")
        return self.content or ""


class _StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = None


# An error to answer: message, type, status, param.
Refusal = tuple[str, str, int, str | None]


class GenerationRequest(BaseModel):
    """What a chat and a text completion request share: the sampling and streaming
    fields the emulator acts on; others are accepted."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    stream: bool | None = False
    stream_options: _StreamOptions | None = None
    ignore_eos: bool = False
    seed: int | None = None
    n: int = Field(1, ge=1)

    # The field that caps the answer, as errors name it.
    max_field: ClassVar[str] = "max_tokens"

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def refusal(self) -> Refusal | None:
        """A field the server refuses once the model is known, as ``Refusal``."""
        return None

    def no_room(self, prompt_tokens: int, limit: int) -> Refusal | None:
        """The refusal of a prompt that leaves the answer no token of the context."""
        return None if prompt_tokens < limit else too_few_tokens(0)


def too_few_tokens(got: int) -> Refusal:
    """vLLM's refusal of an answer capped below one token (its sampling check)."""
    return (
        f"max_tokens must be at least 1, got {got}. (parameter=max_tokens, value={got})",
        "BadRequestError",
        400,
        "max_tokens",
    )


class ChatRequest(GenerationRequest):
    """The fields of a chat completion request the emulator acts on; others are accepted."""

    messages: list[_Message] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)

    @property
    def max_answer(self) -> int | None:
        """The answer's cap as asked (None: what the context leaves)."""
        return self.max_completion_tokens or self.max_tokens

    def turns(self) -> list[tuple[str, str]]:
        """``(role, text)`` of each message."""
        return [(m.role, m.text()) for m in self.messages]


class CompletionRequest(GenerationRequest):
    """A ``/v1/completions`` request: a text prompt, no chat template."""

    prompt: str | list[str]
    max_tokens: int | None = Field(16, ge=1)  # the completions API's default, as in vLLM

    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else "".join(self.prompt)


class TokenizeRequest(BaseModel):
    """A ``/tokenize`` request: a ``prompt`` or chat ``messages``."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    prompt: str | None = None
    messages: list[_Message] | None = None


def error_body(message: str, type_: str, status: int, param: str | None = None) -> bytes:
    """vLLM's error JSON: ``{"error":{"message","type","param","code"}}``."""
    return dumps({"error": {"message": message, "type": type_, "param": param, "code": status}})


def schema_error(exc: ValidationError) -> bytes:
    """A 400 body for a request that fails the schema, naming the first bad field."""
    first = exc.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    return error_body(f"{loc or 'body'}: {first['msg']}", "Bad Request", 400, f"body.{loc}")


def new_completion_id(prefix: str = "chatcmpl") -> str:
    return f"{prefix}-{secrets.token_hex(8)}"


def system_fingerprint(model: str) -> str:
    return f"vllm-{VLLM_VERSION}-{zlib.crc32(model.encode()):08x}"


def chat_completion(
    *,
    id_: str,
    created: int,
    model: str,
    content: str,
    finish_reason: str,
    prompt_tokens: int,
    completion_tokens: int,
) -> bytes:
    """A non-streaming ``chat.completion`` body."""
    return dumps(
        {
            "id": id_,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": content,
                        "refusal": None,
                        "annotations": None,
                        "audio": None,
                        "function_call": None,
                        "reasoning": None,
                    },
                    "logprobs": None,
                    "finish_reason": finish_reason,
                    "stop_reason": None,
                    "token_ids": None,
                    "routed_experts": None,
                }
            ],
            "service_tier": None,
            "system_fingerprint": system_fingerprint(model),
            "usage": {
                "prompt_tokens": prompt_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
                "completion_tokens": completion_tokens,
                "prompt_tokens_details": None,
                "completion_tokens_details": None,
            },
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "prompt_text": None,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }
    )


class Encoder(Protocol):
    """How one kind of completion looks on the wire: SSE events and the JSON body."""

    has_role: bool

    def role(self, prompt_tokens: int) -> str: ...
    def token(self, text_json: str) -> str: ...
    def finish(self, text_json: str, reason: str) -> str: ...
    def end(self, prompt_tokens: int, completion_tokens: int) -> str: ...
    def body(
        self, content: str, reason: str, prompt_tokens: int, completion_tokens: int
    ) -> bytes: ...


class _Encoding:
    """What both formats share: every SSE event starts with the same head (id, object,
    creation time, model); the end is the usage event, when asked for, then ``[DONE]``."""

    __slots__ = ("_after_usage", "_created", "_head", "_id", "_include_usage", "_model")
    _object = ""  # the ``object`` of each streamed event

    def __init__(self, *, id_: str, created: int, model: str, include_usage: bool) -> None:
        self._id, self._created, self._model = id_, created, model
        self._head = (
            f'data: {{"id":"{id_}","object":"{self._object}","created":{created},'
            f'"model":{json.dumps(model, ensure_ascii=False)},"choices":'
        )
        self._include_usage = include_usage
        self._after_usage = ""  # more fields of the usage event, after ``usage``

    def end(self, prompt_tokens: int, completion_tokens: int) -> str:
        """The usage event (when asked for) and ``[DONE]``."""
        if not self._include_usage:
            return DONE
        usage = _usage(prompt_tokens, completion_tokens)
        return f'{self._head}[],"usage":{usage}{self._after_usage}}}\n\n{DONE}'


class ChatEncoder(_Encoding):
    """SSE events of one streamed chat completion, as strings (encoded once per write).

    The first event carries the role; each token's event its text; the
    ``length`` finish rides on the last token's event, a ``stop`` (EOS) finish
    has its own event with empty content; with ``include_usage`` a usage event
    with empty ``choices`` follows; then ``data: [DONE]``.
    """

    __slots__ = ("_fingerprint", "_tail")
    _object = "chat.completion.chunk"
    has_role = True

    def __init__(self, *, id_: str, created: int, model: str, include_usage: bool) -> None:
        super().__init__(id_=id_, created=created, model=model, include_usage=include_usage)
        self._tail = ',"logprobs":null,"finish_reason":null,"token_ids":null}]}\n\n'
        self._fingerprint = json.dumps(system_fingerprint(model))
        self._after_usage = f',"system_fingerprint":{self._fingerprint}'

    def role(self, prompt_tokens: int) -> str:
        return (
            self._head + '[{"index":0,"delta":{"role":"assistant","content":""},'
            '"logprobs":null,"finish_reason":null}],"prompt_token_ids":null,"prompt_text":null}\n\n'
        )

    def token(self, text_json: str) -> str:
        """The event of one token; ``text_json`` is the JSON-encoded text."""
        return f'{self._head}[{{"index":0,"delta":{{"content":{text_json}}}{self._tail}'

    def finish(self, text_json: str, reason: str) -> str:
        """The event that carries ``finish_reason`` (``text_json`` is ``'""'`` for EOS)."""
        fingerprint = "" if self._include_usage else f',"system_fingerprint":{self._fingerprint}'
        return (
            f'{self._head}[{{"index":0,"delta":{{"content":{text_json}}},"logprobs":null,'
            f'"finish_reason":"{reason}","stop_reason":null,"token_ids":null}}]{fingerprint}}}\n\n'
        )

    def body(self, content: str, reason: str, prompt_tokens: int, completion_tokens: int) -> bytes:
        """The non-streaming ``chat.completion`` body."""
        return chat_completion(
            id_=self._id,
            created=self._created,
            model=self._model,
            content=content,
            finish_reason=reason,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
        )


def _usage(prompt_tokens: int, completion_tokens: int) -> str:
    total = prompt_tokens + completion_tokens
    return (
        f'{{"prompt_tokens":{prompt_tokens},"total_tokens":{total},'
        f'"completion_tokens":{completion_tokens}}}'
    )


class TextEncoder(_Encoding):
    """A ``/v1/completions`` answer: ``text_completion`` objects, no role event.

    Unlike the chat format, this one was not captured from vLLM 0.32: it follows
    vLLM's response models (``CompletionResponse``, ``CompletionStreamResponse``).
    """

    __slots__ = ()
    _object = "text_completion"
    has_role = False

    def role(self, prompt_tokens: int) -> str:
        return ""

    def token(self, text_json: str) -> str:
        return (
            f'{self._head}[{{"index":0,"text":{text_json},"logprobs":null,'
            '"finish_reason":null,"stop_reason":null}]}\n\n'
        )

    def finish(self, text_json: str, reason: str) -> str:
        return (
            f'{self._head}[{{"index":0,"text":{text_json},"logprobs":null,'
            f'"finish_reason":"{reason}","stop_reason":null}}]}}\n\n'
        )

    def body(self, content: str, reason: str, prompt_tokens: int, completion_tokens: int) -> bytes:
        """The non-streaming ``text_completion`` body."""
        choice = {
            "index": 0,
            "text": content,
            "logprobs": None,
            "finish_reason": reason,
            "stop_reason": None,
            "prompt_logprobs": None,
        }
        usage = {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
            "prompt_tokens_details": None,
        }
        return dumps(
            {
                "id": self._id,
                "object": "text_completion",
                "created": self._created,
                "model": self._model,
                "choices": [choice],
                "service_tier": None,
                "system_fingerprint": None,
                "usage": usage,
                "kv_transfer_params": None,
            }
        )


def models_list(model: str, max_model_len: int, created: int) -> bytes:
    """The ``GET /v1/models`` body."""
    permission = {
        "id": f"modelperm-{secrets.token_hex(16)}",
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
    entry: dict[str, Any] = {
        "id": model,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": model,
        "parent": None,
        "max_model_len": max_model_len,
        "permission": [permission],
    }
    return dumps({"object": "list", "data": [entry]})
