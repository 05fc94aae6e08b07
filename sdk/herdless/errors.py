"""Errors raised by herdless clients. Every one derives from ``HerdlessError``::

    HerdlessError
    ├── APIStatusError             a backend answered with an error status
    │   ├── BadRequestError          400 and any 4xx without a class of its own
    │   │   ├── NotFoundError          404: wrong URL (no /v1?) or unknown model
    │   │   ├── ConflictError          409
    │   │   └── UnprocessableEntityError  422
    │   ├── AuthenticationError      401: the API key is missing or wrong
    │   ├── PermissionDeniedError    403: the key may not do this
    │   ├── RateLimitError           429: come back later (retried first)
    │   └── ServiceUnavailableError  5xx: not serving now (retried first)
    │       └── InternalServerError    every status >= 500 (openai's name)
    ├── APIConnectionError         no HTTP answer: refused, reset, broken
    │   └── APITimeoutError          connect, first-byte or stream-idle timeout
    ├── DeadlineExceeded           the call's deadline ran out, waits included
    ├── StreamInterrupted          a stream broke after chunks reached the caller
    │   └── StreamDeadlineExceeded   (also a DeadlineExceeded) the stream passed its
    │                                ``stream_deadline``
    ├── FallbackNotAllowed         only a fallback could serve, and the call forbids it
    ├── SpendLimitExceeded         the external fallback's spend limit is reached
    ├── AllBackendsFailed          every backend was tried; ``errors`` holds each one's
    └── ConfigurationError         a setting is missing or malformed (names the variable)

The status classes map as openai-python's do (``NotFoundError``, ``ConflictError``,
``UnprocessableEntityError``, ``InternalServerError``, ``status_code``), and each keeps
the herdless class it was raised as before as a base, so an existing
``except BadRequestError`` still catches a 404 and ``except ServiceUnavailableError`` a 500.

Every error carries keyword-only context: ``request_id`` (sent as ``X-Request-ID``, to
find the call in server logs), ``attempts`` (``AttemptRecord`` per attempt, oldest first),
``backend`` (the backend's name), ``status`` (``status_code`` on status errors, as openai
names it) and ``retry_after`` (seconds the server asked to wait). Messages say what
happened and what to do; they never contain an API key. All errors pickle (they cross
process pools), context included.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from herdless._types import AttemptRecord

if TYPE_CHECKING:
    from herdless._actions import Response, TransportFailure
    from herdless._backend import Backend

__all__ = [
    "APIConnectionError",
    "APIStatusError",
    "APITimeoutError",
    "AllBackendsFailed",
    "AuthenticationError",
    "BadRequestError",
    "ConfigurationError",
    "ConflictError",
    "DeadlineExceeded",
    "FallbackNotAllowed",
    "HerdlessError",
    "InternalServerError",
    "NotFoundError",
    "PermissionDeniedError",
    "RateLimitError",
    "ServiceUnavailableError",
    "SpendLimitExceeded",
    "StreamDeadlineExceeded",
    "StreamInterrupted",
    "UnprocessableEntityError",
    "status_error",
    "transport_error",
]

# An error body is for a human; a megabyte of HTML from a proxy is not worth keeping.
_MAX_SERVER_MESSAGE = 500
_SHOWN_ATTEMPTS = 5


def _rebuild(cls: type[HerdlessError], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    # Bypass __init__: its keyword-only arguments are not in ``args``.
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


class HerdlessError(Exception):
    """Base class of every herdless error.

    Args:
        message: what happened and what to do.
        request_id: the call's ``X-Request-ID``.
        attempts: the call's attempts, oldest first.
        backend: name of the backend the error is about.
        status: HTTP status, when a server answered.
        retry_after: seconds the server asked to wait, when it did.
    """

    def __init__(
        self,
        message: str,
        *,
        request_id: str | None = None,
        attempts: Sequence[AttemptRecord] = (),
        backend: str | None = None,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.request_id = request_id
        self.attempts: tuple[AttemptRecord, ...] = tuple(attempts)
        self.backend = backend
        self.status = status
        self.retry_after = retry_after

    def __str__(self) -> str:
        context = []
        if self.request_id is not None:
            context.append(f"request_id={self.request_id}")
        if self.attempts:
            shown = [a.describe() for a in self.attempts[-_SHOWN_ATTEMPTS:]]
            more = len(self.attempts) - len(shown)
            prefix = f"... {more} more, " if more else ""
            context.append(f"attempts: {prefix}{', '.join(shown)}")
        return f"{self.message} [{'; '.join(context)}]" if context else self.message

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))


class APIStatusError(HerdlessError):
    """A backend answered with an error status.

    Attributes:
        server_message: the ``error.message`` the server sent (size-capped, key redacted).
        code: the ``error.code`` the server sent (``"queue_full"``, ``"draining"``, 503, ...).
        error_type: the ``error.type`` the server sent.
    """

    def __init__(
        self,
        message: str,
        *,
        server_message: str = "",
        code: str | int | None = None,
        error_type: str | None = None,
        **context: Any,
    ) -> None:
        super().__init__(message, **context)
        self.server_message = server_message
        self.code = code
        self.error_type = error_type

    @property
    def status_code(self) -> int | None:
        """The HTTP status (openai-python's name; ``status`` is the same value)."""
        return self.status


class BadRequestError(APIStatusError):
    """The backend rejected the request itself (400, 413, any 4xx without a class of
    its own, and the base of ``NotFoundError``, ``ConflictError`` and
    ``UnprocessableEntityError``). Not retried."""


class NotFoundError(BadRequestError):
    """404: the URL is wrong (a ``base_url`` without ``/v1``?) or the model is unknown.
    Not retried."""


class ConflictError(BadRequestError):
    """409: the request conflicts with the server's state. Not retried."""


class UnprocessableEntityError(BadRequestError):
    """422: the request is well-formed JSON the server cannot process. Not retried."""


class AuthenticationError(APIStatusError):
    """401: the API key is missing or wrong. Not retried."""


class PermissionDeniedError(APIStatusError):
    """403: the API key may not do this. Not retried."""


class RateLimitError(APIStatusError):
    """429: the backend is full; retried after the wait it asked for before this is raised."""


class ServiceUnavailableError(APIStatusError):
    """5xx: the backend is not serving now (down, loading, draining, broken). Raised as
    its subclass ``InternalServerError``; catching either catches every 5xx."""


class InternalServerError(ServiceUnavailableError):
    """Every status >= 500 (openai-python's name); retried first."""


class APIConnectionError(HerdlessError):
    """No HTTP answer: the connection was refused, reset or broke.

    Attributes:
        kind: the transport failure kind (``"connect"``, ``"read"``, ``"protocol"``, ...).
    """

    def __init__(self, message: str, *, kind: str | None = None, **context: Any) -> None:
        super().__init__(message, **context)
        self.kind = kind


class APITimeoutError(APIConnectionError):
    """No connection, no first byte, or a stream gone idle, within the per-attempt timeout."""


class DeadlineExceeded(HerdlessError):
    """The call's deadline ran out (waits included) before any backend answered.

    Attributes:
        deadline: the call's deadline, in seconds.
    """

    def __init__(self, message: str, *, deadline: float | None = None, **context: Any) -> None:
        super().__init__(message, **context)
        self.deadline = deadline


class StreamInterrupted(HerdlessError):
    """A stream broke after chunks reached the caller; it cannot be retried transparently.

    Attributes:
        delivered_chunks: chunks with content the caller received before the break.
        delivered_chars: characters of content the caller received before the break.
    """

    def __init__(
        self, message: str, *, delivered_chunks: int, delivered_chars: int, **context: Any
    ) -> None:
        super().__init__(message, **context)
        self.delivered_chunks = delivered_chunks
        self.delivered_chars = delivered_chars


class StreamDeadlineExceeded(StreamInterrupted, DeadlineExceeded):
    """A stream passed its ``stream_deadline`` (seconds from the call's start to the
    stream's end) and was closed. Both a ``StreamInterrupted`` (what reached the caller
    is a prefix of the answer) and a ``DeadlineExceeded`` (``deadline`` holds the limit)."""


class FallbackNotAllowed(HerdlessError):
    """The primary could not serve and the only way left is a fallback the call forbids
    (``allow_fallback=False`` and the fallback is ``external``)."""


class SpendLimitExceeded(HerdlessError):
    """The external fallback's spend limit is reached; the call was not sent there.

    Attributes:
        limit: the cap that was reached: ``"share"`` (``max_external_share``),
            ``"calls"`` (``max_external_per_minute``), ``"tokens"``
            (``max_external_tokens``) or ``"cost"`` (``max_external_cost``); ``None``
            when not known.
    """

    def __init__(self, message: str, *, limit: str | None = None, **context: Any) -> None:
        super().__init__(message, **context)
        self.limit = limit


class AllBackendsFailed(HerdlessError):
    """Every backend was tried and none answered.

    Attributes:
        errors: the last error of each backend, by backend name, in the order tried.
    """

    def __init__(
        self, message: str, *, errors: Mapping[str, HerdlessError], **context: Any
    ) -> None:
        super().__init__(message, **context)
        self.errors = dict(errors)


class ConfigurationError(HerdlessError):
    """A setting is missing or malformed.

    Attributes:
        variable: the environment variable (or argument) at fault.
    """

    def __init__(self, message: str, *, variable: str | None = None, **context: Any) -> None:
        super().__init__(message, **context)
        self.variable = variable


_STATUS_CLASSES: dict[int, type[APIStatusError]] = {
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    422: UnprocessableEntityError,
    429: RateLimitError,
}

_ADVICE: dict[type[APIStatusError], str] = {
    BadRequestError: "The request itself was refused: fix it; retrying will not help.",
    NotFoundError: "Check the backend's base_url and the model name; retrying will not help.",
    ConflictError: "The request itself was refused: fix it; retrying will not help.",
    UnprocessableEntityError: "The request itself was refused: fix it; retrying will not help.",
    AuthenticationError: "Check the API key configured for this backend.",
    PermissionDeniedError: "The API key is valid but may not do this; check its permissions.",
    RateLimitError: "The backend is full; retries ran out. Slow down or add capacity.",
    InternalServerError: "The backend is not serving; retries ran out. Check its health.",
}


def _status_class(status: int) -> type[APIStatusError]:
    if status in _STATUS_CLASSES:
        return _STATUS_CLASSES[status]
    if status >= 500:
        return InternalServerError
    return BadRequestError


def _parse_error_body(body: bytes) -> tuple[str, str | int | None, str | None]:
    """``(message, code, type)`` from an OpenAI/vLLM error body, tolerating anything."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return body[:_MAX_SERVER_MESSAGE].decode("utf-8", "replace").strip(), None, None
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        message, code, kind = error.get("message"), error.get("code"), error.get("type")
        return (
            str(message or ""),
            code if isinstance(code, str | int) else None,
            kind if isinstance(kind, str) else None,
        )
    if isinstance(error, str):  # some servers send {"error": "text"}
        return error, None, None
    return "", None, None


def _redact(text: str, backend: Backend | str) -> str:
    # Servers sometimes echo the key they were given ("Incorrect API key provided: sk-...").
    key = getattr(backend, "api_key", None)
    if key:
        text = text.replace(key, "[secure]")
    return text[:_MAX_SERVER_MESSAGE]


def _name(backend: Backend | str) -> str:
    return backend if isinstance(backend, str) else backend.name


def status_error(
    response: Response,
    *,
    backend: Backend | str,
    request_id: str | None,
    attempts: Sequence[AttemptRecord],
    retry_after: float | None = None,
) -> APIStatusError:
    """Build the error for a backend's error status.

    Args:
        response: the error answer (its body is parsed for the OpenAI/vLLM error JSON).
        backend: the backend that answered (its API key is redacted from the message).
        request_id: the call's id.
        attempts: the call's attempts so far.
        retry_after: seconds the server asked to wait, as parsed by the retry policy.

    Returns:
        An instance of the status's class: 401 ``AuthenticationError``, 403
        ``PermissionDeniedError``, 404 ``NotFoundError``, 409 ``ConflictError``, 422
        ``UnprocessableEntityError``, 429 ``RateLimitError``, >= 500
        ``InternalServerError``, any other status ``BadRequestError``. A 404 from a
        backend whose ``base_url`` does not end in ``/v1`` says so.
    """
    cls = _status_class(response.status)
    server_message, code, error_type = _parse_error_body(response.body)
    server_message = _redact(server_message, backend)
    name = _name(backend)
    # The server's own sentence ends with its period ("... Valid aliases: gemma-4."): one
    # period between it and the advice, not two.
    said = f": {server_message.removesuffix('.')}" if server_message else ""
    advice = _ADVICE[cls]
    if cls is NotFoundError and not isinstance(backend, str):
        advice = _no_v1_hint(backend) or advice
    return cls(
        f"{name} answered {response.status}{said}. {advice}",
        server_message=server_message,
        code=code,
        error_type=error_type,
        request_id=request_id,
        attempts=attempts,
        backend=name,
        status=response.status,
        retry_after=retry_after,
    )


def _no_v1_hint(backend: Backend) -> str | None:
    """What to say about a 404 from a ``base_url`` that is not an OpenAI API root."""
    parts = urlsplit(backend.base_url)
    # Shown without user info, query or fragment: a URL may carry credentials.
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    path = parts.path.rstrip("/")
    if path.endswith("/chat/completions"):
        root = f"{parts.scheme}://{host}{path.removesuffix('/chat/completions')}"
        return (
            f"Its base_url ends in /chat/completions: give the API root ({root}); herdless "
            "adds /chat/completions itself."
        )
    if path.endswith("/v1"):
        return None
    shown = f"{parts.scheme}://{host}{path}"
    return (
        f"Its base_url ({shown}) does not end in /v1: herdless posts to "
        f"{shown}/chat/completions, and OpenAI-compatible servers (vLLM, the herdless "
        f"gateway) serve it under /v1; try {shown}/v1."
    )


_TIMEOUT_KINDS = frozenset({"connect_timeout", "first_byte_timeout", "read_timeout"})


def transport_error(
    failure: TransportFailure,
    *,
    backend: Backend | str,
    request_id: str | None,
    attempts: Sequence[AttemptRecord],
) -> APIConnectionError:
    """Build the error for an attempt that got no HTTP answer.

    Returns:
        ``APITimeoutError`` for the timeout kinds, else ``APIConnectionError``.
    """
    cls = APITimeoutError if failure.kind in _TIMEOUT_KINDS else APIConnectionError
    name = _name(backend)
    return cls(
        f"{name} gave no answer ({failure.kind}: {_redact(failure.message, backend)}). "
        "Check that the backend is up and reachable, or raise the timeouts.",
        kind=failure.kind,
        request_id=request_id,
        attempts=attempts,
        backend=name,
    )
