"""The raw ASGI pieces of the admitted routes (:mod:`herdless.gateway.proxy`) and of the
hosted fallback (:mod:`herdless.gateway.spill`): the body read, the access record, whole
JSON answers, the OpenAI-style errors and refusals, and which refusals a request may
spill instead of."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn

from starlette.types import Receive, Scope, Send

from herdless.gateway.core.decisions import Refuse
from herdless.gateway.core.limits import Priority
from herdless.gateway.policies import KeyPolicy
from herdless.gateway.wire import error_body, refusal_headers, user_header

__all__ = [
    "Access",
    "Answered",
    "BodyTooLarge",
    "ClientGone",
    "error",
    "named_user",
    "read_body",
    "send_json",
    "send_refusal",
    "spills",
]

_OWN_LIMITS = ("rate_limited", "token_budget")  # the key's own limits: never spilled
_JSON_TYPE = (b"content-type", b"application/json")


async def send_json(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """Send a complete JSON response."""
    raw = [_JSON_TYPE, (b"content-length", b"%d" % len(body))]
    if headers:
        raw += headers
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class BodyTooLarge(Exception):
    """The body is over ``max_body_bytes``."""


class ClientGone(Exception):
    """The client went away while its body was read."""


@dataclass(slots=True)
class Access:
    """What the access line says of one request, filled in as it becomes known."""

    request_id: str | None = None
    key_id: str | None = None
    user: str | None = None
    klass: Priority | None = None
    policy: KeyPolicy | None = None
    backend: str = "upstream"


class Answered(Exception):
    """The request was answered before admission, with ``status`` (and ``reason``)."""

    def __init__(self, status: int, reason: str | None) -> None:
        super().__init__(status, reason)
        self.status = status
        self.reason = reason


async def error(
    send: Send,
    status: int,
    code: str,
    message: str,
    *,
    kind: str = "invalid_request_error",
    param: str | None = None,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> NoReturn:
    """Answer an OpenAI-style error, then raise :class:`Answered`."""
    await send_json(send, status, error_body(message, code=code, type=kind, param=param), headers)
    raise Answered(status, code)


def spills(refused: Refuse) -> bool:
    """Whether a refusal is one a request spills instead of (not the key's own limits)."""
    return refused.status in (429, 503) and refused.code not in _OWN_LIMITS


def named_user(headers: dict[str, str], policy: KeyPolicy) -> str | None:
    """The end user: the key's ``user_header``, else ``X-Herdless-User`` (``None``: none)."""
    if policy.user_header is not None:
        named = headers.get(policy.user_header, "").strip()
        if named:
            return named
    return user_header(headers)


async def send_refusal(
    send: Send, refuse: Refuse, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    """``refuse`` as an OpenAI-style error with its hints; ``extra``: more headers."""
    type_ = "invalid_request_error" if refuse.status == 400 else "rate_limit_error"
    if refuse.status == 503:
        type_ = "service_unavailable"
    body = error_body(refuse.message, code=refuse.code, type=type_)
    await send_json(send, refuse.status, body, refusal_headers(refuse) + (extra or []))


async def read_body(scope: Scope, receive: Receive, headers: dict[str, str], limit: int) -> bytes:
    declared = headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)
