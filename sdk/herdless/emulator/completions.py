"""The generation routes: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/messages``,
``/v1/responses``, and the counts ``/tokenize`` and ``/v1/messages/count_tokens``.

Each validates as vLLM does, in vLLM's order (schema, model, limits), then hands
the sequence to the engine and answers with ``responses.py``. A message's errors have
the Messages API's shape (``anthropic.error_body``), but for a body that fails the
schema: vLLM answers those before its Messages code runs, in its own shape.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Callable
from typing import NamedTuple, TypeVar

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response

from herdless.emulator import anthropic, responses_api, text, wire
from herdless.emulator.engine import Sequence
from herdless.emulator.kvcache import block_hashes
from herdless.emulator.responses import JsonGeneration, StreamGeneration, json_response
from herdless.emulator.state import EmulatorState

__all__ = [
    "chat_completions",
    "completions",
    "count_tokens",
    "messages",
    "responses",
    "tokenize",
    "unknown_response",
]

_ErrorBody = Callable[[str, str, int, str | None], bytes]


def _error(
    message: str,
    type_: str,
    status: int,
    param: str | None = None,
    shape: _ErrorBody = wire.error_body,
) -> Response:
    return json_response(shape(message, type_, status, param), status)


def _unknown_model(state: EmulatorState, model: str | None, shape: _ErrorBody) -> Response | None:
    served = state.settings.model
    if model is None or model == served:
        return None
    message = f"The model `{model}` does not exist. Valid aliases: {served}."
    return _error(message, "NotFoundError", 404, "model", shape)


_Body = TypeVar(
    "_Body",
    wire.ChatRequest,
    wire.CompletionRequest,
    wire.TokenizeRequest,
    anthropic.MessagesRequest,
    anthropic.CountTokensRequest,
    responses_api.ResponsesRequest,
)


async def _read(
    request: Request, kind: type[_Body], shape: _ErrorBody = wire.error_body
) -> tuple[EmulatorState, _Body] | Response:
    """The request's body as ``kind``, asking for the model this emulator serves (or
    none); else the answer to give: 400 for a body that does not validate, 404 (in
    ``shape``) for another model."""
    state: EmulatorState = request.app.state.emulator
    try:
        req = kind.model_validate_json(await request.body())
    except ValidationError as exc:
        return json_response(wire.schema_error(exc), 400)
    if (refusal := _unknown_model(state, req.model, shape)) is not None:
        return refusal
    return state, req


class _Prompt(NamedTuple):
    """What the engine needs of a request's prompt."""

    tokens: int  # prompt tokens, the chat template's included
    max_tokens: int | None  # the completion's cap as asked (None: up to the context)
    texts: list[str]  # the texts the answer's seed is drawn from


def _template_tokens(texts: list[str]) -> int:
    """The prompt tokens of chat messages: their texts in the chat template."""
    return (
        sum(text.count_tokens(t) for t in texts)
        + text.MESSAGE_OVERHEAD * len(texts)
        + text.GENERATION_PROMPT
    )


def _chat_prompt(
    req: wire.ChatRequest | anthropic.MessagesRequest | responses_api.ResponsesRequest,
) -> _Prompt:
    texts = [t for _, t in req.turns()]
    return _Prompt(_template_tokens(texts), req.max_answer, texts)


def _text_prompt(req: wire.CompletionRequest) -> _Prompt:
    prompt = req.text()
    return _Prompt(max(1, text.count_tokens(prompt)), req.max_tokens, [prompt])


def _prompt_hashes(
    req: wire.ChatRequest
    | wire.CompletionRequest
    | anthropic.MessagesRequest
    | responses_api.ResponsesRequest,
    block_size: int,
) -> tuple[int, ...]:
    """The hashes of the prompt's full KV blocks: its tokens as :func:`_chat_prompt` and
    :func:`_text_prompt` count them, a message's role in its template header."""
    if isinstance(req, wire.CompletionRequest):
        tokens = text.split_tokens(req.text())
    else:
        tokens = []
        for role, said in req.turns():
            tokens += [role] + ["\n"] * (text.MESSAGE_OVERHEAD - 1) + text.split_tokens(said)
        tokens += ["assistant"] * text.GENERATION_PROMPT
    salt = (req.model_extra or {}).get("cache_salt")
    return block_hashes(tokens, block_size, salt if isinstance(salt, str) else None)


_Generation = TypeVar(
    "_Generation",
    wire.ChatRequest,
    wire.CompletionRequest,
    anthropic.MessagesRequest,
    responses_api.ResponsesRequest,
)
# Builds the answer's encoder from the request, the model served and the answer's cap.
_Encode = Callable[[_Generation, str, int], wire.Encoder]


def _completion(
    encoder: type[wire.ChatEncoder | wire.TextEncoder | anthropic.MessageEncoder], id_prefix: str
) -> Callable[[wire.GenerationRequest, str, int], wire.Encoder]:
    """A completion's encoder, its id starting ``id_prefix``."""

    def encode(req: wire.GenerationRequest, model: str, max_tokens: int) -> wire.Encoder:
        return encoder(
            id_=wire.new_completion_id(id_prefix),
            created=int(time.time()),
            model=model,
            include_usage=req.include_usage,
        )

    return encode


def _response(req: responses_api.ResponsesRequest, model: str, max_tokens: int) -> wire.Encoder:
    return responses_api.ResponseEncoder(
        req.echo(max_tokens), created=int(time.time()), model=model
    )


async def _generate(
    request: Request,
    kind: type[_Generation],
    measure: Callable[[_Generation], _Prompt],
    encoder: _Encode[_Generation],
    shape: _ErrorBody = wire.error_body,
) -> Response:
    """Read a ``kind`` request; check ``n``, the limits, the faults and the queue cap;
    then schedule it and answer in ``encoder``'s format (errors in ``shape``)."""
    read = await _read(request, kind, shape)
    if isinstance(read, Response):
        return read
    state, req = read
    if req.n != 1:
        return _error("The emulator supports n=1 only.", "BadRequestError", 400, "n", shape)
    if (refusal := req.refusal()) is not None:
        return _error(*refusal, shape=shape)
    prompt, max_tokens, texts = measure(req)
    settings, faults = state.settings, state.faults
    limit, field = settings.max_model_len, req.max_field
    if max_tokens is not None and max_tokens > limit:
        return _error(
            f"{field}={max_tokens} cannot be greater than max_model_len={limit}. Please "
            f"request fewer output tokens. (parameter={field}, value={max_tokens})",
            "BadRequestError",
            400,
            field,
            shape,
        )
    if prompt > limit:  # vLLM stops counting one token past the context
        return _error(
            f"This model's maximum context length is {limit} tokens. However, your prompt "
            f"contains at least {limit + 1} input tokens, which exceeds this limit even "
            "without any output tokens. Please reduce the length of the input prompt. "
            f"(parameter=input_tokens, value={limit + 1})",
            "BadRequestError",
            400,
            "input_tokens",
            shape,
        )
    if (no_room := req.no_room(prompt, limit)) is not None:
        return _error(*no_room, shape=shape)
    # What the context leaves caps the answer: asked for more, it is cut there.
    max_tokens = limit - prompt if max_tokens is None else min(max_tokens, limit - prompt)
    encode = encoder(req, settings.model, max_tokens)
    if faults.should_fail(state.rng):
        return _error("Injected fault.", "InternalServerError", faults.error_status, None, shape)
    cap = settings.max_num_queued_reqs
    if cap is not None and state.engine.num_waiting >= cap:
        state.engine.metrics.rejected += 1
        return _error(
            "The engine is currently busy and cannot accept new requests. "
            "Please try again later or on a different instance.",
            "Service Unavailable",
            503,
            None,
            shape,
        )
    hold = faults.hold(state.rng)  # the slow fault: held before the first byte
    if faults.extra_latency:
        await asyncio.sleep(faults.extra_latency)
    seed = text.answer_seed(req.seed, texts)
    seq = Sequence(
        prompt_tokens=prompt,
        max_tokens=max_tokens,
        content_tokens=None
        if req.ignore_eos
        else text.answer_length(seed, settings.answer_min_tokens, settings.answer_max_tokens),
        arrival=state.driver.now(),
        hashes=_prompt_hashes(req, settings.block_size) if settings.enable_prefix_caching else (),
    )
    state.driver.submit(seq)
    respond = StreamGeneration if req.stream else JsonGeneration
    return respond(state, seq, seed, encode, hold=hold)


async def chat_completions(request: Request) -> Response:
    """``POST /v1/chat/completions``."""
    return await _generate(
        request, wire.ChatRequest, _chat_prompt, _completion(wire.ChatEncoder, "chatcmpl")
    )


async def completions(request: Request) -> Response:
    """``POST /v1/completions``: a text prompt, ``max_tokens`` 16 by default."""
    return await _generate(
        request, wire.CompletionRequest, _text_prompt, _completion(wire.TextEncoder, "cmpl")
    )


async def messages(request: Request) -> Response:
    """``POST /v1/messages``: Anthropic's Messages API, run as a chat completion (as vLLM
    does: the same ids, the system prompt first), answered in that API's format."""
    return await _generate(
        request,
        anthropic.MessagesRequest,
        _chat_prompt,
        _completion(anthropic.MessageEncoder, "chatcmpl"),
        anthropic.error_body,
    )


async def responses(request: Request) -> Response:
    """``POST /v1/responses``: OpenAI's Responses API, run as a chat completion (as vLLM
    does: ``instructions`` the system message, the input's items the messages)."""
    return await _generate(request, responses_api.ResponsesRequest, _chat_prompt, _response)


async def unknown_response(request: Request) -> Response:
    """``GET /v1/responses/{id}``: vLLM keeps no response without its store (the default)."""
    found = responses_api.not_found(request.path_params["response_id"])
    return _error(*found)


async def count_tokens(request: Request) -> Response:
    """``POST /v1/messages/count_tokens``: the prompt tokens the message would have, its
    ``usage.input_tokens`` (vLLM counts its chat template's render)."""
    read = await _read(request, anthropic.CountTokensRequest, anthropic.error_body)
    if isinstance(read, Response):
        return read
    _, req = read
    tokens = _template_tokens([t for _, t in req.turns()])
    counted = {"input_tokens": tokens, "context_management": {"original_input_tokens": tokens}}
    return json_response(wire.dumps(counted))


async def tokenize(request: Request) -> Response:
    """``POST /tokenize``: token ids by the emulator's rule (stable, not a real vocabulary)."""
    read = await _read(request, wire.TokenizeRequest)
    if isinstance(read, Response):
        return read
    state, req = read
    if (req.prompt is None) == (req.messages is None):
        return _error("Give either `prompt` or `messages`.", "Bad Request", 400, "body")
    if req.prompt is not None:
        ids = _ids(text.split_tokens(req.prompt))
    else:
        texts = [m.text() for m in req.messages or []]
        ids = []
        for t in texts:
            ids += [1] * text.MESSAGE_OVERHEAD + _ids(text.split_tokens(t))
        ids += [1] * text.GENERATION_PROMPT
    body = {
        "count": len(ids),
        "max_model_len": state.settings.max_model_len,
        "tokens": ids,
        "token_strs": None,
    }
    return json_response(wire.dumps(body))


_VOCAB = 49_152  # a small model's vocabulary size; ids 0-15 are left for special tokens


def _ids(tokens: list[str]) -> list[int]:
    return [16 + zlib.crc32(t.encode()) % (_VOCAB - 16) for t in tokens]
