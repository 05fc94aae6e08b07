"""The upstream side: a streaming httpx proxy to vLLM's OpenAI-compatible server.

Transport failures are mapped here, at the boundary, to :class:`UpstreamUnavailable`
(``raise ... from``); HTTP errors from vLLM are not failures: their status and
JSON are passed through unchanged. The response body is read raw
(``aiter_raw``), so the client gets the SSE bytes exactly as vLLM wrote them, but for
the usage event the gateway asked for itself (:class:`~.usage.UsageSniffer`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
from pydantic import SecretStr

__all__ = [
    "HEALTH_TIMEOUT",
    "KEEPALIVE_EXPIRY",
    "SLOW",
    "Upstream",
    "UpstreamUnavailable",
]

KEEPALIVE_EXPIRY = 4.0
"""Seconds an idle pooled connection to vLLM is kept: below vLLM's own idle timeout.

vLLM (uvicorn) closes a connection idle for 5 s (``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``),
httpx keeps one for 5 s by default: a request sent on a connection the server is
closing at that moment fails (a spurious 503). Dropping it a second earlier avoids
the race.
"""
HEALTH_TIMEOUT = 5.0
"""Seconds a ``/health`` poll may take (a hung vLLM must not stall the poller)."""
SLOW = "slow"
"""What :meth:`Upstream.health` returns when the poll timed out."""

# Request headers worth passing on; everything else (Authorization above all) stays here.
_FORWARD = ("content-type", "accept", "accept-encoding", "x-request-id", "x-herdless-attempt")


class UpstreamUnavailable(Exception):
    """The upstream could not be reached or gave no response (connect error, timeout).

    Attributes:
        code: the refusal code, ``upstream_unavailable``.
        down: the connection was refused: nothing listens (vLLM loading or gone),
            so later requests are refused at once until a health poll succeeds.
    """

    def __init__(self, message: str, *, code: str, down: bool) -> None:
        super().__init__(message)
        self.code = code
        self.down = down

    @classmethod
    def transport(cls, what: str, exc: httpx.TransportError, *, down: bool) -> UpstreamUnavailable:
        """``upstream_unavailable``: ``what`` went wrong, ``exc``'s class named after it."""
        return cls(f"{what} ({type(exc).__name__})", code="upstream_unavailable", down=down)


class Upstream:
    """One pooled ``httpx.AsyncClient`` to vLLM.

    Args:
        base_url: the upstream root, e.g. ``http://127.0.0.1:8000``.
        api_key: sent as the upstream's bearer key (clients' keys never are).
        max_connections: pool size (``None``: unbounded, the admission bounds it); the
            admission cap plus a few for health checks and metrics.
        connect_timeout: seconds to connect (a loading vLLM refuses at once).
        read_timeout: seconds between two bytes of the response.
        transport: an httpx transport, for tests (``httpx.ASGITransport``).
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: SecretStr | None = None,
        max_connections: int | None = 100,
        connect_timeout: float = 2.0,
        read_timeout: float = 600.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._auth = (
            {} if api_key is None else {"authorization": f"Bearer {api_key.get_secret_value()}"}
        )

        def make(most: int | None) -> httpx.AsyncClient:
            return httpx.AsyncClient(
                base_url=base_url,
                timeout=httpx.Timeout(read_timeout, connect=connect_timeout, pool=connect_timeout),
                limits=httpx.Limits(
                    max_connections=most,
                    max_keepalive_connections=most,
                    keepalive_expiry=KEEPALIVE_EXPIRY,
                ),
                transport=transport,
            )

        self._make = make
        self.max_connections = max_connections
        """The pool's size now (``None``: unbounded)."""
        self._client = self._make(max_connections)
        self._retired: list[httpx.AsyncClient] = []

    def resize(self, max_connections: int | None) -> None:
        """A pool of another size for the requests from now on (a reload). The old pool
        keeps the responses it is streaming and is closed with this one."""
        if max_connections == self.max_connections:
            return
        self._retired.append(self._client)
        self._client = self._make(max_connections)
        self.max_connections = max_connections

    async def open(
        self,
        method: str,
        path: str,
        *,
        body: bytes = b"",
        headers: Mapping[str, str],
        request_timeout: float | None = None,
    ) -> httpx.Response:
        """Send a request and return the response with its body not yet read.

        The caller must ``await response.aclose()``; closing early closes the
        upstream connection, which makes vLLM abort the sequence.
        ``request_timeout`` (seconds) replaces the client's timeouts for this request.

        Raises:
            UpstreamUnavailable: the request did not get a response.
        """
        # httpx encodes str header values as ASCII: a non-ASCII value (any byte a client
        # may send) is dropped here rather than crash the request with a 500.
        forwarded = {
            name: headers[name] for name in _FORWARD if name in headers and headers[name].isascii()
        }
        # httpx would ask for gzip by default; ask for what the client asked for.
        forwarded.setdefault("accept-encoding", "identity")
        request = self._client.build_request(
            method,
            path,
            content=body,
            headers={**forwarded, **self._auth},
            timeout=httpx.USE_CLIENT_DEFAULT if request_timeout is None else request_timeout,
        )
        try:
            return await self._client.send(request, stream=True)
        except httpx.ConnectError as exc:
            raise UpstreamUnavailable.transport(
                "cannot connect to the model server", exc, down=True
            ) from exc
        except httpx.TransportError as exc:
            # A timeout or a dropped connection fails this request only: under load it
            # says nothing about the next one, so the upstream is not marked down.
            raise UpstreamUnavailable.transport(
                "the model server gave no response", exc, down=False
            ) from exc

    async def health(self) -> str | None:
        """Poll vLLM's ``/health`` (at most ``HEALTH_TIMEOUT`` seconds).

        Returns:
            ``None`` when ready; ``"upstream_loading"`` for a non-200 answer;
            ``"upstream_unavailable"`` when the connection is refused;
            ``SLOW`` when no answer came in time (a hung vLLM, or a gateway
            too busy to read it: the caller decides after several in a row).
        """
        try:
            response = await self._client.get("/health", timeout=HEALTH_TIMEOUT)
        except httpx.ConnectError:
            return "upstream_unavailable"
        except httpx.TransportError:
            return SLOW
        return None if response.status_code == 200 else "upstream_loading"

    async def metrics(self, *, within: float) -> str | None:
        """The engine's Prometheus text (``GET /metrics``, at most ``within`` seconds).

        Returns:
            The text; ``""`` for a 404 (no metrics there); ``None`` when no answer came
            (refused, cut or late) or another error did.
        """
        try:
            response = await self._client.get("/metrics", timeout=within)
        except httpx.TransportError:
            return None
        if response.status_code == 404:
            return ""
        return response.text if response.status_code == 200 else None

    async def tokenize(self, body: Mapping[str, Any], *, within: float) -> int | None:
        """The tokens the engine counts for ``body``'s prompt (``POST /tokenize``: its
        tokenizer and chat template; at most ``within`` seconds); ``None`` when it did not
        say (no such route, a body it refused, no answer)."""
        try:
            response = await self._client.post(
                "/tokenize", json=body, headers=self._auth, timeout=within
            )
        except httpx.TransportError:
            return None
        if response.status_code != 200:
            return None
        try:
            count = response.json().get("count")
        except (ValueError, AttributeError):
            return None
        return count if isinstance(count, int) and count > 0 else None

    async def command(self, path: str, *, within: float) -> int | None:
        """``POST path`` (``/sleep?level=1``, ``/wake_up``): its status, ``None`` for no answer."""
        try:
            response = await self._client.post(path, headers=self._auth, timeout=within)
        except httpx.TransportError:
            return None
        return response.status_code

    async def aclose(self) -> None:
        """Close the connection pool (and any a resize retired)."""
        for client in (*self._retired, self._client):
            await client.aclose()


async def aiter_body(response: httpx.Response) -> AsyncIterator[bytes]:
    """The response's raw bytes, chunk by chunk, as the upstream wrote them."""
    async for chunk in response.aiter_raw():
        if chunk:
            yield chunk
