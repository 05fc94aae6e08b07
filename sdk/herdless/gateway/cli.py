"""``herdless serve``: run the gateway with uvicorn.

Every flag is a field of :class:`~herdless.gateway.settings.GatewaySettings`, so
each is also ``HERDLESS_GATEWAY_<NAME>``; a flag wins over the environment.
Secrets (``API_KEYS``, ``ADMIN_TOKEN``, ``UPSTREAM_API_KEY``, ``FALLBACK_API_KEY``) are
environment only: a command line is visible to every user of the machine (``ps``).

``--config FILE`` reads the settings from a TOML file too (under the flags and the
variables); SIGHUP re-reads it and the key policies without a restart (see
:mod:`herdless.gateway.reload`).

SIGTERM (or Ctrl-C) drains first: waiting requests get 503 ``draining`` at once,
running ones finish (up to ``--shutdown-grace`` seconds), then the process exits.

Every line goes to stderr in one format, ``--log-format text`` or ``json`` (see
:mod:`herdless.gateway.logs`), uvicorn's own lines included.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from types import FrameType

import uvicorn

from herdless._cli_settings import SettingsCommand, exit_status
from herdless.gateway.app import create_app
from herdless.gateway.connections import ConnectionGuard, raise_file_limit
from herdless.gateway.logs import LOG, configure, event
from herdless.gateway.policies import PolicyError
from herdless.gateway.protocol import guarded_protocol
from herdless.gateway.reload import ConfigError, Reloader, SettingsLayers
from herdless.gateway.runtime import Runtime
from herdless.gateway.settings import GatewaySettings

__all__ = ["drain_on_signal", "help_text", "load_layers", "load_settings", "main"]

_COMMAND = SettingsCommand(
    GatewaySettings,
    prog="herdless serve",
    description="Admission gateway in front of vLLM: bounded queue, per-key limits, "
    "token-fair order,\nand refusals with a Retry-After spread over time.",
)


def help_text() -> str:
    """The ``herdless serve --help`` text (also the docs' CLI reference)."""
    return _COMMAND.format_help()


def load_settings(argv: Sequence[str]) -> GatewaySettings:
    """Settings from flags over ``HERDLESS_GATEWAY_*`` over the settings file (``--config``)
    over the defaults.

    Raises:
        SystemExit: ``--help`` (status 0), or a bad flag, variable or file (status 2, the
            error on stderr naming the flag, the variable or the file's line).
    """
    return load_layers(argv)[0]


def load_layers(argv: Sequence[str]) -> tuple[GatewaySettings, SettingsLayers]:
    """The settings and where they came from (for a reload); see :func:`load_settings`.

    Raises:
        SystemExit: as :func:`load_settings`.
    """
    settings, namespace = _COMMAND.parse(argv)
    flags = {k: v for k, v in vars(namespace).items() if k in GatewaySettings.model_fields}
    flags.pop("config", None)
    layers = SettingsLayers(flags=flags, file=settings.config)
    if settings.config is None:
        return settings, layers
    try:
        return layers.read(), layers
    except ConfigError as exc:
        _COMMAND.parser.error(f"--config: {exc}")


def main(argv: Sequence[str]) -> int:
    """Run ``herdless serve``; returns the exit status (2 for bad settings)."""
    try:
        settings, layers = load_layers(argv)
    except SystemExit as exc:
        return exit_status(exc)

    configure(settings.log_level, settings.log_format)
    before, after = raise_file_limit()
    if after != before:
        event(LOG, logging.INFO, "open-file limit raised", before=before, after=after)
    try:
        app = create_app(settings, layers=layers)
    except PolicyError as exc:
        print(f"herdless serve: --key-policies: {exc}", file=sys.stderr)
        return 2
    runtime = app.state.runtime
    settings = runtime.settings  # drop the raw secrets (the app keeps digests)
    guard = ConnectionGuard(settings.connection_limits(), runtime.metrics)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        # httptools (what uvicorn[standard] picks) with the gateway's connection limits.
        http=guarded_protocol(guard),
        ws="none",  # no WebSocket route: an Upgrade request is served as plain HTTP
        timeout_keep_alive=math.ceil(settings.keep_alive_timeout),  # the protocol uses the float
        log_level=settings.log_level,
        log_config=None,  # logs.configure() formats uvicorn's lines too: one format per stream
        access_log=False,  # the gateway writes its own, with key ids and reasons
        timeout_graceful_shutdown=int(settings.shutdown_grace) or None,
        lifespan="on",
    )
    server = _DrainingServer(
        config,
        on_exit=lambda sig: drain_on_signal(runtime, sig),
        reloader=app.state.reloader,
    )
    server.run()
    return 0


class _DrainingServer(uvicorn.Server):
    """uvicorn's server, which drains the gateway before its graceful shutdown and
    reloads its settings on SIGHUP."""

    def __init__(
        self, config: uvicorn.Config, *, on_exit: Callable[[int], None], reloader: Reloader
    ) -> None:
        super().__init__(config)
        self._on_exit = on_exit
        self._reloader = reloader

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if hasattr(signal, "SIGHUP"):  # (not on Windows)
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self._reload)

    def _reload(self) -> None:
        with contextlib.suppress(ConfigError):  # logged with its field; the old ones stay
            self._reloader.reload()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # A signal handler runs between two bytecodes of the loop's thread:
        # schedule the drain on the loop instead of mutating state mid-method.
        with contextlib.suppress(RuntimeError):  # no running loop: nothing to drain yet
            # (Logging, too, waits for the loop: a handler may hold the log's lock.)
            asyncio.get_running_loop().call_soon_threadsafe(self._on_exit, sig)
        super().handle_exit(sig, frame)


def drain_on_signal(runtime: Runtime, sig: int) -> None:
    """Drain on SIGTERM or SIGINT, and say so: what was refused, what still runs.

    The ``stopped`` line at the app's shutdown tells how the drain ended.
    """
    refused = runtime.gate.drain()  # 0 when already drained (an admin drain, a 2nd signal)
    event(
        LOG,
        logging.WARNING,
        f"{signal.Signals(sig).name} received: draining",
        signal=signal.Signals(sig).name,
        refused_waiting=refused,
        inflight=runtime.gate.admission.inflight,
        shutdown_grace=runtime.settings.shutdown_grace,
    )
