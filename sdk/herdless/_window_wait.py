"""A call's place in a backend's window (``SlotTicket``).

How long it will wait there is ``herdless._turnover.Turnover``'s to say; whether it
waits, is granted a slot or is told to leave is ``herdless._window.Window``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from herdless._turnover import Turnover

__all__ = ["SlotTicket", "TicketState", "Turnover"]

TicketState = Literal["waiting", "granted", "spill", "done"]


class SlotTicket:
    """One call's place at one backend's window.

    ``state`` is ``"granted"`` (it holds a slot), ``"waiting"`` (in the client's queue),
    ``"spill"`` (told to leave: its wait no longer fits) or ``"done"`` (its place was
    given back). ``end`` is the latest time its answer is still useful, ``max_wait`` the
    longest wait it accepts, ``last`` whether no backend follows (it leaves later),
    ``epoch`` the window's round when its slot was granted.
    """

    __slots__ = (
        "_notify",
        "end",
        "epoch",
        "last",
        "max_wait",
        "predicted",
        "refused",
        "sent",
        "sent_at",
        "served",
        "state",
        "told",
    )

    def __init__(self, end: float, max_wait: float, last: bool = False) -> None:
        self.end = end
        self.max_wait = max_wait
        self.last = last
        self.sent_at = 0.0  # when its last attempt went (the window's clock)
        self.served = False  # its call was answered: its release is a completion
        self.predicted: tuple[float, float] | None = None  # (when, wait): the first estimate
        self.told: tuple[float, float, float, int] | None = None
        """The estimate it was told to leave on: wait, answer, margin, samples."""
        self.state: TicketState = "waiting"
        self.epoch = -1  # the window's round when the slot was granted
        self.refused = False  # refused, and waiting to retry in its slot
        self.sent = 0  # the window's count of sends when its last attempt went (0: none)
        self._notify: Callable[[], None] | None = None

    def __repr__(self) -> str:
        return f"SlotTicket(state={self.state!r})"
