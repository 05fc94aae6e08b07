"""A bare relay to the engine: the baseline of what the gateway's own rules cost.

``python -m herdless.bench.relay --upstream URL [--host H] [--port P]`` serves
``POST /v1/chat/completions`` as the shortest relay the gateway's own stack
allows: Starlette, uvicorn with httptools (the HTTP implementation ``herdless
serve`` runs), and one pooled ``httpx.AsyncClient`` whose response bytes are
streamed back as they come. No admission, no queue, no keys, no logs, no
metrics: :mod:`herdless.bench.gateway_overhead` runs it beside the gateway, and
what the gateway's CPU per request is above this one's is what herdless adds
over the stack it is built on. ``GET /healthz`` answers 200 (readiness).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
from collections.abc import AsyncIterator, Sequence

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from herdless.gateway.settings import GatewaySettings
from herdless.gateway.upstream import KEEPALIVE_EXPIRY

__all__ = ["build_app", "main"]

# `herdless serve`'s default --keep-alive-timeout, as the gateway under test runs.
_KEEP_ALIVE: float = GatewaySettings.model_fields["keep_alive_timeout"].default


def build_app(upstream: str) -> Starlette:
    """The relay to ``upstream`` (``http://host:port``): requests' bodies sent on as
    they are, answers streamed back byte for byte with their status and content type."""
    limits = httpx.Limits(
        max_connections=None, max_keepalive_connections=None, keepalive_expiry=KEEPALIVE_EXPIRY
    )
    client = httpx.AsyncClient(base_url=upstream, timeout=600.0, limits=limits)

    async def chat(request: Request) -> Response:
        sent = client.build_request(
            "POST",
            "/v1/chat/completions",
            content=await request.body(),
            headers={"content-type": "application/json", "accept-encoding": "identity"},
        )
        answer = await client.send(sent, stream=True)

        async def body() -> AsyncIterator[bytes]:
            try:
                async for chunk in answer.aiter_raw():
                    yield chunk
            finally:
                await answer.aclose()

        media = answer.headers.get("content-type")
        return StreamingResponse(body(), status_code=answer.status_code, media_type=media)

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with client:
            yield

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m herdless.bench.relay --upstream URL [--host H] [--port P]``."""
    parser = argparse.ArgumentParser(prog="python -m herdless.bench.relay")
    parser.add_argument("--upstream", required=True, help="the engine's root URL")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    args = parser.parse_args(argv)
    app = build_app(args.upstream)
    # As herdless serve runs: httptools, no WebSocket, no access log, the same keep-alive.
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        http="httptools",
        ws="none",
        timeout_keep_alive=math.ceil(_KEEP_ALIVE),
        log_level="warning",
        access_log=False,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
