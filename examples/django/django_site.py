"""A one-file Django project: async views under ASGI, a sync view under WSGI.

Run it (configuration from HERDLESS_*)::

    uvicorn --app-dir examples/django django_site:asgi_application --port 5000   # async
    gunicorn --chdir examples/django django_site:wsgi_application -b :5001         # sync

Where the clients live: one per process, module-level, created on first use.
Django has no startup/shutdown hook for ASGI apps (no lifespan), and the async
client must be created inside the server's event loop, hence "on first use".
"""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator
from typing import Any

import django
from django.conf import settings

if not settings.configured:
    settings.configure(
        ROOT_URLCONF=__name__,
        ALLOWED_HOSTS=["localhost", "127.0.0.1", "testserver"],
        SECRET_KEY="example-only-not-secret",
        MIDDLEWARE=[],  # no sessions, no CSRF: a JSON API called by other services
        INSTALLED_APPS=[],
    )
    django.setup()

# Imported after settings.configure(): these read the settings when imported.
from django.core.asgi import get_asgi_application
from django.core.wsgi import get_wsgi_application
from django.http import HttpRequest, JsonResponse, StreamingHttpResponse
from django.urls import path

import herdless

_lock = threading.Lock()
_options: dict[str, Any] = {}
_sync: herdless.Client | None = None
_async: herdless.AsyncClient | None = None


def configure(*, asleep: Any = None, **client_options: Any) -> None:
    """Options for both clients (tests pass a fake clock); ``asleep`` is the async
    client's ``sleep``. Call before first use."""
    _options.clear()
    _options.update(client_options)
    _options["asleep"] = asleep


def sync_llm() -> herdless.Client:
    """The process's sync client (thread-safe; WSGI serves requests on threads)."""
    global _sync
    with _lock:
        if _sync is None:
            options = {k: v for k, v in _options.items() if k != "asleep"}
            _sync = herdless.Client(**options)
        return _sync


def async_llm() -> herdless.AsyncClient:
    """The process's async client, created in the ASGI server's event loop."""
    global _async
    if _async is None:  # no await between test and set: no other task can interleave
        options = {k: v for k, v in _options.items() if k not in ("sleep", "asleep")}
        if _options.get("asleep") is not None:
            options["sleep"] = _options["asleep"]
        _async = herdless.AsyncClient(**options)
    return _async


def close() -> list[Any]:
    """Close the sync client; return the async client's ``aclose()`` to await, if any."""
    global _sync, _async
    pending = [_async.aclose()] if _async is not None else []
    if _sync is not None:
        _sync.close()
    _sync = _async = None
    return pending


def _answer(result: herdless.ChatResult) -> JsonResponse:
    response = JsonResponse({"answer": result.content})
    response["x-herdless-backend"] = result.backend
    response["x-herdless-attempts"] = str(len(result.attempts))
    if result.fallback_reason:
        response["x-herdless-fallback-reason"] = result.fallback_reason
    return response


def _unavailable(exc: herdless.HerdlessError) -> JsonResponse:
    return JsonResponse({"error": type(exc).__name__, "message": exc.message}, status=503)


def _messages(request: HttpRequest) -> list[dict[str, str]]:
    return [{"role": "user", "content": json.loads(request.body)["message"]}]


def chat_sync(request: HttpRequest) -> JsonResponse:
    try:
        return _answer(sync_llm().chat(_messages(request)))
    except herdless.HerdlessError as exc:
        return _unavailable(exc)


async def chat_async(request: HttpRequest) -> JsonResponse:
    try:
        return _answer(await async_llm().chat(_messages(request)))
    except herdless.HerdlessError as exc:
        return _unavailable(exc)


async def chat_stream(request: HttpRequest) -> StreamingHttpResponse | JsonResponse:
    try:
        stream = await async_llm().chat(_messages(request), stream=True)
    except herdless.HerdlessError as exc:
        return _unavailable(exc)

    async def events() -> AsyncIterator[bytes]:
        async with stream:
            async for chunk in stream:
                if chunk.content:
                    yield f"data: {json.dumps({'delta': chunk.content})}\n\n".encode()
        yield b"data: [DONE]\n\n"

    response = StreamingHttpResponse(events(), content_type="text/event-stream")
    response["x-herdless-backend"] = stream.backend
    return response


urlpatterns = [
    path("sync/chat", chat_sync),
    path("async/chat", chat_async),
    path("async/chat/stream", chat_stream),
]

asgi_application = get_asgi_application()
wsgi_application = get_wsgi_application()
