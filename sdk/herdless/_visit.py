"""One call's stay at one backend: the per-backend rules of the call flow.

``serve`` is the loop ``CallFlow.run`` runs for each backend of the route, in order:

1. gate: a running Retry-After window (any call's) -> wait above it with jitter if
   that fits, else the next backend; a drain -> the next backend at once;
2. retry budget (a retry at the last backend): wait for budget;
3. pacing (when on): wait for the backend's next slot;
4. spend guard (external backends only) -> wait for a slot, or ``SpendLimitExceeded``;
5. breaker: open -> the next backend (the last one waits for the probe time if it fits);
6. send, its timeouts clipped to the time this backend may use;
7. judge the outcome (``herdless._retry.classify``): 2xx -> done; 4xx other than 429
   -> raise at once (no backend can fix the request); a drain -> the next backend; a
   timeout on a backend with a fallback behind it -> the fallback (a hung backend is
   not waited on twice); retryable -> retry if attempts, budget and deadline allow,
   else the next backend.

Every wait is announced by an event first; every wait that cannot end in time is not
taken.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from herdless._actions import (
    ATTEMPT_HEADER,
    REQUEST_ID_HEADER,
    Accepted,
    Action,
    Outcome,
    Response,
    Send,
    Sleep,
)
from herdless._backend import Backend, Timeouts
from herdless._breaker import Permit
from herdless._retry import Verdict, classify
from herdless._types import AttemptRecord
from herdless.errors import HerdlessError
from herdless.events import AttemptFailed, RetryScheduled, WaitScheduled

if TYPE_CHECKING:
    from herdless._flow import CallFlow

__all__ = ["Fail", "Move", "serve"]

# Seconds: the least a wait loop (budget, breaker) sleeps, so that it can never spin.
_MIN_WAIT = 0.05


@dataclass(frozen=True, slots=True)
class Move:
    """Leave this backend for the next one, for ``reason``; ``error`` is what went wrong."""

    reason: str
    error: HerdlessError


@dataclass(frozen=True, slots=True)
class Fail:
    """The last backend cannot serve within the deadline."""

    error: HerdlessError


def serve(
    call: CallFlow, backend: Backend, *, end: float, last: bool
) -> Generator[Action, Outcome | None, Accepted | Move | Fail]:
    """One call's stay at ``backend``; ``end`` is when it must leave, ``last`` whether
    no backend follows. Returns the answer, or why the call moves on (``Move``) or ends
    (``Fail``); raises at once for a request no backend can serve."""
    policies = call.policies
    name = backend.name
    clock, rng, retry = policies.clock, policies.rng, policies.retry
    fallback_policy = policies.fallback_policy
    breaker, budget, gate = policies.breaker(backend), policies.budget(backend), policies.gate
    sent = 0  # attempts at this backend
    waits = 0  # waits (not retries) at this backend: grows their backoff
    waited = 0.0  # seconds waited since the previous attempt
    reserved = False  # a retry budget unit is held (waiting or in flight)
    last_error: HerdlessError | None = None
    admitted = not backend.external  # the spend guard let this call through
    pacer = policies.pacer(backend)
    paced = pacer is None  # the next attempt holds a pacing slot
    limits = backend.timeouts or policies.timeouts
    counted = policies.counts_in_flight  # only a choice among primaries reads the count
    in_flight: Permit | None = None  # the permit of an attempt sent and not answered yet

    try:
        while True:
            now = clock.monotonic()
            blocked, draining = gate.blocked(name, now)
            if blocked > 0:
                if not last and (draining or fallback_policy.on_backpressure == "fallback"):
                    return Move(
                        "draining" if draining else "backpressure", call.errors.blocked(name)
                    )
                delay = retry.after_server(blocked, rng)
                if not call.fits(now + delay, end):
                    return _give_up(call, backend, last, "retry_after_exceeds_deadline", last_error)
                why = "draining" if draining else "backpressure"
                waited += yield from _pause(call, name, delay, why)
                continue
            # A retry at the last backend that found the budget spent (the others
            # move on instead) waits here until budget frees or the deadline nears.
            if sent and not reserved:
                if budget.try_acquire():
                    reserved = True
                else:
                    delay = max(retry.backoff(waits, rng), _MIN_WAIT)
                    waits += 1
                    if not call.fits(now + delay, end):
                        return _give_up(call, backend, last, "deadline", last_error)
                    waited += yield from _pause(call, name, delay, "budget")
                    continue
            if not paced and pacer is not None:
                delay = pacer.reserve()
                paced = True
                if delay > 0:
                    if not call.fits(now + delay, end):
                        return _give_up(call, backend, last, "deadline", last_error)
                    waited += yield from _pause(call, name, delay, "pacing")
                    continue
            if not admitted:
                delay = policies.spend.admit()
                if delay > 0:
                    if not call.fits(now + delay, end):
                        return Fail(call.errors.spend(name))
                    waited += yield from _pause(call, name, delay, "spend")
                    continue
                admitted = True
            permit, transition = breaker.acquire()
            if transition is not None:
                call.transition(backend, transition)
            if permit is Permit.DENIED:
                if not last:
                    call.records.append(
                        AttemptRecord(backend=name, attempt=0, kind="skipped_breaker_open")
                    )
                    return Move("breaker_open", last_error or call.errors.breaker_open(name))
                # The last backend: wait for its probe time (or, while another call
                # probes, a jittered moment) when the deadline allows.
                delay = breaker.remaining_open()
                delay = retry.after_server(delay, rng) if delay else retry.backoff(waits, rng)
                delay = max(delay, _MIN_WAIT)
                waits += 1
                if not call.fits(now + delay, end):
                    return Fail(last_error or call.errors.breaker_open(name))
                waited += yield from _pause(call, name, delay, "breaker_open")
                continue

            # -- send ------------------------------------------------------------
            if not reserved:
                budget.record_call(now)
            sent += 1
            attempt = call.next_attempt()
            model = call.model_for(backend)
            call.attempt_started(backend, attempt, model, now)
            if counted:
                policies.enter(backend)
            in_flight = permit
            outcome = yield Send(
                backend=backend,
                attempt=attempt,
                model=model,
                body=call.body,
                headers={REQUEST_ID_HEADER: call.request_id, ATTEMPT_HEADER: str(attempt)},
                timeouts=_clip(limits, left=end - now, read_left=call.deadline_at - now),
                stream=call.stream,
            )
            if outcome is None:
                raise TypeError("the driver must send the outcome of a Send action, not None")
            in_flight = None
            if counted:
                policies.leave(backend)
            verdict = classify(outcome, retry, now=policies.wall())
            if reserved:  # a retry: a served one gives its budget back
                budget.settle(failed=not verdict.ok)
                reserved = False
            if pacer is not None:
                paced = False
                if verdict.status == 429:
                    pacer.throttled()
                elif verdict.ok:
                    pacer.succeeded()
            call.records.append(
                AttemptRecord(
                    backend=name,
                    attempt=call.attempt,
                    kind=verdict.kind,
                    status=verdict.status,
                    waited=waited,
                    elapsed=outcome.elapsed,
                )
            )
            waited = 0.0
            if verdict.ok and isinstance(outcome, Response):
                transition = breaker.record_success(permit)
                if transition is not None:
                    call.transition(backend, transition)
                return Accepted(backend=backend, response=outcome, attempts=call.attempts)
            record = breaker.record_failure if verdict.breaker_failure else breaker.record_success
            call.transition(backend, record(permit))
            last_error = call.errors.attempt(backend, outcome, verdict)
            call.emit(
                AttemptFailed,
                backend=name,
                attempt=call.attempt,
                kind=verdict.kind,
                status=verdict.status,
                retry_after=verdict.retry_after,
                message=verdict.message,
            )
            if verdict.draining:
                hold = verdict.retry_after or policies.breaker_policy.open_for
                call.backpressure(backend, hold, draining=True)
                call.transition(backend, breaker.force_open(hold, "draining"))
                if not last:
                    return Move("draining", last_error)
            elif verdict.retry_after is not None:
                call.backpressure(backend, verdict.retry_after, draining=False)
                if not last and fallback_policy.on_backpressure == "fallback":
                    return Move("backpressure", last_error)
            if not verdict.fallback_may_help:
                raise last_error  # a request no backend can serve: 400, 401, 403, ...
            if not verdict.retryable:
                return _give_up(call, backend, last, "failed", last_error)
            if verdict.timeout and not last:
                return Move("timeout", last_error)
            if sent >= retry.max_attempts:
                return _give_up(call, backend, last, "retries_exhausted", last_error)
            now = clock.monotonic()
            delay = retry.delay(sent - 1, verdict.retry_after, rng)
            if not call.fits(now + delay, end):
                too_long = verdict.retry_after is not None
                return _give_up(
                    call,
                    backend,
                    last,
                    "retry_after_exceeds_deadline" if too_long else "deadline",
                    last_error,
                )
            reserved = budget.try_acquire()
            if not reserved:
                if not last:
                    return Move("budget_exhausted", last_error)
                # Wait anyway; the loop's budget check waits more if still spent.
                call.emit(WaitScheduled, backend=name, delay=delay, reason="budget")
            else:
                call.emit(
                    RetryScheduled,
                    backend=name,
                    attempt=call.attempt,
                    delay=delay,
                    reason=_retry_reason(verdict),
                )
            yield Sleep(seconds=delay)
            waited += delay
    finally:
        if in_flight is not None:  # the driver closed the flow mid-attempt: free a probe
            breaker.release(in_flight)
            if counted:
                policies.leave(backend)
        if reserved:  # leaving (fallback, error, or the driver closed us) with a unit held
            budget.cancel()


def _give_up(
    call: CallFlow, backend: Backend, last: bool, reason: str, error: HerdlessError | None
) -> Move | Fail:
    """Leave ``backend`` for ``reason``: the call ends there when it is the last one."""
    error = error or call.errors.deadline(backend.name)
    return Fail(error) if last else Move(reason, error)


def _pause(call: CallFlow, name: str, delay: float, reason: str) -> Generator[Action, Any, float]:
    """Announce a wait that is not a retry's backoff, then take it."""
    call.emit(WaitScheduled, backend=name, delay=delay, reason=reason)
    yield Sleep(seconds=delay)
    return delay


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


def _retry_reason(verdict: Verdict) -> str:
    return f"status_{verdict.status}" if verdict.status is not None else verdict.kind
