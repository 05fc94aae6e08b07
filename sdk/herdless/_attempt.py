"""One attempt at a backend: the ``Send`` the checks let through, and the verdict on
what came back.

``send`` builds the attempt (its headers, the deadline left as
``X-Herdless-Deadline-Ms``, its timeouts clipped to what the call has left). ``judge``
reads the outcome (``herdless._retry.classify``) and records it everywhere it counts (the
attempt record, the retry budget, the pacer, the breaker, the window, a backend hold,
``AttemptFailed``), then decides: the answer (``Accepted``), or why the call moves on
(``Move``), ends (``Fail``), or waits to retry (``Wait``); ``None``: retry as soon as the
checks (``herdless._checks``) let it.
"""

from __future__ import annotations

import math

from herdless._actions import (
    ATTEMPT_HEADER,
    DEADLINE_HEADER,
    PRIORITY_HEADER,
    REQUEST_ID_HEADER,
    Accepted,
    Outcome,
    Response,
    Send,
)
from herdless._backend import Timeouts
from herdless._call import Call, Stay
from herdless._checks import Fail, Move, Wait, give_up
from herdless._retry import Verdict, classify, parse_capacity
from herdless._types import AttemptRecord
from herdless.events import (
    AttemptFailed,
    BackpressureReceived,
    RetryScheduled,
    WindowResized,
)

__all__ = ["judge", "send"]


def send(call: Call, stay: Stay, now: float) -> Send:
    """The attempt to send now (its breaker permit is held in ``stay.permit``)."""
    backend = stay.backend
    if not stay.sent:
        stay.budget.record_call(now)
    stay.sent += 1
    stay.scheduled = False
    if stay.slot is not None:
        stay.window.sent(stay.slot)
    attempt = stay.attempt = call.next_attempt()
    model = call.model_for(backend)
    call.attempt_started(backend, attempt, model, now)
    left = stay.end - now
    return Send(
        backend=backend,
        attempt=attempt,
        model=model,
        body=call.body,
        headers={
            REQUEST_ID_HEADER: call.request_id,
            ATTEMPT_HEADER: str(attempt),
            DEADLINE_HEADER: str(max(1, int(left * 1000))),
            PRIORITY_HEADER: call.priority,
        },
        timeouts=_clip(stay.limits, left=left, read_left=call.deadline_at - now),
        stream=call.stream,
    )


def judge(
    call: Call, stay: Stay, outcome: Outcome, *, decide: bool = True
) -> Accepted | Move | Fail | Wait | None:
    """What the attempt's outcome means: the answer, a move, the end, a wait to retry, or
    ``None``: retry as soon as the checks let it (a refused call back in the window's line).

    With ``decide=False`` a failure is only recorded (the attempt record, the breaker, the
    window, the event, a backend hold) and ``None`` returned: the call's next step is
    another attempt's to decide (a hedge's race, ``herdless._race``).

    Raises:
        HerdlessError: a request no backend can serve (400, 401, 403, ...).
    """
    state, backend, name = call.state, stay.backend, stay.backend.name
    retry, rng = state.config.retry, state.rng
    verdict = classify(outcome, retry, now=state.wall())
    permit, stay.permit = stay.permit, None
    if stay.reserved:  # a retry: a served one gives its budget back
        stay.budget.settle(failed=not verdict.ok)
        stay.reserved = False
    if stay.pacer is not None:
        stay.paced = False
        if verdict.status == 429:
            stay.pacer.throttled()
        elif verdict.ok:
            stay.pacer.succeeded()
    call.records.append(
        AttemptRecord(
            backend=name,
            attempt=stay.attempt,
            kind=verdict.kind,
            status=verdict.status,
            waited=stay.waited,
            elapsed=outcome.elapsed,
        )
    )
    stay.waited = 0.0
    if verdict.ok and isinstance(outcome, Response):
        _learn(call, stay, outcome)
        if permit is not None:
            call.transition(backend, stay.breaker.record_success(permit))
        return Accepted(backend=backend, response=outcome, attempts=call.attempts)
    if permit is not None:
        if verdict.breaker_failure:
            call.transition(backend, stay.breaker.record_failure(permit))
        elif verdict.breaker_refusal:
            answer = stay.window.answer_time
            call.transition(backend, stay.breaker.record_refusal(permit, answer_time=answer))
        else:
            call.transition(backend, stay.breaker.record_success(permit))
    error = stay.last_error = call.errors.attempt(backend, outcome, verdict)
    call.emit(
        AttemptFailed,
        backend=name,
        attempt=stay.attempt,
        kind=verdict.kind,
        status=verdict.status,
        retry_after=verdict.retry_after,
        message=verdict.message,
    )
    if isinstance(outcome, Response):
        capacity = parse_capacity(outcome.headers)
        if capacity is not None:
            _advertised(call, stay, capacity)
    requeued = False
    if verdict.busy and stay.slot is not None:
        if stay.window.refused(stay.slot):
            call.emit(WindowResized, backend=name, size=stay.window.size, reason="refused")
        requeued = stay.window.requeue(stay.slot)
    if verdict.backend_wide:
        _hold_backend(call, stay, verdict)
    if not decide:
        return None
    if verdict.backend_wide and not stay.last:
        return Move("draining" if verdict.draining else "unavailable", error)
    if verdict.unattainable:  # the server says the deadline cannot be met there
        late = call.errors.busy(name, verdict.retry_after)
        return give_up(call, stay, "deadline_unattainable", late)
    if not verdict.fallback_may_help:
        raise error  # a request no backend can serve: 400, 401, 403, ...
    if not verdict.retryable:
        return give_up(call, stay, "failed", error)
    if verdict.timeout and not stay.last:
        return Move("timeout", error)
    policy = state.config.fallback_policy
    why = f"status_{verdict.status}" if verdict.status is not None else verdict.kind
    if requeued:  # the window shrank below its calls: this one waits first in line
        stay.scheduled = True
        call.emit(RetryScheduled, backend=name, attempt=stay.attempt, delay=0.0, reason=why)
        return None
    if verdict.busy:
        ra = verdict.retry_after
        if ra is not None and not stay.last and policy.on_backpressure == "fallback":
            return Move("backpressure", error)
        if ra is not None and not stay.last and ra > (policy.max_busy_wait or math.inf):
            return Move("busy", error)
    else:  # broken, or out (a drain, an outage): attempts are bounded
        stay.broken += 1
        if stay.broken >= retry.max_attempts:
            return give_up(call, stay, "retries_exhausted", error)
    now = state.clock.monotonic()
    if verdict.retry_after is not None:
        delay = retry.after_server(verdict.retry_after, rng)
    else:
        delay = rng.uniform(0.0, _next_ceiling(call, stay, verdict))
    if not call.fits(now + delay, stay.end):
        too_long = verdict.retry_after is not None
        return give_up(call, stay, "retry_after_exceeds_deadline" if too_long else "deadline")
    if verdict.retry_after is not None:  # the server invited this retry: no budget spent
        stay.scheduled = True
        return Wait(delay, why, retry=True)
    if verdict.busy and state.config.window.enabled:
        # A refused call keeps its place in the window, which just shrank: the window,
        # not the budget, keeps its retries from becoming a storm. While the backend
        # serves other calls of the client, it retries when one of them leaves (a place
        # freed there; at most the backoff cap), else after its backoff.
        stay.scheduled = True
        if not stay.window.serving:
            return Wait(delay, why, retry=True)
        delay = min(retry.cap, stay.end - now - policy.min_attempt)
        return Wait(delay, why, retry=True, until_release=True)
    stay.reserved = stay.budget.try_acquire()
    if stay.reserved:
        return Wait(delay, why, retry=True)
    if not stay.last and not verdict.busy:
        return Move("budget_exhausted", error)
    # Wait anyway: a busy backend is worth waiting for; the budget check waits more
    # if the budget is still spent after this.
    return Wait(delay, "budget")


def _next_ceiling(call: Call, stay: Stay, verdict: Verdict) -> float:
    """The full-jitter ceiling of a retry the server gave no time for: it doubles with
    each retry at this backend (``min(cap, base * 2**n)``) and never shrinks. An outage
    (out, and no word on when) outlasts a queue's turnover: its ceiling starts at the
    breaker's open period and doubles up to ``max_open_for``; a refusal after it goes
    on from there, up to ``RetryPolicy.cap``."""
    config = call.state.config
    if verdict.down:
        base, cap = config.breaker.open_for, config.breaker.max_open_for
    else:
        base, cap = config.retry.base, config.retry.cap
    ceiling = min(cap, max(base * 2.0 ** (stay.sent - 1), 2.0 * stay.ceiling))
    stay.ceiling = ceiling
    return ceiling


def _learn(call: Call, stay: Stay, response: Response) -> None:
    """A success: the window measures it (and may grow), and takes an advertised capacity."""
    stay.window.answered(response.elapsed, stay.slot)
    capacity = parse_capacity(response.headers)
    if capacity is not None:
        _advertised(call, stay, capacity)


def _advertised(call: Call, stay: Stay, capacity: int) -> None:
    before = stay.window.size
    stay.window.advertise(capacity)
    if stay.window.size != before:
        call.emit(
            WindowResized, backend=stay.backend.name, size=stay.window.size, reason="advertised"
        )


def _hold_backend(call: Call, stay: Stay, verdict: Verdict) -> None:
    """Keep every call of the client off a backend that is out, for its Retry-After; a
    drain also opens its breaker (for the breaker's open period when it gave no time).
    An outage without a time holds nobody: each call backs off on its own, spread by
    full jitter, rather than all coming back when a guessed hold ends."""
    state, backend, seconds = call.state, stay.backend, verdict.retry_after
    if seconds is not None:
        state.holds.hold(backend.name, seconds, draining=verdict.draining)
        call.emit(
            BackpressureReceived,
            backend=backend.name,
            retry_after=seconds,
            draining=verdict.draining,
        )
    if verdict.draining:
        hold = state.config.breaker.open_for if seconds is None else seconds
        call.transition(backend, stay.breaker.force_open(hold, "draining"))


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
