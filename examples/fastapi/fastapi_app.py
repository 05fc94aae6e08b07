"""A FastAPI app on one shared herdless.AsyncClient: chat, SSE streaming, stats.

Run it (configuration from HERDLESS_*, see README.md)::

    uvicorn --app-dir examples/fastapi fastapi_app:app --port 5000

Every answer says who served it and why, in headers: ``x-herdless-backend``,
``x-herdless-attempts``, ``x-herdless-fallback-reason``, ``x-request-id``.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel

import herdless


class ChatIn(BaseModel):
    message: str
    private: bool = False
    """Personal data: never sent to an external (hosted) fallback."""


def _headers(answer: herdless.ChatResult | Any) -> dict[str, str]:
    """Who answered, in how many attempts, and why it was not the primary."""
    headers = {
        "x-herdless-backend": answer.backend,
        "x-herdless-attempts": str(len(answer.attempts)),
        "x-request-id": answer.request_id,
    }
    if answer.fallback_reason:
        headers["x-herdless-fallback-reason"] = answer.fallback_reason
    return headers


def create_app(**client_options: Any) -> FastAPI:
    """The app. ``client_options`` go to ``herdless.AsyncClient`` (tests inject a fake
    clock there); without them the client reads ``HERDLESS_*``."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # One client per process, created once: every request shares its breaker,
        # backpressure window and retry budget. A client per request would forget,
        # at every request, that the GPU just said "come back in 3 s".
        async with herdless.AsyncClient(**client_options) as client:
            app.state.llm = client
            yield

    app = FastAPI(title="herdless FastAPI example", lifespan=lifespan)

    @app.exception_handler(herdless.HerdlessError)
    async def llm_unavailable(request: Request, exc: herdless.HerdlessError) -> JSONResponse:
        # The client already retried and fell back as far as its deadline allowed:
        # tell our own caller the truth, with a hint of when to come back.
        status = 400 if isinstance(exc, herdless.BadRequestError) else 503
        headers = {"retry-after": str(math.ceil(exc.retry_after))} if exc.retry_after else {}
        if exc.request_id:
            headers["x-request-id"] = exc.request_id
        body = {"error": type(exc).__name__, "message": exc.message}
        return JSONResponse(body, status_code=status, headers=headers)

    @app.post("/chat")
    async def chat(body: ChatIn, request: Request) -> JSONResponse:
        llm: herdless.AsyncClient = request.app.state.llm
        result = await llm.chat(
            [{"role": "user", "content": body.message}], allow_fallback=not body.private
        )
        return JSONResponse({"answer": result.content}, headers=_headers(result))

    @app.post("/chat/stream")
    async def chat_stream(body: ChatIn, request: Request) -> StreamingResponse:
        llm: herdless.AsyncClient = request.app.state.llm
        # Returns once the first chunk arrived, so a failure before any text is still an
        # HTTP error (handled above), and the headers can say who is answering.
        stream = await llm.chat(
            [{"role": "user", "content": body.message}],
            stream=True,
            allow_fallback=not body.private,
        )

        async def events() -> AsyncIterator[str]:
            try:
                async with stream:
                    async for chunk in stream:
                        if chunk.content:
                            yield f"data: {json.dumps({'delta': chunk.content})}\n\n"
            except herdless.StreamInterrupted as exc:
                # Part of the answer already reached the browser: say it is incomplete.
                error = {"error": "stream_interrupted", "delivered": exc.delivered_chars}
                yield f"event: error\ndata: {json.dumps(error)}\n\n"
                return
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream", headers=_headers(stream))

    @app.get("/stats")
    async def stats(request: Request) -> dict[str, Any]:
        return request.app.state.llm.stats().as_dict()

    return app


app = create_app()
