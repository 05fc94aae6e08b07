"""Client settings from the environment: the only place herdless reads ``os.environ``.

pydantic-settings reads ``HERDLESS_*`` variables (and a ``.env`` file) into
``HerdlessSettings``; ``env_options()`` turns them into the frozen objects the
clients take (``Backend``, ``Timeouts``, ``RetryPolicy``, ``BreakerPolicy``,
``HedgePolicy``). Every
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
``HERDLESS_FALLBACK_PRICE_INPUT``      its price per million prompt tokens (``Price``)
``HERDLESS_FALLBACK_PRICE_OUTPUT``     its price per million completion tokens
``HERDLESS_DEADLINE``                  seconds per call, waits included (a stream: until
                                       its first chunk)
``HERDLESS_STREAM_DEADLINE``           seconds from a stream's start to its end
``HERDLESS_CONNECT_TIMEOUT``           seconds, per attempt
``HERDLESS_FIRST_BYTE_TIMEOUT``        seconds, per attempt
``HERDLESS_READ_TIMEOUT``              seconds of silence allowed inside a stream
``HERDLESS_RETRY_<FIELD>``             any ``RetryPolicy`` field, e.g. ``HERDLESS_RETRY_CAP``
``HERDLESS_BREAKER_<FIELD>``           any ``BreakerPolicy`` field, e.g.
                                       ``HERDLESS_BREAKER_OPEN_FOR``
``HERDLESS_HEDGE_AFTER``               hedge late attempts: seconds, or ``auto``
                                       (``HedgePolicy``; unset: no hedging)
``HERDLESS_HEDGE_MAX_SHARE``           at most this share of calls hedge (default 0.05)
``HERDLESS_LLM_D_HEADERS``             send llm-d's request headers (default true)
=====================================  ==================================================

A ``HERDLESS_*`` variable that is none of these but close to one (``HERDLESS_PRIMARY_ULR``)
gets a ``UserWarning`` naming the one it resembles. Others are left alone: the
gateway's, the emulator's and the tools' variables share the prefix and the ``.env`` file.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, get_type_hints

from dotenv import dotenv_values
from pydantic import SecretStr, ValidationError, create_model
from pydantic_settings import BaseSettings, SettingsConfigDict

from herdless._backend import Backend, Price, Timeouts
from herdless._breaker import BreakerPolicy
from herdless._hedge import HedgePolicy
from herdless._retry import RetryPolicy
from herdless.errors import ConfigurationError

__all__ = ["HerdlessSettings", "env_options"]

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
    fallback_price_input: float | None = None
    fallback_price_output: float | None = None
    deadline: float | None = None
    stream_deadline: float | None = None
    connect_timeout: float | None = None
    first_byte_timeout: float | None = None
    read_timeout: float | None = None
    hedge_after: str | None = None
    hedge_max_share: float | None = None
    llm_d_headers: bool | None = None


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


def _var(field: str) -> str:
    return f"{_PREFIX}{field.upper()}"


# Prefixes of the other components' variables, which may share the environment and the
# .env file: never warned about.
_OTHER_PREFIXES = ("GATEWAY_", "EMULATOR_", "DEMO_", "BENCH_", "VLLM_", "TEST_")
# How alike a name must be to a known one to be taken for a misspelling of it (difflib's
# ratio on the part after HERDLESS_: PRIMARY_ULR ~ PRIMARY_URL is 0.91, MODELS_DIR ~ MODEL
# is 0.67).
_CLOSE = 0.75


def _warn_unknown(names: Iterable[str]) -> None:
    """Warn about each ``HERDLESS_*`` name that is no client setting but close to one."""
    known = [name.upper() for name in HerdlessSettings.model_fields]
    for name in sorted({name.upper() for name in names}):
        if not name.startswith(_PREFIX):
            continue
        rest = name.removeprefix(_PREFIX)
        if rest in known or rest.startswith(_OTHER_PREFIXES):
            continue
        close = difflib.get_close_matches(rest, known, n=1, cutoff=_CLOSE)
        if close:
            warnings.warn(
                f"{name} is not a herdless client setting and is ignored; "
                f"did you mean {_PREFIX}{close[0]}?",
                UserWarning,
                stacklevel=6,  # the user's Client(...) line, through the config
            )


def _env_names(env_file: str | Path | None) -> list[str]:
    """The variable names of the environment and of ``env_file`` (when it exists)."""
    names = list(os.environ)
    if env_file is not None and Path(env_file).is_file():
        names += [name for name in dotenv_values(env_file) if name]
    return names


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


def env_options(env_file: str | Path | None = ".env") -> tuple[Backend, dict[str, Any]]:
    """Read the ``HERDLESS_*`` environment (and ``env_file``, when it exists): the
    primary, and the ``ClientOptions`` it sets (``None`` where a variable is unset).

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
    _warn_unknown(_env_names(env_file))
    if not settings.primary_url:
        raise ConfigurationError(
            f"{_var('primary_url')} is not set: give the primary's API root, "
            "e.g. http://gpu-gateway.internal:8080/v1",
            variable=_var("primary_url"),
        )
    return _backend(settings, "primary"), {
        "fallback": _fallback(settings),
        "model": settings.model,
        "deadline": settings.deadline,
        "stream_deadline": settings.stream_deadline,
        "timeouts": _build(
            Timeouts,
            {
                "connect": (_var("connect_timeout"), settings.connect_timeout),
                "first_byte": (_var("first_byte_timeout"), settings.first_byte_timeout),
                "read": (_var("read_timeout"), settings.read_timeout),
            },
        ),
        "retry": _build(RetryPolicy, _group(settings, "retry_")),
        "breaker": _build(BreakerPolicy, _group(settings, "breaker_")),
        "hedge": _hedge(settings),
        "llm_d_headers": settings.llm_d_headers,
    }


def _hedge(settings: Any) -> HedgePolicy | None:
    """``HedgePolicy`` from ``HERDLESS_HEDGE_AFTER`` (``auto`` or seconds) and
    ``HERDLESS_HEDGE_MAX_SHARE``; ``None`` (no hedging) when neither is set."""
    after_var, share_var = _var("hedge_after"), _var("hedge_max_share")
    raw, share = settings.hedge_after, settings.hedge_max_share
    if raw is None:
        if share is not None:
            raise ConfigurationError(
                f"{after_var} is not set: {share_var} caps hedging, which "
                f"{after_var} turns on (seconds, or auto)",
                variable=after_var,
            )
        return None
    after: float | str = raw.strip().lower()
    if after != "auto":
        try:
            after = float(after)
        except ValueError:
            raise ConfigurationError(
                f"{after_var} must be seconds or auto, got {raw!r}",
                variable=after_var,
            ) from None
    policy: HedgePolicy = _build(
        HedgePolicy,
        {"after": (after_var, after), "max_share": (share_var, share)},
    )
    return policy


def _fallback(settings: Any) -> tuple[Backend, ...]:
    if not settings.fallback_url:
        return ()
    if not settings.fallback_model:
        raise ConfigurationError(
            f"{_var('fallback_model')} is not set: a fallback needs its own model name",
            variable=_var("fallback_model"),
        )
    backend = _backend(
        settings,
        "fallback",
        model=(_var("fallback_model"), settings.fallback_model),
        external=(_var("fallback_external"), settings.fallback_external),
        price=("", _price(settings)),
    )
    return (backend,)


def _backend(settings: Any, role: str, **more: tuple[str, Any]) -> Backend:
    """The ``Backend`` named ``role`` at ``HERDLESS_{ROLE}_URL`` with
    ``HERDLESS_{ROLE}_API_KEY``, and ``more`` fields as ``(variable, value)``."""
    backend: Backend = _build(
        Backend,
        {
            "name": ("", role),
            "base_url": (_var(f"{role}_url"), getattr(settings, f"{role}_url")),
            "api_key": (_var(f"{role}_api_key"), _secret(getattr(settings, f"{role}_api_key"))),
            **more,
        },
    )
    return backend


def _price(settings: Any) -> Price | None:
    """The fallback's ``Price``: both variables, or neither."""
    given = {
        field: (_var(f"fallback_price_{field}"), getattr(settings, f"fallback_price_{field}"))
        for field in ("input", "output")
    }
    missing = [variable for variable, value in given.values() if value is None]
    if len(missing) == 2:
        return None
    if missing:
        raise ConfigurationError(
            f"{missing[0]} is not set: a fallback's price needs both "
            f"{_var('fallback_price_input')} and {_var('fallback_price_output')} "
            "(per million tokens)",
            variable=missing[0],
        )
    price: Price = _build(Price, given)
    return price


def _group(settings: Any, prefix: str) -> dict[str, tuple[str, Any]]:
    """The ``prefix``-ed settings as ``{policy field: (variable, value)}``."""
    return {
        name.removeprefix(prefix): (_var(name), value)
        for name, value in settings.model_dump().items()
        if name.startswith(prefix)
    }
