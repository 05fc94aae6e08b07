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
              only when the window was full: a window nobody fills proves nothing
    refusal   threshold = size = max(minimum, min(size, in_use) * decrease)
              (a 429 or a busy 503), at most once per round: only a refusal of an
              attempt sent after the last cut cuts again
    bounds    minimum <= size <= min(maximum, advertised capacity)

**How long a waiter will wait.** The backend answers the client's attempts at the rate
``sending / answer`` (Little's law: ``sending`` attempts are at the server, each answered
after ``answer`` seconds, an EWMA of the time to an accepted answer), and each answer
frees a slot, so the waiter at position ``p`` (0 = next) expects::

    wait = (p + 1 + max(0, in_use - size)) * answer / sending

and its own answer ``answer`` after that. A waiter whose ``now + wait + answer`` passes
the time it may stay (its deadline, less the reserve kept for a fallback), or whose
``wait`` passes its patience, is told to leave at once (``"spill"``), re-checked at every
release. Before the first answer the estimate is unknown and nobody is told to leave.
The estimate errs on the hopeful side (a stream's ``answer`` is its first chunk, sooner
than its slot frees): a call that hoped wrongly leaves when its time runs out, never later.

Pure apart from one lock: no sleeping, no I/O, an injected clock. The drivers do the
waiting: a waiter's ``listen(callback)`` is called once its state is decided.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from herdless._clock import Clock

__all__ = ["SlotTicket", "Window", "WindowPolicy"]

# Weight of the newest sample in the hold and answer EWMAs: about the last ten calls.
_EWMA = 0.2

TicketState = Literal["waiting", "granted", "spill", "done"]


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


class SlotTicket:
    """One call's place at one backend's window.

    ``state`` is ``"granted"`` (it holds a slot), ``"waiting"`` (in the client's queue),
    ``"spill"`` (told to leave: its wait no longer fits) or ``"done"`` (gave its place
    back). ``end`` is the latest time its answer is still useful, ``max_wait`` the
    longest wait it accepts.
    """

    __slots__ = ("_notify", "end", "max_wait", "seq", "state")

    def __init__(self, seq: int, end: float, max_wait: float) -> None:
        self.seq = seq
        self.end = end
        self.max_wait = max_wait
        self.state: TicketState = "waiting"
        self._notify: Callable[[], None] | None = None

    def __repr__(self) -> str:
        return f"SlotTicket(seq={self.seq}, state={self.state!r})"


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
        "_answer",
        "_ceiling",
        "_clock",
        "_cut_at",
        "_in_use",
        "_lock",
        "_policy",
        "_sending",
        "_seq",
        "_size",
        "_threshold",
        "_waiting",
    )

    def __init__(self, policy: WindowPolicy, *, clock: Clock) -> None:
        self._policy = policy
        self._clock = clock
        self._lock = threading.Lock()
        self._size = float(policy.initial) if policy.enabled else math.inf
        self._threshold = math.inf  # slow start until the first refusal
        self._ceiling = float(policy.maximum) if policy.enabled else math.inf
        self._cut_at = -math.inf
        self._in_use = 0
        self._sending = 0
        self._seq = 0
        self._waiting: deque[SlotTicket] = deque()
        self._answer: float | None = None

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
    def waiting(self) -> int:
        """Calls waiting in the client for a slot."""
        return len(self._waiting)

    # -- a call's place --------------------------------------------------------------------

    def acquire(self, *, end: float, max_wait: float = math.inf) -> SlotTicket:
        """A place for one call that must be answered by ``end``: granted at once when
        a slot is free and nobody waits, else waiting (or ``spill`` when the expected
        wait already does not fit)."""
        with self._lock:
            self._seq += 1
            ticket = SlotTicket(self._seq, end, max_wait)
            if not self._waiting and self._in_use < self._size:
                self._grant(ticket)
                return ticket
            self._waiting.append(ticket)
            if not self._fits(ticket, len(self._waiting) - 1, self._clock.monotonic()):
                self._waiting.pop()
                ticket.state = "spill"
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
                return
            if state != "granted":
                return
            self._in_use -= 1
            self._hand_over(self._clock.monotonic())

    def expected_wait(self, position: int) -> float | None:
        """Seconds until the waiter at ``position`` (0 = next) gets a slot; ``None``
        before anything is measured."""
        with self._lock:
            return self._wait_for(position)

    # -- what the backend said ---------------------------------------------------------------

    def sent(self) -> None:
        """An attempt of a call holding a slot goes to the backend."""
        with self._lock:
            self._sending += 1

    def failed(self) -> None:
        """An attempt ended without an answer that says anything about load (a failure,
        or the call was cancelled)."""
        with self._lock:
            self._sending = max(0, self._sending - 1)

    def answered(self, elapsed: float) -> None:
        """An attempt was answered with success after ``elapsed`` seconds: the window was
        right, and may grow if it was full."""
        with self._lock:
            self._sending = max(0, self._sending - 1)
            self._answer = _ewma(self._answer, elapsed)
            if self._in_use >= self._size - 1 and self._size < self._ceiling:
                grow = 1.0 if self._size < self._threshold else 1.0 / self._size
                self._size = min(self._ceiling, self._size + grow)
                self._hand_over(self._clock.monotonic())

    def refused(self, sent_at: float) -> bool:
        """An attempt sent at ``sent_at`` was refused (429, busy 503): shrink, once per
        round. Returns whether the window shrank."""
        with self._lock:
            self._sending = max(0, self._sending - 1)
            if sent_at < self._cut_at or not self._policy.enabled:
                return False  # sent before the last cut: that cut already answered it
            policy = self._policy
            size = max(policy.minimum, math.floor(min(self._size, self._in_use) * policy.decrease))
            self._size = self._threshold = float(size)
            self._cut_at = self._clock.monotonic()
            return True

    def advertise(self, capacity: int) -> None:
        """The server said it holds at most ``capacity`` requests of this client at once:
        never go above it, and start there when nothing was learned yet."""
        if capacity < 1 or not self._policy.enabled or capacity == self._ceiling:
            return  # the common case: the same capacity, again
        with self._lock:
            self._ceiling = float(min(capacity, self._policy.maximum))
            if self._threshold == math.inf:  # no refusal yet: start near the right size
                self._size = self._ceiling
            self._size = min(self._size, self._ceiling)
            self._hand_over(self._clock.monotonic())

    # -- under the lock -----------------------------------------------------------------------

    def _grant(self, ticket: SlotTicket) -> None:
        ticket.state = "granted"
        self._in_use += 1

    def _hand_over(self, now: float) -> None:
        """Give free slots to the oldest waiters; tell those whose wait no longer fits."""
        waiting = self._waiting
        woken: list[SlotTicket] = []
        while waiting and self._in_use < self._size:
            ticket = waiting.popleft()
            self._grant(ticket)
            woken.append(ticket)
        if waiting and self._answer is not None:
            for position, ticket in enumerate(list(waiting)):
                if not self._fits(ticket, position, now):
                    waiting.remove(ticket)
                    ticket.state = "spill"
                    woken.append(ticket)
        for ticket in woken:
            notify, ticket._notify = ticket._notify, None
            if notify is not None:
                notify()

    def _wait_for(self, position: int) -> float | None:
        if self._answer is None:
            return None
        ahead = position + 1 + max(0, self._in_use - math.floor(self._size))
        return ahead * self._answer / max(1, self._sending)

    def _fits(self, ticket: SlotTicket, position: int, now: float) -> bool:
        wait = self._wait_for(position)
        if wait is None:
            return True  # nothing measured: no grounds to send anyone away
        return wait <= ticket.max_wait and now + wait + (self._answer or 0.0) <= ticket.end

    def __repr__(self) -> str:
        return f"Window(size={self._size:g}, in_use={self._in_use}, waiting={len(self._waiting)})"


def _ewma(old: float | None, sample: float) -> float:
    return sample if old is None else old + _EWMA * (sample - old)
