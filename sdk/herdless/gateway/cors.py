"""Web pages of the origins ``--allowed-origins`` names may call ``/v1/`` (CORS).

A web app may call the GPU straight from the browser (openai-node with
``dangerouslyAllowBrowser``, the Vercel AI SDK in a page, a chat UI that keeps its key in
the browser). The browser asks first, with an ``OPTIONS`` preflight; the gateway answers
it itself, before admission, as it costs the GPU nothing. Its answers, its own refusals
included, then say which headers the page may read: a refused call's ``Retry-After`` is
what spreads a crowd of browsers out, and a header the page may not read is one its client
cannot obey (vLLM exposes none).

As vLLM 0.32 (``--allowed-origins``, ``[]`` by default), no origin is allowed until the
operator names one. Only ``/v1/``: health, metrics and admin are the operator's, never a
page's. A request without an ``Origin`` header (every client but a browser) passes
untouched. The headers are Starlette's :class:`~starlette.middleware.cors.CORSMiddleware`'s,
as vLLM's are; no credentials (cookies): a page sends its key in ``Authorization``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the settings read parse_origins where the server extra is not installed
    from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["EXPOSED", "CrossOrigin", "from_page", "parse_origins"]

EXPOSED = (
    "retry-after",
    "retry-after-ms",
    "x-should-retry",
    "x-request-id",
    "x-herdless-backend",
    "x-herdless-fallback-reason",
    "x-herdless-queue-ms",
    "x-herdless-capacity",
    "x-herdless-drain",
    "x-llm-d-request-dropped-reason",
)
"""The gateway's response headers a page may read (CORS lets it read only a few others)."""

_ORIGIN = re.compile(r"https?://(\[[0-9a-f:.]+\]|[a-z0-9.-]+)(:\d{1,5})?")


def parse_origins(text: str) -> tuple[str, ...]:
    """The origins in ``text``: comma-separated, or a JSON list as vLLM's flag takes;
    ``*`` is any origin, and an empty text none. A trailing ``/`` is dropped.

    Raises:
        ValueError: an entry is not ``scheme://host[:port]`` (a browser's ``Origin``).
    """
    text = text.strip()
    try:
        items = json.loads(text) if text.startswith("[") else text.split(",")
    except ValueError:
        items = None
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        raise ValueError("must be origins, comma-separated, or a JSON list of strings")
    origins = []
    for item in (item.strip().lower().removesuffix("/") for item in items):
        if item and item != "*" and _ORIGIN.fullmatch(item) is None:
            raise ValueError(
                f"{item!r} is not an origin: scheme://host[:port] with no path "
                "(https://chat.example.com), or '*' for any"
            )
        if item:
            origins.append(item)
    return tuple(origins)


def from_page(scope: Scope) -> bool:
    """Whether an HTTP request comes from a web page: it carries an ``Origin`` header
    (a browser sends one with every cross-origin request; other clients send none)."""
    return any(name == b"origin" for name, _ in scope["headers"])


class CrossOrigin:
    """ASGI middleware: a browser's request under ``/v1/`` goes through Starlette's
    ``CORSMiddleware`` for the origins ``origins()`` gives (the settings in force, so that a
    reload changes them; none: every page's preflight is refused, a 400 ``Disallowed CORS
    origin`` as vLLM's); any other request goes straight to ``app``."""

    def __init__(self, app: ASGIApp, origins: Callable[[], str]) -> None:
        self._app = app
        self._origins = origins
        self._text: str | None = None
        self._cors: ASGIApp = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/") and from_page(scope):
            await self._for(self._origins())(scope, receive, send)
        else:
            await self._app(scope, receive, send)

    def _for(self, text: str) -> ASGIApp:
        """The CORS middleware for ``text`` (validated by the settings), built once."""
        if text != self._text:
            from starlette.middleware.cors import CORSMiddleware

            self._cors = CORSMiddleware(
                self._app,
                allow_origins=parse_origins(text),
                allow_methods=("GET", "POST"),
                allow_headers=("*",),  # what the page asks for: openai-node's x-stainless-*
                expose_headers=EXPOSED,
            )
            self._text = text
        return self._cors
