"""The loop that runs a call flow: one shape for ``Client``, ``AsyncClient`` and the tests.

The flow (``herdless._call.flow``) yields actions and is resumed with what each came to
(``herdless._actions.Resume``); a driver only says how it performs each kind, through a
``Performer`` (``AsyncPerformer`` for the async client), whose methods give each
action's resume type exactly::

    Send     -> perform it                  -> its Outcome
    Sleep    -> wait its seconds            -> None
    SlotWait -> wait to be woken, or time   -> None
    Race     -> start its send, wait for    -> the Ended send, or None: time ran out
                the first that ends

The events the flow emitted are handed over (``deliver``) before every action, so a hook
hears of a wait before it starts, and once more at the end. A race's sends still running
when the flow yields anything but a ``Race``, or ends, are closed (``cancel``); the flow
is closed too when the driver stops early (an exception, a cancelled task), so that it
gives back what it holds.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Protocol, TypeVar

from herdless._actions import Action, Ended, Outcome, Race, Resume, Send, Sleep, SlotWait

__all__ = ["AsyncPerformer", "Performer", "adrive", "drive"]

T = TypeVar("T")


class Performer(Protocol):
    """How a synchronous driver performs each action (``drive``)."""

    def deliver(self) -> None:
        """Hand the flow's events so far to whoever listens."""

    def send(self, send: Send, /) -> Outcome:
        """Perform one attempt; its outcome."""

    def sleep(self, seconds: float, /) -> None:
        """Wait ``seconds``."""

    def slot_wait(self, wait: SlotWait, /) -> None:
        """Wait until ``wait.listen`` wakes the driver, at most ``wait.timeout`` seconds."""

    def race(self, race: Race, /) -> Ended | None:
        """Start ``race.send`` (if any) beside the running sends; the first that ends, or
        ``None`` once ``race.timeout`` passed."""

    def cancel(self) -> None:
        """Close the sends of a race still running (none: nothing to do)."""


class AsyncPerformer(Protocol):
    """How the asyncio driver performs each action (``adrive``)."""

    async def deliver(self) -> None:
        """Hand the flow's events so far to whoever listens."""

    async def send(self, send: Send, /) -> Outcome:
        """Perform one attempt; its outcome."""

    async def sleep(self, seconds: float, /) -> None:
        """Wait ``seconds``."""

    async def slot_wait(self, wait: SlotWait, /) -> None:
        """Wait until ``wait.listen`` wakes the driver, at most ``wait.timeout`` seconds."""

    async def race(self, race: Race, /) -> Ended | None:
        """Start ``race.send`` (if any) beside the running sends; the first that ends, or
        ``None`` once ``race.timeout`` passed."""

    async def cancel(self) -> None:
        """Close the sends of a race still running (none: nothing to do)."""


def drive(steps: Generator[Action, Resume, T], performer: Performer) -> T:
    """Run the flow's ``steps`` to their end with ``performer``; their result."""
    try:
        action = next(steps)
        while True:
            performer.deliver()
            resumed: Resume = None
            if isinstance(action, Send):
                resumed = performer.send(action)
            elif isinstance(action, Sleep):
                performer.sleep(action.seconds)
            elif isinstance(action, SlotWait):
                performer.slot_wait(action)
            else:
                action = steps.send(performer.race(action))
                if not isinstance(action, Race):
                    performer.cancel()  # the flow waits for none of them any more
                continue
            action = steps.send(resumed)
    except StopIteration as stop:
        result: T = stop.value
        return result
    finally:
        performer.cancel()
        steps.close()  # stopped early (KeyboardInterrupt): free what the flow holds
        performer.deliver()


async def adrive(steps: Generator[Action, Resume, T], performer: AsyncPerformer) -> T:
    """``drive``, for the asyncio driver: the same loop, awaited."""
    try:
        action = next(steps)
        while True:
            await performer.deliver()
            resumed: Resume = None
            if isinstance(action, Send):
                resumed = await performer.send(action)
            elif isinstance(action, Sleep):
                await performer.sleep(action.seconds)
            elif isinstance(action, SlotWait):
                await performer.slot_wait(action)
            else:
                action = steps.send(await performer.race(action))
                if not isinstance(action, Race):
                    await performer.cancel()  # the flow waits for none of them any more
                continue
            action = steps.send(resumed)
    except StopIteration as stop:
        result: T = stop.value
        return result
    finally:
        await performer.cancel()
        steps.close()  # cancelled mid-call: free what the flow holds
        await performer.deliver()
