"""Run the emulator under uvicorn, with a listening socket the faults can close and reopen.

**Loading.** vLLM does not accept connections until its model is loaded, so
the emulator sleeps ``startup_delay`` seconds *before binding its port*: during
that time a client gets "connection refused", exactly as with a loading vLLM,
and readiness is "``GET /health`` answers 200".

**The control port.** ``refuse_for`` and ``maintenance_for`` close the serving
port, so ``DELETE /_emulator/faults`` cannot reach it while they last. With
``control_port``, a second listening socket of the same server serves
``/_emulator/`` only (anything else is a 404); no fault closes it nor drops its
connections.

The socket is bound here (not by uvicorn) so that ``refuse_for`` can close it
and bind the same port again later; the protocol factory is the one uvicorn
builds in ``Server.startup`` (``config.http_protocol_class`` with the server's
state), the documented way a server's sockets are handed to uvicorn.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

import uvicorn

from herdless.emulator.app import create_app
from herdless.emulator.settings import EmulatorSettings

__all__ = ["Listener", "serve"]

log = logging.getLogger("herdless.emulator")


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class Listener:
    """The ``Control`` of a real server: closes, reopens and drops connections.

    Only the serving port (``port``) is affected; a control port never is.
    """

    def __init__(self, host: str, port: int) -> None:
        self.server: uvicorn.Server  # set once the server exists (it needs the app, which needs us)
        self.host = host
        self.port = port
        self._reopen: asyncio.TimerHandle | None = None

    def _serving(self, srv: asyncio.Server) -> bool:
        return any(sock.getsockname()[1] == self.port for sock in srv.sockets)

    def refuse_for(self, seconds: float) -> None:
        for srv in self.server.servers:
            if self._serving(srv):
                srv.close()
        self.server.servers = [srv for srv in self.server.servers if srv.is_serving()]
        if self._reopen is not None:
            self._reopen.cancel()
        self._reopen = asyncio.get_running_loop().call_later(seconds, self.reopen)

    def reopen(self) -> None:
        if self._reopen is not None:
            self._reopen.cancel()
            self._reopen = None
        if not any(self._serving(srv) for srv in self.server.servers):
            asyncio.get_running_loop().create_task(self._listen())

    def drop_connections(self) -> None:
        for conn in list(self.server.server_state.connections):
            transport: Any = getattr(conn, "transport", None)
            if transport is None:
                continue
            local = transport.get_extra_info("sockname")
            if local is None or local[1] == self.port:
                transport.close()

    async def _listen(self) -> None:
        config, server = self.server.config, self.server

        def protocol() -> asyncio.Protocol:
            return config.http_protocol_class(  # type: ignore[call-arg]  # uvicorn's own call
                config=config, server_state=server.server_state, app_state=server.lifespan.state
            )

        try:
            sock = _bind(self.host, self.port)
        except OSError as exc:  # someone took the port meanwhile: say so, keep refusing
            log.error("cannot listen again on port %d: %s", self.port, exc)
            return
        srv = await asyncio.get_running_loop().create_server(
            protocol, sock=sock, backlog=config.backlog
        )
        server.servers.append(srv)
        log.warning("listening again on port %d", self.port)


async def serve(settings: EmulatorSettings) -> None:
    """Load (sleep ``startup_delay``), bind, serve until SIGINT/SIGTERM."""
    log.info(
        "loading model %s for %.3f s (port not bound yet)", settings.model, settings.startup_delay
    )
    await asyncio.sleep(settings.startup_delay)
    sock = _bind(settings.host, settings.port)
    sockets = [sock]
    listener = Listener(settings.host, sock.getsockname()[1])
    app = create_app(settings, control=listener)
    if settings.control_port is not None:
        control = _bind(settings.host, settings.control_port)
        sockets.append(control)
        app.state.emulator.control_port = control.getsockname()[1]
        log.info("fault controls also on http://%s:%d", settings.host, control.getsockname()[1])
    config = uvicorn.Config(
        app,
        log_level=settings.log_level,
        access_log=settings.access_log,
        timeout_graceful_shutdown=1,
        lifespan="on",
    )
    listener.server = server = uvicorn.Server(config)
    log.info(
        "herdless emulator serving %s on http://%s:%d", settings.model, settings.host, listener.port
    )
    await server.serve(sockets=sockets)
