"""Time, injected: every policy reads a ``Clock``; nothing reads ``time`` directly."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """A monotonic clock in float seconds. Deadlines and windows use only this."""

    def monotonic(self) -> float: ...


class SystemClock:
    """The real monotonic clock."""

    __slots__ = ()

    def monotonic(self) -> float:
        return time.monotonic()

    def __repr__(self) -> str:
        return "SystemClock()"


SYSTEM_CLOCK = SystemClock()
