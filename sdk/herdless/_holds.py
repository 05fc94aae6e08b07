"""Backend holds: a backend kept off for every call of the client, until a time.

A backend's Retry-After (or drain signal) is a statement about the backend, not
about the one call that received it: it holds the backend for every call of the client
until it elapses. Calls in that time do not hit that backend; the flow makes them wait
(with their own jitter above the server's time) or go to the fallback. One
``BackendHolds`` per client, never global; one lock makes it safe across threads and
tasks.
"""

from __future__ import annotations

import threading

from herdless._clock import Clock

__all__ = ["BackendHolds"]


class BackendHolds:
    """Per-backend "do not send before" times, shared by all calls of one client.

    >>> from herdless.testing import FakeClock
    >>> clock = FakeClock()
    >>> holds = BackendHolds(clock=clock)
    >>> holds.hold("primary", 2.0)
    >>> clock.advance(0.5)
    >>> holds.held("primary")
    (1.5, False)
    """

    __slots__ = ("_clock", "_lock", "_until")

    def __init__(self, *, clock: Clock) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._until: dict[str, tuple[float, bool]] = {}  # backend -> (until, draining)

    def hold(self, backend: str, seconds: float, *, draining: bool = False) -> None:
        """Keep calls off ``backend`` for ``seconds`` from now. A later end wins; a drain
        signal sticks until its hold ends."""
        with self._lock:
            until = self._clock.monotonic() + max(0.0, seconds)
            old_until, old_draining = self._until.get(backend, (0.0, False))
            still_draining = old_draining and old_until > self._clock.monotonic()
            self._until[backend] = (max(until, old_until), draining or still_draining)

    def held(self, backend: str, now: float | None = None) -> tuple[float, bool]:
        """``(seconds left, draining)`` for ``backend`` at ``now`` (the clock's when not
        given); ``(0.0, False)`` when not held."""
        if not self._until:  # never held: the common case, asked once per attempt
            return (0.0, False)
        with self._lock:
            until, draining = self._until.get(backend, (0.0, False))
            left = until - (self._clock.monotonic() if now is None else now)
            return (left, draining) if left > 0 else (0.0, False)

    def __repr__(self) -> str:
        return f"BackendHolds(backends={sorted(self._until)!r})"
