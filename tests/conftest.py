"""Shared fixtures. HERDLESS_* variables are cleared for every test: pydantic-settings
reads the environment, and a developer's shell must not change test results."""

from __future__ import annotations

import gc
import importlib.util
import os
from collections.abc import Iterator

import pytest

# vllm_server / vllm_url for tests/contract and tests/vllm: one real vLLM per session.
pytest_plugins = ["herdless.launch.vllm_pytest"]

# The `tests(core)` nox session installs the SDK without the server extras: the
# folders that import starlette/uvicorn at module level cannot even be collected.
collect_ignore: list[str] = []
if importlib.util.find_spec("starlette") is None:  # pragma: no cover -- only in tests(core)
    collect_ignore += [
        "gateway",
        "emulator",
        "integration",
        "contract",
        "vllm",
        "demo",
        "bench",
        "faults",
        "fuzz",
    ]


@pytest.fixture(autouse=True)
def clean_environ() -> Iterator[None]:
    saved = dict(os.environ)
    for key in list(os.environ):
        if key.startswith("HERDLESS_"):
            del os.environ[key]
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(autouse=True)
def collect_what_a_real_test_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that talks to real processes, collect the garbage it left: a socket it
    did not close then fails that test (pytest turns the ``ResourceWarning`` into an
    error), not whichever test or end of session the collector happens to run in."""
    yield
    if any(request.node.get_closest_marker(m) for m in ("integration", "vllm", "clients")):
        gc.collect()
