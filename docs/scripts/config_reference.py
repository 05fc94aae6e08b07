"""Render every ``HERDLESS_*`` setting, with its default, from the pydantic-settings classes.

The configuration reference page is generated from the code at build time
(``docs/scripts/hooks.py``), so it cannot drift from the defaults the code uses.
Run ``python docs/scripts/config_reference.py`` to print the tables.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import pkgutil
import re
import typing
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

MARKER = "<!-- herdless:settings -->"

# Import only modules that may define settings: importing the whole package would pull in
# the demo's plotting stack for nothing.
_CANDIDATE_WORDS = ("settings", "config", "_settings")


@dataclass(frozen=True, slots=True)
class Row:
    """One environment variable."""

    env: str
    type: str
    default: str
    description: str


# The SDK's settings leave most knobs unset so that the policy objects' own defaults
# stay the single source of truth: show those defaults and their docstrings here.
_SDK_CORE = {
    "HERDLESS_PRIMARY_URL": "the primary's API root, ending in /v1 (the gateway)",
    "HERDLESS_PRIMARY_API_KEY": "the primary's API key, sent as a bearer token",
    "HERDLESS_MODEL": "the model asked of the primary",
    "HERDLESS_FALLBACK_URL": "the fallback's API root (a hosted OpenAI-compatible model)",
    "HERDLESS_FALLBACK_API_KEY": "the fallback's API key",
    "HERDLESS_FALLBACK_MODEL": "the model asked of the fallback",
    "HERDLESS_FALLBACK_EXTERNAL": "data sent to the fallback leaves the company "
    "(calls with allow_fallback=False never reach it)",
    "HERDLESS_DEADLINE": "seconds for a whole call, waits and fallback included",
}
# Secrets have no command-line flag (a command line is visible to every user), so no
# --help text either.
_SECRETS = {
    "HERDLESS_GATEWAY_API_KEYS": "the API keys clients may use, comma-separated; unset: "
    "anyone may call",
    "HERDLESS_GATEWAY_ADMIN_TOKEN": "bearer token for POST /admin/drain and /admin/resume; "
    "unset: the admin endpoints answer 403",
    "HERDLESS_GATEWAY_UPSTREAM_API_KEY": "API key the gateway sends to vLLM (--api-key)",
    "HERDLESS_GATEWAY_KEY_ID_SECRET": "secret that keys the logged key ids "
    "(key- + 8 hex of HMAC-SHA256(secret, key)); unset: a random one per process, so ids "
    "change when the gateway restarts and differ between replicas",
}


def _arg_docs(cls: type) -> dict[str, str]:
    """``{name: text}`` from the ``Args:`` section of a Google-style docstring."""
    doc = inspect.getdoc(cls) or ""
    section = re.search(r"^(?:Args|Attributes):\n((?:[ ]{4}.*\n?|\n)+)", doc, re.MULTILINE)
    out: dict[str, str] = {}
    name = ""
    for line in (section.group(1) if section else "").splitlines():
        entry = re.match(r"^ {4}(\w+)(?: \(.*?\))?: (.*)", line)
        if entry:
            name, out[entry.group(1)] = entry.group(1), entry.group(2)
        elif name and line.startswith(" " * 8):
            out[name] += " " + line.strip()
    return out


def _policy_rows() -> dict[str, tuple[str, str]]:
    """``{ENV: (default, description)}`` for the SDK knobs whose defaults live in policies."""
    try:
        from herdless._backend import Timeouts
        from herdless._breaker import BreakerPolicy
        from herdless._policies import DEFAULT_DEADLINE
        from herdless._retry import RetryPolicy
    except ImportError:  # the SDK is not built yet: nothing to add
        return {}
    out: dict[str, tuple[str, str]] = {}
    for env, text in _SDK_CORE.items():
        out[env] = ("", text)
    out["HERDLESS_DEADLINE"] = (str(DEFAULT_DEADLINE), _SDK_CORE["HERDLESS_DEADLINE"])
    sources: list[tuple[type, str, str]] = [
        (RetryPolicy, "HERDLESS_RETRY_", ""),
        (BreakerPolicy, "HERDLESS_BREAKER_", ""),
        (Timeouts, "HERDLESS_", "_TIMEOUT"),
    ]
    for cls, prefix, suffix in sources:
        docs = _arg_docs(cls)
        for field in dataclasses.fields(cls):
            env = f"{prefix}{field.name.upper()}{suffix}"
            out[env] = (str(field.default), docs.get(field.name, ""))
    return out


def _flag_help(cls: type[BaseSettings]) -> dict[str, str]:
    """The ``--help`` text of each flag of the command the settings belong to, by field.

    The gateway and the emulator document their settings as command-line flags; their
    argument parser is the one place that text lives.
    """
    package = cls.__module__.rsplit(".", 1)[0]
    try:
        cli = importlib.import_module(f"{package}.cli")
    except ImportError:
        return {}
    build = getattr(cli, "build_parser", None) or getattr(cli, "_parser", None)
    if build is None:
        return {}
    parser: argparse.ArgumentParser = build()
    return {a.dest: a.help for a in parser._actions if a.help and a.dest != "help"}


def _candidate_modules(package: str = "herdless") -> Iterator[str]:
    root = importlib.import_module(package)
    for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
        leaf = info.name.rsplit(".", 1)[-1]
        if any(word in leaf for word in _CANDIDATE_WORDS):
            yield info.name


def settings_classes(package: str = "herdless") -> list[type[BaseSettings]]:
    """Every ``BaseSettings`` subclass defined in ``package``, sorted by env prefix."""
    found: dict[str, type[BaseSettings]] = {}
    for name in _candidate_modules(package):
        module = importlib.import_module(name)
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, BaseSettings)
                and value is not BaseSettings
                and value.__module__ == module.__name__
                and not value.__name__.startswith("_")  # a private base of a public class
            ):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return sorted(found.values(), key=lambda cls: (_prefix(cls), cls.__qualname__))


def _prefix(cls: type[BaseSettings]) -> str:
    return str(cls.model_config.get("env_prefix", "") or "")


def _type_name(annotation: Any) -> str:
    if typing.get_origin(annotation) is typing.Literal:
        return " or ".join(repr(arg) for arg in typing.get_args(annotation))
    text = annotation.__name__ if isinstance(annotation, type) else repr(annotation)
    for noise in ("typing.", "pydantic.types.", "pydantic.networks."):
        text = text.replace(noise, "")
    # "float | None" only means "not set: the policy's default applies".
    return text.replace(" | None", "").replace(" | ", " or ")


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value: Any = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None:
        return "unset"
    if isinstance(value, SecretStr):
        return "unset" if not value.get_secret_value() else "(secret)"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _env_names(cls: type[BaseSettings], name: str, field: FieldInfo) -> str:
    alias = field.validation_alias or field.alias
    if isinstance(alias, str):
        return alias.upper()
    choices = getattr(alias, "choices", None)
    if choices:
        return " or ".join(str(choice).upper() for choice in choices)
    return f"{_prefix(cls)}{name}".upper()


def rows(cls: type[BaseSettings]) -> Iterator[Row]:
    """One row per field; nested models are flattened with the class's delimiter."""
    policy = _policy_rows()
    flag_help = _flag_help(cls)
    delimiter = cls.model_config.get("env_nested_delimiter") or "__"
    for name, field in cls.model_fields.items():
        env = _env_names(cls, name, field)
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            for sub_name, sub_field in annotation.model_fields.items():
                yield Row(
                    env=f"{env}{delimiter}{sub_name}".upper(),
                    type=_type_name(sub_field.annotation),
                    default=_default(sub_field),
                    description=_one_line(sub_field.description),
                )
            continue
        default = _default(field)
        text = _one_line(field.description or flag_help.get(name) or _SECRETS.get(env))
        if env in policy:
            default = policy[env][0] if default == "unset" and policy[env][0] else default
            text = text or _one_line(policy[env][1])
        yield Row(env=env, type=_type_name(annotation), default=default, description=text)


def _one_line(text: str | None) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


def render(classes: Iterable[type[BaseSettings]]) -> str:
    """Markdown: one section and one table per settings class."""
    parts: list[str] = []
    for cls in classes:
        doc = _one_line((cls.__doc__ or "").strip().split("\n\n")[0])
        parts.append(f"## `{_prefix(cls)}*`: `{cls.__module__}.{cls.__qualname__}`\n")
        if doc:
            parts.append(f"{doc}\n")
        parts.append("| Variable | Type | Default | Meaning |\n|---|---|---|---|")
        parts.extend(
            f"| `{row.env}` | `{row.type}` | `{row.default}` | {row.description} |"
            for row in rows(cls)
        )
        parts.append("")
    if not parts:
        return "*No settings classes found.*\n"
    return "\n".join(parts)


if __name__ == "__main__":
    print(render(settings_classes()))
