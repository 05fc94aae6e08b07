"""A pytest plugin for apps that use herdless: fixtures to test your own fallback paths.

Enabled automatically when herdless is installed (entry point ``pytest11``), or
with ``-p herdless.testing.pytest_plugin``. Fixtures:

- ``herdless_clock``: a :class:`~herdless.testing.FakeClock`; pass it as
  ``clock=`` and its ``sleep``/``asleep`` as ``sleep=`` so waits cost nothing.
- ``herdless_rng``: a ``random.Random(0)``, for exact, repeatable backoff delays.
- ``herdless_env``: removes every ``HERDLESS_*`` variable for the test and
  returns a function to set some (``herdless_env(PRIMARY_URL="http://gpu.test/v1")``).
- ``herdless_backends``: a started respx router; call it with a base URL to get a
  :class:`~herdless.testing.MockBackend` to script.

Example::

    from herdless.testing import rate_limited, ok

    def test_my_endpoint_survives_a_full_gpu(herdless_backends, herdless_clock):
        gpu = herdless_backends("http://gpu.test/v1").script(rate_limited(1.0), ok("hi"))
        ...

respx is imported only when ``herdless_backends`` is used, so the plugin costs
nothing in projects that do not use it.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator

import pytest

from herdless.testing import FakeClock
from herdless.testing.mock import MockBackend

__all__ = ["herdless_backends", "herdless_clock", "herdless_env", "herdless_rng"]

ENV_PREFIX = "HERDLESS_"


@pytest.fixture
def herdless_clock() -> FakeClock:
    """A fake monotonic clock that only moves when the client sleeps or you ``advance`` it."""
    return FakeClock()


@pytest.fixture
def herdless_rng() -> random.Random:
    """A seeded random source: backoff delays are the same on every run."""
    return random.Random(0)


@pytest.fixture
def herdless_env(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """Clear ``HERDLESS_*`` from the environment; return a setter that adds the prefix."""
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)

    def set_env(**values: str) -> None:
        for name, value in values.items():
            monkeypatch.setenv(f"{ENV_PREFIX}{name.upper()}", value)

    return set_env


@pytest.fixture
def herdless_backends() -> Iterator[Callable[..., MockBackend]]:
    """Mock HTTP for the test (``httpx`` only; unmocked hosts fail loudly) and return a
    factory: ``herdless_backends(base_url, model="...") -> MockBackend``."""
    import respx  # lazily: respx is a test dependency of your project, not of herdless

    with respx.mock(assert_all_called=False) as router:

        def backend(base_url: str, *, model: str = "mock-model") -> MockBackend:
            return MockBackend(router, base_url, model=model)

        yield backend
