"""A call's place in a backend's window (``SlotTicket``), and the line of the calls that
wait for one (``WaitingLine``, a base of ``herdless._window.Window``).

How long a call will wait is ``herdless._turnover.Turnover``'s to say; the line hands
free slots to the oldest waiters and tells those whose best case no longer fits to
leave: at every release, and once each clump of answers is over (``review``: the first
waiter is woken to run it, since no release may come for a while after a clump).
"""

from __future__ import annotations

import bisect
import math
import threading
from collections import deque
from collections.abc import Callable
from typing import Literal

from herdless._clock import Clock
from herdless._turnover import Turnover

__all__ = ["SlotTicket", "TicketState", "Turnover", "WaitingLine"]

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


class WaitingLine:
    """The client's line at one backend's window: who waits, who is told to leave, and
    what the window expects of their waits (``herdless._turnover``). A base of
    ``herdless._window.Window``, which owns the state named below and the lock every
    method here holds or is called under (methods with a leading underscore)."""

    __slots__ = ("_reviewed", "_sentinel", "_waiting")

    _clock: Clock
    _lock: threading.Lock
    _in_use: int
    _size: float
    _whole: float
    _threshold: float
    _ceiling: float
    _failed_at: float
    _patience: float
    _turnover: Turnover
    _reviewed: float  # the clump the waiters were last reviewed after
    _sentinel: SlotTicket | None  # the waiter woken to review them
    _waiting: deque[SlotTicket]  # first come, first served

    def _grant(self, ticket: SlotTicket) -> None:
        raise NotImplementedError  # the window's

    @staticmethod
    def _wake(ticket: SlotTicket) -> None:
        raise NotImplementedError  # the window's

    def expected_wait(self, position: int) -> float | None:
        """Seconds until the waiter at ``position`` (0 = next) gets a slot; ``None``
        before anything is measured."""
        with self._lock:
            return self._wait_for(position, self._clock.monotonic())

    def position(self, ticket: SlotTicket) -> int:
        """``ticket``'s place in the client's line (0 = next); 0 when it does not wait."""
        with self._lock:
            return self._waiting.index(ticket) if ticket.state == "waiting" else 0

    def estimate(self, ticket: SlotTicket) -> tuple[float, float, float, int] | None:
        """What the window expects of ``ticket``'s wait: ``(wait, answer, margin,
        samples)``, the one it was told to leave on if it was; ``None`` before anything
        is measured."""
        with self._lock:
            if ticket.told is not None:
                return ticket.told
            position = self._waiting.index(ticket) if ticket.state == "waiting" else 0
            return self._estimate(ticket, position, self._clock.monotonic())

    def best_answer(self, last: bool) -> float:
        """Seconds: the best case of an answer after a slot is granted (0 before one is
        measured): a waiter whose slot comes later than this before its end cannot use it."""
        turnover = self._turnover
        return (1 - turnover.margin(last)) * (turnover.answer or 0.0)

    def review_at(self) -> float | None:
        """When waiters should look at their place again: the latest clump of answers is
        then over, and the estimate firmer; ``None`` when no review is due."""
        settles = self._turnover.settles_at()
        return settles if settles is not None and settles > self._reviewed else None

    def review(self) -> None:
        """Re-check the waiters once the latest clump of answers is over (no release may
        come for a while after it): tell those whose best case no longer fits."""
        with self._lock:
            now = self._clock.monotonic()
            settles = self._turnover.settles_at()
            if settles is None or settles <= self._reviewed or now <= settles:
                return
            self._reviewed = settles
            self._sentinel = None
            self._hand_over(now, grant=False)

    def wait_error(self) -> dict[str, float]:
        """The estimator's recent error over the waiters that got a slot (``p50``, ``p90``,
        ``samples``): ``|predicted - actual wait| / max(actual wait, answer time)``."""
        with self._lock:
            return self._turnover.error()

    # -- under the lock -----------------------------------------------------------------------

    def _hand_over(self, now: float, *, grant: bool = True) -> None:
        """Give free slots to the oldest waiters (``grant``) that can still use one; tell
        those whose best case no longer fits."""
        waiting = self._waiting
        woken: list[SlotTicket] = []
        turnover = self._turnover
        while grant and waiting and self._in_use < self._whole:
            ticket = waiting.popleft()
            woken.append(ticket)
            if not turnover.fits(
                wait=0.0, end=ticket.end, max_wait=ticket.max_wait, last=ticket.last, now=now
            ):
                self._spill(ticket, 0.0)  # its answer would come too late even now
                continue
            if ticket.predicted is not None:
                made, predicted = ticket.predicted
                turnover.waited(predicted, now - made)
            self._grant(ticket)
        if waiting and turnover.measured:
            kept: deque[SlotTicket] = deque()
            plan = self._slots_after(self._need(len(waiting) - 1))  # once for them all
            for position, ticket in enumerate(waiting):
                fits, expected = self._judge(ticket, position, now, plan)
                if fits:
                    kept.append(ticket)
                else:
                    self._spill(ticket, expected)
                    woken.append(ticket)
            self._waiting = kept
        for ticket in woken:
            self._wake(ticket)

    def _arm_review(self) -> None:
        """A clump of answers began: wake the first waiter, whose flow then waits until
        the clump is over and reviews every waiter (``review``). No release may come for
        a while after a clump; without this, a waiter queued before it would learn only
        at its own time limit that its wait no longer fits."""
        if not self._waiting or self.review_at() is None:
            return
        sentinel = self._sentinel
        if sentinel is None or sentinel.state != "waiting":
            self._sentinel = sentinel = self._waiting[0]
            self._wake(sentinel)

    def _spill(self, ticket: SlotTicket, wait: float | None) -> None:
        ticket.state = "spill"
        turnover = self._turnover
        if wait is not None and turnover.answer is not None:
            margin = turnover.margin(ticket.last)
            ticket.told = (wait, turnover.answer, margin, turnover.samples)

    def _need(self, position: int) -> int:
        # The slots to free before this waiter's: those ahead of it, its own, and the
        # calls the window holds beyond its size (it just shrank).
        return position + 1 + max(0, self._in_use - math.floor(self._size))

    def _ahead(self, position: int, plan: list[int] | None = None) -> int:
        """The answers the waiter at ``position`` waits for: enough to free the slots it
        needs (``_need``), less those the window adds as it grows meanwhile (``plan``:
        ``_slots_after``, made once for a review of every waiter)."""
        need = self._need(position)
        if plan is None:
            plan = self._slots_after(need)
        return bisect.bisect_left(plan, need) if plan else need

    def _slots_after(self, need: int) -> list[int]:
        """``slots[k]``: the slots ``k`` more answers give the waiters, up to ``need``:
        one each, and one more each time the window, full while calls wait, grows
        past a whole call (as ``Window.answered`` grows it, toward its ceiling). Empty
        when it is at its ceiling: one slot an answer."""
        if self._size >= self._ceiling:
            return []
        size, slots = self._size, [0]
        while slots[-1] < need:
            before = math.floor(size)
            if size < self._ceiling:
                grow = 1.0 if size < self._threshold else 1.0 / size
                if size + 1 >= self._failed_at:  # probing a level refused before
                    grow /= self._patience
                size = min(self._ceiling, size + grow)
            slots.append(slots[-1] + 1 + math.floor(size) - before)
        return slots

    def _wait_for(self, position: int, now: float) -> float | None:
        return self._turnover.wait(self._ahead(position), now)

    def _judge(
        self, ticket: SlotTicket, position: int, now: float, plan: list[int] | None = None
    ) -> tuple[bool, float | None]:
        """Whether the waiter at ``position`` still fits, and the wait it was judged on
        (the estimate, or the best case before one)."""
        turnover = self._turnover
        ahead = self._ahead(position, plan)
        wait = turnover.wait(ahead, now)
        if wait is not None and ticket.predicted is None:
            ticket.predicted = (now, wait)  # the first estimate: its error is measured
        if wait is None:
            wait = turnover.best(ahead, now)
        fits = turnover.fits(
            wait=wait, end=ticket.end, max_wait=ticket.max_wait, last=ticket.last, now=now
        )
        return fits, wait

    def _estimate(
        self, ticket: SlotTicket, position: int, now: float
    ) -> tuple[float, float, float, int] | None:
        turnover = self._turnover
        wait = turnover.best(self._ahead(position), now)
        if wait is None or turnover.answer is None:
            return None
        return (wait, turnover.answer, turnover.margin(ticket.last), turnover.samples)
