"""The admitted routes (``POST /v1/chat/completions``, ``/v1/completions``,
``/v1/embeddings``): authenticate, price, admit, stream (pure ASGI).

A pure ASGI endpoint rather than a Starlette ``Response``: the gateway must
notice a client that goes away at any moment (waiting in the queue, or between
two chunks of a slow stream) and close the upstream request at once so vLLM
frees the sequence. A task watches ``receive()`` for ``http.disconnect`` and
cancels the work; ``finally`` blocks release the ticket and close the upstream
response. The refusal path returns before any task is created.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import NoReturn

import anyio
import httpx
from starlette.types import Receive, Scope, Send

from herdless.gateway.core.decisions import Admit, Enqueued, Refuse, Ticket
from herdless.gateway.core.limits import Priority
from herdless.gateway.routes import CHAT, AdmittedRoute, Priced
from herdless.gateway.runtime import Runtime, header_map, request_id, send_json
from herdless.gateway.upstream import UpstreamUnavailable, UsageSniffer
from herdless.gateway.wire import (
    BadRequest,
    capacity_header,
    deadline_header,
    error_body,
    priority_header,
    refusal_headers,
    user_header,
)

__all__ = ["AdmittedProxy"]

_CLIENT_CLOSED = 499  # nginx's "client closed request", for logs and metrics only
_PASS_HEADERS = (b"content-type", b"content-encoding", b"cache-control")


class _BodyTooLarge(Exception):
    pass


class _ClientGone(Exception):
    pass


class AdmittedProxy:
    """The ASGI app of one admitted route (default: ``POST /v1/chat/completions``); the
    upstream path is the route's own."""

    __slots__ = ("_route", "_rt")

    def __init__(self, runtime: Runtime, route: AdmittedRoute = CHAT) -> None:
        self._rt = runtime
        self._route = route

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        arrived = time.perf_counter()
        headers = header_map(scope)
        access = _Access()
        status, reason, ticket = await self._handle(scope, receive, send, headers, access)
        rt = self._rt
        rt.metrics.requests[status] += 1
        if reason is not None and status in (429, 503):
            rt.metrics.rejections[reason] += 1
        elapsed = time.perf_counter() - arrived
        rt.metrics.duration.observe(elapsed)
        if rt.access_log:
            wait = ticket.queue_wait if ticket is not None else 0.0
            rt.log_access(
                # The request id is made only when used (admitted, or logged): not per refusal.
                request_id=access.request_id or request_id(headers),
                key_id=access.key_id,
                user=access.user,
                **{"class": ticket.priority if ticket is not None else access.klass},
                method="POST",
                path=scope["path"],
                status=status,
                reason=reason,
                queue_wait_ms=round(wait * 1000, 3),
                duration_ms=round(elapsed * 1000, 3),
            )

    async def _handle(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        headers: dict[str, str],
        access: _Access,
    ) -> tuple[int, str | None, Ticket | None]:
        """Serve one request; returns (status, refusal reason or None, ticket or None)."""
        try:
            raw, request, deadline = await self._read(scope, receive, send, headers, access)
        except _Answered as answered:
            return answered.status, answered.reason, None
        rt = self._rt
        assert access.key_id is not None
        # The fairness unit: the key, refined by the user the request names (the header
        # first: it is what a proxy in front of an app that cannot change bodies sets).
        named = user_header(headers) or request.user
        user = access.user = None if named is None else rt.users(named)
        decision = rt.gate.offer(
            access.key_id,
            request.price(rt.settings.default_max_tokens),
            deadline=deadline,
            user=user,
            priority=access.klass or "interactive",
            prompt=request.prompt_tokens,
        )
        if isinstance(decision, Refuse):
            await _send_refusal(send, decision)
            return decision.status, decision.code, None
        ticket = decision.ticket
        rid = access.request_id = request_id(headers)
        outcome: list[tuple[int, str | None]] = []
        try:
            async with anyio.create_task_group() as tg:

                async def watch() -> None:
                    # The body is read: the next message can only be the disconnect.
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    tg.cancel_scope.cancel()

                tg.start_soon(watch)
                outcome.append(
                    await self._admitted(
                        send, decision, headers | {"x-request-id": rid}, raw, deadline
                    )
                )
                tg.cancel_scope.cancel()
        finally:
            rt.gate.release(ticket, used_tokens=None)  # no-op when _admitted released it
        if not outcome:
            return _CLIENT_CLOSED, "client_closed", ticket
        status, reason = outcome[0]
        return status, reason, ticket

    async def _read(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        headers: dict[str, str],
        access: _Access,
    ) -> tuple[bytes, Priced, float | None]:
        """Everything before admission: the key, the refusals that need no body (a flood
        is refused before its bodies are read), the class, the body and its parse.

        Returns:
            The body, the parsed request and the caller's deadline.

        Raises:
            _Answered: the request was answered here (an error or a refusal).
        """
        rt = self._rt
        key_id = access.key_id = rt.identify(headers)
        if key_id is None:
            message = "a valid API key is required (Authorization: Bearer <key>)"
            await _error(send, 401, "invalid_api_key", message, kind="authentication_error",
                         headers=[(b"www-authenticate", b"Bearer")])  # fmt: skip
        assert key_id is not None
        deadline = deadline_header(headers)
        early = rt.gate.precheck(key_id, deadline=deadline)
        if early is not None:
            await _send_refusal(send, early)
            raise _Answered(early.status, early.code)
        settings = rt.settings
        try:
            access.klass = priority_header(headers)
            async with asyncio.timeout(settings.body_timeout):
                raw = await _read_body(scope, receive, headers, settings.max_body_bytes)
            request = self._route.parse(
                raw, max_messages=settings.max_messages, max_tokens_cap=settings.max_tokens_cap
            )
        except TimeoutError:
            # A stalled body would hold its connection and task forever; close it too.
            message = f"the body did not arrive within {settings.body_timeout:g}s"
            await _error(send, 408, "body_timeout", message, headers=[(b"connection", b"close")])
        except _ClientGone:
            raise _Answered(_CLIENT_CLOSED, "client_closed") from None
        except _BodyTooLarge:
            message = f"the body exceeds {settings.max_body_bytes} bytes"
            await _error(send, 413, "body_too_large", message)
        except BadRequest as exc:
            await _error(send, 400, exc.code, str(exc), param=exc.param)
        return raw, request, deadline

    async def _admitted(
        self,
        send: Send,
        decision: Admit | Enqueued,
        headers: dict[str, str],
        raw: bytes,
        deadline: float | None,
    ) -> tuple[int, str | None]:
        rt = self._rt
        ticket = decision.ticket
        if isinstance(decision, Enqueued):
            refused = await rt.gate.wait(ticket, deadline=deadline)
            if refused is not None:
                await _send_refusal(send, refused)
                return refused.status, refused.code
        rt.metrics.queue_wait.observe(ticket.queue_wait)
        started = time.perf_counter()
        try:
            response = await rt.upstream.open("POST", self._route.path, body=raw, headers=headers)
        except UpstreamUnavailable as exc:
            rt.gate.release(ticket)
            if exc.down:
                rt.gate.set_upstream(ready=False, code=exc.code)
            refused = rt.gate.unavailable(exc.code, str(exc))
            await _send_refusal(send, refused)
            return 503, exc.code
        try:
            sniffer = await _relay(send, response, headers["x-request-id"], started, rt)
        finally:
            await response.aclose()
        rt.gate.release(
            ticket,
            used_tokens=sniffer.total_tokens,
            prompt_tokens=sniffer.prompt_tokens,
            completion_tokens=sniffer.completion_tokens,
        )
        return response.status_code, None


async def _relay(
    send: Send,
    response: httpx.Response,
    rid: str,
    started: float,
    rt: Runtime,
) -> UsageSniffer:
    """Pass the upstream response through, byte for byte; returns what it saw of usage."""
    out = [(name, value) for name, value in response.headers.raw if name.lower() in _PASS_HEADERS]
    out.append((b"x-request-id", rid.encode()))
    out.append(capacity_header(rt.gate.key_capacity))
    if response.status_code in (429, 503) and "retry-after" not in response.headers:
        retry_after = rt.settings.upstream_retry_after
        out += refusal_headers(
            Refuse(status=response.status_code, code="", message="", retry_after=retry_after)
        )
    await send({"type": "http.response.start", "status": response.status_code, "headers": out})
    sniffer = UsageSniffer()
    first = True
    try:
        async for chunk in response.aiter_raw():
            if first:
                rt.metrics.ttfb.observe(time.perf_counter() - started)
                first = False
            sniffer.feed(chunk)
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
    except httpx.TransportError:
        # The upstream cut the stream: end ours where it ended (no [DONE] follows).
        pass
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    return sniffer


@dataclass(slots=True)
class _Access:
    """What the access line says of one request, filled in as it becomes known."""

    request_id: str | None = None
    key_id: str | None = None
    user: str | None = None
    klass: Priority | None = None


class _Answered(Exception):
    """The request was answered before admission, with ``status`` (and ``reason``)."""

    def __init__(self, status: int, reason: str | None) -> None:
        super().__init__(status, reason)
        self.status = status
        self.reason = reason


async def _error(
    send: Send,
    status: int,
    code: str,
    message: str,
    *,
    kind: str = "invalid_request_error",
    param: str | None = None,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> NoReturn:
    """Answer an OpenAI-style error, then raise :class:`_Answered`."""
    await send_json(send, status, error_body(message, code=code, type=kind, param=param), headers)
    raise _Answered(status, code)


async def _send_refusal(send: Send, refuse: Refuse) -> None:
    type_ = "invalid_request_error" if refuse.status == 400 else "rate_limit_error"
    if refuse.status == 503:
        type_ = "service_unavailable"
    body = error_body(refuse.message, code=refuse.code, type=type_)
    await send_json(send, refuse.status, body, refusal_headers(refuse))


async def _read_body(scope: Scope, receive: Receive, headers: dict[str, str], limit: int) -> bytes:
    declared = headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)
