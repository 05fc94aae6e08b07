"""A call's place in a backend's window (``SlotTicket``), and how long it will wait
there (``Turnover``).

**How long a waiter will wait.** Slots free at the rate measured over the last
``_RATE_SAMPLES`` releases, ``rate = (n - 1) / (now - the first of them)`` (measured to
*now*, so that a backend that stops answering reads as slower and slower), so the
waiter at position ``p`` (0 = next) expects::

    wait = (p + 1 + max(0, in_use - size)) / rate

and then its own answer (``answer``: an EWMA of the time from sending an attempt to its
accepted answer; for a stream, its first chunk). A waiter whose ``now + wait + answer``
passes the time it may stay (its deadline, less the reserve kept for a fallback), or
whose ``wait`` passes its patience, does not fit (``herdless._window.Window`` tells it to
leave). Until two releases and an answer are measured the estimate is unknown and
everyone fits: a call that hoped wrongly leaves when its time runs out, never later.

Pure, no lock of its own: the window calls it under its lock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Literal

__all__ = ["SlotTicket", "TicketState", "Turnover"]

# Weight of the newest sample in the answer EWMA: about the last ten answers.
_EWMA = 0.2
# Releases the rate is measured over: several rounds of a GPU that finishes a whole batch
# at once, few enough to follow a change within seconds.
_RATE_SAMPLES = 32

TicketState = Literal["waiting", "granted", "spill", "done"]


class SlotTicket:
    """One call's place at one backend's window.

    ``state`` is ``"granted"`` (it holds a slot), ``"waiting"`` (in the client's queue),
    ``"spill"`` (told to leave: its wait no longer fits) or ``"done"`` (its place was
    given back). ``end`` is the latest time its answer is still useful, ``max_wait`` the
    longest wait it accepts, ``epoch`` the window's round when its slot was granted.
    """

    __slots__ = ("_notify", "end", "epoch", "max_wait", "refused", "sent", "state")

    def __init__(self, end: float, max_wait: float) -> None:
        self.end = end
        self.max_wait = max_wait
        self.state: TicketState = "waiting"
        self.epoch = -1  # the window's round when the slot was granted
        self.refused = False  # refused, and waiting to retry in its slot
        self.sent = 0  # the window's count of sends when its last attempt went (0: none)
        self._notify: Callable[[], None] | None = None

    def __repr__(self) -> str:
        return f"SlotTicket(state={self.state!r})"


class Turnover:
    """How fast one backend's window turns over: when its slots were freed, and how long
    its answers take (seconds, the window's clock)."""

    __slots__ = ("_freed", "answer")

    def __init__(self) -> None:
        self._freed: deque[float] = deque(maxlen=_RATE_SAMPLES)  # when slots were freed
        self.answer: float | None = None
        """An EWMA of the time from sending an attempt to its accepted answer."""

    def freed(self, now: float) -> None:
        """A slot was freed at ``now``."""
        self._freed.append(now)

    def answered(self, elapsed: float) -> None:
        """An attempt was answered with success after ``elapsed`` seconds."""
        answer = self.answer
        self.answer = elapsed if answer is None else answer + _EWMA * (elapsed - answer)

    @property
    def measured(self) -> bool:
        """Whether a wait can be estimated: two releases and an answer are known."""
        return self.answer is not None and len(self._freed) > 1

    def wait(self, slots: float, now: float) -> float | None:
        """Seconds until ``slots`` more slots are freed, at the measured rate; ``None``
        before two releases are known."""
        freed = self._freed
        if len(freed) < 2 or now <= freed[0]:
            return None
        return slots / ((len(freed) - 1) / (now - freed[0]))

    def fits(self, ticket: SlotTicket, wait: float | None, now: float) -> bool:
        """Whether ``ticket``'s call, ``wait`` seconds from a slot, still fits: its wait
        within its patience, and its answer (``now + wait + answer``) before its end."""
        if wait is None or self.answer is None:
            return True  # nothing measured: no grounds to send anyone away
        return wait <= ticket.max_wait and now + wait + self.answer <= ticket.end
