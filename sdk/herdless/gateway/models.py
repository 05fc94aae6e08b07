"""``GET /v1/models``: vLLM's model list, one upstream fetch for many callers, kept briefly.

The route needs no admission slot, so without care a crowd of callers listing
models would take the upstream connections that admitted chats need. Here at
most one fetch is under way at a time (every caller that arrives meanwhile
waits for the same answer), and a 200 answer is reused for ``ttl`` seconds: a
thousand callers cost vLLM one request per ``ttl``. The list changes only when
vLLM restarts with another model, which the next fetch after ``ttl`` sees.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import httpx

from herdless._clock import Clock
from herdless.gateway.upstream import HEALTH_TIMEOUT, Upstream, UpstreamUnavailable

__all__ = ["ModelList", "ModelsAnswer"]


@dataclass(frozen=True, slots=True)
class ModelsAnswer:
    """vLLM's answer to ``GET /v1/models``, as the gateway relays it."""

    status: int
    body: bytes
    content_type: str


class ModelList:
    """The model list: single-flight upstream fetches, 200 answers cached ``ttl`` seconds.

    Args:
        upstream: the pooled client to vLLM.
        ttl: seconds a 200 answer is reused; 0 caches nothing (fetches are still shared).
        clock: the monotonic clock that ages the cached answer.
        timeout: seconds a fetch may take (a hung vLLM must not hold callers for the
            chat read timeout).
    """

    __slots__ = ("_answer", "_clock", "_expires", "_fetch", "_timeout", "_ttl", "_upstream")

    def __init__(
        self, upstream: Upstream, *, ttl: float, clock: Clock, timeout: float = HEALTH_TIMEOUT
    ) -> None:
        if ttl < 0:
            raise ValueError(f"ttl must be >= 0, got {ttl!r}")
        self._upstream = upstream
        self._ttl = ttl
        self._clock = clock
        self._timeout = timeout
        self._answer: ModelsAnswer | None = None
        self._expires = 0.0
        self._fetch: asyncio.Future[ModelsAnswer] | None = None

    async def get(self, request_id: str) -> ModelsAnswer:
        """The current answer: cached, the fetch under way, or a new fetch.

        ``request_id`` is forwarded with a new fetch (the first caller's id).

        Raises:
            UpstreamUnavailable: the fetch got no answer from vLLM.
        """
        if self._answer is not None and self._clock.monotonic() < self._expires:
            return self._answer
        if self._fetch is None:
            self._fetch = asyncio.ensure_future(self._load(request_id))
            self._fetch.add_done_callback(self._fetched)
        # A caller that goes away must not cancel the fetch the others wait for.
        return await asyncio.shield(self._fetch)

    async def _load(self, request_id: str) -> ModelsAnswer:
        response = await self._upstream.open(
            "GET", "/v1/models", headers={"x-request-id": request_id}, request_timeout=self._timeout
        )
        try:
            content = await response.aread()
        except httpx.TransportError as exc:
            raise UpstreamUnavailable.transport(
                "the model server's answer was cut", exc, down=False
            ) from exc
        finally:
            await response.aclose()
        media = response.headers.get("content-type", "application/json")
        answer = ModelsAnswer(response.status_code, content, media)
        if answer.status == 200 and self._ttl > 0:
            self._answer, self._expires = answer, self._clock.monotonic() + self._ttl
        return answer

    def _fetched(self, fetch: asyncio.Future[ModelsAnswer]) -> None:
        self._fetch = None
        if not fetch.cancelled():
            fetch.exception()  # retrieved here: every caller may have left before it ended
