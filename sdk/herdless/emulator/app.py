"""The emulated vLLM server's Starlette app: routes only.

Routes as vLLM serves them: ``POST /v1/chat/completions``, ``POST /v1/completions``,
``POST /v1/embeddings`` (emulated vectors), Anthropic's ``POST /v1/messages`` and
``POST /v1/messages/count_tokens``, OpenAI's ``POST /v1/responses`` (and
``GET /v1/responses/{id}``, always a 404: vLLM stores none by default),
``POST /tokenize``, ``GET /v1/models``,
``GET /health`` (200, empty), ``GET /ping``, ``GET /version``, ``GET /metrics``
(which the ``metrics_error_for`` and ``metrics_stall_for`` faults fail or stall); vLLM's
sleep mode ``POST /sleep``, ``POST /wake_up``, ``GET /is_sleeping`` (see
:mod:`herdless.emulator.sleep`; ``GET /_emulator/sleep`` counts what reached it asleep);
and the fault controls ``GET|POST|DELETE /_emulator/faults``, which no fault
affects (``refuse_for`` and ``maintenance_for`` close the serving port: use the
control port, ``--control-port``, to reach them meanwhile). Web pages of the origins
``--allowed-origins`` names may call it (CORS), as vLLM's flag of that name says.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable

from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from herdless.emulator import wire
from herdless.emulator.completions import (
    chat_completions,
    completions,
    count_tokens,
    messages,
    responses,
    tokenize,
    unknown_response,
)
from herdless.emulator.embeddings import embeddings
from herdless.emulator.faults import parse_faults
from herdless.emulator.metrics import render
from herdless.emulator.responses import json_response, until_disconnect
from herdless.emulator.settings import EmulatorSettings
from herdless.emulator.sleep import GENERATION_PATHS
from herdless.emulator.state import Control, EmulatorState, exit_now

__all__ = ["create_app"]

log = logging.getLogger("herdless.emulator")


class _FaultGate:
    """Pure ASGI: a hung or not-serving server, for every route but ``/_emulator/``.

    On the control port (``state.control_port``) only ``/_emulator/`` is served.
    """

    def __init__(self, app: ASGIApp, state: EmulatorState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith("/_emulator/"):
            await self.app(scope, receive, send)
        elif self._on_control_port(scope):
            body = wire.error_body("The control port serves /_emulator/ only.", "NotFound", 404)
            await json_response(body, 404)(scope, receive, send)
        elif self.state.faults.hang:
            await until_disconnect(receive)  # accept, never answer
        elif not self.state.serving:
            body = wire.error_body("The model is being loaded.", "Service Unavailable", 503)
            await json_response(body, 503)(scope, receive, send)
        else:
            if scope["path"] in GENERATION_PATHS:
                await self.state.sleep.hold()  # a sleeping vLLM hangs the request
            await self.app(scope, receive, send)

    def _on_control_port(self, scope: Scope) -> bool:
        server = scope.get("server")
        port = self.state.control_port
        return port is not None and server is not None and server[1] == port


async def _models(request: Request) -> Response:
    settings = _state(request).settings
    return json_response(wire.models_list(settings.model, settings.max_model_len, int(time.time())))


async def _health(request: Request) -> Response:
    return Response(status_code=200)


async def _version(request: Request) -> Response:
    return json_response(wire.dumps({"version": wire.VLLM_VERSION}))


async def _metrics(request: Request) -> Response:
    state = _state(request)
    if state.metrics_outage == "error":  # the /metrics fault: as a handler that raised
        return PlainTextResponse("Internal Server Error", status_code=500)
    await state.metrics_back()  # the stall fault: held until it ends (at once if off)
    settings = state.settings
    text = render(state.engine, settings.model, max_model_len=settings.max_model_len)
    text += state.sleep.metrics(settings.model)
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


async def _get_faults(request: Request) -> Response:
    return json_response(wire.dumps(_state(request).faults.as_json()))


async def _post_faults(request: Request) -> Response:
    state = _state(request)
    try:
        faults, actions = parse_faults(await request.json())
    except ValueError as exc:  # json.JSONDecodeError is a ValueError too
        return json_response(wire.error_body(str(exc), "BadRequestError", 400), 400)
    # Actions run after the answer is sent: maintenance drops connections, this one too.
    return Response(
        wire.dumps(faults.as_json()),
        media_type="application/json",
        background=BackgroundTask(state.apply_later, faults, actions),
    )


async def _delete_faults(request: Request) -> Response:
    state = _state(request)
    state.clear()
    return json_response(wire.dumps(state.faults.as_json()))


def _state(request: Request) -> EmulatorState:
    state: EmulatorState = request.app.state.emulator
    return state


def create_app(
    settings: EmulatorSettings | None = None,
    *,
    control: Control | None = None,
    crash: Callable[[], None] = exit_now,
) -> Starlette:
    """Build the emulator's ASGI app.

    Args:
        settings: the server's settings (default: from the environment).
        control: the listening socket's control (``server.py``); in-process, a recorder.
        crash: ends the process (the ``crash`` fault, ``--crash-after``, a KV crash).

    Returns:
        The app; its ``state.emulator`` is the :class:`EmulatorState`.
    """
    settings = settings or EmulatorSettings()
    state = EmulatorState(settings, control=control, crash=crash)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        timer = None
        if settings.crash_after is not None:
            timer = asyncio.get_running_loop().call_later(settings.crash_after, crash)
        if (outage := settings.metrics_outage()) is not None:
            state.begin_metrics_outage(outage)
        try:
            yield
        finally:
            if timer is not None:
                timer.cancel()
            state.end_metrics_outage()
            state.driver.close()

    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        Route("/v1/messages", messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
        Route("/v1/responses", responses, methods=["POST"]),
        Route("/v1/responses/{response_id}", unknown_response),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/v1/models", _models),
        Route("/health", _health),
        Route("/ping", _health, methods=["GET", "POST"]),
        Route("/version", _version),
        Route("/metrics", _metrics),
        Route("/sleep", state.sleep.sleep, methods=["POST"]),
        Route("/wake_up", state.sleep.wake_up, methods=["POST"]),
        Route("/is_sleeping", state.sleep.is_sleeping),
        Route("/_emulator/sleep", state.sleep.report),
        Route("/_emulator/faults", _get_faults, methods=["GET"]),
        Route("/_emulator/faults", _post_faults, methods=["POST"]),
        Route("/_emulator/faults", _delete_faults, methods=["DELETE"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.emulator = state
    app.add_middleware(_FaultGate, state=state)
    # as vLLM 0.32 (entrypoints/serve/middleware/register.py): every method and header, and
    # the origins of --allowed-origins (none by default: a page's preflight is a 400)
    app.add_middleware(
        CORSMiddleware, allow_origins=settings.origins(), allow_methods=["*"], allow_headers=["*"]
    )
    return app
