"""The rules of one visit: the checks before every attempt, and ``decide`` after it.

Before every attempt at a backend, the flow (``herdless._call.flow``) asks the checks in
order; the first that does not say "go on" (``None``) decides what happens next:

1. ``hold``: the backend is out for every call (a drain, or it said it is loading or
   its upstream is down) -> the next backend at once; the last one waits it out;
2. ``window``: the client's calls already fill the backend's window -> wait in the
   client for a slot (``Queue``); leave at once when that wait no longer fits;
3. ``budget``: a retry the server gave no time for needs retry budget -> wait for it;
4. ``pacing`` (when on): the backend's next send slot;
5. ``spend``: an external backend's spend guard -> wait for a slot, or stop;
6. ``breaker``: open -> the next backend (the last one waits for its probe time).

``try_admit`` asks the same of an attempt that never waits (a hedge's). Then the attempt
is sent; ``judge`` has the visit ``record`` its outcome and ``decide`` (pure, its rules
numbered in its docstring) what follows. Every wait is announced by an event before it
starts; a wait that cannot end in time is not taken.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple, TypeAlias

from herdless._actions import Accepted, Outcome, Response
from herdless._call.decisions import Budgeted, Decision, Fail, Move, Queue, Requeued, Wait
from herdless._call.errors import (
    blocked_error,
    breaker_open_error,
    busy_error,
    deadline_error,
    spend_error,
)
from herdless._call.visit import Visit
from herdless._types import AttemptRecord, WaitEstimate
from herdless.events import SlotAwaited

if TYPE_CHECKING:
    from herdless._config import ClientConfig
    from herdless._retry import Verdict
    from herdless.errors import HerdlessError

__all__ = [
    "CHECKS",
    "Check",
    "Judged",
    "Policy",
    "checks_for",
    "decide",
    "judge",
    "move_on",
    "try_admit",
]

# Seconds: the least a wait loop (budget, breaker) sleeps, so that it can never spin.
_MIN_WAIT = 0.05
# Seconds past the end of a clump of answers a waiter looks at its place again: the
# clump is surely over then, and the review is not asked before its time.
_REVIEW_SLACK = 0.001

Check: TypeAlias = Callable[[Visit, float], Decision]
"""One rule asked before an attempt: ``check(visit, now)``."""
Judged: TypeAlias = Accepted | Move | Fail | Wait | Requeued
"""What an attempt's outcome leads to."""


class Policy(NamedTuple):
    """What ``decide`` reads besides the verdict and the visit: the client's
    configuration, and the random source its jitter is drawn from."""

    config: ClientConfig
    rng: random.Random


def move_on(visit: Visit, reason: str, error: HerdlessError | None = None) -> Move | Fail:
    """Leave the backend for ``reason``: the call ends there when it is the last one."""
    error = error or visit.last_error or deadline_error(visit.call, visit.backend.name)
    return Fail(error) if visit.last else Move(reason, error)


def _wait(visit: Visit, now: float, delay: float, why: str, late: str = "deadline") -> Decision:
    """Wait ``delay`` seconds for ``why`` when the deadline still leaves an attempt its
    time after it; else leave the backend for ``late``."""
    if not visit.call.fits(now + delay, visit.end):
        return move_on(visit, late)
    return Wait(delay, why)


# -- the checks, in order ------------------------------------------------------------------


def hold(visit: Visit, now: float) -> Decision:
    """A drain or an outage the backend announced holds every call of the client."""
    call = visit.call
    left, draining = call.state.holds.held(visit.backend.name, now)
    if left <= 0:
        return None
    if not visit.last:
        why = "draining" if draining else "unavailable"
        return Move(why, visit.last_error or blocked_error(call, visit.backend.name))
    delay = call.state.config.retry.after_server(left, call.state.rng)
    why = "draining" if draining else "backpressure"
    return _wait(visit, now, delay, why, "retry_after_exceeds_deadline")


def window(visit: Visit, now: float) -> Decision:
    """Wait in the client while the backend's window is full (flow control)."""
    call, window = visit.call, visit.window
    policy = call.state.config.fallback_policy
    patience = policy.max_busy_wait
    slot = visit.take_slot(
        math.inf if visit.last or patience is None else patience, last=visit.last
    )
    if slot.state == "waiting":
        window.review()  # the latest clump of answers is over: does its place still fit?
    # Read once: another thread may grant the slot at any moment, and a slot granted
    # between two reads must not be taken for one told to leave.
    state = slot.state
    if state == "granted":
        visit.dequeue(now)
        return None
    # A slot granted later than this could not be answered in time, even at best.
    timeout = visit.end - max(policy.min_attempt, window.best_answer(visit.last)) - now
    if state == "waiting" and timeout > 0:
        if visit.queue(now):
            position = window.position(slot)
            call.emit(
                SlotAwaited,
                now,
                backend=visit.backend.name,
                position=position,
                expected=window.expected_wait(position),
            )
        review = window.review_at()
        if review is not None:  # look again once the latest clump of answers is over
            timeout = min(timeout, review - now + _REVIEW_SLACK)
        return Queue(slot, timeout)
    # Told to leave (even its best case no longer fits), or out of time while waiting.
    visit.dequeue(now)
    told = window.estimate(slot)
    estimate = None
    if told is not None:
        wait, answer, margin, samples = told
        left = call.deadline_at - now
        reserve = 0.0 if visit.last else max(0.0, call.deadline_at - visit.end)
        estimate = WaitEstimate(
            wait=wait, answer=answer, margin=margin, samples=samples, left=left, reserve=reserve
        )
    return move_on(visit, "busy", busy_error(call, visit.backend.name, estimate=estimate))


def budget(visit: Visit, now: float) -> Decision:
    """A retry after the client's own backoff needs budget (keeps a storm off a server
    that says nothing); the first attempt, a retry at the server's (or the window's)
    time and a requeued call's do not."""
    if visit.phase != "backoff" or visit.budgeted or visit.take_budget():
        return None
    state = visit.call.state
    delay = max(state.config.retry.backoff(visit.count_wait(), state.rng), _MIN_WAIT)
    return _wait(visit, now, delay, "budget")


def pacing(visit: Visit, now: float) -> Decision:
    """The client's own rate toward the backend (``PacingPolicy``, off by default)."""
    if visit.paced:
        return None
    delay = visit.take_pace()
    return None if delay <= 0 else _wait(visit, now, delay, "pacing")


def spend(visit: Visit, now: float) -> Decision:
    """An external backend's spend guard (``FallbackPolicy.max_external_*``)."""
    if visit.admitted:
        return None
    delay = visit.take_spend()
    if delay <= 0:
        return None
    call = visit.call
    if not call.fits(now + delay, visit.end):
        return Fail(spend_error(call, visit.backend.name, call.state.spend))
    return Wait(delay, "spend")


def breaker(visit: Visit, now: float) -> Decision:
    """An open breaker: the next backend; the last one waits for its probe time."""
    if visit.take_permit():
        return None
    call, name = visit.call, visit.backend.name
    if not visit.last:
        call.records.append(AttemptRecord(backend=name, attempt=0, kind="skipped_breaker_open"))
        return Move("breaker_open", visit.last_error or breaker_open_error(call, name))
    # The last backend: wait for its probe time (or, while another call probes, a
    # jittered moment) when the deadline allows.
    retry, rng = call.state.config.retry, call.state.rng
    waits, open_left = visit.count_wait(), visit.breaker.remaining_open()
    delay = retry.after_server(open_left, rng) if open_left else retry.backoff(waits, rng)
    delay = max(delay, _MIN_WAIT)
    if not call.fits(now + delay, visit.end):
        return Fail(visit.last_error or breaker_open_error(call, name))
    return Wait(delay, "breaker_open")


CHECKS = (hold, window, budget, pacing, spend, breaker)
"""The checks before every attempt, in order."""

# The checks a visit asks, by (external backend, pacing on): the others never stop a
# call there, so they are not asked before every attempt.
_APPLICABLE = {
    (external, paced): tuple(
        check
        for check in CHECKS
        if (check is not spend or external) and (check is not pacing or paced)
    )
    for external in (False, True)
    for paced in (False, True)
}


def checks_for(visit: Visit) -> tuple[Check, ...]:
    """The checks that apply to ``visit`` (the spend guard to external backends only,
    pacing when it is on), in ``CHECKS`` order."""
    return _APPLICABLE[visit.backend.external, visit.pacer is not None]


def try_admit(visit: Visit, now: float) -> bool:
    """The checks, asked of an attempt that never waits (a hedge's): ``True`` when none
    is in the way, the visit then holding what its attempt needs. The one that counts
    for good (the spend guard) is asked last. On ``False`` the caller ``leave``s."""
    if visit.call.state.holds.held(visit.backend.name, now)[0] > 0:
        return False
    # A place granted at once, or none: a hedge never waits in the line.
    if visit.take_slot(0.0, last=False).state != "granted":
        return False
    if not visit.paced and visit.take_pace() > 0:
        visit.give_pace()
        return False
    if not visit.take_permit():
        return False
    return visit.admitted or visit.take_spend() <= 0


# -- after the attempt ---------------------------------------------------------------------


def judge(visit: Visit, outcome: Outcome) -> Judged:
    """The attempt's outcome, recorded (``Visit.record``), then what follows: the answer,
    or what ``decide`` says, the holdings it names taken (a budget unit) and the phase
    it names set (a retry at a given time).

    Raises:
        HerdlessError: a request no backend can serve (400, 401, 403, ...).
    """
    verdict = visit.record(outcome)
    call = visit.call
    if verdict.ok and isinstance(outcome, Response):
        return Accepted(backend=visit.backend, response=outcome, attempts=call.attempts)
    state = call.state
    decision = decide(verdict, visit, Policy(state.config, state.rng), state.clock.monotonic())
    if isinstance(decision, Budgeted):
        return decision.wait if visit.take_budget() else decision.without
    if isinstance(decision, Wait) and decision.scheduled:
        visit.schedule()
    return decision


def decide(
    verdict: Verdict, visit: Visit, policy: Policy, now: float
) -> Move | Fail | Wait | Requeued | Budgeted:
    """What a failed attempt at ``visit`` leads to, at ``now``. Pure: it writes nothing
    (the visit recorded the outcome before; the caller takes what the decision names);
    its jitter is drawn from ``policy.rng``. The first rule that applies decides:

    1. the backend is out (a drain, an outage) and another follows -> ``Move``
       (``draining`` / ``unavailable``);
    2. the server says the deadline cannot be met there -> leave
       (``deadline_unattainable``; the last backend: ``Fail``);
    3. a request no backend can serve (400, 401, 403, ...) -> raise its error;
    4. nothing to retry (not retryable) -> leave (``failed``);
    5. a timeout, and another backend follows -> ``Move`` (``timeout``);
    6. the window took the call back first in its line -> ``Requeued``;
    7. busy with a time, another follows, ``on_backpressure="fallback"`` -> ``Move``
       (``backpressure``);
    8. busy with a time past ``max_busy_wait``, another follows -> ``Move`` (``busy``);
    9. broken ``RetryPolicy.max_attempts`` times here -> leave (``retries_exhausted``);
    10. the retry's delay (the server's time with jitter above it, else full jitter
        under the visit's ceiling) does not fit the deadline -> leave
        (``retry_after_exceeds_deadline`` / ``deadline``);
    11. the server gave the time -> ``Wait`` (scheduled: no budget spent);
    12. busy, and the window is on -> ``Wait`` (scheduled: the window, not the budget,
        keeps a refused call's retries from becoming a storm), until another call
        leaves the backend while it serves others (at most the backoff cap);
    13. else -> ``Budgeted``: the ``Wait`` with a budget unit; without one, ``Move``
        (``budget_exhausted``) for a broken backend that another follows, else a
        ``Wait`` for the budget (a busy backend is worth waiting for).
    """
    config, rng = policy
    call, name, last = visit.call, visit.backend.name, visit.last
    error = visit.last_error
    assert error is not None  # recorded by the visit
    if verdict.backend_wide and not last:  # 1
        return Move("draining" if verdict.draining else "unavailable", error)
    if verdict.unattainable:  # 2
        return move_on(visit, "deadline_unattainable", busy_error(call, name, verdict.retry_after))
    if not verdict.fallback_may_help:  # 3
        raise error
    if not verdict.retryable:  # 4
        return move_on(visit, "failed", error)
    if verdict.timeout and not last:  # 5
        return Move("timeout", error)
    why = f"status_{verdict.status}" if verdict.status is not None else verdict.kind
    if visit.phase == "requeued":  # 6
        return Requeued(why)
    fallback, retry = config.fallback_policy, config.retry
    ra = verdict.retry_after
    if verdict.busy and ra is not None and not last:
        if fallback.on_backpressure == "fallback":  # 7
            return Move("backpressure", error)
        if ra > (fallback.max_busy_wait or math.inf):  # 8
            return Move("busy", error)
    if not verdict.busy and visit.broken >= retry.max_attempts:  # 9
        return move_on(visit, "retries_exhausted", error)
    delay = retry.after_server(ra, rng) if ra is not None else rng.uniform(0.0, visit.ceiling)
    if not call.fits(now + delay, visit.end):  # 10
        return move_on(visit, "retry_after_exceeds_deadline" if ra is not None else "deadline")
    if ra is not None:  # 11
        return Wait(delay, why, retry=True, scheduled=True)
    if verdict.busy and config.window.enabled:  # 12
        if not visit.window.serving:
            return Wait(delay, why, retry=True, scheduled=True)
        delay = min(retry.cap, visit.end - now - fallback.min_attempt)
        return Wait(delay, why, retry=True, until_release=True, scheduled=True)
    without = Move("budget_exhausted", error) if not last and not verdict.busy else None
    return Budgeted(Wait(delay, why, retry=True), without or Wait(delay, "budget"))  # 13
