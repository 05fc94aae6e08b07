"""The herd scenario's server: the gateway's own admission core in front of a model GPU.

Purpose-built so that capacity and service time are exact: ``slots`` requests
run at once, each for ``service`` seconds, so the server completes
``slots / service`` requests per second, no more, no less. Admission is not a
copy: it is :class:`herdless.gateway.core.admission.Admission` driven by the
gateway's own async driver (:class:`herdless.gateway.gate.Gate`), and refusals
are written with the gateway's own headers and error bodies
(:mod:`herdless.gateway.wire`). Runs in-process on the virtual-time loop
(:mod:`herdless.bench.vtime`), reached through an httpx ``MockTransport``.

``cooperative=False`` strips ``Retry-After``, ``retry-after-ms`` and the
``RateLimit`` fields from the refusals: a server that says "no" but not "when"
(as TGI's 429 does), so that only the clients' own backoff spreads them.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from herdless.bench.answers import chat_completion
from herdless.bench.vtime import VirtualClock
from herdless.gateway.core.admission import Admission
from herdless.gateway.core.decisions import Enqueued, Refuse
from herdless.gateway.core.limits import AdmissionConfig
from herdless.gateway.gate import Gate
from herdless.gateway.wire import capacity_header, error_body, refusal_headers

__all__ = ["HerdServer", "ServerParams", "completion_body"]

_TIMING = (b"retry-after", b"ratelimit")  # what a server that says "no" but not "when" omits


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerParams:
    """The server of the herd: its GPU, its gateway limits and its outage.

    Attributes:
        slots: sequences the GPU runs at once (the gateway's ``max_concurrency``).
        service: seconds one request runs.
        queue: requests the gateway lets wait (``max_queue``).
        recover_at: seconds after t=0 when the upstream becomes ready.
        upstream_retry_after: the gateway's Retry-After while the upstream loads.
        cooperative: send Retry-After on refusals (the herdless gateway) or not.
    """

    slots: int = 50
    service: float = 0.5
    queue: int = 50
    recover_at: float = 1.5
    upstream_retry_after: float = 2.0
    cooperative: bool = True

    @property
    def capacity(self) -> float:
        """Requests per second the GPU completes: ``slots / service``."""
        return self.slots / self.service


@dataclass(slots=True)
class HerdServer:
    """Answers chat requests on the running virtual loop and records every arrival."""

    params: ServerParams
    arrivals: list[float] = field(default_factory=list)
    served: list[float] = field(default_factory=list)
    _gate: Gate | None = None

    def start(self) -> None:
        """Take the upstream down now and schedule its recovery (call inside the loop)."""
        loop = asyncio.get_running_loop()
        config = AdmissionConfig(
            max_concurrency=self.params.slots,
            max_queue=self.params.queue,
            initial_service_time=self.params.service,
            upstream_retry_after=self.params.upstream_retry_after,
        )
        gate = self._gate = Gate(Admission(config, clock=VirtualClock(loop)))
        gate.set_upstream(ready=False)
        loop.call_later(self.params.recover_at, functools.partial(gate.set_upstream, ready=True))

    async def handle(self) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """One request: ``(status, headers, body)``."""
        gate = self._gate
        if gate is None:
            raise RuntimeError("HerdServer.start() must run first")
        loop = asyncio.get_running_loop()
        self.arrivals.append(loop.time())
        decision = gate.offer("anonymous", 1)
        if isinstance(decision, Refuse):
            return self._refusal(decision)
        if isinstance(decision, Enqueued):
            refused = await gate.wait(decision.ticket)
            if refused is not None:
                return self._refusal(refused)
        try:
            await asyncio.sleep(self.params.service)  # the GPU at work
        finally:
            gate.release(decision.ticket)
        self.served.append(loop.time())
        capacity = capacity_header(gate.admission.key_capacity)
        return 200, [(b"content-type", b"application/json"), capacity], completion_body()

    def _refusal(self, refuse: Refuse) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        headers = refusal_headers(refuse)
        if not self.params.cooperative:  # says neither when, nor how much is left
            headers = [(k, v) for k, v in headers if not k.startswith(_TIMING)]
        headers.append((b"content-type", b"application/json"))
        kind = "rate_limit_error" if refuse.status == 429 else "service_unavailable"
        return refuse.status, headers, error_body(refuse.message, code=refuse.code, type=kind)

    def transport(self, module: Any = httpx) -> Any:
        """A ``MockTransport`` of ``module`` (httpx, or the openai client's httpx fork)."""

        async def handler(request: Any) -> Any:
            status, headers, body = await self.handle()
            return module.Response(status, headers=headers, content=body)

        make: Callable[..., Any] = module.MockTransport
        return make(handler)


def completion_body() -> bytes:
    """A minimal OpenAI chat completion."""
    answer = chat_completion(
        id_="chatcmpl-herd", model="herd", content="ok", prompt_tokens=8, completion_tokens=1
    )
    return json.dumps(answer).encode()
