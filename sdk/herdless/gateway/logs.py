"""The gateway's log lines: one format per stream, ``text`` or ``json``, with a timestamp.

Every gateway record carries its structured fields in ``record.fields`` (a dict, set
with ``extra={"fields": ...}``); the formatters render them after the message:

* ``text``: ``2025-06-01T12:00:00.123Z INFO herdless.gateway upstream ready from=loading``
  (values with spaces, quotes or ``=`` are JSON-quoted, ``None`` is ``-``);
* ``json``: one object per line, ``{"ts", "level", "logger", "message", ...fields}``.

:func:`configure` puts one handler with that formatter on the root logger, so
uvicorn's own lines (``uvicorn.error``) and any library's warnings come out in the same
format on the same stream, never interleaved with another format. The stdlib's
``logging`` is enough here: a formatter of twenty lines does not justify a dependency.

The events (logger ``herdless.gateway`` unless said):

* ``config``: the effective settings at start; secrets appear as ``set``/``unset``.
* ``upstream``: the upstream's state changed (``loading``, ``ready``, ``unavailable``);
  once per change, never per health poll.
* ``admin`` (``herdless.gateway.audit``): a drain or resume asked for, by whom, outcome.
* ``signal``: SIGTERM or SIGINT received; the drain it starts.
* ``stopped``: the app's shutdown, with the requests still running.
* ``access`` (``herdless.gateway.access``): one per admitted-route request.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from pathlib import PurePath
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import AnyUrl, SecretStr

if TYPE_CHECKING:
    from herdless.gateway.settings import GatewaySettings

__all__ = [
    "LOG",
    "JsonFormatter",
    "LogFormat",
    "TextFormatter",
    "configure",
    "effective_config",
    "event",
]

LOG = logging.getLogger("herdless.gateway")
"""The gateway's operational log (start, upstream state, signals, shutdown)."""

LogFormat = Literal["text", "json"]

# Loggers whose INFO lines an operator wants; everything else at WARNING and above.
_OURS = ("herdless.gateway", "uvicorn")
_BARE = frozenset(' ="\\')


def event(logger: logging.Logger, level: int, message: str, **fields: object) -> None:
    """Log ``message`` with structured ``fields`` (skipped cheaply when not enabled)."""
    if logger.isEnabledFor(level):
        logger.log(level, message, extra={"fields": fields}, stacklevel=2)


def _timestamp(record: logging.LogRecord) -> str:
    at = datetime.fromtimestamp(record.created, UTC)
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _fields(record: logging.LogRecord) -> dict[str, object]:
    fields = getattr(record, "fields", None)
    return fields if isinstance(fields, dict) else {}


class TextFormatter(logging.Formatter):
    """``<UTC timestamp> <LEVEL> <logger> <message> key=value ...`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        parts = [_timestamp(record), record.levelname, record.name, record.getMessage()]
        parts += [f"{name}={_text_value(value)}" for name, value in _fields(record).items()]
        line = " ".join(parts)
        if record.exc_info:
            # A traceback keeps its lines: text logs are read by people.
            line += "\n" + self.formatException(record.exc_info)
        return line


def _text_value(value: object) -> str:
    if value is None:
        return "-"
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    if not text or any(char in _BARE or not char.isprintable() for char in text):
        return json.dumps(text)
    return text


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``message``, the fields."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": _timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in _fields(record).items():
            line.setdefault(name, value)  # a field never hides the four above
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)  # one line, escaped
        return json.dumps(line, separators=(",", ":"), default=str)


def configure(level: str, log_format: LogFormat) -> logging.Handler:
    """Send every log line to stderr in ``log_format``; returns the handler installed.

    The root logger gets the one handler (at WARNING: a library's INFO chatter, such
    as httpx's line per request, stays out); ``herdless.gateway`` and ``uvicorn`` log
    at ``level``. uvicorn must then be started with ``log_config=None`` so that it
    does not install its own handlers and formats.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    for name in _OURS:
        logger = logging.getLogger(name)
        logger.handlers = []
        logger.propagate = True
        logger.setLevel(level.upper())
    return handler


def effective_config(settings: GatewaySettings) -> dict[str, object]:
    """The settings as logged at start: secrets as ``set``/``unset``, never their value.

    A URL loses any user info (``user:password@``) it may carry; a URL or a path is
    shown as its text.
    """
    shown: dict[str, object] = {}
    for name in type(settings).model_fields:
        value = getattr(settings, name)
        if isinstance(value, SecretStr) or name in _SECRETS:
            shown[name] = "unset" if value is None else "set"
        elif isinstance(value, AnyUrl):
            shown[name] = _without_userinfo(str(value))
        elif isinstance(value, PurePath):
            shown[name] = str(value)
        else:
            shown[name] = value
    return shown


_SECRETS = frozenset({"api_keys", "admin_token", "key_id_secret", "upstream_api_key"})


def _without_userinfo(url: str) -> str:
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))
