"""Render every ``HERDLESS_*`` setting, with its default, from the pydantic-settings classes.

The configuration reference page is generated from the code at build time
(``docs/scripts/hooks.py``), so it cannot drift from the defaults the code uses.
Run ``python docs/scripts/config_reference.py`` to print the tables.
"""

from __future__ import annotations

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
    "HERDLESS_FALLBACK_PRICE_INPUT": "the fallback's price per million prompt tokens "
    "(for stats().cost and FallbackPolicy.max_external_cost; set both prices or neither)",
    "HERDLESS_FALLBACK_PRICE_OUTPUT": "the fallback's price per million completion tokens",
    "HERDLESS_DEADLINE": "seconds for a whole call, waits and fallback included (a stream: "
    "until its first chunk)",
    "HERDLESS_STREAM_DEADLINE": "seconds from a streamed call's start to the stream's end; "
    "unset: no limit (Timeouts.read bounds each silence)",
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
        from herdless._config import DEFAULT_DEADLINE
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
    return sorted(found.values(), key=_order)


def _order(cls: type[BaseSettings]) -> tuple[int, str, str]:
    """The SDK first, then the commands in the order of ``_TITLES``, then the rest."""
    titles = list(_TITLES)
    prefix = _prefix(cls)
    rank = titles.index(prefix) if prefix in titles else len(titles)
    return rank, prefix, cls.__qualname__


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
        text = _one_line(field.description)
        if env in policy:
            default = policy[env][0] if default == "unset" and policy[env][0] else default
            text = text or _one_line(policy[env][1])
        yield Row(env=env, type=_type_name(annotation), default=default, description=text)


def _one_line(text: str | None) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


# Each section's title: what reads these variables, by its public name (never the
# module that happens to define the settings class).
_TITLES = {
    "HERDLESS_": "The SDK: `herdless.Client` and `herdless.AsyncClient`",
    "HERDLESS_GATEWAY_": "The gateway: `herdless serve`",
    "HERDLESS_EMULATOR_": "The emulator: `herdless emulate`",
    "HERDLESS_DEMO_": "The demo: `herdless demo`",
    "HERDLESS_BENCH_": "The benchmarks: `herdless bench`",
}
_LEADS = {
    "HERDLESS_": "Read by `Client()` / `AsyncClient()` when no `primary` is given, and by "
    "`Client.from_env()`.",
}
# Variables that are a policy's fields under a prefix: their own table, with the field.
_POLICY_GROUPS = {
    "HERDLESS_": (
        ("HERDLESS_RETRY_", "Retries", "RetryPolicy"),
        ("HERDLESS_BREAKER_", "Circuit breaker", "BreakerPolicy"),
    ),
}


def env_code(env: str) -> str:
    """A variable name as inline code that wraps only after an underscore, never inside
    a word (``<wbr>`` marks where; the page's CSS forbids other breaks)."""
    return '<code class="herdless-env">' + env.replace("_", "_<wbr>") + "</code>"


def _title(cls: type[BaseSettings]) -> str:
    prefix = _prefix(cls)
    return _TITLES.get(prefix, cls.__name__) + f" (`{prefix}*`)"


def _table(rows_: Iterable[Row], field_prefix: str | None = None) -> list[str]:
    if field_prefix is None:
        lines = ["| Variable | Type | Default | Meaning |", "|---|---|---|---|"]
        lines += [
            f"| {env_code(r.env)} | `{r.type}` | `{r.default}` | {r.description} |" for r in rows_
        ]
        return lines
    lines = ["| Variable | Field | Type | Default | Meaning |", "|---|---|---|---|---|"]
    lines += [
        f"| {env_code(r.env)} | `{r.env.removeprefix(field_prefix).lower()}` | `{r.type}` "
        f"| `{r.default}` | {r.description} |"
        for r in rows_
    ]
    return lines


def render(classes: Iterable[type[BaseSettings]]) -> str:
    """Markdown: one section per settings class, headed by what reads it; a policy's
    fields in a table of their own, with the field each variable sets."""
    parts: list[str] = []
    for cls in classes:
        prefix = _prefix(cls)
        doc = _LEADS.get(prefix) or _one_line((cls.__doc__ or "").strip().split("\n\n")[0])
        parts.append(f"## {_title(cls)}\n")
        if doc:
            parts.append(f"{doc}\n")
        all_rows = list(rows(cls))
        groups = _POLICY_GROUPS.get(prefix, ())
        plain = [r for r in all_rows if not any(r.env.startswith(g[0]) for g in groups)]
        parts += [*_table(plain), ""]
        for group_prefix, name, policy in groups:
            grouped = [r for r in all_rows if r.env.startswith(group_prefix)]
            if not grouped:
                continue
            parts.append(f"### {name}: `{group_prefix}*`\n")
            # The example shows the rule where it reads oddly: a field whose name
            # starts like the prefix's last word (RETRY_ + retry_after_jitter).
            word = group_prefix.removeprefix("HERDLESS_")
            example = next(
                (r.env for r in grouped if r.env.removeprefix(group_prefix).startswith(word)),
                grouped[0].env,
            )
            field = example.removeprefix(group_prefix).lower()
            parts.append(
                f"Each variable is `{group_prefix}` followed by a field of "
                f"[`herdless.{policy}`](api.md#herdless.{policy}), in capitals: "
                f"`{field}` is `{example}`. Unset, the field keeps the default shown.\n"
            )
            parts += [*_table(grouped, group_prefix), ""]
    if not parts:
        return "*No settings classes found.*\n"
    return "\n".join(parts)


if __name__ == "__main__":
    print(render(settings_classes()))
