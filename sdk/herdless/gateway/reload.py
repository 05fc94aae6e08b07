"""Reload without a restart: ``--config FILE``, ``SIGHUP`` and ``POST /admin/reload``.

The settings come in layers, each over the next: flags, ``HERDLESS_GATEWAY_*`` variables,
the settings file (TOML, the settings' own names: ``max_queue = 128``), the defaults. A
reload reads the file and the key policies again and puts what changed in force at once:
the queue, its fair-share counters, the key budgets, the reservations, the running
requests and the client connections stay; the frozen limits
(:class:`~herdless.gateway.core.limits.AdmissionConfig`) are replaced and the upstream
pool resized.

Not everything can change under a running gateway. A setting given by a flag or a
variable wins over the file: the file's value is reported as ignored. A setting outside
:data:`RELOADABLE` (the port above all) keeps its value until a restart, and is reported
so. A file or a key policy that does not validate changes nothing: the old settings stay
in force and the error names the file, the line and the field.
"""

from __future__ import annotations

import logging
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import SecretStr, ValidationError

from herdless.gateway.logs import LOG, event
from herdless.gateway.policies import PolicyError
from herdless.gateway.runtime import Runtime
from herdless.gateway.settings import GatewaySettings, secret_digest

__all__ = [
    "HEALTH_CONNECTIONS",
    "RELOADABLE",
    "ConfigError",
    "ReloadReport",
    "Reloader",
    "SettingsLayers",
    "read_settings_file",
]

HEALTH_CONNECTIONS = 4
"""Upstream connections beyond ``max_concurrency``: health and metrics polls, /v1/models."""

RELOADABLE = frozenset({
    "max_concurrency", "max_queue", "queue_timeout", "rate", "burst", "tokens_per_minute",
    "max_inflight_tokens", "key_queue_share", "max_retry_after", "drain_retry_after",
    "upstream_retry_after", "prompt_weight", "completion_weight", "interactive_reserve",
    "max_body_bytes", "body_timeout", "max_messages", "max_tokens_cap", "default_max_tokens",
    "health_interval", "access_log", "api_keys", "key_policies", "admin_token",
    "allowed_origins",
})  # fmt: skip
"""The settings a reload changes; the others take a restart (the listening port first)."""

_PREFIX = "HERDLESS_GATEWAY_"
_SECRET_FIELDS = ("api_keys", "admin_token", "key_id_secret", "fallback_api_key")


class ConfigError(ValueError):
    """The settings file or the key policies are invalid: the message names the file,
    the line and the field. Nothing changed."""


def read_settings_file(path: Path) -> dict[str, Any]:
    """The settings a TOML file sets, by name (not validated yet). A relative path in
    it (``key_policies``) is relative to the file's folder, not to the working folder
    the gateway was started in.

    Raises:
        ConfigError: unreadable, not TOML, or a name that is no setting (line named).
    """
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it ({exc.strerror or exc})") from exc
    try:
        values = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    known = GatewaySettings.model_fields
    for name in values:
        if name == "config" or name not in known:
            why = "the file cannot name another file" if name == "config" else "no such setting"
            raise ConfigError(f"{_where(path, text, name)}: {name}: {why}")
    policies = values.get("key_policies")
    if isinstance(policies, str) and not Path(policies).expanduser().is_absolute():
        values["key_policies"] = str(path.parent / policies)
    return values


def _where(path: Path, text: str, name: str) -> str:
    pattern = re.compile(rf"^\s*{re.escape(name)}\s*=")
    for number, line in enumerate(text.splitlines(), 1):
        if pattern.match(line):
            return f"{path}: line {number}"
    return str(path)


@dataclass(frozen=True, slots=True, kw_only=True)
class SettingsLayers:
    """Where the settings come from: ``flags`` (as typed) over ``environ`` over ``file``.

    Attributes:
        flags: the flags given, by field name, as the strings typed.
        environ: the variables seen at start (only their names are used here).
        file: the settings file (``--config``), or ``None``.
    """

    flags: Mapping[str, object] = field(default_factory=dict)
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    file: Path | None = None

    def pinned(self) -> dict[str, str]:
        """The settings a flag or a variable sets (the file's value is ignored), with
        what sets each: ``--max-queue`` or ``HERDLESS_GATEWAY_MAX_QUEUE``."""
        pinned = {name: "--" + name.replace("_", "-") for name in self.flags}
        upper = {variable.upper() for variable in self.environ}
        for name in GatewaySettings.model_fields:
            variable = f"{_PREFIX}{name}".upper()
            if name not in pinned and variable in upper:
                pinned[name] = variable
        return pinned

    def file_values(self) -> dict[str, Any]:
        """What the file sets (``{}`` without one).

        Raises:
            ConfigError: see :func:`read_settings_file`.
        """
        return {} if self.file is None else read_settings_file(self.file)

    def read(self) -> GatewaySettings:
        """The settings now: the file read again, under the flags and the variables.

        Raises:
            ConfigError: the file, or a value in it, is invalid (file, line, field named).
        """
        values = self.file_values()
        pinned = self.pinned()
        below = {name: value for name, value in values.items() if name not in pinned}
        try:
            return GatewaySettings(**below, **self.flags)  # type: ignore[arg-type]
        except ValidationError as exc:
            raise ConfigError("; ".join(self._problem(e, values) for e in exc.errors())) from exc

    def _problem(self, error: Any, values: Mapping[str, Any]) -> str:
        message = str(error["msg"]).removeprefix("Value error, ")
        loc = error["loc"]
        name = str(loc[0]) if loc else ""
        if name in values and name not in self.pinned() and self.file is not None:
            where = _where(self.file, self.file.read_text(), name)
            shown = "" if name in _SECRET_FIELDS else f" (got {values[name]!r})"
            return f"{where}: {name}: {message}{shown}"
        if name:
            return f"{self.pinned().get(name, name)}: {message}"
        return message


@dataclass(frozen=True, slots=True)
class ReloadReport:
    """What a reload did.

    Attributes:
        changed: the settings now in force with another value (secrets: ``"changed"``).
        ignored: the settings the file changed that did not change, and why.
    """

    changed: dict[str, object]
    ignored: dict[str, str]

    def as_dict(self) -> dict[str, object]:
        """The report as ``POST /admin/reload`` answers it."""
        return {"changed": self.changed, "ignored": self.ignored}


class Reloader:
    """Re-reads the settings file and the key policies into a running gateway.

    Args:
        runtime: the gateway's parts (changed in place).
        layers: where the settings came from at start.
        started: the settings the gateway started with (secrets included: only their
            digests are kept here).
    """

    def __init__(self, runtime: Runtime, layers: SettingsLayers, started: GatewaySettings) -> None:
        self._rt = runtime
        self._layers = layers
        self._digests = _digests(started)
        self._fallback = runtime.policies.fallback
        self._named = _named_digest(started.policies().secrets)

    def reload(self) -> ReloadReport:
        """Read and apply the settings file and the key policies; log what changed.

        Raises:
            ConfigError: invalid; the old settings stay in force (logged with the field).
        """
        try:
            report = self._reload()
        except ConfigError as exc:
            event(LOG, logging.ERROR, "reload refused, the old settings stay", error=str(exc))
            raise
        event(
            LOG,
            logging.WARNING if report.ignored else logging.INFO,
            "reloaded",
            changed=",".join(sorted(report.changed)) or "nothing",
            ignored="; ".join(f"{k}: {v}" for k, v in sorted(report.ignored.items())) or None,
        )
        return report

    def _reload(self) -> ReloadReport:
        rt = self._rt
        new = self._layers.read()
        try:
            policies = new.policies()
        except PolicyError as exc:
            raise ConfigError(f"key_policies: {exc}") from exc
        old = rt.settings
        digests = _digests(new)
        in_file = self._layers.file_values()
        ignored = {
            name: f"set by {source}; the file's value is ignored"
            for name, source in self._layers.pinned().items()
            if name in in_file
        }
        keep: dict[str, object] = {}
        for name in GatewaySettings.model_fields:
            if name in RELOADABLE or name == "config":
                continue
            if name in self._digests:
                differs = digests[name] != self._digests[name]
            else:
                differs = getattr(new, name) != getattr(old, name)
            if differs:
                ignored[name] = "needs a restart (kept)"
                if name not in self._digests:
                    keep[name] = getattr(old, name)
        if policies.fallback != self._fallback:
            ignored["key_policies [fallback]"] = "needs a restart (kept)"
        settings = new.model_copy(update=keep)
        try:
            config = settings.admission_config()
            rt.gate.reconfigure(config, policies.limits())
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        # Nothing below can fail: the reload is whole or nothing.
        changed: dict[str, object] = {}
        for name in RELOADABLE:
            if name in self._digests:
                if digests[name] != self._digests[name]:
                    changed[name] = "changed"
            elif getattr(settings, name) != getattr(old, name):
                changed[name] = getattr(settings, name)
        rt.keys = settings.api_key_table(named=policies.secrets, before=rt.keys)
        named = _named_digest(policies.secrets)
        if policies.without_secrets() != rt.policies or named != self._named:
            changed["key_policies"] = "changed"
        self._named = named
        rt.policies = policies.without_secrets()
        admin = settings.admin_token
        rt.admin_digest = None if admin is None else secret_digest(admin)
        cap = settings.max_concurrency
        rt.upstream.resize(None if cap is None else cap + HEALTH_CONNECTIONS)
        rt.settings = settings.without_secrets()
        self._digests.update({n: digests[n] for n in ("api_keys", "admin_token")})
        return ReloadReport(changed=changed, ignored=ignored)


def _named_digest(secrets: Mapping[str, str]) -> bytes:
    """One digest of the key policies' keys and names (a key rotated shows as a change)."""
    joined = "\n".join(f"{name}\t{key}" for key, name in sorted(secrets.items()))
    return secret_digest(SecretStr(joined))


def _digests(settings: GatewaySettings) -> dict[str, bytes | None]:
    """The secrets' digests, to tell a change without keeping a secret."""
    out: dict[str, bytes | None] = {}
    for name in (*_SECRET_FIELDS, "upstream_api_key"):
        value = getattr(settings, name)
        out[name] = secret_digest(value) if isinstance(value, SecretStr) else None
    return out
