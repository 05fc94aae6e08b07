"""Test doubles for code that uses herdless: a fake clock, scripted backends, a pytest plugin.

- ``FakeClock``: a monotonic clock that moves only when told to (inject it as ``clock=``,
  its ``sleep`` / ``asleep`` as ``sleep=``).
- ``MockBackend`` and its replies (``ok``, ``rate_limited``, ``hang``, ...): backends
  scripted on a respx router (``herdless.testing.mock``).
- ``herdless.testing.pytest_plugin``: fixtures for both (``herdless_clock``,
  ``herdless_rng``, ``herdless_env``, ``herdless_backends``).

Nothing here starts a process or imports the server extras; real emulators, gateways
and vLLM are started by ``herdless.launch``.
"""

from __future__ import annotations

# As asyncio's __init__ does: the names are mock's ``__all__``, written once, there.
from herdless.testing import mock
from herdless.testing.mock import *  # noqa: F403

__all__ = ["FakeClock", *mock.__all__]


class FakeClock:
    """A monotonic clock that only moves when told to.

    >>> clock = FakeClock()
    >>> clock.advance(1.5)
    >>> clock.monotonic()
    1001.5
    """

    __slots__ = ("_now",)

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start

    def monotonic(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (must not be negative)."""
        if seconds < 0:
            raise ValueError(f"seconds must be >= 0, got {seconds!r}")
        self._now += seconds

    def sleep(self, seconds: float) -> None:
        """A ``sleep`` to inject into a sync driver: advances instead of waiting."""
        self.advance(max(0.0, seconds))

    async def asleep(self, seconds: float) -> None:
        """An async ``sleep`` to inject into an async driver."""
        self.advance(max(0.0, seconds))

    def __repr__(self) -> str:
        return f"FakeClock(now={self._now!r})"
