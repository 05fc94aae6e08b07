"""One call's visit to one backend: what it holds there, its phase, and how it went.

``Visit`` is the only writer of its own fields (``tests/test_visit_owner.py`` checks it,
as h11 keeps every writer of its state in ``h11/_state.py``). Each holding has its take
and give methods:

- the **slot** in the backend's window (``take_slot``; given back by ``leave``, or kept
  by an accepted stream, ``hand_slot``);
- the breaker's **permit** (``take_permit``; spent by ``record``, freed by ``leave``);
- a retry **budget** unit (``take_budget``; settled by ``record``, cancelled by ``leave``);
- a **pacing** slot (``take_pace``, ``give_pace``);
- the **spend** guard's admission of an external backend (``take_spend``).

Its **phase** says what the next attempt is: the ``first``; a retry at a time the server
(or the window) gave, ``scheduled``; a retry after the client's own ``backoff``, which
needs budget; or ``requeued``, first in the window's line again. ``send`` builds the
next attempt; ``record`` writes down what its outcome did to the visit and to what the
client keeps of the backend (breaker, window, pacer, holds), before the rules decide
(``herdless._call.checks.decide``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, TypeAlias

from herdless._actions import (
    ATTEMPT_HEADER,
    DEADLINE_HEADER,
    FAIRNESS_HEADER,
    PRIORITY_HEADER,
    REQUEST_ID_HEADER,
    TTL_HEADER,
    Outcome,
    Response,
    Send,
)
from herdless._backend import Backend, Timeouts
from herdless._breaker import Permit
from herdless._call.errors import attempt_error
from herdless._retry import Verdict, classify, parse_capacity
from herdless._types import AttemptRecord
from herdless.events import AttemptFailed, BackpressureReceived, WindowResized

if TYPE_CHECKING:
    from herdless._call.record import Call
    from herdless._window import SlotTicket
    from herdless.errors import HerdlessError

__all__ = ["Backup", "Phase", "Visit"]

Backup: TypeAlias = tuple[Backend, float, bool]
"""A hedge's backend, and the ``end`` and ``last`` its visit would have in the route."""

Phase: TypeAlias = Literal["first", "scheduled", "backoff", "requeued"]
"""What the visit's next attempt is (see the module docstring)."""


class Visit:
    """One call's visit to one backend.

    Args:
        call: the call.
        backend: the backend.
        end: when the call must leave it (its deadline, less the reserve kept for the
            backends after it).
        last: whether no backend follows.
        backup: where an attempt here may be hedged (``herdless._call.race``).
    """

    __slots__ = (
        "admitted",
        "attempt",
        "backend",
        "backup",
        "breaker",
        "broken",
        "budget",
        "budgeted",
        "call",
        "ceiling",
        "end",
        "last",
        "last_error",
        "limits",
        "paced",
        "pacer",
        "permit",
        "phase",
        "queued_at",
        "sent",
        "slot",
        "waited",
        "waits",
        "window",
    )

    def __init__(
        self, call: Call, backend: Backend, *, end: float, last: bool, backup: Backup | None = None
    ) -> None:
        state = call.state
        self.call = call
        self.backend = backend
        self.end = end
        self.last = last
        self.backup = backup
        """Where an attempt here may be hedged: the next backend, with the ``end`` and
        ``last`` of its visit; ``None``: it is not."""
        # One lookup for the backend's objects, asked once per visit.
        self.breaker, self.budget, self.window, self.pacer = state.parts[backend.name]
        self.limits: Timeouts = backend.timeouts or state.config.timeouts
        self.phase: Phase = "first"
        self.sent = 0  # attempts sent here
        self.attempt = 0  # the number of the last attempt sent here (across the call)
        self.broken = 0  # failures here that say the backend is broken
        self.ceiling = 0.0  # the last full-jitter ceiling of a retry here
        self.waits = 0  # waits (not retries) here: grows their backoff
        self.waited = 0.0  # seconds waited since the previous attempt
        self.budgeted = False  # a retry budget unit is held (waiting or in flight)
        self.admitted = not backend.external  # the spend guard let the call through
        self.paced = self.pacer is None  # the next attempt holds a pacing slot
        self.permit: Permit | None = None  # the breaker permit of the next or current attempt
        self.slot: SlotTicket | None = None  # the call's place in the window
        self.queued_at: float | None = None  # when it started waiting for a slot
        self.last_error: HerdlessError | None = None

    # -- the holdings ----------------------------------------------------------------------

    def take_slot(self, max_wait: float, *, last: bool) -> SlotTicket:
        """The call's place in the backend's window, waiting at most ``max_wait`` seconds
        for it (asked for once, kept until leaving); ``last``: it leaves later."""
        if self.slot is None:
            self.slot = self.window.acquire(end=self.end, max_wait=max_wait, last=last)
        return self.slot

    def hand_slot(self) -> None:
        """An accepted stream keeps the slot past the visit, until it ends
        (``Call.release_slot``)."""
        if self.slot is not None:
            self.call.keep_slot(self.window, self.slot)
            self.slot = None

    def take_permit(self) -> bool:
        """Ask the breaker for the next attempt's permit; ``False``: it is open."""
        permit, transition = self.breaker.acquire()
        self.call.transition(self.backend, transition)
        if permit is Permit.DENIED:
            return False
        self.permit = permit
        return True

    def take_budget(self) -> bool:
        """Take a retry budget unit for the next attempt; ``False``: none is left."""
        self.budgeted = self.budget.try_acquire()
        return self.budgeted

    def take_pace(self) -> float:
        """Reserve the next attempt's pacing slot: the seconds until it comes."""
        assert self.pacer is not None  # asked only when pacing is on
        self.paced = True
        return self.pacer.reserve()

    def give_pace(self) -> None:
        """Give back a pacing slot taken by ``take_pace`` (its attempt is not sent)."""
        assert self.pacer is not None
        self.pacer.refund()
        self.paced = False

    def take_spend(self) -> float:
        """Ask the spend guard to let the call through: the seconds until it may (0: it
        may now, and counts toward the guard)."""
        delay = self.call.state.spend.admit()
        if delay <= 0:
            self.admitted = True
        return delay

    def leave(self) -> None:
        """The call leaves: give back what it holds (a probe, a budget unit, its slot)."""
        if self.permit is not None:  # the driver closed the flow mid-attempt: free a probe
            self.breaker.release(self.permit)
            self.permit = None
        if self.budgeted:  # leaving (fallback, error, or the driver closed us) with a unit
            self.budget.cancel()
            self.budgeted = False
        if self.slot is not None:
            self.window.release(self.slot)
            self.slot = None

    # -- waits -----------------------------------------------------------------------------

    def queue(self, now: float) -> bool:
        """The call waits in the window's line from ``now``; ``True`` the first time."""
        if self.queued_at is not None:
            return False
        self.queued_at = now
        return True

    def dequeue(self, now: float) -> None:
        """The call's wait in the window's line is over (granted, or told to leave)."""
        if self.queued_at is not None:
            self.call.state.counts.slot_waited(now - self.queued_at)
            self.queued_at = None

    def count_wait(self) -> int:
        """Count one more wait (not a retry) here; return how many came before it."""
        self.waits += 1
        return self.waits - 1

    def waited_for(self, seconds: float) -> None:
        """The call waited ``seconds`` before its next attempt here."""
        self.waited += seconds

    def schedule(self) -> None:
        """The next attempt comes at a time the server (or the window) gave."""
        self.phase = "scheduled"

    def take_backup(self) -> Backup | None:
        """Where the attempt may be hedged, once per call: asked, it is gone."""
        backup, self.backup = self.backup, None
        return backup

    # -- the attempt -----------------------------------------------------------------------

    def send(self, now: float) -> Send:
        """The attempt to send now (its breaker permit is held in ``permit``)."""
        call, backend = self.call, self.backend
        if not self.sent:
            self.budget.record_call(now)
        self.sent += 1
        self.phase = "backoff"  # the next attempt's, unless a rule gives it a time
        if self.slot is not None:
            self.window.sent(self.slot)
        attempt = self.attempt = call.next_attempt()
        model = call.model_for(backend)
        call.attempt_started(backend, attempt, model, now)
        left = self.end - now
        headers = {
            REQUEST_ID_HEADER: call.request_id,
            ATTEMPT_HEADER: str(attempt),
            DEADLINE_HEADER: str(max(1, int(left * 1000))),
            PRIORITY_HEADER: call.priority,
        }
        if call.fairness is not None:
            headers[FAIRNESS_HEADER] = call.fairness
        if call.queue_ttl:  # the latest start that can still be answered in time
            answer = max(
                call.state.config.fallback_policy.min_attempt, self.window.best_answer(self.last)
            )
            headers[TTL_HEADER] = f"{max(1, int((left - answer) * 1000))}ms"
        return Send(
            backend=backend,
            attempt=attempt,
            model=model,
            body=call.body,
            headers=headers,
            timeouts=_clip(self.limits, left=left, read_left=call.deadline_at - now),
            stream=call.stream,
        )

    def record(self, outcome: Outcome) -> Verdict:
        """What the attempt's ``outcome`` did: written into the attempt records, the
        budget, the pacer, the breaker, the window, the backend holds and this visit
        (an ``AttemptFailed`` event for a failure). Returns its verdict, for the rules."""
        call, backend, name = self.call, self.backend, self.backend.name
        state = call.state
        verdict = classify(outcome, state.config.retry, now=state.wall())
        permit, self.permit = self.permit, None
        if self.budgeted:  # a retry: a served one gives its budget back
            self.budget.settle(failed=not verdict.ok)
            self.budgeted = False
        if self.pacer is not None:
            self.paced = False
            if verdict.status == 429:
                self.pacer.throttled()
            elif verdict.ok:
                self.pacer.succeeded()
        call.records.append(
            AttemptRecord(
                backend=name,
                attempt=self.attempt,
                kind=verdict.kind,
                status=verdict.status,
                waited=self.waited,
                elapsed=outcome.elapsed,
            )
        )
        self.waited = 0.0
        if verdict.ok and isinstance(outcome, Response):
            self.window.answered(outcome.elapsed, self.slot)
            self._capacity(outcome)
            if permit is not None:
                call.transition(backend, self.breaker.record_success(permit))
            return verdict
        if permit is not None:
            if verdict.breaker_failure:
                call.transition(backend, self.breaker.record_failure(permit))
            elif verdict.breaker_refusal:
                answer = self.window.answer_time
                call.transition(backend, self.breaker.record_refusal(permit, answer_time=answer))
            else:
                call.transition(backend, self.breaker.record_success(permit))
        self.last_error = attempt_error(call, backend, outcome, verdict)
        call.emit(
            AttemptFailed,
            backend=name,
            attempt=self.attempt,
            kind=verdict.kind,
            status=verdict.status,
            retry_after=verdict.retry_after,
            message=verdict.message,
        )
        if isinstance(outcome, Response):
            self._capacity(outcome)
        if verdict.busy and self.slot is not None:
            if self.window.refused(self.slot):
                call.emit(WindowResized, backend=name, size=self.window.size, reason="refused")
            if self.window.requeue(self.slot):
                self.phase = "requeued"
        if verdict.backend_wide:
            self._hold_backend(verdict)
        if not verdict.busy:  # broken, or out (a drain, an outage): attempts are bounded
            self.broken += 1
        if verdict.retry_after is None and self.phase != "requeued":
            self.ceiling = self._next_ceiling(verdict)
        return verdict

    def cancelled(self, sent_at: float) -> None:
        """A hedge's race moved on without this visit's attempt: it is recorded as
        ``"cancelled"`` and what the visit holds given back (no verdict on its backend:
        lateness is not a failure, the breaker hears nothing)."""
        call = self.call
        call.records.append(
            AttemptRecord(
                backend=self.backend.name,
                attempt=self.attempt,
                kind="cancelled",
                waited=self.waited,
                elapsed=call.state.clock.monotonic() - sent_at,
            )
        )
        self.waited = 0.0
        self.leave()

    def _next_ceiling(self, verdict: Verdict) -> float:
        """The full-jitter ceiling of a retry the server gave no time for: it doubles with
        each retry at this backend (``min(cap, base * 2**n)``) and never shrinks. An outage
        (out, and no word on when) outlasts a queue's turnover: its ceiling starts at the
        breaker's open period and doubles up to ``max_open_for``; a refusal after it goes
        on from there, up to ``RetryPolicy.cap``."""
        config = self.call.state.config
        if verdict.down:
            base, cap = config.breaker.open_for, config.breaker.max_open_for
        else:
            base, cap = config.retry.base, config.retry.cap
        return min(cap, max(base * 2.0 ** (self.sent - 1), 2.0 * self.ceiling))

    def _capacity(self, response: Response) -> None:
        """The window takes the capacity the backend advertises, if it does."""
        capacity = parse_capacity(response.headers)
        if capacity is None:
            return
        window = self.window
        before = window.size
        window.advertise(capacity)
        if window.size != before:
            self.call.emit(
                WindowResized, backend=self.backend.name, size=window.size, reason="advertised"
            )

    def _hold_backend(self, verdict: Verdict) -> None:
        """Keep every call of the client off a backend that is out, for its Retry-After; a
        drain also opens its breaker (for the breaker's open period when it gave no time).
        An outage without a time holds nobody: each call backs off on its own, spread by
        full jitter, rather than all coming back when a guessed hold ends."""
        call, backend, seconds = self.call, self.backend, verdict.retry_after
        state = call.state
        if seconds is not None:
            state.holds.hold(backend.name, seconds, draining=verdict.draining)
            call.emit(
                BackpressureReceived,
                backend=backend.name,
                retry_after=seconds,
                draining=verdict.draining,
            )
        if verdict.draining:
            call.transition(backend, self.breaker.force_open(seconds, "draining"))


def _clip(limits: Timeouts, *, left: float, read_left: float) -> Timeouts:
    """``limits``, clipped to the ``left`` seconds this backend may still use; a stream's
    idle limit to ``read_left``, what is left of the whole call: reading a stream happens
    after the call is accepted, when no fallback is possible any more."""
    left, read_left = max(left, 1e-3), max(read_left, 1e-3)
    if limits.connect <= left and limits.first_byte <= left and limits.read <= read_left:
        return limits  # the common case: the driver reuses their httpx form
    return Timeouts(
        connect=min(limits.connect, left),
        first_byte=min(limits.first_byte, left),
        read=min(limits.read, read_left),
    )
