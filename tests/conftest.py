"""Shared fixtures. HERDLESS_* variables are cleared for every test: pydantic-settings
reads the environment, and a developer's shell must not change test results."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def clean_environ() -> Iterator[None]:
    saved = dict(os.environ)
    for key in list(os.environ):
        if key.startswith("HERDLESS_"):
            del os.environ[key]
    yield
    os.environ.clear()
    os.environ.update(saved)
