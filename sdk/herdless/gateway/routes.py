"""The OpenAI routes the gateway admits, and how each request is priced (pure, no I/O).

Every admitted route goes through the same admission (keys, body limits, the ``user``
field as the fairness unit, the deadline header, usage settlement); only the price
differs:

* ``/v1/chat/completions``: the messages' estimated tokens plus ``max_tokens``
  (see :func:`~herdless.gateway.wire.parse_chat_request`);
* ``/v1/completions``: the ``prompt``'s estimated tokens (a string, a list of them, token
  ids, or a list of those) plus ``max_tokens`` for each prompt, since vLLM generates one
  completion per prompt;
* ``/v1/embeddings``: the ``input``'s estimated tokens, no completion tokens;
* ``/v1/responses`` (OpenAI's Responses API, which vLLM serves too): the ``input``
  (a string, or a list of items estimated from their JSON) and ``instructions``, plus
  ``max_output_tokens``. A ``background`` response is refused (400): its work would
  outlive the request, so admission could not hold its slot. A
  ``previous_response_id`` brings context the body does not show: the price is low
  until the usage settles it.
* ``/v1/messages`` (Anthropic's Messages API, which vLLM serves too: what Claude Code and
  the Anthropic SDKs send): the ``system``, the ``messages`` and the ``tools``' JSON,
  plus ``max_tokens``, which that API requires; ``metadata.user_id`` is the fairness
  unit. Its stream ends with its usage (``message_delta``), asked for or not;
* ``/v1/messages/count_tokens``: read as a message, then sent on unadmitted (no GPU counts).

Strings are estimated at 4 characters a token; token ids count one each. The price is
settled against vLLM's ``usage`` afterwards, so it only needs to be in range. A list of
prompts or inputs is capped like a chat's messages (``max_messages``): each one costs
vLLM a sequence.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from herdless.gateway.core.prefixes import chain, chat_links, rendering
from herdless.gateway.usage import adds_usage
from herdless.gateway.wire import (
    BadRequest,
    content_chars,
    json_object,
    messages_tokens,
    parse_chat_request,
)

__all__ = [
    "CHAT",
    "COMPLETIONS",
    "EMBEDDINGS",
    "MESSAGES",
    "MESSAGE_TOKENS",
    "RESPONSES",
    "ROUTES",
    "AdmittedRoute",
    "Priced",
    "TextRequest",
    "parse_completion_request",
    "parse_embedding_request",
    "parse_message_request",
    "parse_message_tokens_request",
    "parse_response_request",
]

_CHARS_PER_TOKEN = 4  # as wire.py's chat estimate
_TOOL_BLOCKS = frozenset({"tool_use", "tool_result"})  # a message's blocks without "text"


class Priced(Protocol):
    """What admission needs from a parsed request of any admitted route."""

    @property
    def prompt_tokens(self) -> int:
        """Estimated prompt (or input) tokens."""

    @property
    def user(self) -> str | None:
        """The OpenAI ``user`` field, or ``None``."""

    @property
    def adds_usage(self) -> bool:
        """Whether the gateway asks vLLM for its usage (see
        :func:`~herdless.gateway.usage.adds_usage`)."""

    @property
    def prefix(self) -> tuple[int, ...]:
        """Its prompt's links (:func:`~herdless.gateway.core.prefixes.chain`)."""

    @property
    def open_ended(self) -> bool:
        """Whether it generates with no ``max_tokens`` (its price assumes the default)."""

    def price(self, default_max_tokens: int) -> int:
        """Tokens priced before the run."""


Parser = Callable[..., Priced]


@dataclass(frozen=True, slots=True)
class AdmittedRoute:
    """A ``POST`` route proxied through admission: its path (the same upstream) and parser.

    ``parse(body, max_messages=..., max_tokens_cap=...)`` raises
    :class:`~herdless.gateway.wire.BadRequest` for what cannot be priced.
    """

    path: str
    parse: Parser


@dataclass(frozen=True, slots=True, kw_only=True)
class TextRequest:
    """A ``/v1/completions`` or ``/v1/embeddings`` request as admission sees it.

    Attributes:
        prompt_tokens: estimated tokens of the prompts (or inputs), all of them.
        sequences: how many prompts (or inputs) the request holds.
        max_tokens: the client's ``max_tokens``; ``None`` when absent.
        generates: whether completion tokens follow (``False`` for embeddings).
        stream: whether the client asked for SSE.
        user: the OpenAI ``user`` field, or ``None``.
        adds_usage: a completions stream whose client did not ask for its usage (see
            :func:`~herdless.gateway.usage.adds_usage`; a response's stream always ends
            with its usage).
        prefix: its prompt's links (:func:`~herdless.gateway.core.prefixes.chain`), empty
            where the engine's prefix cache is not predicted (embeddings, token ids,
            several prompts).
    """

    prompt_tokens: int
    sequences: int
    max_tokens: int | None
    generates: bool
    stream: bool = False
    user: str | None = None
    adds_usage: bool = False
    prefix: tuple[int, ...] = ()

    @property
    def open_ended(self) -> bool:
        """Whether it generates with no ``max_tokens``."""
        return self.generates and self.max_tokens is None

    def price(self, default_max_tokens: int) -> int:
        """``prompt_tokens``, plus ``(max_tokens or default)`` per prompt when it generates."""
        if not self.generates:
            return self.prompt_tokens
        return self.prompt_tokens + self.sequences * (self.max_tokens or default_max_tokens)


def parse_completion_request(
    body: bytes, *, max_messages: int = 2048, max_tokens_cap: int = 32_768
) -> TextRequest:
    """Validate a ``/v1/completions`` body just enough to price it.

    Raises:
        BadRequest: not JSON, no usable ``prompt``, too many prompts, a bad ``max_tokens``.
    """
    data = json_object(body)
    prompt = data.get("prompt")
    tokens, sequences = _text_tokens(prompt, "prompt", max_messages)
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    # A text prompt's links; token ids, or several prompts, are counted whole.
    prefix = chain(rendering(data), [prompt]) if isinstance(prompt, str) else ()
    return _generation(
        data, tokens, sequences, "max_tokens", max_tokens_cap, options=True, prefix=prefix
    )


def parse_response_request(
    body: bytes, *, max_messages: int = 2048, max_tokens_cap: int = 32_768
) -> TextRequest:
    """Validate a ``/v1/responses`` body just enough to price it.

    Raises:
        BadRequest: not JSON, no usable ``input``, too many input items, a bad
            ``instructions`` or ``max_output_tokens``, a ``background`` response.
    """
    data = json_object(body)
    value = data.get("input")
    if isinstance(value, str):
        text = value
    elif isinstance(value, list) and value:
        if len(value) > max_messages:
            raise BadRequest(
                f"'input' holds {len(value)} items; the gateway accepts at most {max_messages}",
                param="input",
                code="request_too_large",
            )
        text = json.dumps(value)  # text, roles and structure: settled later
    else:
        raise BadRequest("'input' must be a string or a non-empty list of items", param="input")
    instructions = data.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise BadRequest("'instructions' must be a string", param="instructions")
    tokens = _estimate(text) + (0 if instructions is None else _estimate(instructions))
    if data.get("background") is True:
        raise BadRequest(
            "the gateway does not admit background responses: their work would outlive "
            "the request; send it without 'background'",
            param="background",
        )
    prefix = chain(rendering(data), [instructions or "", "\x1e", text])
    return _generation(data, tokens, 1, "max_output_tokens", max_tokens_cap, prefix=prefix)


def parse_embedding_request(
    body: bytes, *, max_messages: int = 2048, max_tokens_cap: int = 32_768
) -> TextRequest:
    """Validate a ``/v1/embeddings`` body just enough to price it (``max_tokens_cap``
    does not apply: nothing is generated).

    Raises:
        BadRequest: not JSON, no usable ``input``, too many inputs.
    """
    data = json_object(body)
    tokens, sequences = _text_tokens(data.get("input"), "input", max_messages)
    return TextRequest(
        prompt_tokens=tokens,
        sequences=sequences,
        max_tokens=None,
        generates=False,
        user=_user(data),
    )


def parse_message_request(
    body: bytes, *, max_messages: int = 2048, max_tokens_cap: int = 32_768
) -> TextRequest:
    """Validate a ``/v1/messages`` body (Anthropic's Messages API) just enough to price it.

    Raises:
        BadRequest: not JSON, no usable ``messages``, too many of them, a bad ``system``,
            ``metadata`` or ``stream``, a ``max_tokens`` missing, bad or over the cap.
    """
    data = json_object(body)
    request = _messages(data, max_messages)
    most = _max_tokens(data, "max_tokens", max_tokens_cap)
    if most is None:
        raise BadRequest("'max_tokens' is required by the Messages API", param="max_tokens")
    return replace(request, max_tokens=most, generates=True, stream=_stream(data))


def parse_message_tokens_request(
    body: bytes, *, max_messages: int = 2048, max_tokens_cap: int = 32_768
) -> TextRequest:
    """Validate a ``/v1/messages/count_tokens`` body just enough to price it: its
    prompt, as a message's (``max_tokens_cap`` does not apply: nothing is generated).

    Raises:
        BadRequest: as :func:`parse_message_request`, ``max_tokens`` aside.
    """
    return _messages(json_object(body), max_messages)


def _messages(data: dict[str, Any], most: int) -> TextRequest:
    """The prompt of a Messages API body: ``system`` (a string or text blocks), the
    ``messages`` as a chat's, with their tool calls and results as JSON (a file a tool
    read is in one), the ``tools`` as JSON; ``metadata.user_id``."""
    system, tools, metadata = data.get("system"), data.get("tools"), data.get("metadata")
    messages, tokens = messages_tokens(data, most)
    tokens += math.ceil(content_chars(system, "system") / _CHARS_PER_TOKEN)
    calls = [
        block
        for message in messages
        if isinstance(blocks := message.get("content"), list)
        for block in blocks
        if isinstance(block, dict) and block.get("type") in _TOOL_BLOCKS
    ]
    tokens += _estimate(json.dumps(calls)) if calls else 0
    tokens += _estimate(json.dumps(tools)) if tools else 0
    if metadata is not None and not isinstance(metadata, dict):
        raise BadRequest("'metadata' must be an object", param="metadata")
    user = (metadata or {}).get("user_id")
    if user is not None and not isinstance(user, str):
        raise BadRequest("'metadata.user_id' must be a string", param="metadata.user_id")
    if system:  # where vLLM renders it: the chat's first message
        messages = [{"role": "system", "content": system}, *messages]
    prefix = chat_links(data, messages)
    return TextRequest(
        prompt_tokens=tokens,
        sequences=1,
        max_tokens=None,
        generates=False,
        user=user or None,
        prefix=prefix,
    )


def _generation(
    data: dict[str, Any],
    tokens: int,
    sequences: int,
    max_tokens: str,
    cap: int,
    *,
    options: bool = False,
    prefix: tuple[int, ...] = (),
) -> TextRequest:
    """A request that generates, its cap on completion tokens in the field ``max_tokens``
    (at most ``cap``), then its ``stream`` and ``user`` fields checked. ``options``: its
    stream takes ``stream_options`` (a response's stream ends with its usage anyway);
    ``prefix``: its prompt's links."""
    most = _max_tokens(data, max_tokens, cap)
    stream = _stream(data)
    return TextRequest(
        prompt_tokens=tokens,
        sequences=sequences,
        max_tokens=most,
        generates=True,
        stream=stream,
        user=_user(data),
        adds_usage=options and adds_usage(data, stream),
        prefix=prefix,
    )


def _max_tokens(data: dict[str, Any], name: str, cap: int) -> int | None:
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise BadRequest(f"'{name}' must be a positive integer", param=name)
    if value > cap:
        raise BadRequest(
            f"'{name}' is {value}; the gateway accepts at most {cap}",
            param=name,
            code="request_too_large",
        )
    return value


def _stream(data: dict[str, Any]) -> bool:
    stream = data.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean", param="stream")
    return stream


def _user(data: dict[str, Any]) -> str | None:
    user = data.get("user")
    if user is not None and not isinstance(user, str):
        raise BadRequest("'user' must be a string", param="user")
    return user or None


def _text_tokens(value: object, param: str, most: int) -> tuple[int, int]:
    """(estimated tokens, sequences) of a prompt or input: a string, a list of strings,
    a list of token ids, or a list of lists of token ids (OpenAI's four shapes)."""
    if isinstance(value, str):
        return _estimate(value), 1
    if not isinstance(value, list) or not value:
        raise BadRequest(
            f"'{param}' must be a string, a list of strings or a list of token ids",
            param=param,
        )
    if all(_is_token(item) for item in value):
        return len(value), 1  # one sequence given as token ids
    if len(value) > most:
        raise BadRequest(
            f"'{param}' holds {len(value)} items; the gateway accepts at most {most}",
            param=param,
            code="request_too_large",
        )
    tokens = 0
    for index, item in enumerate(value):
        if isinstance(item, str):
            tokens += _estimate(item)
        elif isinstance(item, list) and item and all(_is_token(t) for t in item):
            tokens += len(item)
        else:
            raise BadRequest(
                f"{param}[{index}] must be a string or a non-empty list of token ids",
                param=f"{param}[{index}]",
            )
    return tokens, len(value)


def _is_token(item: object) -> bool:
    return isinstance(item, int) and not isinstance(item, bool) and item >= 0


def _estimate(text: str) -> int:
    return max(1, math.ceil(len(text) / _CHARS_PER_TOKEN))


CHAT = AdmittedRoute("/v1/chat/completions", parse_chat_request)
COMPLETIONS = AdmittedRoute("/v1/completions", parse_completion_request)
EMBEDDINGS = AdmittedRoute("/v1/embeddings", parse_embedding_request)
RESPONSES = AdmittedRoute("/v1/responses", parse_response_request)
MESSAGES = AdmittedRoute("/v1/messages", parse_message_request)
MESSAGE_TOKENS = AdmittedRoute("/v1/messages/count_tokens", parse_message_tokens_request)
ROUTES = (CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES, MESSAGES, MESSAGE_TOKENS)
"""Every admitted route, in the order the 404 message names them."""
