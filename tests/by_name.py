"""A check for configs built from settings by name (the gateway's and the emulator's)."""

from __future__ import annotations

from typing import get_type_hints

from pydantic_settings import BaseSettings


def assert_built_by_name(config: object, settings: BaseSettings, unnamed: set[str]) -> None:
    """Each field of ``config`` is the setting of its name, of the same type and value,
    but those in ``unnamed``, which no setting names (a renamed setting lands there)."""
    fields = type(settings).model_fields
    hints = get_type_hints(type(config))
    shared = hints.keys() & fields.keys()
    assert hints.keys() - shared == unnamed
    for name in shared:
        assert hints[name] == fields[name].annotation, name
        assert getattr(config, name) == getattr(settings, name), name
