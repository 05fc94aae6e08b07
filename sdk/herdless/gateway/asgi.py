"""The gateway's ASGI application: Starlette, with a short way in for the admitted routes.

Every model request (a chat, a completion, an embedding, ...) is a ``POST`` to one of the
admitted routes, and most come from a client that is not a web page (no ``Origin``
header: every SDK, every server-side app). For such a request Starlette's stack decides
nothing: its error middleware, :class:`~herdless.gateway.cors.CrossOrigin` (which passes
it untouched), its exception middleware and the router's match against every route.
Yet it costs CPU on every request: a large part of what refusing a flood costs
(``docs/benchmarks.md``, overhead-gateway). :class:`GatewayApp` hands such a request to
its route's proxy at once; everything else goes through Starlette as before: a page's
request (CORS), another method (the 405), every other path, the lifespan.

The proxy answers every error it knows itself (an OpenAI-style JSON body). An exception
it raises reaches uvicorn, which logs it and answers 500 when nothing was sent yet, as
Starlette's error middleware would have.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.applications import Starlette
from starlette.types import ASGIApp, Receive, Scope, Send

from herdless.gateway.cors import from_page

__all__ = ["GatewayApp"]


class GatewayApp(Starlette):
    """Starlette whose ``POST`` to a path of ``direct`` (path -> the route's ASGI app),
    from a client that sends no ``Origin`` header, goes straight to that app.

    ``direct`` names apps that are also among ``routes``: the short way and Starlette's
    reach the same code, and a request Starlette would treat apart (CORS, a 405) takes
    Starlette's way. Other arguments are Starlette's.
    """

    def __init__(self, *, direct: Mapping[str, ASGIApp], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._direct = dict(direct)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and (app := self._direct.get(scope["path"])) is not None
            and not from_page(scope)
        ):
            scope["app"] = self
            await app(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)
