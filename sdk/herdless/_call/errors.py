"""The errors one call raises, built with its context (request id, attempts so far).

What to say is kept apart from how to decide. A function here builds each error of one
call from the call's facts (``CallFacts``: its request id, deadline, data guard and
attempts) and what went wrong; the error one failed attempt stands for is
``status_error`` (a status mapped to its class, as openai-python's
``_make_status_error`` does, with what to do) or ``transport_error``
(``APIConnectionError`` or ``APITimeoutError``). Every message says what happened and
what to do; none contains an API key: what a server echoes is
redacted, and at most ``_MAX_SERVER_MESSAGE`` characters of it kept.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from herdless._actions import Outcome, Response, TransportFailure
from herdless._backend import Backend
from herdless._retry import Verdict
from herdless._types import AttemptRecord, WaitEstimate
from herdless.errors import (
    AllBackendsFailed,
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    DeadlineExceeded,
    FallbackNotAllowed,
    HerdlessError,
    InternalServerError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    SpendLimitExceeded,
    UnprocessableEntityError,
)

if TYPE_CHECKING:
    from herdless._spend import SpendGuard

__all__ = [
    "CallFacts",
    "attempt_error",
    "blocked_error",
    "breaker_open_error",
    "busy_error",
    "deadline_error",
    "final_error",
    "spend_error",
    "status_error",
    "transport_error",
]

# An error body is for a human; a megabyte of HTML from a proxy is not worth keeping.
_MAX_SERVER_MESSAGE = 500

_STATUS_CLASSES: dict[int, type[APIStatusError]] = {
    408: RateLimitError,  # a queue timeout (SMG's): the backend is full, as with a 429
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
    """``(message, code, type)`` from an OpenAI/vLLM error body, tolerating anything: a
    body that is not JSON (llm-d's ``inference error: ...``) is the message itself."""
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
    if isinstance(data, dict) and isinstance(message := data.get("message"), str):
        # NVIDIA Dynamo's frontend: {"message": ..., "type": ..., "code": 529}
        code, kind = data.get("code"), data.get("type")
        return (
            message,
            code if isinstance(code, str | int) else None,
            kind if isinstance(kind, str) else None,
        )
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
        ``UnprocessableEntityError``, 429 and 408 (a queue timeout) ``RateLimitError``, >= 500
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


# An OpenAI route a base_url may end in by mistake; chat first: it ends in /completions too.
_ROUTES = ("/chat/completions", "/completions", "/embeddings", "/responses", "/models")


def _no_v1_hint(backend: Backend) -> str | None:
    """What to say about a 404 from a ``base_url`` that is not an OpenAI API root."""
    parts = urlsplit(backend.base_url)
    # Shown without user info, query or fragment: a URL may carry credentials.
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    path = parts.path.rstrip("/")
    for route in _ROUTES:
        if path.endswith(route):
            root = f"{parts.scheme}://{host}{path.removesuffix(route)}"
            hint = f"Its base_url ends in {route}: give the API root ({root}); herdless "
            if route == "/chat/completions":
                return hint + "adds /chat/completions itself."
            return (
                f"{hint}serves chat only and adds /chat/completions itself (it posted to "
                f"{root}{route}/chat/completions)."
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


class CallFacts(Protocol):
    """What an error says of its call (``herdless._call.record.Call`` has it all)."""

    request_id: str
    deadline: float
    allow_fallback: bool
    records: list[AttemptRecord]


def _context(call: CallFacts, name: str | None) -> dict[str, Any]:
    return {"request_id": call.request_id, "attempts": tuple(call.records), "backend": name}


def attempt_error(
    call: CallFacts, backend: Backend, outcome: Outcome, verdict: Verdict
) -> HerdlessError:
    """The error one failed attempt stands for (status or transport)."""
    request_id, attempts = call.request_id, tuple(call.records)
    if isinstance(outcome, Response):
        return status_error(
            outcome,
            backend=backend,
            request_id=request_id,
            attempts=attempts,
            retry_after=verdict.retry_after,
        )
    return transport_error(outcome, backend=backend, request_id=request_id, attempts=attempts)


def deadline_error(call: CallFacts, name: str) -> DeadlineExceeded:
    """No time was left to (re)try ``name``."""
    return DeadlineExceeded(
        f"The call's {call.deadline:g} s deadline does not leave time to try {name} "
        "again. Raise the deadline or add a fallback.",
        deadline=call.deadline,
        **_context(call, name),
    )


def busy_error(
    call: CallFacts,
    name: str,
    expected: float | None = None,
    *,
    estimate: WaitEstimate | None = None,
) -> DeadlineExceeded:
    """``name`` is busy and the call's wait for it no longer fits its deadline:
    ``estimate``, the client's numbers; ``expected``, the server's predicted wait."""
    if estimate is not None:
        why = estimate.describe()
    elif expected is not None:
        why = f"it would wait about {expected:.1f} s for its turn"
    else:
        why = "it ran out of time waiting for its turn"
    return DeadlineExceeded(
        f"{name} is busy: {why}, against a {call.deadline:g} s deadline, so it was not "
        "sent. Raise the deadline, add a fallback, or add capacity.",
        deadline=call.deadline,
        estimate=estimate,
        **_context(call, name),
    )


def blocked_error(call: CallFacts, name: str) -> APIConnectionError:
    """``name`` was left alone because of a Retry-After or drain window."""
    return APIConnectionError(
        f"{name} asked clients to wait (Retry-After or drain); the call did not send to it.",
        kind="backpressure",
        **_context(call, name),
    )


def breaker_open_error(call: CallFacts, name: str) -> APIConnectionError:
    """``name``'s breaker is open and its probe comes too late."""
    return APIConnectionError(
        f"{name}'s circuit breaker is open (it failed recently) and its next probe "
        "comes too late for this call's deadline; nothing was sent.",
        kind="breaker_open",
        **_context(call, name),
    )


def spend_error(call: CallFacts, name: str, guard: SpendGuard | None = None) -> SpendLimitExceeded:
    """The spend guard kept the call off the external ``name``; ``guard`` says which of
    its caps did."""
    blocking = guard.blocking() if guard is not None else None
    if blocking is None:
        return SpendLimitExceeded(
            f"The spend limit for external backends is reached; the call was not sent to "
            f"{name}. Raise the FallbackPolicy.max_external_* cap, or add primary "
            "capacity.",
            **_context(call, name),
        )
    limit, why = blocking
    return SpendLimitExceeded(
        f"The spend limit for external backends is reached ({why}); the call was not "
        f"sent to {name}. Raise that cap, or add primary capacity.",
        limit=limit,
        **_context(call, name),
    )


def final_error(
    call: CallFacts, errors: Mapping[str, HerdlessError], refused: tuple[Backend, ...]
) -> HerdlessError:
    """What the call raises when no backend served: the one error, all of them, or the
    data guard's refusal when only a refused backend was left."""
    if refused:
        names = ", ".join(b.name for b in refused)
        why = (
            "this call has allow_fallback=False"
            if not call.allow_fallback
            else "the client's FallbackPolicy has allow_external=False"
        )
        tried = "; ".join(f"{n}: {e.message}" for n, e in errors.items()) or "none"
        return FallbackNotAllowed(
            f"No allowed backend could serve, and {names} may not be used because {why}. "
            f"Tried: {tried}",
            **_context(call, next(iter(errors), None)),
        )
    if len(errors) == 1:
        return next(iter(errors.values()))
    summary = "; ".join(f"{n}: {e.message}" for n, e in errors.items())
    return AllBackendsFailed(
        f"Every backend failed. {summary}", errors=errors, **_context(call, None)
    )
