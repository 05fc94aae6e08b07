"""Flow control: per backend, how many of the client's calls may be at it at once.

A busy GPU is not a broken one. One client is usually shared by every request of a
process, so the client itself is the place to hold the crowd: a call beyond the window
waits in the client's memory, which costs nothing, instead of in a retry, which costs a
round trip and a place in the server's queue.

**What the window counts.** A call holds a slot from the moment it is let through to
the moment it leaves the backend: answered (a stream: when it ends), moved on, or
failed. Its waits for a retry there are included: a refused call keeps its place, as a
retransmission keeps its place in TCP's window. Calls beyond the window wait first come
first served; a call that leaves hands its slot to the next waiting call at once.

**How big it is** (AIMD, as TCP's congestion window)::

    start     size = initial, or the server's advertised capacity (X-Herdless-Capacity)
    success   size += 1           while size < threshold   (slow start)
              size += 1 / size    after                    (one more per round)
              only when the window was full and none of its calls is refused now;
              toward a level the backend refused before, ``patience`` times slower
              (doubling each time it refuses that level again, up to 64)
    refusal   (a 429 or a busy 503)
              threshold = size = min(size, max(minimum, held))
                  held: the calls sent and not refused, what the backend holds of
                  this client now: a measurement
              when that says nothing new (the window holds more calls than its size):
                  size *= decrease, once per round; not for a call sent before the
                  server first advertised its capacity (a burst beyond it is refused
                  as expected)
              a refused call keeps its slot, unless the window now holds more calls
              than its size: then it gives the slot back and waits first in line,
              behind the calls requeued before it
    bounds    minimum <= size <= min(maximum, advertised capacity)

**How long a waiter will wait**: ``herdless._turnover`` (``Turnover``: the rule, from the
answers' clumps). A waiter whose best case no longer fits is told to leave at once
(``"spill"``): re-checked at every release, and once the latest clump of answers is
over (``review``); a waiter whose turn comes too late to be answered in time leaves
instead of taking the slot.

A call's place is a ``SlotTicket``; the window and its line are one class, ``Window``:
every grant, release, refusal, requeue and review moves the same slots and tickets
under one lock. Pure apart from that lock: no sleeping, no I/O, an injected clock. The
drivers do the waiting: a waiter's ``listen(callback)`` is called once its state is
decided.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from herdless._bounds import require
from herdless._clock import Clock
from herdless._turnover import Turnover

__all__ = ["SlotTicket", "TicketState", "Window", "WindowPolicy"]

# How much slower, at most, the window probes a level the backend keeps refusing.
_MAX_PATIENCE = 64.0


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


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowPolicy:
    """How many calls one client lets be at one backend at once (flow control).

    Args:
        initial: the window before the backend said anything (no refusal yet, no
            advertised capacity). A herdless gateway advertises its own.
        minimum: the window never shrinks below this.
        maximum: the window never grows above this.
        decrease: the window is multiplied by this on a refusal (once per round).
        enabled: ``False`` turns flow control off: every call goes at once (the
            behaviour of a plain HTTP client).

    >>> WindowPolicy(initial=8, decrease=0.5).initial
    8
    """

    initial: int = 16
    minimum: int = 1
    maximum: int = 1024
    decrease: float = 0.75
    enabled: bool = True

    def __post_init__(self) -> None:
        require(self, ">= 1", "initial", "minimum", "maximum")
        if not self.minimum <= self.initial <= self.maximum:
            raise ValueError(
                "WindowPolicy needs minimum <= initial <= maximum, got "
                f"{self.minimum!r}, {self.initial!r}, {self.maximum!r}"
            )
        if not 0 < self.decrease < 1:
            raise ValueError(f"WindowPolicy.decrease must be in (0, 1), got {self.decrease!r}")


class Window:
    """One backend's window for one client. Thread- and task-safe.

    >>> from herdless.testing import FakeClock
    >>> window = Window(WindowPolicy(initial=1), clock=FakeClock())
    >>> first, second = window.acquire(end=60.0), window.acquire(end=60.0)
    >>> first.state, second.state
    ('granted', 'waiting')
    >>> window.release(first)
    >>> second.state
    'granted'
    """

    __slots__ = (
        "_blind",
        "_ceiling",
        "_clock",
        "_epoch",
        "_failed_at",
        "_granted",
        "_in_use",
        "_listeners",
        "_lock",
        "_patience",
        "_policy",
        "_resting",
        "_reviewed",
        "_sends",
        "_sentinel",
        "_size",
        "_threshold",
        "_turnover",
        "_waiting",
        "_whole",
    )

    def __init__(self, policy: WindowPolicy, *, clock: Clock) -> None:
        self._policy = policy
        self._clock = clock
        self._lock = threading.Lock()
        self._size = float(policy.initial) if policy.enabled else math.inf
        self._whole = _whole(self._size)  # the calls it lets through: whole ones
        self._threshold = math.inf  # slow start until the first refusal
        self._ceiling = float(policy.maximum) if policy.enabled else math.inf
        self._epoch = 0  # cuts so far: a refusal cuts by the factor only in the current one
        self._failed_at = math.inf  # the most calls at the backend when it last refused
        self._patience = 1.0  # how much slower the window probes that level again
        self._in_use = 0
        self._resting = 0  # slot holders refused and waiting to retry
        self._sends = 0  # attempts sent: orders them (who was at the backend before whom)
        self._blind: int | None = None  # the sends before the server first said its capacity
        self._granted: set[SlotTicket] = set()  # the calls holding a slot
        self._waiting: deque[SlotTicket] = deque()
        self._listeners: deque[SlotTicket] = deque()  # refused, retrying at a release
        self._turnover = Turnover()  # how fast slots free, how long answers take
        self._reviewed = -math.inf  # the clump the waiters were last reviewed after
        self._sentinel: SlotTicket | None = None  # the waiter woken to review them

    # -- observation ---------------------------------------------------------------------

    @property
    def size(self) -> float:
        """Calls let through at once now (``inf`` when flow control is off)."""
        return self._size

    @property
    def in_use(self) -> int:
        """Calls at the backend now (sent, or waiting there for a retry)."""
        return self._in_use

    @property
    def serving(self) -> int:
        """Calls at the backend now that it did not refuse (its answer will free a place)."""
        return self._in_use - self._resting

    @property
    def waiting(self) -> int:
        """Calls waiting in the client for a slot."""
        return len(self._waiting)

    # -- a call's place --------------------------------------------------------------------

    def acquire(self, *, end: float, max_wait: float = math.inf, last: bool = False) -> SlotTicket:
        """A place for one call that must be answered by ``end``: granted at once when
        a slot is free and nobody waits, else waiting (or ``"spill"`` when even its best
        case already does not fit). ``last``: no backend follows (it leaves later)."""
        ticket = SlotTicket(end, max_wait, last)
        with self._lock:
            if not self._waiting and self._in_use < self._whole:
                self._grant(ticket)
                return ticket
            now = self._clock.monotonic()
            fits, wait = self._judge(ticket, len(self._waiting), now)
            if fits:
                self._waiting.append(ticket)
            else:
                self._spill(ticket, wait)
            return ticket

    def listen(self, ticket: SlotTicket, notify: Callable[[], None]) -> None:
        """Call ``notify`` (once, from any thread) when ``ticket`` stops waiting; at once
        when it already has."""
        with self._lock:
            if ticket.state == "waiting":
                ticket._notify = notify
                return
        notify()

    def release(self, ticket: SlotTicket) -> None:
        """``ticket`` leaves: its slot (if granted) goes to the next waiter; a waiting one
        gives its place up."""
        with self._lock:
            state, ticket.state = ticket.state, "done"
            ticket._notify = None
            if state == "waiting":
                self._waiting.remove(ticket)
            elif state == "granted":
                self._in_use -= 1
                self._granted.discard(ticket)
                self._resting -= ticket.refused
                if ticket.refused and ticket in self._listeners:
                    self._listeners.remove(ticket)
                now = self._clock.monotonic()
                if ticket.served:  # an answer: the backend's pace (not a call moving on)
                    # ...with the calls at the backend when it answered (this one too).
                    serving = self._in_use - self._resting + 1
                    self._turnover.completed(now, now - ticket.sent_at, serving)
                # A place at the backend freed: it goes to a call the backend refused
                # (oldest first), not to a new one, which would only be refused too.
                listener = self._listeners.popleft() if self._listeners else None
                if self._waiting:
                    self._hand_over(now, grant=listener is None)
                self._turnover.settled(bool(self._waiting) or self._in_use >= self._whole)
                if listener is not None:
                    self._wake(listener)
                self._arm_review()

    # -- what the backend said ---------------------------------------------------------------

    def answered(self, elapsed: float, ticket: SlotTicket | None = None) -> None:
        """An attempt (of ``ticket``'s call) was answered with success after ``elapsed``
        seconds: the window was right, and may grow if it was full."""
        with self._lock:
            self._turnover.answered(elapsed)
            if ticket is not None:
                ticket.served = True
            # Grow only when the window is full and nobody it let through is refused now.
            full = self._in_use >= self._whole - 1 and not self._resting
            if full and self._size < self._ceiling:
                grow = 1.0 if self._size < self._threshold else 1.0 / self._size
                if self._size + 1 >= self._failed_at:  # probing the level refused before
                    grow /= self._patience
                self._resize(min(self._ceiling, self._size + grow))
                if self._size >= self._failed_at:  # that level holds now: forget it
                    self._failed_at, self._patience = math.inf, 1.0
                self._hand_over(self._clock.monotonic())

    def refused(self, ticket: SlotTicket) -> bool:
        """An attempt of ``ticket``'s call was refused (a 429, a busy 503): shrink to what
        the backend holds of this client now, and by ``decrease`` once per round.
        Returns whether the window shrank."""
        with self._lock:
            if not self._policy.enabled:
                return False
            # The level that failed: refused again at (or below) the one refused last
            # time, the window probes it more patiently (rounds double, up to a cap).
            failed_at = float(self._in_use)
            if failed_at <= self._failed_at:
                self._patience = min(self._patience * 2, _MAX_PATIENCE)
            else:
                self._patience = 1.0
            self._failed_at = failed_at
            if not ticket.refused:
                ticket.refused = True
                self._resting += 1
            policy = self._policy
            before = self._size
            # What the backend holds of ours now: the calls sent and not refused (a call
            # granted but not sent yet holds nothing there). A measurement, not a guess:
            # the refusals of one burst bring it down to what the server took, no lower.
            held = max(
                policy.minimum,
                sum(1 for t in self._granted if t.sent and not t.refused),
            )
            # Sent before the server said how many calls of ours it takes: a burst
            # beyond that is refused as expected, and says nothing of less room.
            blind = self._blind is not None and ticket.sent <= self._blind
            if held < self._size:
                self._threshold = float(held)
                self._resize(self._threshold)
            elif ticket.epoch == self._epoch and not blind:
                # Nothing new measured (the window holds more calls than its size, as when
                # its ceiling just fell): shrink by the factor, once per round.
                size = max(policy.minimum, math.floor(min(before, self._in_use) * policy.decrease))
                self._threshold = float(min(self._size, size))
                self._resize(self._threshold)
            if self._size < before:
                self._epoch += 1
            return self._size < before

    def on_release(self, ticket: SlotTicket, notify: Callable[[], None]) -> None:
        """Call ``notify`` (once, from any thread) when another call leaves the backend:
        a place there just freed, the moment for ``ticket``'s refused call to retry. One
        refused call is woken per release, oldest first."""
        with self._lock:
            ticket._notify = notify
            self._listeners.append(ticket)

    def requeue(self, ticket: SlotTicket) -> bool:
        """``ticket``'s call was refused while the window holds more calls than its size
        (it just shrank): give its slot back and put it first in line (behind the calls
        requeued before it, refused earlier), so that it goes
        again when the window has room, not into a full server. Returns whether it did."""
        with self._lock:
            if ticket.state != "granted" or self._in_use <= self._whole:
                return False
            if ticket.refused:
                ticket.refused = False
                self._resting -= 1
                if ticket in self._listeners:
                    self._listeners.remove(ticket)
            ticket.state = "waiting"
            ticket._notify = None
            self._in_use -= 1
            self._granted.discard(ticket)
            # Behind the calls requeued before it, which were refused first: a server
            # that told each a time told them earlier ones.
            waiting = self._waiting
            place = next((i for i, t in enumerate(waiting) if not t.sent), len(waiting))
            waiting.insert(place, ticket)
            return True

    @property
    def answer_time(self) -> float | None:
        """An EWMA of the time from sending an attempt to its accepted answer, seconds."""
        return self._turnover.answer

    def sent(self, ticket: SlotTicket) -> None:
        """``ticket``'s call sends an attempt (again, after a refusal)."""
        with self._lock:
            self._sends += 1
            ticket.sent = self._sends
            ticket.sent_at = self._clock.monotonic()
            if ticket.refused:
                ticket.refused = False
                self._resting -= 1
                if ticket in self._listeners:  # its backoff ended before any release
                    self._listeners.remove(ticket)
                ticket._notify = None

    def advertise(self, capacity: int) -> None:
        """The server said it holds at most ``capacity`` requests of this client at once:
        never go above it, and start there when nothing was learned yet."""
        if capacity < 1 or not self._policy.enabled or capacity == self._ceiling:
            return  # the common case: the same capacity, again
        with self._lock:
            if self._blind is None:  # the first time it says
                self._blind = self._sends
            self._ceiling = float(min(capacity, self._policy.maximum))
            if self._threshold == math.inf:  # no refusal yet: start near the right size
                self._resize(self._ceiling)
            self._resize(min(self._size, self._ceiling))
            self._hand_over(self._clock.monotonic())

    # -- under the lock -----------------------------------------------------------------------

    def _resize(self, size: float) -> None:
        self._size = size
        self._whole = _whole(size)

    def _grant(self, ticket: SlotTicket) -> None:
        ticket.state = "granted"
        ticket.epoch = self._epoch
        self._in_use += 1
        self._granted.add(ticket)

    @staticmethod
    def _wake(ticket: SlotTicket) -> None:
        notify, ticket._notify = ticket._notify, None
        if notify is not None:
            notify()

    def __repr__(self) -> str:
        return f"Window(size={self._size:g}, in_use={self._in_use}, waiting={len(self._waiting)})"

    # -- the line: who waits, who is told to leave, what their waits will be --------------

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


def _whole(size: float) -> float:
    """Whole calls a window of ``size`` lets through: it grows by fractions, calls come
    whole."""
    return math.floor(size) if size != math.inf else math.inf
