"""Client settings from the environment: the only place herdless reads ``os.environ``.

pydantic-settings reads ``HERDLESS_*`` variables (and a ``.env`` file) into
``HerdlessSettings``; ``env_options()`` turns them into the frozen objects the
clients take (``Backend``, ``Timeouts``, ``RetryPolicy``, ``BreakerPolicy``). Every
problem becomes a ``ConfigurationError`` that names the variable to fix.

Variables (all optional unless marked):

=====================================  ==================================================
``HERDLESS_PRIMARY_URL`` (required)    the primary's API root, ending in ``/v1``
``HERDLESS_PRIMARY_API_KEY``           its key (sent as ``Authorization: Bearer``)
``HERDLESS_MODEL``                     the model asked of the primary
``HERDLESS_FALLBACK_URL``              a hosted fallback's API root
``HERDLESS_FALLBACK_API_KEY``          its key
``HERDLESS_FALLBACK_MODEL``            its model (required with a fallback URL)
``HERDLESS_FALLBACK_EXTERNAL``         data sent there leaves the company (default true)
``HERDLESS_DEADLINE``                  seconds per call, waits included
``HERDLESS_CONNECT_TIMEOUT``           seconds, per attempt
``HERDLESS_FIRST_BYTE_TIMEOUT``        seconds, per attempt
``HERDLESS_READ_TIMEOUT``              seconds of silence allowed inside a stream
``HERDLESS_RETRY_<FIELD>``             any ``RetryPolicy`` field, e.g. ``HERDLESS_RETRY_CAP``
``HERDLESS_BREAKER_<FIELD>``           any ``BreakerPolicy`` field, e.g.
                                       ``HERDLESS_BREAKER_OPEN_FOR``
=====================================  ==================================================
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_type_hints

from pydantic import SecretStr, ValidationError, create_model
from pydantic_settings import BaseSettings, SettingsConfigDict

from herdless._backend import Backend, Timeouts
from herdless._breaker import BreakerPolicy
from herdless._retry import RetryPolicy
from herdless.errors import ConfigurationError

__all__ = ["EnvOptions", "HerdlessSettings", "env_options"]

_PREFIX = "HERDLESS_"


class _Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=_PREFIX,
        env_file=".env",
        # The same .env file usually holds the gateway's and emulator's variables too.
        extra="ignore",
    )

    primary_url: str | None = None
    primary_api_key: SecretStr | None = None
    model: str | None = None
    fallback_url: str | None = None
    fallback_api_key: SecretStr | None = None
    fallback_model: str | None = None
    fallback_external: bool = True
    deadline: float | None = None
    connect_timeout: float | None = None
    first_byte_timeout: float | None = None
    read_timeout: float | None = None


def _policy_fields(cls: type[Any], prefix: str) -> dict[str, Any]:
    # One optional setting per policy field, typed like the field: the policy's own
    # defaults and validation stay the single source of truth.
    hints = get_type_hints(cls)
    return {f"{prefix}{f.name}": (hints[f.name] | None, None) for f in dataclasses.fields(cls)}


HerdlessSettings = create_model(
    "HerdlessSettings",
    __base__=_Settings,
    __doc__="The ``HERDLESS_*`` environment, as read by pydantic-settings.",
    **_policy_fields(RetryPolicy, "retry_"),
    **_policy_fields(BreakerPolicy, "breaker_"),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class EnvOptions:
    """Client constructor arguments read from the environment."""

    primary: Backend
    fallback: tuple[Backend, ...]
    model: str | None
    deadline: float | None
    timeouts: Timeouts
    retry: RetryPolicy
    breaker: BreakerPolicy


def _var(field: str) -> str:
    return f"{_PREFIX}{field.upper()}"


def _build(cls: type[Any], values: Mapping[str, tuple[str, Any]]) -> Any:
    """``cls(**values)`` where ``values`` maps each field to ``(variable, value)``; a
    ``ValueError`` about a field becomes a ``ConfigurationError`` naming its variable."""
    given = {field: value for field, (_, value) in values.items() if value is not None}
    try:
        return cls(**given)
    except ValueError as exc:
        # The objects' messages name the field as "Class.field".
        match = re.search(r"\.(\w+)", str(exc))
        field = match.group(1) if match and match.group(1) in values else next(iter(given))
        variable = values[field][0]
        raise ConfigurationError(f"{variable}: {exc}", variable=variable) from exc


def _secret(value: SecretStr | None) -> str | None:
    return value.get_secret_value() if value is not None else None


def env_options(env_file: str | Path | None = ".env") -> EnvOptions:
    """Read the ``HERDLESS_*`` environment (and ``env_file``, when it exists).

    Raises:
        ConfigurationError: a variable is missing or malformed; ``.variable`` names it.
    """
    try:
        # pydantic-settings' init-only option; mypy without its plugin does not know it.
        settings = HerdlessSettings(_env_file=env_file)  # type: ignore[call-arg]
    except ValidationError as exc:
        error = exc.errors()[0]
        variable = _var(str(error["loc"][0]))
        # Only the message: pydantic's text would repeat the (maybe secret) input.
        raise ConfigurationError(
            f"{variable} is malformed: {error['msg']}", variable=variable
        ) from None
    if not settings.primary_url:
        raise ConfigurationError(
            f"{_var('primary_url')} is not set: give the primary's API root, "
            "e.g. http://gpu-gateway.internal:8080/v1",
            variable=_var("primary_url"),
        )
    primary = _build(
        Backend,
        {
            "name": ("", "primary"),
            "base_url": (_var("primary_url"), settings.primary_url),
            "api_key": (_var("primary_api_key"), _secret(settings.primary_api_key)),
        },
    )
    return EnvOptions(
        primary=primary,
        fallback=_fallback(settings),
        model=settings.model,
        deadline=settings.deadline,
        timeouts=_build(
            Timeouts,
            {
                "connect": (_var("connect_timeout"), settings.connect_timeout),
                "first_byte": (_var("first_byte_timeout"), settings.first_byte_timeout),
                "read": (_var("read_timeout"), settings.read_timeout),
            },
        ),
        retry=_build(RetryPolicy, _group(settings, "retry_")),
        breaker=_build(BreakerPolicy, _group(settings, "breaker_")),
    )


def _fallback(settings: Any) -> tuple[Backend, ...]:
    if not settings.fallback_url:
        return ()
    if not settings.fallback_model:
        raise ConfigurationError(
            f"{_var('fallback_model')} is not set: a fallback needs its own model name",
            variable=_var("fallback_model"),
        )
    backend = _build(
        Backend,
        {
            "name": ("", "fallback"),
            "base_url": (_var("fallback_url"), settings.fallback_url),
            "api_key": (_var("fallback_api_key"), _secret(settings.fallback_api_key)),
            "model": (_var("fallback_model"), settings.fallback_model),
            "external": (_var("fallback_external"), settings.fallback_external),
        },
    )
    return (backend,)


def _group(settings: Any, prefix: str) -> dict[str, tuple[str, Any]]:
    """The ``prefix``-ed settings as ``{policy field: (variable, value)}``."""
    return {
        name.removeprefix(prefix): (_var(name), value)
        for name, value in settings.model_dump().items()
        if name.startswith(prefix)
    }
