"""A virtual-time asyncio event loop: the clock jumps to the next timer instead of waiting.

The herd scenario runs unmodified client code (the official openai client's
retry loop, tenacity, herdless) against an in-process server. Real time on a busy
2-core machine would blur exactly what we measure: a thousand callers retrying
in the same millisecond cannot be told apart from CPU queueing. On this loop,
``asyncio.sleep(3)`` costs no wall time and ends exactly 3 virtual seconds
later, so arrival times are those the clients *chose*, and a run is
reproducible from its seed.

How: the loop's ``time()`` returns a virtual clock, and its selector, asked to
block for ``timeout`` seconds, advances that clock by ``timeout`` and returns no
events. Only in-process work may run on it (no sockets): real I/O would never
be waited for. Work handed to a thread (``run_in_executor``, ``asyncio.to_thread``:
the openai client looks up the platform that way on its first request) is
waited for in real time with the clock stopped, as if it took no time; jumping
ahead meanwhile would fire every timer, deadlines included, before the thread's
answer. A loop that would block forever with nothing scheduled is a deadlock and
raises instead of hanging.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from typing import Any, TypeVar, TypeVarTuple

__all__ = ["VirtualClock", "VirtualTimeLoop", "run_virtual"]

_T = TypeVar("_T")
_Ts = TypeVarTuple("_Ts")
_REAL_WAIT_LIMIT = 30.0  # seconds of real time a thread may take before we call it a deadlock


class _Selector(selectors.DefaultSelector):
    """Polls real events without blocking; a wait becomes a jump of the virtual clock."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.threads = 0  # executor jobs not yet finished

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events = super().select(0)
        if events or (timeout is not None and timeout <= 0):
            return events
        if timeout is None or self.threads:
            # Only another thread can wake the loop now (an executor job is running,
            # or no timer is set): wait for it in real time, clock stopped, not forever.
            events = super().select(_REAL_WAIT_LIMIT)
            if not events:
                raise RuntimeError(
                    f"virtual-time loop: a thread has not answered in {_REAL_WAIT_LIMIT:g} s"
                    if self.threads
                    else "virtual-time loop would block forever: nothing is scheduled"
                )
            return events
        self.now += timeout
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose ``time()`` only moves when every task is waiting on a timer."""

    def __init__(self) -> None:
        self._vselector = _Selector()
        super().__init__(self._vselector)

    def time(self) -> float:
        return self._vselector.now

    def run_in_executor(
        self, executor: Executor | None, func: Callable[[*_Ts], _T], *args: *_Ts
    ) -> asyncio.Future[_T]:
        future = super().run_in_executor(executor, func, *args)
        self._vselector.threads += 1
        future.add_done_callback(self._thread_done)
        return future

    def _thread_done(self, _: asyncio.Future[Any]) -> None:
        self._vselector.threads -= 1


class VirtualClock:
    """A ``herdless._clock.Clock`` that reads the running virtual loop's time."""

    __slots__ = ("_loop",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def monotonic(self) -> float:
        return self._loop.time()


def run_virtual(main: Coroutine[Any, Any, _T]) -> _T:
    """Run ``main`` to completion on a fresh :class:`VirtualTimeLoop` and close it."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(main)
