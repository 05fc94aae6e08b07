"""The raw ASGI pieces of the admitted routes (:mod:`herdless.gateway.proxy`) and of the
hosted fallback (:mod:`herdless.gateway.spill`): the body read, the access record, whole
JSON answers, the OpenAI-style errors and refusals, which refusals a request may spill
instead of, and which one a caller that does not retry waits out here."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import NoReturn, TypeVar

from starlette.types import Receive, Send

from herdless.gateway.core.comebacks import Sender
from herdless.gateway.core.decisions import Admit, Enqueued, Refuse
from herdless.gateway.core.limits import Priority
from herdless.gateway.policies import KeyPolicy
from herdless.gateway.wire import (
    client_timeout,
    error_body,
    never_retries,
    refusal_headers,
    returned,
    user_header,
    whole_number,
)

__all__ = [
    "CLIENT_CLOSED",
    "Access",
    "Answered",
    "call_id",
    "decides_itself",
    "error",
    "keeps",
    "kept_for",
    "named_user",
    "read_body",
    "send_json",
    "send_refusal",
    "spills",
    "unless_gone",
    "waited_out",
    "waits_out",
]

T = TypeVar("T")

_OWN_LIMITS = ("rate_limited", "token_budget")  # the key's own limits: never spilled
_WAITED_OUT = ("queue_full", "kv_budget")  # a busy GPU: a place frees at a known time
# A request that waits on past its told time answers this long before its hold ends, so
# that a client whose own timeout is its hold reads the refusal, not its timeout.
_ANSWER_TIME = 1.0
_JSON_TYPE = (b"content-type", b"application/json")
CLIENT_CLOSED = 499  # nginx's "client closed request", for logs and metrics only


async def send_json(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """Send a complete JSON response."""
    raw = [_JSON_TYPE, (b"content-length", b"%d" % len(body))]
    if headers:
        raw += headers
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class _BodyTooLarge(Exception):
    """The body is over ``max_body_bytes``."""


@dataclass(slots=True)
class Access:
    """What the access line says of one request, filled in as it becomes known."""

    request_id: str | None = None
    key_id: str | None = None
    user: str | None = None
    klass: Priority | None = None
    policy: KeyPolicy | None = None
    backend: str = "upstream"
    kept: float = 0.0
    """Seconds it waited out a full queue before it had a place (:func:`waited_out`)."""
    sent: tuple[Sender, bytes] | None = None
    """Who sent it and its body, where a refusal of it is remembered: read, and not a
    herdless client's (:func:`decides_itself`; see
    :class:`~herdless.gateway.core.comebacks.Comebacks`)."""


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


def decides_itself(headers: dict[str, str], deadline: float | None) -> bool:
    """Whether the request is a herdless client's: it sends its deadline or its attempt,
    and decides itself what a refusal means (its backoff, its fallback)."""
    return deadline is not None or "x-herdless-attempt" in headers


def call_id(headers: dict[str, str], rid: str) -> str | None:
    """The id a refused caller comes back with: a herdless client's ``X-Request-ID``
    (the same on every attempt of a call, beside ``X-Herdless-Attempt``), else ``None``:
    another client's id may be a proxy's, new on every attempt."""
    return rid if "x-herdless-attempt" in headers and headers.get("x-request-id") == rid else None


def keeps(
    policy: KeyPolicy, headers: dict[str, str], deadline: float | None, *, again: bool = False
) -> bool:
    """Whether a full queue keeps this request waiting here rather than refuse it: its
    client does not retry (its 429 is an error on a screen): its key says so
    (``retries = false``), or, where the key says nothing, the request shows it
    (:func:`~herdless.gateway.wire.never_retries`); or it is a refused one come back,
    which it says (:func:`~herdless.gateway.wire.returned`) or its body shows (``again``:
    :class:`~herdless.gateway.core.comebacks.Comebacks`): it has had its 429 at once;
    another costs it a round trip and one of its few retries. Never a herdless client's
    (:func:`decides_itself`). Such a request waits out an upstream out, too, where no one
    knows for how long (``waits``: :meth:`~herdless.gateway.core.admission.Admission.offer`)."""
    if decides_itself(headers, deadline):
        return False
    if again or returned(headers) or policy.retries is False:
        return True
    return policy.retries is None and never_retries(headers) is not None


def kept_for(policy: KeyPolicy, headers: dict[str, str], ttl: float | None) -> float:
    """Seconds a kept request may wait out a full queue: its hold (its key's, capped by
    its queue TTL), and never past the client's own timeout, where it says it."""
    hold = policy.limits.hold_for(ttl)
    timeout = client_timeout(headers)
    return hold if timeout is None else min(hold, timeout)


def waits_out(refused: Refuse, left: float) -> bool:
    """Whether a caller that does not retry waits here for the place ``refused`` names
    rather than get it: a full queue's reservation (``queue_full``, ``kv_budget``) due
    within the ``left`` seconds of its hold."""
    return _busy(refused) and refused.retry_after <= left


def _busy(refused: Refuse) -> bool:
    """A full queue's refusal, with a time a place frees: only a busy GPU."""
    return refused.code in _WAITED_OUT and refused.retry


async def unless_gone(receive: Receive, work: Awaitable[T]) -> T | None:
    """``work``'s result, or ``None`` when the client went away first (then it is
    cancelled). Two plain tasks and one wait: every request passes here, and a task
    group's cancel scopes cost several times as much CPU."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnect(receive))
    try:
        await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():  # gone, or this request cancelled (the server stops)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if watch.done() and not watch.cancelled() and (failed := watch.exception()) is not None:
        raise failed
    return None if task.cancelled() else task.result()


async def _disconnect(receive: Receive) -> None:
    """Returns when the client goes away. The body is read: the next message can only
    be the disconnect."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def waited_out(
    offer: Callable[[float], Admit | Enqueued | Refuse],
    refused: Refuse,
    hold: float,
    counted: Counter[str],
    place: Callable[[float], Awaitable[bool]],
    *,
    patient: bool = False,
) -> Admit | Enqueued | Refuse:
    """A request a full queue keeps (:func:`keeps`) waits here for the place the
    refusal names, and is offered again, with the seconds it waited (``offer`` passes
    the id the refusal held the place for: it comes back on time; and its queue wait is
    what is left of its hold). Waiting in the gateway is free; a refusal its caller
    shows as an error is not. A refusal its ``hold`` (seconds from now) does not cover
    is the answer, unless the request is ``patient``; each one waited out is ``counted``.

    It waits with ``place`` (:meth:`herdless.gateway.gate.Gate.until_place`), which
    ends the wait early where the queue runs dry before that time: the request is
    offered then, and where it is refused it keeps its time (not counted again).

    ``patient`` (a key that may not spill): a full queue's time past its hold is a
    prediction too, and a pessimistic one where run times were learned on longer
    answers. The request waits for the queue to run dry, up to its hold less
    ``_ANSWER_TIME``, and is offered once more then; its answer comes after that. It
    takes no place meanwhile (see ``kept_for`` in
    :meth:`~herdless.gateway.core.admission.Admission.offer`): only one the GPU would
    leave idle."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    decision: Admit | Enqueued | Refuse = refused
    early = False
    while isinstance(decision, Refuse):
        left = began + hold - loop.time()
        if waits_out(decision, left):
            told = decision.retry_after
        elif patient and _busy(decision) and left > _ANSWER_TIME:
            told = left - _ANSWER_TIME
        else:
            break
        if not early:
            counted[decision.code] += 1
        early = await place(told)
        decision = offer(loop.time() - began)
    return decision


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


async def read_body(
    receive: Receive, send: Send, headers: dict[str, str], limit: int, within: float
) -> bytes:
    """The request's body, of ``limit`` bytes at most, within ``within`` seconds.

    Raises:
        Answered: a 408 or a 413 was sent, or the client went away (``CLIENT_CLOSED``).
    """
    try:
        async with asyncio.timeout(within):
            return await _body(receive, headers, limit)
    except TimeoutError:
        # A stalled body would hold its connection and task forever; close it too.
        message = f"the body did not arrive within {within:g}s"
        await error(send, 408, "body_timeout", message, headers=[(b"connection", b"close")])
    except _BodyTooLarge:
        message = f"the body exceeds {limit} bytes"
        await error(send, 413, "body_too_large", message)


async def _body(receive: Receive, headers: dict[str, str], limit: int) -> bytes:
    declared = whole_number(headers.get("content-length", ""))
    if declared is not None and declared > limit:
        raise _BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Answered(CLIENT_CLOSED, "client_closed")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)
