"""Time, injected: every policy and the call flow read a ``Clock``. Only the drivers read
``time`` themselves, for the real-time limits of their sockets (``herdless._sockets``),
and ``ClientState`` the wall clock, for an HTTP-date ``Retry-After``."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """A monotonic clock in float seconds. Deadlines and windows use only this."""

    def monotonic(self) -> float: ...


class SystemClock:
    """The real monotonic clock."""

    __slots__ = ()

    # The C function itself, not a method that calls it: it is read several times a call.
    monotonic = staticmethod(time.monotonic)

    def __repr__(self) -> str:
        return "SystemClock()"


SYSTEM_CLOCK = SystemClock()
