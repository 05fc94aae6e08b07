"""What one emulated server holds: engine, driver, faults, and whether it is serving.

``Control`` is the seam to the listening socket (``server.py`` closes and
reopens it); in-process tests use :class:`NoListener`, which only records.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections.abc import Callable
from typing import Literal, Protocol

from herdless.emulator.driver import Driver
from herdless.emulator.engine import Engine
from herdless.emulator.faults import FaultActions, Faults, MetricsOutage
from herdless.emulator.settings import EmulatorSettings
from herdless.emulator.sleep import Sleep

__all__ = ["Control", "EmulatorState", "NoListener", "exit_now"]

log = logging.getLogger("herdless.emulator")

CRASH_STATUS = 70  # EX_SOFTWARE: the engine died

_OUTAGE_WORDS = {"error": "answers 500", "stall": "does not answer"}


def exit_now() -> None:
    """End the process at once, as a crashed vLLM would: no cleanup, no goodbye."""
    logging.shutdown()  # flush the log file first: it is how a test sees why
    os._exit(CRASH_STATUS)


class Control(Protocol):
    """The listening socket, as seen by the faults."""

    def refuse_for(self, seconds: float) -> None:
        """Close the listening socket now and reopen it ``seconds`` later."""

    def reopen(self) -> None:
        """Reopen the listening socket now if it is closed."""

    def drop_connections(self) -> None:
        """Close every open connection, as a dying process would."""


class NoListener:
    """A ``Control`` for in-process tests: records what was asked."""

    __slots__ = ("dropped", "refusals", "reopened")

    def __init__(self) -> None:
        self.refusals: list[float] = []
        self.reopened = 0
        self.dropped = 0

    def refuse_for(self, seconds: float) -> None:
        self.refusals.append(seconds)

    def reopen(self) -> None:
        self.reopened += 1

    def drop_connections(self) -> None:
        self.dropped += 1


class EmulatorState:
    """The server's mutable state, shared by its routes.

    Args:
        settings: the server's settings.
        control: the listening socket's control.
        crash: ends the process (replaced in tests).
    """

    def __init__(
        self,
        settings: EmulatorSettings,
        *,
        control: Control | None = None,
        crash: Callable[[], None] = exit_now,
    ) -> None:
        self.settings = settings
        self.engine = Engine(settings.engine_config())
        self.driver = Driver(self.engine, on_fatal=self._engine_died)
        self.faults: Faults = settings.faults()
        self.rng = random.Random(settings.seed)
        self.control: Control = control or NoListener()
        self.crash = crash
        self.serving = True
        self.sleep = Sleep(settings.wake_time)
        """vLLM's sleep mode (``/sleep``, ``/wake_up``, ``/is_sleeping``)."""
        self.control_port: int | None = None  # serves /_emulator/ only; set by server.py
        self._resume: asyncio.TimerHandle | None = None
        # The /metrics fault in progress: "error", "stall" or None; set when it begins,
        # back to None (and the stalled scrapes let go) when it ends.
        self.metrics_outage: Literal["error", "stall"] | None = None
        self._metrics_back = asyncio.Event()
        self._metrics_end: asyncio.TimerHandle | None = None

    def _engine_died(self, exc: BaseException) -> None:
        # The process is about to end; should ``crash`` return (in tests), nobody may wait
        # forever on a dead engine.
        self.crash()
        self.serving = False
        self.driver.abort_all()

    async def apply_later(self, faults: Faults, actions: FaultActions) -> None:
        """:meth:`apply`, as a background task that runs after the answer is sent."""
        self.apply(faults, actions)

    def apply(self, faults: Faults, actions: FaultActions) -> None:
        """Set the steady faults and run the one-shot actions."""
        self.faults = faults
        log.warning("faults set: %s", faults.as_json() if faults.active else "none")
        if actions.crash:
            log.error("fault: crashing now")
            self.crash()
            return
        if actions.maintenance_for is not None:
            self.begin_maintenance(actions.maintenance_for)
        if actions.refuse_for is not None:
            log.warning("fault: refusing connections for %.3f s", actions.refuse_for)
            self.control.refuse_for(actions.refuse_for)
        if (outage := actions.metrics_outage()) is not None:
            self.begin_metrics_outage(outage)

    def clear(self) -> None:
        """Clear the steady faults; end a refusal, maintenance or /metrics window early."""
        self.faults = Faults()
        self.control.reopen()
        if self._resume is not None:
            self._resume.cancel()
            self.end_maintenance()
        self.end_metrics_outage()

    def begin_metrics_outage(self, outage: MetricsOutage) -> None:
        """``GET /metrics`` fails or stalls for ``outage.seconds`` from now; a window in
        progress ends first (its stalled scrapes are answered)."""
        self.end_metrics_outage()
        log.warning("fault: /metrics %s for %.3f s", _OUTAGE_WORDS[outage.mode], outage.seconds)
        self.metrics_outage = outage.mode
        self._metrics_back = asyncio.Event()
        self._metrics_end = asyncio.get_running_loop().call_later(
            outage.seconds, self.end_metrics_outage
        )

    def end_metrics_outage(self) -> None:
        """End the ``/metrics`` fault now, if one is on: stalled scrapes are answered."""
        if self._metrics_end is not None:
            self._metrics_end.cancel()
            self._metrics_end = None
        if self.metrics_outage is None:
            return
        self.metrics_outage = None
        self._metrics_back.set()
        log.warning("/metrics answers again")

    async def metrics_back(self) -> None:
        """Return when the ``/metrics`` fault in progress ends (at once if none is on)."""
        if self.metrics_outage is not None:
            await self._metrics_back.wait()

    def begin_maintenance(self, seconds: float) -> None:
        """Model swap: drop everything in flight, stop serving, come back after ``seconds``."""
        log.warning("maintenance: not serving for %.3f s", seconds)
        self.serving = False
        self.control.refuse_for(seconds)
        self.driver.abort_all()
        self.control.drop_connections()
        if self._resume is not None:
            self._resume.cancel()
        self._resume = asyncio.get_running_loop().call_later(seconds, self.end_maintenance)

    def end_maintenance(self) -> None:
        self._resume = None
        self.serving = True
        log.warning("maintenance over: serving again")
