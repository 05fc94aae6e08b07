"""Errors raised by herdless clients. Every one derives from ``HerdlessError``::

    HerdlessError
    ├── APIStatusError             a backend answered with an error status
    │   ├── BadRequestError          400 and any 4xx without a class of its own
    │   │   ├── NotFoundError          404: wrong URL (no /v1?) or unknown model
    │   │   ├── ConflictError          409
    │   │   └── UnprocessableEntityError  422
    │   ├── AuthenticationError      401: the API key is missing or wrong
    │   ├── PermissionDeniedError    403: the key may not do this
    │   ├── RateLimitError           429 (or 408): come back later (retried first)
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

from collections.abc import Mapping, Sequence
from typing import Any

from herdless._types import AttemptRecord, WaitEstimate

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
]

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
    """429 (or 408, a queue timeout): the backend is full; retried after the wait it asked
    for before this is raised."""


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
        estimate: when the call was not sent because the client expected its wait for a
            busy backend not to fit: the numbers it compared (``WaitEstimate``); else
            ``None``.
    """

    def __init__(
        self,
        message: str,
        *,
        deadline: float | None = None,
        estimate: WaitEstimate | None = None,
        **context: Any,
    ) -> None:
        super().__init__(message, **context)
        self.deadline = deadline
        self.estimate = estimate


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
