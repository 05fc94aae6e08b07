"""The asyncio driver of the pure engine: one timer, and a wake-up per waiting stream.

The engine says when its step in flight ends; the driver sets one ``call_at``
timer for that moment, calls :meth:`Engine.advance` when it fires and wakes the
streams whose sequence progressed. No task per step, no polling. A stream waits
on a per-sequence future rather than an ``asyncio.Queue``: the engine keeps the
count of generated tokens and a token's text is a pure function of its index,
so a counter is the whole queue (one future per wake instead of one item per
token).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from herdless.emulator.engine import Engine, KVCacheExhausted, SeqState, Sequence

__all__ = ["Driver"]

log = logging.getLogger("herdless.emulator")


class Driver:
    """Runs ``engine`` on the running event loop's clock.

    Args:
        engine: the scheduler to drive.
        on_fatal: called when the engine dies (``--on-kv-exhausted crash``).
    """

    __slots__ = ("_live", "_loop", "_on_fatal", "_timer", "engine")

    def __init__(self, engine: Engine, *, on_fatal: Callable[[BaseException], None]) -> None:
        self.engine = engine
        self._on_fatal = on_fatal
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | asyncio.Handle | None = None
        # Sequences submitted and not finished, for abort_all (maintenance).
        self._live: set[Sequence] = set()

    def now(self) -> float:
        return self._get_loop().time()

    def submit(self, seq: Sequence) -> None:
        """Queue ``seq`` and make sure a step is coming."""
        self.engine.add(seq, self.now())
        self._live.add(seq)
        if self._timer is None:
            # Idle engine: schedule a tick right away; it starts the first step.
            self._timer = self._get_loop().call_soon(self._tick)

    def abort(self, seq: Sequence) -> None:
        """Abort ``seq`` (client gone) and free its KV at once. Idempotent."""
        self.engine.abort(seq, self.now())
        self._live.discard(seq)
        _wake(seq)

    def abort_all(self) -> None:
        """Abort every live sequence (the model is going away)."""
        for seq in list(self._live):
            self.abort(seq)

    async def wait(self, seq: Sequence, upto: int) -> None:
        """Return once ``seq`` has at least ``upto`` tokens or has finished."""
        if seq.generated >= upto or seq.state is SeqState.FINISHED:
            return
        fut = self._get_loop().create_future()
        seq.waiter, seq.wake_at = fut, upto
        try:
            await fut
        finally:
            seq.waiter = None

    def close(self) -> None:
        """Cancel the timer (the server is shutting down)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _get_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def _tick(self) -> None:
        self._timer = None
        loop = self._get_loop()
        try:
            progressed = self.engine.advance(loop.time())
        except KVCacheExhausted as exc:
            log.error("engine died: %s", exc)
            self._on_fatal(exc)
            return
        for seq in progressed:
            if seq.state is SeqState.FINISHED:
                self._live.discard(seq)
                _wake(seq)
            elif seq.generated >= seq.wake_at:
                _wake(seq)
        deadline = self.engine.next_deadline()
        if deadline is not None:
            self._timer = loop.call_at(deadline, self._tick)


def _wake(seq: Sequence) -> None:
    fut = seq.waiter
    if isinstance(fut, asyncio.Future) and not fut.done():
        fut.set_result(None)
