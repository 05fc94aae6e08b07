"""Render every ``HERDLESS_*`` setting, with its default, from the pydantic-settings classes.

The configuration reference page is generated from the code at build time
(``docs/scripts/hooks.py``), so it cannot drift from the defaults the code uses.
Run ``python docs/scripts/config_reference.py`` to print the tables.
"""

from __future__ import annotations

import importlib
import pkgutil
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
    return text.replace(" | ", " or ")


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
        yield Row(
            env=env,
            type=_type_name(annotation),
            default=_default(field),
            description=_one_line(field.description),
        )


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
