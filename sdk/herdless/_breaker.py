"""The circuit breaker: one per backend per client, a pure state machine.

    closed ──(failure rate over the window, or N consecutive failures)──> open
    open ──(open period elapsed; the next call becomes the probe)──> half_open
    half_open ──(the probe succeeds)──> closed
    half_open ──(the probe fails: the open period doubles, up to max_open_for)──> open
    any ──(a draining 503: open at once for its Retry-After)──> open
    open, by a drain ──(its time elapsed: closed on trial, the first failure opens)──> closed

Failures are connection errors, timeouts (first byte included) and 5xx. A 429 or
another 4xx is *not* a failure: the server is alive; nor is a 503 that says why (a
drain, an outage) or when (Retry-After). A bare 503 counts toward the failure rate
only (``record_refusal``). Nor is a drain: the backend answered at once and said when
it would be back, so when that time comes the breaker closes with the first failure
already counted against it (one probe at a time sent a shared client's other calls to
the fallback for the probe's whole answer while the GPU served again). The breaker
never sleeps and never does I/O; callers ask
it (``acquire``) and tell it (``record_*``). One lock around the state makes
"exactly one half-open probe at a time" hold across threads and asyncio tasks alike
(no method awaits, so a task never holds the lock across a suspension).

The open period is jittered so that clients across the company, opened by the same
outage, do not all probe at the same instant (a drain's Retry-After is kept as named)::

    open_for = min(max_open_for, open_for * 2**reopens) * uniform(1, 1 + open_jitter)
"""

from __future__ import annotations

import enum
import random
import threading
from collections import deque
from dataclasses import dataclass

from herdless._bounds import require
from herdless._clock import Clock
from herdless.events import BreakerState

__all__ = ["BreakerPolicy", "CircuitBreaker", "Permit", "Transition"]


@dataclass(frozen=True, slots=True, kw_only=True)
class BreakerPolicy:
    """When a backend's breaker opens, and for how long.

    Args:
        failure_rate: open when at least this share of the calls in ``window`` failed...
        window: seconds of outcomes the failure rate looks at...
        min_calls: ...and the window holds at least this many outcomes.
        consecutive_failures: open after this many failures in a row, whatever the rate.
        open_for: seconds the breaker stays open the first time (before jitter).
        max_open_for: the open period doubles after each failed probe, up to this.
        open_jitter: the open period is stretched by a random factor in ``[1, 1 + open_jitter]``.
    """

    failure_rate: float = 0.5
    window: float = 30.0
    min_calls: int = 10
    consecutive_failures: int = 5
    open_for: float = 5.0
    max_open_for: float = 60.0
    open_jitter: float = 0.2

    def __post_init__(self) -> None:
        if not 0 < self.failure_rate <= 1:
            raise ValueError(
                f"BreakerPolicy.failure_rate must be in (0, 1], got {self.failure_rate!r}"
            )
        require(self, "> 0", "window", "open_for", "max_open_for")
        require(self, ">= 1", "min_calls", "consecutive_failures")
        require(self, ">= 0", "open_jitter")
        if self.max_open_for < self.open_for:
            raise ValueError("BreakerPolicy.max_open_for must be >= open_for")


class Permit(enum.Enum):
    """What ``acquire`` allows: a normal call, the single half-open probe, or nothing."""

    CALL = "call"
    PROBE = "probe"
    DENIED = "denied"


@dataclass(frozen=True, slots=True)
class Transition:
    """A state change, for the caller to emit as ``BreakerStateChanged``."""

    old: BreakerState
    new: BreakerState
    reason: str
    open_for: float | None = None


_CALL: tuple[Permit, Transition | None] = (Permit.CALL, None)
_SAME_END = 1.0  # Retry-After counts whole seconds: ends closer than this are one end


class CircuitBreaker:
    """One backend's breaker. Thread- and task-safe; pure apart from its lock.

    >>> from herdless.testing import FakeClock
    >>> clock = FakeClock()
    >>> breaker = CircuitBreaker(BreakerPolicy(consecutive_failures=1, open_jitter=0),
    ...                          clock=clock, rng=random.Random(0))
    >>> permit, _ = breaker.acquire()
    >>> breaker.record_failure(permit).new
    'open'
    >>> breaker.acquire()[0]
    <Permit.DENIED: 'denied'>
    """

    __slots__ = (
        "_clock",
        "_consecutive",
        "_drained",
        "_failures",
        "_lock",
        "_open_until",
        "_outcomes",
        "_policy",
        "_probing",
        "_reopens",
        "_rng",
        "_served_at",
        "_state",
    )

    def __init__(self, policy: BreakerPolicy, *, clock: Clock, rng: random.Random) -> None:
        self._policy = policy
        self._clock = clock
        self._rng = rng
        self._lock = threading.Lock()
        self._state: BreakerState = "closed"
        self._open_until = 0.0
        self._probing = False  # a half-open probe is in flight
        self._drained = False  # opened by a drain: closes on trial when it elapses
        self._reopens = 0  # failed probes in a row: doubles the open period
        self._consecutive = 0
        self._outcomes: deque[tuple[float, bool]] = deque()  # (time, failed) while closed
        self._failures = 0  # failed entries in _outcomes, kept in step to stay O(1)
        # The last success (first: when the breaker was made: a new backend gets the
        # benefit of the doubt); a bare 503 counts only long after it.
        self._served_at = clock.monotonic()

    @property
    def state(self) -> BreakerState:
        """The state a call would find now (an elapsed open period reads as ``half_open``,
        or ``closed`` after a drain)."""
        with self._lock:
            if self._state == "open" and self._clock.monotonic() >= self._open_until:
                return "closed" if self._drained else "half_open"
            return self._state

    def remaining_open(self) -> float:
        """Seconds until a call may pass (0 when closed, or when the probe is free to take)."""
        with self._lock:
            if self._state != "open":
                return 0.0
            return max(0.0, self._open_until - self._clock.monotonic())

    def acquire(self) -> tuple[Permit, Transition | None]:
        """Ask to send one attempt. A ``PROBE`` or ``CALL`` must be answered with exactly
        one of ``record_success``, ``record_failure`` or ``release``."""
        state = self._state  # one read, as good as under the lock: the common case
        if state == "closed":
            return _CALL
        with self._lock:
            if self._state == "closed":
                return _CALL
            transition = None
            if self._state == "open":
                if self._clock.monotonic() < self._open_until:
                    return Permit.DENIED, None
                if self._drained:
                    self._reset()
                    self._consecutive = self._policy.consecutive_failures - 1  # on trial
                    return Permit.CALL, Transition("open", "closed", "drain_ended")
                self._state = "half_open"
                transition = Transition("open", "half_open", "open_elapsed")
            if self._probing:
                return Permit.DENIED, transition
            self._probing = True
            return Permit.PROBE, transition

    def release(self, permit: Permit) -> None:
        """The attempt ended with no verdict on the backend (cancelled, abandoned)."""
        if permit is Permit.PROBE:
            with self._lock:
                self._probing = False

    def record_success(self, permit: Permit) -> Transition | None:
        """The backend answered (2xx, or a 4xx/429: alive, even if it said no)."""
        with self._lock:
            if permit is Permit.CALL:
                if self._state == "closed":
                    self._consecutive = 0
                    self._served_at = self._clock.monotonic()
                    self._remember(False)
                return None
            if permit is Permit.PROBE:
                self._probing = False
                if self._state == "half_open":
                    self._reset()
                    return Transition("half_open", "closed", "probe_ok")
            return None

    def record_failure(self, permit: Permit) -> Transition | None:
        """The backend failed (connection error, timeout, 5xx, stream cut)."""
        with self._lock:
            if permit is Permit.PROBE:
                self._probing = False
                if self._state == "half_open":
                    self._reopens += 1
                    return self._open("half_open", "probe_failed", self._period())
                return None
            if permit is not Permit.CALL or self._state != "closed":
                return None  # an attempt started before another call opened the breaker
            self._consecutive += 1
            failures, total = self._remember(True)
            policy = self._policy
            if self._consecutive >= policy.consecutive_failures:
                return self._open("closed", "consecutive_failures", self._period())
            if total >= policy.min_calls and failures >= policy.failure_rate * total:
                return self._open("closed", "failure_rate", self._period())
            return None

    def record_refusal(
        self, permit: Permit, *, answer_time: float | None = None
    ) -> Transition | None:
        """The backend refused without saying why or when (a bare 503, as vLLM's full
        queue). A busy backend serves calls all the time, a dead one behind a proxy
        never: so a refusal counts, toward the failure rate only (never the consecutive
        count), once the backend has served nothing for ``open_for`` seconds, or four
        of its answer times (``answer_time``) when those are longer. A refused probe
        proves nothing either way: the next call probes again."""
        with self._lock:
            if permit is Permit.PROBE:
                self._probing = False
                return None
            if permit is not Permit.CALL or self._state != "closed":
                return None
            grace = max(self._policy.open_for, 4 * (answer_time or 0.0))
            if self._clock.monotonic() - self._served_at < grace:
                return None  # it served recently: busy, not dead
            failures, total = self._remember(True)
            policy = self._policy
            if total >= policy.min_calls and failures >= policy.failure_rate * total:
                return self._open("closed", "failure_rate", self._period())
            return None

    def force_open(self, seconds: float | None, reason: str) -> Transition | None:
        """Open now for ``seconds`` (a draining backend's Retry-After), or for the policy's
        ``open_for``, jittered, when the backend named no time.

        A time the server named is kept to the letter: the gateway tells every caller of
        a drain its end, and a breaker stretched past it sent calls to the fallback while
        the GPU served again. Only a period of the breaker's own is spread."""
        with self._lock:
            if seconds is None:
                policy = self._policy
                seconds = policy.open_for * self._rng.uniform(1.0, 1.0 + policy.open_jitter)
            until = self._clock.monotonic() + seconds
            if self._state == "open" and until < self._open_until + _SAME_END:
                # The same end told again by the crowd's other refusals: no new event.
                self._open_until = max(self._open_until, until)
                return None
            # A probe still in flight keeps its flag: it is answered later (record_* or
            # release clear it); clearing it here let a second probe start beside it.
            transition = self._open(self._state, reason, seconds)
            self._drained = True
            return transition

    def _period(self) -> float:
        policy = self._policy
        base = min(policy.max_open_for, policy.open_for * 2.0**self._reopens)
        return base * self._rng.uniform(1.0, 1.0 + policy.open_jitter)

    def _open(self, old: BreakerState, reason: str, period: float) -> Transition:
        self._state = "open"
        self._drained = False
        self._open_until = self._clock.monotonic() + period
        self._outcomes.clear()
        self._failures = 0
        self._consecutive = 0
        return Transition(old, "open", reason, open_for=period)

    def _reset(self) -> None:
        self._served_at = self._clock.monotonic()
        self._state = "closed"
        self._drained = False
        self._reopens = 0
        self._consecutive = 0
        self._outcomes.clear()
        self._failures = 0

    def _remember(self, failed: bool) -> tuple[int, int]:
        """Add an outcome, drop those older than the window; return (failures, total)."""
        now = self._clock.monotonic()
        outcomes = self._outcomes
        outcomes.append((now, failed))
        self._failures += failed
        horizon = now - self._policy.window
        while outcomes[0][0] < horizon:
            self._failures -= outcomes.popleft()[1]
        return self._failures, len(outcomes)

    def __repr__(self) -> str:
        return f"CircuitBreaker(state={self.state!r})"
