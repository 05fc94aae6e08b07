"""The admitted routes (``POST /v1/chat/completions``, ``/v1/completions``,
``/v1/embeddings``): authenticate, price, admit, stream (pure ASGI).

A pure ASGI endpoint rather than a Starlette ``Response``: the gateway must
notice a client that goes away at any moment (waiting in the queue, or between
two chunks of a slow stream) and close the upstream request at once so vLLM
frees the sequence. A task watches ``receive()`` for ``http.disconnect`` and
cancels the work; ``finally`` blocks release the ticket and close the upstream
response. The refusal path returns before any task is created.

A chat request its key's policy lets leave the building (``fallback = true``, no
``X-Herdless-Deadline-Ms`` of its own: a herdless client decides that itself, and no
batch class) is answered by the hosted model (:mod:`herdless.gateway.spill`) where it
would have been refused: the upstream out, loading or draining, the queue full, its
wait predicted past its key's hold, its hold passed, or the upstream's own 429 or 503.
Never after its first byte: a request the GPU started stays there.

A request whose client does not retry (a chat front-end that shows a 429 as an error), or
a refused one come back (an OpenAI SDK's retry says so; any other sends the same body
again), waits out a full queue here (:func:`herdless.gateway.edge.keeps`): at the time a
refusal names, it takes the place held for it, within its hold
(:func:`~herdless.gateway.edge.waited_out`), or spills, or is refused. It waits out an
upstream out for a time no one knows (admission's rule 1) and is never displaced (rule 8)."""

from __future__ import annotations

import functools
import itertools
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass

from starlette.types import Receive, Scope, Send

from herdless.gateway.core.comebacks import Sender
from herdless.gateway.core.decisions import Admit, Enqueued, Refuse, Ticket
from herdless.gateway.core.limits import Priority
from herdless.gateway.edge import (
    CLIENT_CLOSED,
    Access,
    Answered,
    call_id,
    decides_itself,
    error,
    keeps,
    kept_for,
    named_user,
    read_body,
    send_refusal,
    spills,
    unless_gone,
    waited_out,
)
from herdless.gateway.items import ItemMemory
from herdless.gateway.logs import event
from herdless.gateway.policies import KeyPolicy
from herdless.gateway.relay import relay, settle, sniffer_for, unrun
from herdless.gateway.routes import CHAT, MESSAGE_TOKENS, RESPONSES, AdmittedRoute, Priced
from herdless.gateway.runtime import AUDIT_LOG, KEY_REQUIRED, Runtime, header_map, request_id
from herdless.gateway.settings import GatewaySettings
from herdless.gateway.spill import Spill
from herdless.gateway.upstream import UpstreamUnavailable
from herdless.gateway.usage import asking_usage
from herdless.gateway.wire import (
    BadRequest,
    capacity_header,
    deadline_header,
    json_object,
    priority_header,
    ttl_header,
)

__all__ = ["AdmittedProxy"]

_HOSTED = (b"x-herdless-backend", b"hosted")
_KEPT = itertools.count()  # a kept request's id: "kept N", a space no X-Request-ID holds


@dataclass(frozen=True, slots=True)
class _Exchange:
    """One request on the wire: its ASGI scope and channels, its headers, and its access
    record, filled in as the request is served."""

    scope: Scope
    receive: Receive
    send: Send
    headers: dict[str, str]
    access: Access


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
        access = Access()
        status, reason, ticket = await self._handle(
            _Exchange(scope, receive, send, headers, access)
        )
        rt = self._rt
        rt.metrics.requests[status] += 1
        if reason is not None and status in (429, 503):
            rt.metrics.rejections[reason] += 1
            if access.sent is not None:  # its client may send it again
                rt.gate.comebacks.refused(*access.sent)
        elapsed = time.perf_counter() - arrived
        rt.metrics.duration.observe(elapsed)
        if rt.access_log:
            wait = access.kept + (ticket.queue_wait if ticket is not None else 0.0)
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
                backend=access.backend,
            )

    async def _handle(self, exchange: _Exchange) -> tuple[int, str | None, Ticket | None]:
        """Serve one request; returns (status, refusal reason or None, ticket or None)."""
        try:
            raw, request, deadline, early, again = await self._read(exchange)
        except Answered as answered:
            return answered.status, answered.reason, None
        rt, headers, access = self._rt, exchange.headers, exchange.access
        assert access.key_id is not None
        assert access.policy is not None
        policy = access.policy
        access.request_id = request_id(headers)
        if self._route is MESSAGE_TOKENS:  # vLLM counts without the GPU: not admitted
            return *await self._until_gone(exchange.receive, self._counted(exchange, raw)), None
        spill = self._spill(policy, deadline, access.klass)
        if early is not None:  # only when it may spill: the upstream is out or draining
            assert spill is not None
            return *await self._until_gone(
                exchange.receive, self._spilled(exchange, spill, raw, early)
            ), None
        # The fairness unit: the key, refined by the user the request names (the key's own
        # header first, then X-Herdless-User: what a proxy in front of an app that cannot
        # change bodies sets, then the body's user field).
        named = named_user(headers, policy) or request.user
        user = access.user = None if named is None else rt.users(named)
        kept = keeps(policy, headers, deadline, again=again)  # it waits out a full queue
        ttl = ttl_header(headers)
        call = f"kept {next(_KEPT)}" if kept else call_id(headers, access.request_id)
        hold = kept_for(policy, headers, ttl) if kept else None
        offer = functools.partial(
            rt.gate.offer,
            access.key_id,
            request.price(rt.settings.default_max_tokens),
            # A request that may spill leaves when its wait is predicted past its hold.
            deadline=policy.limits.hold if spill is not None and deadline is None else deadline,
            user=user,
            priority=access.klass or "interactive",
            prompt=request.prompt_tokens,
            open_ended=request.open_ended,
            prefix=request.prefix,
            ttl=ttl,  # a cap on its queue wait, never its deadline
            call=call,
            kept_for=hold,
            waits=kept and spill is None,  # an upstream out for a time no one knows: it waits
            returns=not kept,  # with a call id: a herdless client, back at its time
            kept_back=access.sent is not None,  # its retry is known by its body, and kept
        )
        decision: Admit | Enqueued | Refuse = offer()
        if hold is not None and isinstance(decision, Refuse):
            assert call is not None
            waiting = waited_out(lambda s: offer(kept=s), decision, hold, rt.metrics.waited_out,
                                 rt.gate.until_place, patient=spill is None)  # fmt: skip
            began = time.perf_counter()
            waited = await unless_gone(exchange.receive, waiting)
            access.kept = time.perf_counter() - began
            if not isinstance(waited, Admit | Enqueued):  # gone, or it waits no longer
                rt.gate.admission.forget(access.key_id, call)  # nobody comes back for it
            if waited is None:
                return CLIENT_CLOSED, "client_closed", None
            decision = waited
        if isinstance(decision, Refuse):
            if spill is not None and spills(decision):
                work = self._spilled(exchange, spill, raw, decision)
                return *await self._until_gone(exchange.receive, work), None
            await send_refusal(exchange.send, decision)
            return decision.status, decision.code, None
        ticket = decision.ticket
        try:
            work = self._admitted(
                exchange, decision, raw, deadline, spill=spill, usage=request.adds_usage
            )
            outcome = await self._until_gone(exchange.receive, work)
        finally:
            rt.gate.release(ticket, whole=False)  # its client left first (else a no-op)
        status, reason = outcome
        return status, reason, ticket

    @staticmethod
    async def _until_gone(
        receive: Receive, work: Awaitable[tuple[int, str | None]]
    ) -> tuple[int, str | None]:
        """Await ``work`` unless the client goes away first (then it is cancelled: vLLM
        or the hosted model frees the request at once)."""
        outcome = await unless_gone(receive, work)
        return (CLIENT_CLOSED, "client_closed") if outcome is None else outcome

    async def _counted(self, exchange: _Exchange, raw: bytes) -> tuple[int, str | None]:
        """Relay vLLM's answer to a request the engine does not run (never queued)."""
        rt, rid = self._rt, exchange.access.request_id or ""
        headers = exchange.headers | {"x-request-id": rid}
        try:
            response = await rt.upstream.open("POST", self._route.path, body=raw, headers=headers)
        except UpstreamUnavailable as exc:
            refused = rt.gate.admission.unavailable(exc.code, str(exc))
            await send_refusal(exchange.send, refused)
            return 503, exc.code
        try:
            sniffer = sniffer_for(response, omit=False, keep=None)
            await relay(exchange.send, response, sniffer, rid, None, rt, 0.0)
        finally:
            await response.aclose()
        return response.status_code, None

    def _items(self) -> ItemMemory | None:
        """Where a response's output items are kept, for the Responses API's references."""
        return self._rt.items if self._route is RESPONSES else None

    def _spill(
        self, policy: KeyPolicy, deadline: float | None, klass: Priority | None
    ) -> Spill | None:
        """The hosted fallback, when this request may go there: a chat request (the SDK's
        client speaks chat only) whose key allows it, that named no deadline (a herdless
        client spills itself) and is not batch work."""
        spill = self._rt.spill
        if spill is None or self._route is not CHAT or not policy.fallback:
            return None
        return None if deadline is not None or klass == "batch" else spill

    async def _spilled(
        self, exchange: _Exchange, spill: Spill, raw: bytes, refused: Refuse
    ) -> tuple[int, str | None]:
        """Answer from the hosted model instead of sending ``refused``; count and audit it."""
        rt, access = self._rt, exchange.access
        rid = access.request_id or ""
        reason = refused.code
        extra = [
            (b"x-request-id", rid.encode()),
            capacity_header(rt.gate.admission.key_capacity),
            _HOSTED,
            (b"x-herdless-fallback-reason", reason.encode()),
        ]
        ended = await spill.answer(exchange.send, json_object(raw), refused, extra)
        key = access.key_id or ""
        rt.metrics.spills[(key, reason, ended.outcome)] += 1
        for kind, tokens in (
            ("prompt", ended.prompt_tokens),
            ("completion", ended.completion_tokens),
        ):
            if tokens:
                rt.metrics.spill_tokens[(key, kind)] += tokens
        access.backend = "hosted"
        event(AUDIT_LOG, logging.WARNING, f"spill {ended.outcome}", event="spill", key_id=key,
              reason=reason, outcome=ended.outcome, status=ended.status, model=spill.model,
              prompt_tokens=ended.prompt_tokens, completion_tokens=ended.completion_tokens,
              request_id=rid)  # fmt: skip
        return ended.status, reason

    async def _read(
        self, exchange: _Exchange
    ) -> tuple[bytes, Priced, float | None, Refuse | None, bool]:
        """Everything before admission: the key, the refusals that need no body (a flood
        is refused before its bodies are read, unless it may spill), the class, the body,
        whether it is a refused request come back, and its parse. Returns the body, the
        parsed request, the caller's deadline, the refusal it spills instead of (``None``:
        offer it) and whether it came back; raises :class:`Answered` where it answered."""
        rt, send, headers, access = self._rt, exchange.send, exchange.headers, exchange.access
        key_id = access.key_id = rt.identify(headers)
        if key_id is None:
            await error(send, 401, "invalid_api_key", KEY_REQUIRED, kind="authentication_error",
                         headers=[(b"www-authenticate", b"Bearer")])  # fmt: skip
        assert key_id is not None
        policy = access.policy = rt.policies.of(key_id)
        deadline = deadline_header(headers)
        settings = rt.settings
        try:
            access.klass = priority_header(headers, policy.priority or "interactive")
        except BadRequest as exc:
            await error(send, 400, exc.code, str(exc), param=exc.param)
        ttl, own = ttl_header(headers), decides_itself(headers, deadline)
        check = functools.partial(rt.gate.admission.precheck, key_id, deadline=deadline, ttl=ttl)
        stays = self._spill(policy, deadline, access.klass) is None  # else an outage spills it
        early, spilled = check(waits=stays and keeps(policy, headers, deadline)), None
        if early is not None and not stays and spills(early):
            early, spilled = None, early  # the refusal it spills instead of
        # A 503 (draining, loading) reads the body: its retry is known by it, and waits.
        if early is not None and (early.status != 503 or own):
            await send_refusal(send, early)  # the key's rate reads no body: a flood is cheap
            raise Answered(early.status, early.code)
        raw = await _body(exchange, settings)
        if not own:  # a refusal of it is remembered
            access.sent = _sender(exchange), raw
        again = access.sent is not None and rt.gate.comebacks.back(*access.sent)
        rt.metrics.comebacks += again
        if early is not None and not (again and check(waits=True) is None):
            await send_refusal(send, early)
            raise Answered(early.status, early.code)
        try:
            if (items := self._items()) is not None:  # its references, written out
                raw = items.resolve(key_id, raw)
            request = self._route.parse(
                raw, max_messages=settings.max_messages, max_tokens_cap=settings.max_tokens_cap
            )
        except BadRequest as exc:
            await error(send, 400, exc.code, str(exc), param=exc.param)
        return raw, request, deadline, spilled, again

    async def _admitted(
        self,
        exchange: _Exchange,
        decision: Admit | Enqueued,
        raw: bytes,
        deadline: float | None,
        *,
        spill: Spill | None,
        usage: bool,
    ) -> tuple[int, str | None]:
        """Run it upstream (after its wait in the queue), relayed to its client. ``usage``:
        the gateway asks for the stream's usage itself (:func:`~.usage.adds_usage`)."""
        rt, send = self._rt, exchange.send
        ticket = decision.ticket
        if isinstance(decision, Enqueued):
            refused = await rt.gate.wait(ticket, deadline=deadline)
            if refused is not None:
                if spill is not None and spills(refused):
                    return await self._spilled(exchange, spill, raw, refused)
                await send_refusal(send, refused)
                return refused.status, refused.code
            rt.metrics.held += 1
        rt.metrics.queue_wait.observe(ticket.queue_wait)
        rid = exchange.access.request_id or ""
        headers = exchange.headers | {"x-request-id": rid}
        started = time.perf_counter()
        rt.gate.admission.sizing.sample_prompt(raw, ticket.prompt)  # for the engine to count
        try:
            body = asking_usage(raw) if usage else raw
            response = await rt.upstream.open("POST", self._route.path, body=body, headers=headers)
        except UpstreamUnavailable as exc:
            unrun(rt.gate, ticket)
            if exc.down:
                rt.gate.set_upstream(ready=False, code=exc.code)
            refused = rt.gate.admission.unavailable(exc.code, str(exc))
            if spill is not None:
                return await self._spilled(exchange, spill, raw, refused)
            await send_refusal(send, refused)
            return 503, exc.code
        if spill is not None and response.status_code in (429, 503):  # vLLM's own refusal
            await response.aclose()
            unrun(rt.gate, ticket)
            code = "upstream_busy" if response.status_code == 429 else "upstream_unavailable"
            said = f"the model server answered {response.status_code}"
            refused = Refuse(status=response.status_code, code=code, message=said,
                             retry_after=rt.settings.upstream_retry_after)  # fmt: skip
            return await self._spilled(exchange, spill, raw, refused)
        items, key = self._items(), exchange.access.key_id or ""
        keep = None if items is None else items.keeper(key)
        sniffer, whole = sniffer_for(response, omit=usage, keep=keep), False
        try:
            waited = exchange.access.kept + ticket.queue_wait
            whole = await relay(send, response, sniffer, rid, started, rt, waited)
        finally:  # its client gone too (cancelled): it is settled on what vLLM sent
            await response.aclose()
            if response.status_code >= 400 and response.status_code != 500:
                unrun(rt.gate, ticket)  # vLLM refused it: a 400, a 404, its own 429 or 503
            else:
                settle(rt.gate, ticket, sniffer, whole=whole and response.status_code != 500)
        return response.status_code, None


def _sender(exchange: _Exchange) -> Sender:
    """Who sent the request, as a refusal of it is remembered: its key and address."""
    assert exchange.access.key_id is not None
    return exchange.access.key_id, (exchange.scope.get("client") or (None,))[0]


async def _body(exchange: _Exchange, settings: GatewaySettings) -> bytes:
    limit, timeout = settings.max_body_bytes, settings.body_timeout
    return await read_body(exchange.receive, exchange.send, exchange.headers, limit, timeout)
