"""``herdless serve``: run the gateway with uvicorn.

Every flag is a field of :class:`~herdless.gateway.settings.GatewaySettings`, so
each is also ``HERDLESS_GATEWAY_<NAME>``; a flag wins over the environment.
Secrets (``API_KEYS``, ``ADMIN_TOKEN``, ``UPSTREAM_API_KEY``) are environment
only: a command line is visible to every user of the machine (``ps``).

SIGTERM (or Ctrl-C) drains first: waiting requests get 503 ``draining`` at once,
running ones finish (up to ``--shutdown-grace`` seconds), then the process exits.

Every line goes to stderr in one format, ``--log-format text`` or ``json`` (see
:mod:`herdless.gateway.logs`), uvicorn's own lines included.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import signal
import sys
from collections.abc import Callable, Sequence
from types import FrameType

import uvicorn
from pydantic import SecretStr, ValidationError

from herdless.gateway.app import create_app
from herdless.gateway.connections import ConnectionGuard, raise_file_limit
from herdless.gateway.logs import LOG, configure, event
from herdless.gateway.protocol import guarded_protocol
from herdless.gateway.runtime import Runtime
from herdless.gateway.settings import GatewaySettings

__all__ = ["main"]

_HELP = {
    "host": "interface to listen on (default 127.0.0.1)",
    "port": "port to listen on (default 8080; 0 picks a free one)",
    "upstream": "vLLM's base URL (default http://127.0.0.1:8000)",
    "max_concurrency": "requests running upstream at once (default 64)",
    "max_queue": "requests waiting at once (default 256; 0 refuses instead)",
    "queue_timeout": "seconds a request may wait before 429 queue_timeout (default 30)",
    "rate": "requests per second per key (default: no limit)",
    "burst": "requests a key may send at once (default: ceil(rate))",
    "tokens_per_minute": "LLM tokens per minute per key (default: no limit)",
    "max_inflight_tokens": "KV budget: prompt + max_tokens admitted at once (default: none)",
    "key_queue_share": "fraction of the queue one API key may hold (default 0.5)",
    "max_body_bytes": "largest request body, else 413 (default 1 MiB)",
    "body_timeout": "seconds a client has to send its whole body, else 408 (default 5)",
    "max_messages": "most messages in one chat request, else 400 (default 2048)",
    "max_tokens_cap": "largest max_tokens a request may ask for, else 400 (default 32768)",
    "default_max_tokens": "max_tokens assumed for pricing when a request has none (512)",
    "max_retry_after": "cap on Retry-After, seconds (default 60)",
    "drain_retry_after": "Retry-After while draining, seconds (default 30)",
    "upstream_retry_after": "Retry-After while vLLM is not ready, seconds (default 2)",
    "health_interval": "seconds between polls of vLLM's /health (default 1)",
    "connect_timeout": "seconds to connect to vLLM (default 2)",
    "read_timeout": "seconds between two bytes from vLLM (default 600)",
    "shutdown_grace": "seconds running requests get to finish on SIGTERM (default 30)",
    "max_head_bytes": "largest request head (request line and headers), else 431 "
    "and close (default 32768)",
    "max_headers": "most header lines in a request, else 431 and close (default 100)",
    "head_timeout": "seconds from a request's first byte to the end of its headers, "
    "else 408 and close (default 10)",
    "keep_alive_timeout": "seconds a connection may stay open with no request under way; "
    "keep it above your clients' idle timeout (httpx: 5) (default 10)",
    "max_connections_per_peer": "connections one client address may hold, at most half "
    "the process's file limit; 0: no cap (default 1024)",
    "models_cache_ttl": "seconds GET /v1/models is answered from the last upstream answer; "
    "0: fetched every time, concurrent requests still share one fetch (default 1)",
    "scheduler": "order of the waiters: vtc (token-fair between keys, then users; "
    "interactive before batch), or the reference orders round-robin and fcfs (default vtc)",
    "prompt_weight": "weight of a prompt token in a user's service (default 1)",
    "completion_weight": "weight of a completion token in a user's service (default 2)",
    "max_users": "most users (per class) whose service the queue remembers (default 10000)",
    "interactive_reserve": "slots batch work leaves free while interactive work is recent "
    "(default: max_concurrency / 8, rounded up)",
    "reserve_window": "seconds after the last interactive request during which the reserve "
    "holds (default 30)",
    "fair_window": "seconds over which /metrics measures service per user and the "
    "fairness index (default 10)",
    "metrics_top_users": "users named in /metrics by their service; the rest are 'other' "
    "(default 10)",
    "access_log": "write one JSON access-log line per request (default on)",
    "log_level": "critical, error, warning, info or debug (default info)",
    "log_format": "text (one line: time, level, logger, message, key=value) or json "
    "(one object per line), for every line on stderr (default text)",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="herdless serve",
        description="Admission gateway in front of vLLM. Every flag is also "
        "HERDLESS_GATEWAY_<FLAG> (upper case, '_' for '-'); secrets are environment only: "
        "HERDLESS_GATEWAY_API_KEYS, HERDLESS_GATEWAY_ADMIN_TOKEN, "
        "HERDLESS_GATEWAY_UPSTREAM_API_KEY.",
        argument_default=argparse.SUPPRESS,  # absent flags leave the environment in charge
    )
    for name, info in GatewaySettings.model_fields.items():
        if info.annotation is SecretStr or info.annotation == SecretStr | None:
            continue
        flag = "--" + name.replace("_", "-")
        if info.annotation is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, help=_HELP[name])
        else:
            parser.add_argument(flag, metavar=name.upper(), help=_HELP[name])
    return parser


def load_settings(argv: Sequence[str]) -> GatewaySettings:
    """Settings from flags over ``HERDLESS_GATEWAY_*``.

    Raises:
        SystemExit: ``--help`` or an unknown flag (argparse's behaviour).
        pydantic.ValidationError: a value is out of range or of the wrong type.
    """
    flags = vars(_parser().parse_args(list(argv)))
    return GatewaySettings(**flags)


def main(argv: Sequence[str]) -> int:
    """Run ``herdless serve``; returns the exit status (2 for bad settings)."""
    try:
        settings = load_settings(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    except ValidationError as exc:
        for error in exc.errors():
            name = "-".join(str(part) for part in error["loc"]).replace("_", "-")
            where = f"--{name}: " if name else ""  # a check across fields names none
            print(f"herdless serve: {where}{error['msg']}", file=sys.stderr)
        return 2

    configure(settings.log_level, settings.log_format)
    before, after = raise_file_limit()
    if after != before:
        event(LOG, logging.INFO, "open-file limit raised", before=before, after=after)
    app = create_app(settings)
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
    server = _DrainingServer(config, on_exit=lambda sig: drain_on_signal(runtime, sig))
    server.run()
    return 0


class _DrainingServer(uvicorn.Server):
    """uvicorn's server, which drains the gateway before its graceful shutdown."""

    def __init__(self, config: uvicorn.Config, *, on_exit: Callable[[int], None]) -> None:
        super().__init__(config)
        self._on_exit = on_exit

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
    adm = runtime.gate.admission
    event(
        LOG,
        logging.WARNING,
        f"{signal.Signals(sig).name} received: draining",
        signal=signal.Signals(sig).name,
        refused_waiting=refused,
        inflight=adm.inflight,
        shutdown_grace=runtime.settings.shutdown_grace,
    )
