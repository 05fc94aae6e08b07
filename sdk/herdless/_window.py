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
                  size *= decrease, once per round
              a refused call keeps its slot, unless the window now holds more calls
              than its size: then it gives the slot back and waits first in line
    bounds    minimum <= size <= min(maximum, advertised capacity)

**How long a waiter will wait**: ``herdless._turnover`` (``Turnover``: the rule, from the
answers' clumps). A waiter whose best case no longer fits is told to leave at once
(``"spill"``): re-checked at every release, and once the latest clump of answers is
over (``review``); a waiter whose turn comes too late to be answered in time leaves
instead of taking the slot.

Pure apart from one lock: no sleeping, no I/O, an injected clock. The drivers do the
waiting: a waiter's ``listen(callback)`` is called once its state is decided.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from herdless._clock import Clock
from herdless._window_wait import SlotTicket, Turnover, WaitingLine

__all__ = ["Window", "WindowPolicy"]

# How much slower, at most, the window probes a level the backend keeps refusing.
_MAX_PATIENCE = 64.0


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
        for name in ("initial", "minimum", "maximum"):
            if getattr(self, name) < 1:
                raise ValueError(f"WindowPolicy.{name} must be >= 1, got {getattr(self, name)!r}")
        if not self.minimum <= self.initial <= self.maximum:
            raise ValueError(
                "WindowPolicy needs minimum <= initial <= maximum, got "
                f"{self.minimum!r}, {self.initial!r}, {self.maximum!r}"
            )
        if not 0 < self.decrease < 1:
            raise ValueError(f"WindowPolicy.decrease must be in (0, 1), got {self.decrease!r}")


class Window(WaitingLine):
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
        "_sends",
        "_size",
        "_threshold",
        "_turnover",
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
            if held < self._size:
                self._threshold = float(held)
                self._resize(self._threshold)
            elif ticket.epoch == self._epoch:
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
        (it just shrank): give its slot back and put it first in line, so that it goes
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
            self._waiting.appendleft(ticket)
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


def _whole(size: float) -> float:
    """Whole calls a window of ``size`` lets through: it grows by fractions, calls come
    whole."""
    return math.floor(size) if size != math.inf else math.inf
