"""Places in the queue held for the callers a full queue told a time (pure, no I/O).

A queue refusal names the time a place frees for its caller (:mod:`.reservations`). The
places that free before then go to whoever arrives first: in a crowd, callers that
never waited, so a caller that kept its time met a full queue again and was told a
later one, at the back of the line. A herdless client says who it is (the same
``X-Request-ID`` on every attempt of a call, beside ``X-Herdless-Attempt``), so for its
caller the time is kept: from shortly before it until the caller is back (or
:data:`GRACE` after it, when the caller went elsewhere), newcomers count one place of
the queue as taken. Callers that do not say who they are get the time as advice only.
"""

from __future__ import annotations

import bisect
from typing import Final

__all__ = ["GRACE", "Call", "Holds"]

GRACE: Final = 1.5
"""Seconds a place stays held past its time: a herdless client comes back within a
second of it (its jitter above the server's time); then the place is anyone's."""

Call = tuple[str, str]
"""(key id, the call's ``X-Request-ID``)."""


def _due(item: tuple[float, Call]) -> float:
    return item[0]


class Holds:
    """The held places, each a call's and its time. Not thread-safe.

    Usage::

        holds.promise(("key-1", "req-9"), due=12.0)   # a refusal named 12.0
        holds.held(now=11.8, ahead=0.5)               # 1: a newcomer counts it as taken
        holds.claim(("key-1", "req-9"), now=12.1, ahead=0.5)  # True: back, its own
    """

    __slots__ = ("_due", "_times")

    def __init__(self) -> None:
        self._due: dict[Call, float] = {}
        self._times: list[tuple[float, Call]] = []  # by time: ends past GRACE go first

    def __len__(self) -> int:
        return len(self._due)

    def promise(self, call: Call, due: float) -> None:
        """A refusal told ``call`` to come back at ``due`` (clock time)."""
        self._drop(call)
        self._due[call] = due
        bisect.insort(self._times, (due, call), key=_due)

    def forget(self, call: Call) -> None:
        """``call`` will not come back (its caller went away, or waits no longer): the
        place held for it is anyone's now, not after its grace."""
        self._drop(call)

    def due(self, call: Call) -> float | None:
        """The time held for ``call`` (``None``: none is)."""
        return self._due.get(call)

    def claim(self, call: Call, now: float, ahead: float) -> bool:
        """``call`` is back: whether a place was held for it (its time is at most
        ``ahead`` away, and not past its grace). One that comes earlier is judged like
        anyone else and keeps its hold, at its time, if it is refused (let in, it is
        forgotten: it is in the queue already)."""
        due = self._due.get(call)
        if due is None or due - now > ahead:
            return False
        self._drop(call)
        return now < due + GRACE

    def held(self, now: float, ahead: float) -> int:
        """Places held now: the times within ``ahead`` seconds (a place that frees now
        is the one promised to the caller due before the next frees) or in their grace."""
        times = self._times
        if not times:
            return 0
        gone = bisect.bisect_right(times, now - GRACE, key=_due)
        if gone:
            for _, call in times[:gone]:
                del self._due[call]
            del times[:gone]
        return bisect.bisect_right(times, now + ahead, key=_due)

    def _drop(self, call: Call) -> None:
        due = self._due.pop(call, None)
        if due is None:
            return
        times = self._times
        i = bisect.bisect_left(times, due, key=_due)
        while times[i][1] != call:
            i += 1
        del times[i]
