"""vLLM's answer to an admitted request, relayed to its client (pure ASGI sends).

The body passes on byte for byte, as vLLM wrote it, but for the usage event the gateway
asked for on behalf of a client that did not (:class:`~.usage.UsageSniffer`); the
head gets the gateway's own headers, and a refusal of vLLM's own the hints every client
obeys."""

from __future__ import annotations

import time

import httpx
from starlette.types import Send

from herdless.gateway.core.decisions import Refuse, Ticket
from herdless.gateway.gate import Gate
from herdless.gateway.items import Keep, OutputItems
from herdless.gateway.runtime import Runtime
from herdless.gateway.usage import UsageSniffer
from herdless.gateway.wire import capacity_header, refusal_headers, upstream_hint

__all__ = ["relay", "settle", "sniffer_for", "unrun"]

_PASS_HEADERS = (b"content-type", b"content-encoding", b"cache-control")
_UPSTREAM = (b"x-herdless-backend", b"upstream")


def sniffer_for(response: httpx.Response, *, omit: bool, keep: Keep | None) -> UsageSniffer:
    """What reads ``response``'s usage as it passes (``omit``: the usage event the gateway
    asked for is left out, of a 200 event stream whose bytes are not compressed); with
    ``keep``, also its output items (:class:`~.items.OutputItems`, a 200 answer's)."""
    head = response.headers
    events = head.get("content-type", "").startswith("text/event-stream")
    plain = head.get("content-encoding", "identity") == "identity"  # else bytes unread
    omit = omit and response.status_code == 200 and events and plain
    if keep is not None and response.status_code == 200 and plain:
        return OutputItems(keep, stream=events, omit=omit)
    return UsageSniffer(omit=omit)


async def relay(
    send: Send,
    response: httpx.Response,
    sniffer: UsageSniffer,
    rid: str,
    started: float | None,
    rt: Runtime,
    queued: float,
) -> bool:
    """Pass the upstream response through, byte for byte, as ``sniffer`` lets it (it reads
    the usage); returns whether it ended whole (``False``: vLLM cut it).

    ``started``: when it was sent upstream, for the time to its first byte (``None``: an
    answer nothing generates, not timed); ``queued``: seconds it waited in the gateway
    (``X-Herdless-Queue-Ms`` when any)."""
    out = [(name, value) for name, value in response.headers.raw if name.lower() in _PASS_HEADERS]
    out.append((b"x-request-id", rid.encode()))
    out.append(capacity_header(rt.gate.admission.key_capacity))
    out.append(_UPSTREAM)
    if queued > 0:
        out.append((b"x-herdless-queue-ms", b"%d" % round(queued * 1000)))
    if response.status_code in (429, 503):  # vLLM's own refusal: hints every client obeys
        settings = rt.settings
        said = upstream_hint(response.headers, settings.upstream_retry_after)
        retry_after = min(said, settings.max_retry_after)
        out += refusal_headers(
            Refuse(status=response.status_code, code="", message="", retry_after=retry_after)
        )
    await send({"type": "http.response.start", "status": response.status_code, "headers": out})
    first, whole = True, True
    try:
        async for chunk in response.aiter_raw():
            if first and started is not None:
                rt.metrics.ttfb.observe(time.perf_counter() - started)
                first = False
            if passed := sniffer.feed(chunk):
                await send({"type": "http.response.body", "body": passed, "more_body": True})
    except httpx.TransportError:
        # The upstream cut the stream: end ours where it ended (no [DONE] follows).
        whole = False
    await send({"type": "http.response.body", "body": sniffer.end(), "more_body": False})
    return whole


def unrun(gate: Gate, ticket: Ticket) -> None:
    """End a ticket vLLM did not run (not reached, or it refused it): no token is charged."""
    gate.release(ticket, used_tokens=0, prompt_tokens=0, completion_tokens=0, whole=False)


def settle(gate: Gate, ticket: Ticket, sniffer: UsageSniffer, *, whole: bool) -> None:
    """End ``ticket`` on the usage vLLM reported. An answer cut short (its client left, the
    stream broke, vLLM failed with a 500) has none, or only its start's (a Messages
    stream's first event: 0 output tokens): a stream is settled on its events, about a
    token each (an employee who stops an answer is charged what it used, not its
    ``max_tokens``); one with no event on the engine's measured decode rate
    (:meth:`~herdless.gateway.core.admission.Admission.release`). A cut answer teaches no
    answer length."""
    completion = sniffer.completion_tokens
    if not whole and sniffer.events:
        completion = max(completion or 0, sniffer.events)
    gate.release(
        ticket,
        used_tokens=sniffer.total_tokens,
        prompt_tokens=sniffer.prompt_tokens,
        completion_tokens=completion,
        whole=whole,
    )
