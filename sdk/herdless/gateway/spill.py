"""The hosted fallback at the gateway: a request the GPU cannot serve in time, answered
by the hosted model (``herdless serve --fallback-url URL --fallback-model NAME``).

The gateway decides *whether* a request spills (:mod:`herdless.gateway.proxy`: its key's
policy allows it, it named no deadline of its own, and the upstream is out, draining,
full, or would keep it past its key's hold); this module only answers it. It does so
through herdless's own SDK, an :class:`herdless.AsyncClient` whose one backend is the
hosted model (``external=True``): its retries, its circuit breaker and its spend guard
(the ``[fallback]`` table's token and money caps) are the same rules a Python app gets,
not written twice. Before the first byte only: a request that started on the GPU
stays there.

The answer is the hosted model's, re-framed as it came (one JSON object, or the same
SSE chunks and ``[DONE]``), naming the model that answered; the usage chunk the SDK
asks for is passed on only when the client asked for it too.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import SecretStr
from starlette.types import Send

import herdless
from herdless.errors import HerdlessError, SpendLimitExceeded
from herdless.gateway.core.decisions import Refuse
from herdless.gateway.edge import send_json, send_refusal
from herdless.gateway.policies import FallbackTable

__all__ = ["Spill", "Spilled"]

LOG = logging.getLogger("herdless.gateway")
_DEADLINE = 300.0  # seconds: a cap on a spilled call's wait for its first byte, retries included
_WINDOW = 1024  # spilled calls at the hosted API at once, at most
_LIMITS = httpx.Limits(max_connections=_WINDOW, max_keepalive_connections=64)
_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]
_OWN_FIELDS = ("messages", "model", "stream", "max_tokens", "temperature")


@dataclass(frozen=True, slots=True)
class Spilled:
    """How a spilled request ended.

    Attributes:
        status: the status the client got (the hosted model's, or the refusal's).
        outcome: ``served``, ``spend_cap`` (the refusal was sent: the cap is reached) or
            ``failed`` (the hosted model failed too: a 503 naming both).
        prompt_tokens: the hosted model's usage, when it said.
        completion_tokens: likewise.
    """

    status: int
    outcome: str
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class Spill:
    """The hosted model, as one herdless ``AsyncClient`` shared by every spilled request.

    Args:
        url: the hosted API's base URL (ending in ``/v1``).
        model: the model asked of it.
        api_key: its key (never logged; kept by the SDK's ``Backend``, hidden from reprs).
        table: prices and spend caps (the key policies' ``[fallback]`` table).
        transport: an httpx transport to the hosted API (tests).
    """

    __slots__ = ("_client", "_http", "model")

    def __init__(
        self,
        url: str,
        model: str,
        api_key: SecretStr | None,
        table: FallbackTable,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        price = None
        if table.input_price is not None or table.output_price is not None:
            price = herdless.Price(input=table.input_price or 0.0, output=table.output_price or 0.0)
        backend = herdless.Backend(
            name="hosted",
            base_url=url,
            api_key=None if api_key is None else api_key.get_secret_value(),
            model=model,
            external=True,
            price=price,
        )
        policy = herdless.FallbackPolicy(
            max_external_tokens=table.max_tokens,
            max_external_cost=table.max_cost,
            spend_window=table.window,
        )
        self.model = model
        # One client for every employee whose request spills: a window and a pool as wide
        # as a hosted API takes (the SDK's defaults fit one app: 16 calls, 100 sockets).
        # The window still narrows on the hosted API's own 429s.
        self._http = httpx.AsyncClient(transport=transport, limits=_LIMITS)
        self._client = herdless.AsyncClient(
            primary=backend,
            fallback_policy=policy,
            deadline=_DEADLINE,
            window=herdless.WindowPolicy(initial=_WINDOW, maximum=_WINDOW),
            http_client=self._http,
        )

    async def answer(
        self, send: Send, body: Mapping[str, Any], refused: Refuse, extra: list[tuple[bytes, bytes]]
    ) -> Spilled:
        """Answer the request ``body`` from the hosted model, or, when it cannot, with the
        refusal the GPU gave (``refused``: the spend cap is reached) or a 503 naming both.

        ``extra``: headers every answer carries (request id, capacity, backend, reason).
        """
        fields = dict(body)
        messages = fields.get("messages", [])
        stream = fields.get("stream") is True
        asked_usage = _include_usage(fields)
        rest = {name: value for name, value in fields.items() if name not in _OWN_FIELDS}
        try:
            if stream:
                chunks = await self._client.chat(
                    messages,
                    stream=True,
                    max_tokens=fields.get("max_tokens"),
                    temperature=fields.get("temperature"),
                    extra_body=rest,
                )
                return await _relay_stream(send, chunks, asked_usage, extra)
            result = await self._client.chat(
                messages,
                max_tokens=fields.get("max_tokens"),
                temperature=fields.get("temperature"),
                extra_body=rest,
            )
        except SpendLimitExceeded:
            await send_refusal(send, refused, extra)
            return Spilled(refused.status, "spend_cap")
        except HerdlessError as exc:
            message = f"{refused.message}; the hosted fallback failed too: {exc}"
            both = Refuse(status=503, code="fallback_failed", message=message,
                          retry_after=refused.retry_after)  # fmt: skip
            await send_refusal(send, both, extra)
            return Spilled(503, "failed")
        await send_json(send, 200, json.dumps(result.raw, separators=(",", ":")).encode(), extra)
        usage = result.usage
        return Spilled(
            200,
            "served",
            None if usage is None else usage.prompt_tokens,
            None if usage is None else usage.completion_tokens,
        )

    async def aclose(self) -> None:
        """Close the hosted API's connections."""
        await self._client.aclose()
        await self._http.aclose()

    def __repr__(self) -> str:
        return f"Spill(model={self.model!r})"


async def _relay_stream(
    send: Send, chunks: herdless.AsyncStream, asked_usage: bool, extra: list[tuple[bytes, bytes]]
) -> Spilled:
    """Send the hosted model's chunks as SSE; a stream cut after its start ends ours there
    (no ``[DONE]``), as the gateway does for the GPU's streams."""
    await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS + extra})
    prompt = completion = None
    complete = False
    try:
        async with chunks:
            async for chunk in chunks:
                if chunk.usage is not None:
                    prompt, completion = chunk.usage.prompt_tokens, chunk.usage.completion_tokens
                    if not asked_usage and not chunk.raw.get("choices"):
                        continue  # the usage chunk the SDK asked for, not the client
                data = json.dumps(chunk.raw, separators=(",", ":")).encode()
                await send({"type": "http.response.body", "body": b"data: " + data + b"\n\n",
                            "more_body": True})  # fmt: skip
            complete = True
    except HerdlessError as exc:
        LOG.warning("the hosted fallback's stream broke off: %s", type(exc).__name__)
    tail = b"data: [DONE]\n\n" if complete else b""
    await send({"type": "http.response.body", "body": tail, "more_body": False})
    return Spilled(200, "served", prompt, completion)


def _include_usage(fields: Mapping[str, Any]) -> bool:
    options = fields.get("stream_options")
    return isinstance(options, Mapping) and options.get("include_usage") is True
