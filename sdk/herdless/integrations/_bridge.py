"""Between an OpenAI-style HTTP request and a herdless call, both ways (no I/O here).

An integration's transport receives the request the ``openai`` library built, turns it
into one ``client.chat(...)`` call, and turns the result, the stream or the error back
into what the library expects. All retry, backoff, breaker and fallback decisions stay
in the herdless client; the transport only translates.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from herdless._fields import split_fields
from herdless._stream import AsyncStream, Stream
from herdless._types import ChatResult, Chunk
from herdless.errors import (
    AllBackendsFailed,
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    DeadlineExceeded,
    FallbackNotAllowed,
    HerdlessError,
    SpendLimitExceeded,
)

__all__ = [
    "ALLOW_FALLBACK_HEADER",
    "DEADLINE_HEADER",
    "DONE",
    "PLACEHOLDER_KEY",
    "PLACEHOLDER_URL",
    "Call",
    "Failure",
    "Reply",
    "library_options",
    "parse_call",
    "reply_for_error",
    "reply_for_result",
    "reply_for_stream",
    "sse",
    "unserved",
]

ALLOW_FALLBACK_HEADER = "x-herdless-allow-fallback"
"""Request header: ``false`` keeps this call off external fallbacks (the data guard)."""
DEADLINE_HEADER = "x-herdless-deadline"
"""Request header: seconds for this call, waits and fallback included."""
DONE = b"data: [DONE]\n\n"
# The libraries require a base URL and a key; the transport ignores both (each herdless
# backend has its own), so these only have to be valid.
PLACEHOLDER_URL = "http://herdless.invalid/v1"
PLACEHOLDER_KEY = "unused-herdless-uses-each-backends-key"


def library_options(kwargs: dict[str, Any], *, url_key: str = "base_url") -> None:
    """Complete the arguments of an OpenAI library's client for herdless: the key and
    base URL it requires (placeholders, unless given; ``url_key`` names the URL's
    argument) and no retries of its own (herdless retries; always 0)."""
    kwargs.setdefault("api_key", PLACEHOLDER_KEY)
    kwargs.setdefault(url_key, PLACEHOLDER_URL)
    kwargs["max_retries"] = 0


# The library must never retry on top of herdless: openai-python obeys this header
# even when the app left its own max_retries above zero.
_NO_RETRY = {"x-should-retry": "false"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True, slots=True)
class Call:
    """The arguments of one ``client.chat`` call."""

    messages: list[Any]
    stream: bool
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Reply:
    """An HTTP answer to hand back to the library."""

    status: int
    headers: dict[str, str]
    body: bytes = b""


@dataclass(frozen=True, slots=True)
class Failure:
    """No HTTP answer: every backend failed to connect, or timed out.

    The transport raises it as the library's own ``APIConnectionError`` /
    ``APITimeoutError`` when the request came from an openai client that passes such
    errors through without retrying (openai 2.31 and later); as ``httpx``'s
    ``ConnectError`` / ``ReadTimeout`` for any other caller; and, for an older openai,
    which retries whatever its transport raises, answers :meth:`as_reply` instead.
    """

    timeout: bool
    message: str

    def as_reply(self) -> Reply:
        """The failure as an HTTP answer that no openai version retries: ``504`` for a
        timeout, ``502`` for a connection failure, with ``x-should-retry: false``."""
        status, code = (504, "timeout") if self.timeout else (502, "connection_error")
        body = {"error": {"message": self.message, "type": "api_error", "code": code}}
        return _json_reply(status, body, {})


def _json_reply(status: int, payload: Mapping[str, Any], headers: Mapping[str, str]) -> Reply:
    all_headers = {"content-type": "application/json", **_NO_RETRY, **headers}
    return Reply(status, all_headers, json.dumps(payload).encode())


def _bad_request(message: str) -> Reply:
    error = {"message": message, "type": "invalid_request_error", "code": "invalid_request"}
    return _json_reply(400, {"error": error}, {})


def parse_call(
    method: str, path: str, headers: Mapping[str, str], body: bytes, *, pass_model: bool
) -> Call | Reply:
    """The chat call a request asks for, or the ``Reply`` that refuses it.

    Args:
        method: the HTTP method.
        path: the URL path; only ``.../chat/completions`` is served.
        headers: the request headers (``x-herdless-*`` ones are read here).
        body: the JSON body the library sent.
        pass_model: send the request's ``model`` to the primary; ``False`` (the default)
            lets each backend's (or the client's) model apply, so an app written for
            ``gpt-4o-mini`` asks the GPU for its own model and the fallback for its own.
    """
    if method != "POST" or not path.rstrip("/").endswith("/chat/completions"):
        return _json_reply(
            404,
            {
                "error": {
                    "message": f"herdless serves POST .../chat/completions only, not {method} "
                    f"{path}; call other endpoints with a plain client",
                    "type": "invalid_request_error",
                    "code": "unsupported_endpoint",
                }
            },
            {},
        )
    try:
        payload = json.loads(body or b"null")
    except ValueError:
        return _bad_request("the request body is not JSON")
    if not isinstance(payload, dict) or not isinstance(payload.get("messages"), list):
        return _bad_request("the request body needs a 'messages' list")
    # The fields chat() knows go as keyword arguments, the rest (a library's or a server's
    # own) in extra_body: chat() refuses keyword arguments it does not know.
    kwargs: dict[str, Any]
    kwargs, extra_body = split_fields(
        {k: v for k, v in payload.items() if k not in ("messages", "model", "stream")}
    )
    if extra_body:
        kwargs["extra_body"] = extra_body
    model = payload.get("model")
    kwargs["model"] = model if pass_model and isinstance(model, str) else None
    if headers.get(ALLOW_FALLBACK_HEADER, "").strip().lower() in _FALSE:
        kwargs["allow_fallback"] = False
    deadline = headers.get(DEADLINE_HEADER)
    if deadline is not None:
        try:
            kwargs["deadline"] = float(deadline)
        except ValueError:
            return _bad_request(f"{DEADLINE_HEADER} must be a number of seconds")
    return Call(payload["messages"], bool(payload.get("stream")), kwargs)


def _herdless_headers(
    request_id: str, backend: str, attempts: int, fallback_reason: str | None
) -> dict[str, str]:
    headers = {
        "x-request-id": request_id,
        "x-herdless-backend": backend,
        "x-herdless-attempts": str(attempts),
    }
    if fallback_reason:
        headers["x-herdless-fallback-reason"] = fallback_reason
    return headers


def unserved(message: str) -> Reply:
    """The answer for a path that no herdless client serves (LangChain's async methods
    when ``chat_openai`` got only a sync client, and the other way round): ``501``,
    code ``herdless_client_missing``, never retried, nothing sent anywhere."""
    error = {"message": message, "type": "invalid_request_error", "code": "herdless_client_missing"}
    return _json_reply(501, {"error": error}, {})


def reply_for_result(result: ChatResult) -> Reply:
    """A whole completion: the answering backend's JSON, and which backend it was."""
    headers = _herdless_headers(
        result.request_id, result.backend, len(result.attempts), result.fallback_reason
    )
    return _json_reply(200, dict(result.raw), headers)


def reply_for_stream(stream: Stream | AsyncStream) -> Reply:
    """The status and headers of a stream; its body comes from :func:`sse`."""
    headers = _herdless_headers(
        stream.request_id, stream.backend, len(stream.attempts), stream.fallback_reason
    )
    return Reply(200, {"content-type": "text/event-stream", **_NO_RETRY, **headers})


def sse(chunk: Chunk) -> bytes:
    """One chunk as the server-sent event the library parses."""
    return b"data: " + json.dumps(dict(chunk.raw)).encode() + b"\n\n"


def _status_reply(error: APIStatusError, message: str) -> Reply:
    headers: dict[str, str] = {}
    if error.retry_after is not None:
        headers["retry-after"] = str(max(0, round(error.retry_after)))
    if error.request_id:
        headers["x-request-id"] = error.request_id
    body = {
        "error": {
            "message": message,
            "type": error.error_type or "api_error",
            "code": error.code,
        }
    }
    return _json_reply(error.status or 502, body, headers)


def reply_for_error(error: HerdlessError) -> Reply | Failure:
    """What the library should see for a call herdless gave up on.

    Status errors stay status errors (so the app's ``except openai.RateLimitError``
    keeps working), connection problems and timeouts become the library's own, and the
    guards answer ``503`` with a code naming them. Other errors (a misconfigured client)
    are not translated: the caller re-raises them.

    Raises:
        HerdlessError: ``error`` itself, when it is not about a backend's answer.
    """
    if isinstance(error, AllBackendsFailed) and error.errors:
        last = list(error.errors.values())[-1]
        if isinstance(last, APIStatusError):
            return _status_reply(last, str(error))
        return Failure(isinstance(last, APITimeoutError | DeadlineExceeded), str(error))
    if isinstance(error, APIStatusError):
        return _status_reply(error, error.server_message or error.message)
    if isinstance(error, APITimeoutError | DeadlineExceeded):
        return Failure(True, str(error))
    if isinstance(error, APIConnectionError):
        return Failure(False, str(error))
    if isinstance(error, FallbackNotAllowed | SpendLimitExceeded):
        code = "fallback_not_allowed" if isinstance(error, FallbackNotAllowed) else "spend_limit"
        body = {"error": {"message": str(error), "type": "service_unavailable", "code": code}}
        headers = {"x-request-id": error.request_id} if error.request_id else {}
        return _json_reply(503, body, headers)
    raise error
