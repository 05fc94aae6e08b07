"""Request parsing, token pricing and error bodies of the gateway (pure, no I/O)."""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from herdless.gateway.core.decisions import Refuse
from herdless.gateway.core.limits import Priority
from herdless.gateway.core.prefixes import chat_links
from herdless.gateway.usage import adds_usage

__all__ = [
    "DROPPED_REASONS",
    "BadRequest",
    "ChatRequest",
    "capacity_header",
    "client_timeout",
    "content_chars",
    "deadline_header",
    "error_body",
    "json_object",
    "messages_tokens",
    "never_retries",
    "parse_chat_request",
    "priority_header",
    "refusal_headers",
    "returned",
    "ttl_header",
    "upstream_hint",
    "user_header",
    "whole_number",
]

# Rough tokens per character of English text for the price estimate; the price is
# settled against vLLM's real usage afterwards, so it only needs to be in range.
_CHARS_PER_TOKEN = 4
_TOKENS_PER_MESSAGE = 4  # role markers and separators of a chat template


class BadRequest(ValueError):
    """The request cannot go upstream; ``param`` names the offending field.

    ``code`` is ``invalid_request``, or ``request_too_large`` for a well-formed
    request over a size limit (the same code as one over the KV budget).
    """

    def __init__(
        self, message: str, *, param: str | None = None, code: str = "invalid_request"
    ) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatRequest:
    """What admission needs to know about a chat request.

    Attributes:
        stream: whether the client asked for SSE.
        max_tokens: the client's ``max_tokens`` (or ``max_completion_tokens``), or ``None``.
        prompt_tokens: estimated prompt tokens (characters / 4 + 4 per message).
        user: the OpenAI ``user`` field (the end user an app serves), or ``None``.
        adds_usage: a stream whose client did not ask for its usage: the gateway asks
            vLLM for it (:func:`~.usage.asking_usage`) and keeps the usage event to itself.
        prefix: its prompt's links (:func:`~.core.prefixes.chain`): what the engine's
            prefix cache may share with another request's.
    """

    stream: bool
    max_tokens: int | None
    prompt_tokens: int
    user: str | None = None
    adds_usage: bool = False
    prefix: tuple[int, ...] = ()

    @property
    def open_ended(self) -> bool:
        """Whether it named no ``max_tokens`` (as chat front-ends send)."""
        return self.max_tokens is None

    def price(self, default_max_tokens: int) -> int:
        """Tokens priced before the run: ``prompt_tokens + (max_tokens or default)``."""
        return self.prompt_tokens + (self.max_tokens or default_max_tokens)


def json_object(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object whose ``model``, if any, is a string.

    Raises:
        BadRequest: not JSON, not an object, or a ``model`` that is not a string.
    """
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        # RecursionError: a deeply nested body ("[[[[...") exhausts json's C stack guard.
        raise BadRequest(f"the body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object")
    if "model" in data and not isinstance(data["model"], str):
        raise BadRequest("'model' must be a string", param="model")
    return data


def parse_chat_request(
    body: bytes, *, max_messages: int = 2048, max_tokens_cap: int = 32_768
) -> ChatRequest:
    """Validate a ``/v1/chat/completions`` body just enough to price it.

    vLLM validates the rest and answers with its own 400; the gateway only
    keeps out what it cannot price, what is not JSON at all, and what would
    cost vLLM without bound: more than ``max_messages`` messages (each one a
    pass of the chat template) or a ``max_tokens`` over ``max_tokens_cap``
    (it would be priced, and reserved in the KV budget, as asked).

    Raises:
        BadRequest: malformed JSON or a missing or mistyped field.
    """
    data = json_object(body)
    messages, prompt = messages_tokens(data, max_messages)
    stream = data.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean", param="stream")
    max_tokens = data.get("max_tokens")
    param = "max_tokens"
    if max_tokens is None:
        max_tokens, param = data.get("max_completion_tokens"), "max_completion_tokens"
    if max_tokens is not None and (
        not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
    ):
        raise BadRequest(f"'{param}' must be a positive integer", param=param)
    if max_tokens is not None and max_tokens > max_tokens_cap:
        raise BadRequest(
            f"'{param}' is {max_tokens}; the gateway accepts at most {max_tokens_cap}",
            param=param,
            code="request_too_large",
        )
    user = data.get("user")
    if user is not None and not isinstance(user, str):
        raise BadRequest("'user' must be a string", param="user")
    return ChatRequest(
        stream=stream,
        max_tokens=max_tokens,
        prompt_tokens=prompt,
        user=user or None,
        adds_usage=adds_usage(data, stream),
        prefix=chat_links(data, messages),
    )


def messages_tokens(data: dict[str, Any], most: int) -> tuple[list[dict[str, Any]], int]:
    """A body's ``messages``, checked (a non-empty list of at most ``most`` objects, each
    with a string ``role``; else :class:`BadRequest`), and their estimated tokens: each
    ``content``'s text (:func:`content_chars`) and the chat template's markers."""
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list", param="messages")
    if len(messages) > most:
        raise BadRequest(
            f"'messages' holds {len(messages)} messages; the gateway accepts at most {most}",
            param="messages",
            code="request_too_large",
        )
    chars = 0
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest(
                f"messages[{index}] must be an object with a string 'role'",
                param=f"messages[{index}]",
            )
        chars += content_chars(message.get("content"), f"messages[{index}].content")
    return messages, math.ceil(chars / _CHARS_PER_TOKEN) + _TOKENS_PER_MESSAGE * len(messages)


def content_chars(content: Any, param: str) -> int:
    """Characters of a message's ``content`` (the field ``param``): a string, or the text
    of its parts; a part with no text (an image, a tool's call) counts none."""
    if content is None:
        return 0
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):  # multimodal parts: count the text ones
        # Only string texts count: a mistyped part is priced at 0 and left to vLLM to refuse.
        texts = (part.get("text") for part in content if isinstance(part, dict))
        return sum(len(text) for text in texts if isinstance(text, str))
    raise BadRequest(f"{param} must be a string or a list", param=param)


@functools.lru_cache(maxsize=256)  # refusals repeat the same few bodies under a flood
def error_body(message: str, *, code: str, type: str, param: str | None = None) -> bytes:
    """An OpenAI-style error: ``{"error": {"message", "type", "param", "code"}}``."""
    error = {"message": message, "type": type, "param": param, "code": code}
    return json.dumps({"error": error}, separators=(",", ":")).encode()


@functools.lru_cache(maxsize=4)  # one capacity per gateway: built once, sent on every answer
def capacity_header(capacity: int) -> tuple[bytes, bytes]:
    """``X-Herdless-Capacity``: the requests of one key the gateway holds at once
    (running or waiting). A herdless client sizes its window to it."""
    return (b"x-herdless-capacity", str(capacity).encode())


def deadline_header(headers: dict[str, str]) -> float | None:
    """Seconds the caller waits (``X-Herdless-Deadline-Ms``), or ``None`` when it did not
    say (or said nonsense: a client is never refused for a header it garbled)."""
    ms = whole_number(headers.get("x-herdless-deadline-ms", ""), most=12)
    return None if ms is None else ms / 1000


def whole_number(text: str, *, most: int | None = None) -> int | None:
    """``text`` as a whole number of ASCII digits (at most ``most`` of them), else
    ``None``: ``str.isdigit`` alone takes latin-1's ``²``, which ``int()`` refuses."""
    if not (text.isascii() and text.isdigit()) or (most is not None and len(text) > most):
        return None
    return int(text)


_PRIORITIES: dict[str, Priority] = {"interactive": "interactive", "batch": "batch"}


def priority_header(headers: dict[str, str], default: Priority = "interactive") -> Priority:
    """The request's class from ``X-Herdless-Priority`` (``default`` when absent: its key
    policy's ``priority``, else ``interactive``).

    Raises:
        BadRequest: another value (a batch job that misspelt its class must not run as
            interactive work unnoticed).
    """
    text = headers.get("x-herdless-priority")
    if text is None:
        return default
    priority = _PRIORITIES.get(text.strip().lower())
    if priority is None:
        raise BadRequest(
            f"X-Herdless-Priority must be 'interactive' or 'batch', got {text[:40]!r}",
            param="X-Herdless-Priority",
        )
    return priority


def user_header(headers: dict[str, str]) -> str | None:
    """``X-Herdless-User``: the end user, for clients that cannot set the body's ``user``
    field, else llm-d's ``x-llm-d-inference-fairness-id`` (``None`` when both are absent
    or blank)."""
    return (
        headers.get("x-herdless-user", "").strip()
        or headers.get("x-llm-d-inference-fairness-id", "").strip()
        or None
    )


# A Go duration (time.ParseDuration): one or more decimal numbers, each with its unit.
_GO_DURATION = re.compile(r"(?:(?:\d+\.?\d*|\.\d+)(?:ns|us|µs|μs|ms|s|m|h))+")
_GO_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_GO_UNITS = {
    "ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0
}  # fmt: skip


def ttl_header(headers: dict[str, str]) -> float | None:
    """Seconds llm-d's ``x-llm-d-inference-ttl`` lets the request wait in the queue (a Go
    duration: ``1500ms``, ``1.5s``, ``1m30s``), or ``None`` when absent, not positive or
    nonsense (a client is never refused for a header it garbled). A cap on the queue
    wait only: never a deadline (``X-Herdless-Deadline-Ms``)."""
    text = headers.get("x-llm-d-inference-ttl")
    if text is None or len(text) > 40 or not _GO_DURATION.fullmatch(text := text.strip()):
        return None
    seconds = sum(float(n) * _GO_UNITS[unit] for n, unit in _GO_PART.findall(text))
    return seconds if 0 < seconds < math.inf else None


def returned(headers: dict[str, str]) -> bool:
    """Whether the request says it is a refused one come back: an OpenAI SDK's
    ``X-Stainless-Retry-Count`` above 0 (openai-node and openai-python send it on every
    attempt, counting from 0; LangChain.js's inner client always sends 0)."""
    count = whole_number(headers.get("x-stainless-retry-count", "").strip(), most=5)
    return count is not None and count > 0


# User agents of clients that send each request once: a 429 is an error on a screen.
_SINGLE_SHOT = re.compile(
    r"(?P<browser>Mozilla/)|(?P<curl>curl/)|(?P<fetch>(?:node|undici|node-fetch)(?:$|[ /]))"
    r"|(?P<aiohttp>.*\baiohttp/)"
)


def never_retries(headers: dict[str, str]) -> str | None:
    """The client, where the request shows one that never retries a 429 (each request
    is sent once, its 429 shown as an error), else ``None``: Open WebUI's backend (its
    ``X-OpenWebUI-User-Id``, or aiohttp's user agent, which it sends), a browser, curl,
    Node's own ``fetch``. An OpenAI SDK (``X-Stainless-Lang`` or
    ``X-Stainless-Retry-Count``, which openai-node and openai-python send on every
    request) retries, whatever its user agent; so do the Vercel AI SDK and LangChain,
    which say nothing this reads. The client's name is ``open-webui``, ``aiohttp``,
    ``browser``, ``curl`` or ``fetch`` (Node's, undici's or node-fetch's)."""
    if "x-stainless-lang" in headers or "x-stainless-retry-count" in headers:
        return None
    if "x-openwebui-user-id" in headers:
        return "open-webui"
    found = _SINGLE_SHOT.match(headers.get("user-agent", "")[:200])
    return None if found is None else found.lastgroup


def client_timeout(headers: dict[str, str]) -> float | None:
    """Seconds the client waits for its answer, where its OpenAI SDK says so:
    openai-node's ``X-Stainless-Timeout`` (the whole request), else openai-python's
    ``X-Stainless-Read-Timeout`` (each read, the first byte's included); ``None`` when
    absent, not positive or nonsense."""
    for name in ("x-stainless-timeout", "x-stainless-read-timeout"):
        text = headers.get(name, "")
        if not 0 < len(text) <= 20:
            continue
        try:
            seconds = float(text)
        except ValueError:
            continue
        if 0 < seconds < math.inf:
            return seconds
    return None


DROPPED_REASONS: Mapping[str, str] = {
    "queue_full": "rejected-saturated",
    "kv_budget": "rejected-saturated",
    "queue_timeout": "rejected-ttl-expired",
    "deadline_unattainable": "rejected-ttl-expired",
    "displaced": "evicted-priority",
    "draining": "rejected-shutting-down",
    "upstream_loading": "rejected-no-endpoints",
    "upstream_unavailable": "rejected-no-endpoints",
}
"""A refusal's ``x-llm-d-request-dropped-reason`` by its code (docs/gateway.md, "llm-d's
names for the refusals"): an llm-d-aware client reads the gateway's refusals as it reads
llm-d's endpoint picker's. A key's own limits (``rate_limited``, ``token_budget``) have
no llm-d name and carry none."""
_DROPPED_HEADERS = {
    code: (b"x-llm-d-request-dropped-reason", reason.encode())
    for code, reason in DROPPED_REASONS.items()
}


def refusal_headers(refuse: Refuse) -> list[tuple[bytes, bytes]]:
    """``Retry-After`` (whole seconds, rounded up), ``retry-after-ms`` (never 0: it agrees with
    ``Retry-After`` that a refusal is not "now"), ``x-should-retry: false`` when coming back
    cannot help, and the rest.

    A 400 (the request can never fit) carries none: coming back would not help.
    """
    if refuse.status not in (429, 503):
        return []
    seconds = str(math.ceil(refuse.retry_after)).encode()
    headers = [
        (b"retry-after", seconds),
        (b"retry-after-ms", str(max(1, round(refuse.retry_after * 1000))).encode()),
    ]
    if refuse.drain:  # the drain's two headers agree, whatever the code
        headers += (_DRAIN_HEADER, _DROPPED_HEADERS["draining"])
    elif (dropped := _DROPPED_HEADERS.get(refuse.code)) is not None:
        headers.append(dropped)
    if not refuse.retry:
        headers.append(_NO_RETRY_HEADER)
    if refuse.capacity is not None:
        headers.append(capacity_header(refuse.capacity))
    if refuse.policy is not None:
        policy, name = _policy_parts(refuse.policy)
        headers.append((b"ratelimit-policy", policy))
        headers.append((b"ratelimit", b"%s;r=%d;t=%s" % (name, refuse.remaining, seconds)))
    return headers


def upstream_hint(headers: Mapping[str, str], default: float) -> float:
    """Seconds an upstream's 429 or 503 says to wait: ``retry-after-ms``, else a numeric
    ``Retry-After``, else ``default`` (an HTTP date, or nonsense, says nothing usable)."""
    for name, scale in (("retry-after-ms", 1000), ("retry-after", 1)):
        try:
            seconds = float(headers.get(name, "")) / scale
        except ValueError:
            continue
        if math.isfinite(seconds) and seconds >= 0:
            return seconds
    return default


_DRAIN_HEADER = (b"x-herdless-drain", b"1")
# openai-node, openai-python and the Vercel AI SDK read it: a refusal whose cause outlasts
# the capped Retry-After is not worth their retries.
_NO_RETRY_HEADER = (b"x-should-retry", b"false")


@functools.lru_cache(maxsize=16)  # a handful of policies per gateway, one per limit
def _policy_parts(policy: str) -> tuple[bytes, bytes]:
    """A ``RateLimit-Policy`` item encoded, and its name (the part before ``;``)."""
    return policy.encode(), policy.split(";", 1)[0].encode()
