"""Sleep mode: put an idle vLLM to sleep, wake it for the next request (``--upstream-sleep``).

vLLM's sleep mode (``--enable-sleep-mode`` with ``VLLM_SERVER_DEV_MODE=1``; CUDA and ROCm
only) keeps the process and frees the GPU: ``POST /sleep?level=1`` offloads the weights
to CPU memory and discards the KV cache, ``POST /wake_up`` brings them back, many times
faster than a reload. A request that reaches a sleeping engine hangs it, so:

* the gate is paused *before* ``/sleep`` is sent, and only when nothing runs or waits:
  from then on nothing starts, and a request that arrives waits in the queue (its
  key's hold) instead of reaching the engine;
* that arrival wakes the engine (``/wake_up``, which answers once awake); the gate is
  unpaused after, and the held requests start in their fair order;
* the engine watcher reads nothing while it sleeps: its empty KV cache is no room.

Every sleep and wake is logged on ``herdless.gateway`` with how long the wake took.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from herdless.gateway.gate import Gate
from herdless.gateway.logs import LOG, event
from herdless.gateway.upstream import Upstream

__all__ = ["Sleeper"]

_WAKE_WITHIN = 300.0  # seconds a wake may take before it is given up (and retried)
_SLEEP_WITHIN = 60.0


class Sleeper:
    """Puts the engine to sleep after ``idle`` seconds without work and wakes it on demand.

    Args:
        upstream: the engine.
        gate: the admission gate (paused while the engine sleeps).
        idle: seconds without a running or waiting request before it sleeps.
        now: monotonic clock.
    """

    def __init__(
        self, upstream: Upstream, gate: Gate, *, idle: float, now: Callable[[], float]
    ) -> None:
        self._upstream = upstream
        self._gate = gate
        self._idle = idle
        self._now = now
        self._busy_at = now()
        self._wanted = asyncio.Event()
        self.sleeps = 0
        """Times the engine was put to sleep."""
        self.last_wake: float | None = None
        """Seconds the last wake took."""
        gate.on_held = self._wanted.set

    def _busy(self) -> bool:
        admission = self._gate.admission
        return bool(admission.inflight or admission.queue_depth)

    async def run(self) -> None:
        """Watch for idleness and wake-ups, for ever."""
        tick = min(1.0, self._idle / 4)
        admission = self._gate.admission
        while True:
            if admission.paused:
                await self._wanted.wait()
                await self._wake()
                continue
            await asyncio.sleep(tick)
            if self._busy() or admission.draining or not admission.upstream_ready:
                self._busy_at = self._now()
            elif self._now() - self._busy_at >= self._idle:
                await self._sleep()

    async def _sleep(self) -> None:
        self._gate.pause()  # first: nothing may start once /sleep is on its way
        if self._busy():  # an arrival in the same tick (it cannot have started)
            self._gate.unpause()
            return
        self._wanted.clear()
        status = await self._upstream.command("/sleep?level=1", within=_SLEEP_WITHIN)
        if status != 200:
            self._gate.unpause()
            self._busy_at = self._now()  # not again at once
            event(LOG, logging.WARNING, "upstream would not sleep", status=status)
            return
        self.sleeps += 1
        event(LOG, logging.INFO, "upstream asleep", idle=self._idle)
        if self._busy():  # a request came while /sleep was under way: it waits
            self._wanted.set()

    async def _wake(self) -> None:
        began = self._now()
        status = await self._upstream.command("/wake_up", within=_WAKE_WITHIN)
        if status != 200:
            event(LOG, logging.WARNING, "upstream would not wake; trying again", status=status)
            await asyncio.sleep(1.0)
            return
        self.last_wake = self._now() - began
        self._wanted.clear()
        self._busy_at = self._now()
        self._gate.unpause()
        event(LOG, logging.INFO, "upstream awake", wake_seconds=round(self.last_wake, 3))
