"""``GatewayApp``: a POST to an admitted route from a client that is not a web page goes
straight to its proxy; every other request takes Starlette's way (its middleware, CORS,
the 405s and 404s, the lifespan). The gateway's answers are the same either way."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send
from tests.gateway.fakes import GatewayFactory, chat_body

from herdless.gateway.asgi import GatewayApp

pytestmark = [pytest.mark.server]

CHAT = "/v1/chat/completions"


class Stack:
    """A middleware that notes every request that goes through Starlette's stack."""

    def __init__(self, app: ASGIApp, seen: list[str]) -> None:
        self._app = app
        self._seen = seen

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self._seen.append(f"{scope['method']} {scope['path']}")
        await self._app(scope, receive, send)


class Proxy:
    """An admitted route's app: answers 200 and notes the app its scope names."""

    def __init__(self) -> None:
        self.apps: list[object] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.apps.append(scope["app"])
        await JSONResponse({"object": "chat.completion"})(scope, receive, send)


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


def build() -> tuple[GatewayApp, Proxy, list[str], list[str]]:
    """The app, its one admitted route's proxy, what went through the stack, the lifespan."""
    proxy, seen, lived = Proxy(), list[str](), list[str]()

    @asynccontextmanager
    async def lifespan(app: object) -> AsyncIterator[None]:
        lived.append("startup")
        yield
        lived.append("shutdown")

    app = GatewayApp(
        routes=[
            Route(CHAT, proxy, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
        ],
        direct={CHAT: proxy},
        lifespan=lifespan,
    )
    app.router.redirect_slashes = False  # as the gateway's
    app.add_middleware(Stack, seen=seen)
    return app, proxy, seen, lived


async def test_a_post_from_no_web_page_skips_the_stack_and_its_scope_names_the_app() -> None:
    app, proxy, seen, _ = build()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://g") as c:
        response = await c.post(CHAT, json=chat_body())
    assert response.status_code == 200
    assert response.json() == {"object": "chat.completion"}
    assert seen == []
    assert proxy.apps == [app]


@pytest.mark.parametrize(
    ("method", "path", "headers", "status", "served"),
    [
        ("POST", CHAT, {"origin": "https://chat.example.com"}, 200, True),  # CORS sees it
        ("GET", CHAT, {}, 405, False),
        ("POST", CHAT + "/", {}, 404, False),
        ("POST", "/v1/chat/completion", {}, 404, False),
        ("POST", "/healthz", {}, 405, False),
        ("GET", "/healthz", {}, 200, False),
    ],
)
async def test_everything_else_takes_starlettes_way(
    method: str, path: str, headers: dict[str, str], status: int, served: bool
) -> None:
    app, proxy, seen, _ = build()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://g") as c:
        response = await c.request(method, path, headers=headers, json=chat_body())
    assert response.status_code == status
    assert seen == [f"{method} {path}"]
    assert proxy.apps == ([app] if served else [])


async def test_the_lifespan_takes_starlettes_way() -> None:
    app, _, _, lived = build()
    sent: list[MutableMapping[str, Any]] = []
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for message in ("lifespan.startup", "lifespan.shutdown"):
        inbox.put_nowait({"type": message})

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    await app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, inbox.get, send)
    assert lived == ["startup", "shutdown"]
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]


async def test_the_gateway_answers_alike_on_either_way(gateway: GatewayFactory) -> None:
    """A refusal and an answer, from a server-side client (the short way) and from a page
    (Starlette's, through CORS): the same status, body and headers but CORS's own."""
    page = {"origin": "https://chat.example.com"}
    async with gateway(allowed_origins="*", rate=1e-6, burst=2) as (client, runtime):
        answers = [
            await client.post(CHAT, json=chat_body(), headers=headers)
            for headers in ({}, page, {}, page)
        ]
    assert [r.status_code for r in answers] == [200, 200, 429, 429]
    for direct, paged in (answers[:2], answers[2:]):
        assert "access-control-allow-origin" not in direct.headers
        assert paged.headers["access-control-allow-origin"] == "*"
        cors = {n for n in paged.headers if n.startswith("access-control-") or n == "vary"}
        assert set(direct.headers) == set(paged.headers) - cors
        assert direct.headers.get("content-type") == paged.headers.get("content-type")
        if direct.status_code == 200:
            assert direct.json()["choices"] == paged.json()["choices"]
        else:
            assert direct.json()["error"]["code"] == paged.json()["error"]["code"] == "rate_limited"
    assert runtime.metrics.requests == {200: 2, 429: 2}
