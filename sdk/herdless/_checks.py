"""The per-backend rules of a call, one small function each, returning a decision.

Before every attempt at a backend, ``herdless._visit.serve`` asks the checks in order;
the first that does not say "go on" (``None``) decides what happens next:

1. ``hold``: the backend is out for every call (a drain, or it said it is loading or
   its upstream is down) -> the next backend at once; the last one waits it out;
2. ``window``: the client's calls already fill the backend's window -> wait in the
   client for a slot (``Queue``); leave at once when that wait no longer fits;
3. ``budget``: a retry the server gave no time for needs retry budget -> wait for it;
4. ``pacing`` (when on): the backend's next send slot;
5. ``spend``: an external backend's spend guard -> wait for a slot, or stop;
6. ``breaker``: open -> the next backend (the last one waits for its probe time).

Then the attempt is sent and its outcome judged (``herdless._attempt``: ``send``,
``judge``), which decides with the same values (``Wait``, ``Move``, ``Fail``). Every
wait is announced by an event before it starts; a wait that cannot end in time is not
taken.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

from herdless._breaker import Permit
from herdless._call import Call, Stay
from herdless._types import AttemptRecord, WaitEstimate
from herdless._window_wait import SlotTicket
from herdless.errors import HerdlessError
from herdless.events import (
    SlotAwaited,
)

__all__ = [
    "CHECKS",
    "Check",
    "Decision",
    "Fail",
    "Move",
    "Queue",
    "Wait",
    "checks_for",
    "give_up",
]

# Seconds: the least a wait loop (budget, breaker) sleeps, so that it can never spin.
_MIN_WAIT = 0.05
# Seconds past the end of a clump of answers a waiter looks at its place again: the
# clump is surely over then, and the review is not asked before its time.
_REVIEW_SLACK = 0.001


@dataclass(frozen=True, slots=True)
class Wait:
    """Wait ``seconds`` before trying again, for ``why``; ``retry``: a retry's backoff
    (announced as ``RetryScheduled``), else another wait (``WaitScheduled``);
    ``until_release``: or less, until another call leaves the backend."""

    seconds: float
    why: str
    retry: bool = False
    until_release: bool = False


@dataclass(frozen=True, slots=True)
class Queue:
    """Wait in the client for ``ticket``'s slot, at most ``timeout`` seconds."""

    ticket: SlotTicket
    timeout: float


@dataclass(frozen=True, slots=True)
class Move:
    """Leave this backend for the next one, for ``reason``; ``error`` is what went wrong."""

    reason: str
    error: HerdlessError


@dataclass(frozen=True, slots=True)
class Fail:
    """The call ends here: the last backend cannot serve it in time."""

    error: HerdlessError


Decision: TypeAlias = Wait | Queue | Move | Fail | None
"""What a check says; ``None``: nothing in the way, ask the next one."""
Check: TypeAlias = Callable[[Call, Stay, float], Decision]
"""One rule asked before an attempt: ``check(call, stay, now)``."""


def give_up(call: Call, stay: Stay, reason: str, error: HerdlessError | None = None) -> Move | Fail:
    """Leave the backend for ``reason``: the call ends there when it is the last one."""
    error = error or stay.last_error or call.errors.deadline(stay.backend.name)
    return Fail(error) if stay.last else Move(reason, error)


# -- the checks, in order ------------------------------------------------------------------


def hold(call: Call, stay: Stay, now: float) -> Decision:
    """A drain or an outage the backend announced holds every call of the client."""
    held, draining = call.state.holds.held(stay.backend.name, now)
    if held <= 0:
        return None
    why = "draining" if draining else "unavailable"
    if not stay.last:
        return Move(why, stay.last_error or call.errors.blocked(stay.backend.name))
    delay = call.state.config.retry.after_server(held, call.state.rng)
    if not call.fits(now + delay, stay.end):
        return give_up(call, stay, "retry_after_exceeds_deadline")
    return Wait(delay, "draining" if draining else "backpressure")


def window(call: Call, stay: Stay, now: float) -> Decision:
    """Wait in the client while the backend's window is full (flow control)."""
    slot, window = stay.slot, stay.window
    policy = call.state.config.fallback_policy
    if slot is None:
        patience = policy.max_busy_wait
        slot = stay.slot = window.acquire(
            end=stay.end,
            max_wait=math.inf if stay.last or patience is None else patience,
            last=stay.last,
        )
    if slot.state == "waiting":
        window.review()  # the latest clump of answers is over: does its place still fit?
    # Read once: another thread may grant the slot at any moment, and a slot granted
    # between two reads must not be taken for one told to leave.
    state = slot.state
    if state == "granted":
        if stay.queued_at is not None:
            call.state.counts.slot_waited(now - stay.queued_at)
            stay.queued_at = None
        return None
    # A slot granted later than this could not be answered in time, even at best.
    timeout = stay.end - max(policy.min_attempt, window.best_answer(stay.last)) - now
    if state == "waiting" and timeout > 0:
        if stay.queued_at is None:
            stay.queued_at = now
            position = window.position(slot)
            call.emit(
                SlotAwaited,
                now,
                backend=stay.backend.name,
                position=position,
                expected=window.expected_wait(position),
            )
        review = window.review_at()
        if review is not None:  # look again once the latest clump of answers is over
            timeout = min(timeout, review - now + _REVIEW_SLACK)
        return Queue(slot, timeout)
    # Told to leave (even its best case no longer fits), or out of time while waiting.
    if stay.queued_at is not None:
        call.state.counts.slot_waited(now - stay.queued_at)
        stay.queued_at = None
    told = window.estimate(slot)
    estimate = None
    if told is not None:
        wait, answer, margin, samples = told
        left = call.deadline_at - now
        reserve = 0.0 if stay.last else max(0.0, call.deadline_at - stay.end)
        estimate = WaitEstimate(
            wait=wait, answer=answer, margin=margin, samples=samples, left=left, reserve=reserve
        )
    return give_up(call, stay, "busy", call.errors.busy(stay.backend.name, estimate=estimate))


def budget(call: Call, stay: Stay, now: float) -> Decision:
    """A retry the server gave no time for needs budget (keeps a storm off a server that
    says nothing); the first attempt, a retry the server scheduled and a refused call's
    retry held to the window do not."""
    if not stay.sent or stay.reserved or stay.scheduled:
        return None
    if stay.budget.try_acquire():
        stay.reserved = True
        return None
    retry = call.state.config.retry
    delay = max(retry.backoff(stay.waits, call.state.rng), _MIN_WAIT)
    stay.waits += 1
    if not call.fits(now + delay, stay.end):
        return give_up(call, stay, "deadline")
    return Wait(delay, "budget")


def pacing(call: Call, stay: Stay, now: float) -> Decision:
    """The client's own rate toward the backend (``PacingPolicy``, off by default)."""
    if stay.paced or stay.pacer is None:
        return None
    delay = stay.pacer.reserve()
    stay.paced = True
    if delay <= 0:
        return None
    if not call.fits(now + delay, stay.end):
        return give_up(call, stay, "deadline")
    return Wait(delay, "pacing")


def spend(call: Call, stay: Stay, now: float) -> Decision:
    """An external backend's spend guard (``FallbackPolicy.max_external_*``)."""
    if stay.admitted:
        return None
    delay = call.state.spend.admit()
    if delay > 0:
        if not call.fits(now + delay, stay.end):
            return Fail(call.errors.spend(stay.backend.name, call.state.spend))
        return Wait(delay, "spend")
    stay.admitted = True
    return None


def breaker(call: Call, stay: Stay, now: float) -> Decision:
    """An open breaker: the next backend; the last one waits for its probe time."""
    permit, transition = stay.breaker.acquire()
    call.transition(stay.backend, transition)
    if permit is not Permit.DENIED:
        stay.permit = permit
        return None
    name = stay.backend.name
    if not stay.last:
        call.records.append(AttemptRecord(backend=name, attempt=0, kind="skipped_breaker_open"))
        return Move("breaker_open", stay.last_error or call.errors.breaker_open(name))
    # The last backend: wait for its probe time (or, while another call probes, a
    # jittered moment) when the deadline allows.
    retry, rng = call.state.config.retry, call.state.rng
    delay = stay.breaker.remaining_open()
    delay = retry.after_server(delay, rng) if delay else retry.backoff(stay.waits, rng)
    delay = max(delay, _MIN_WAIT)
    stay.waits += 1
    if not call.fits(now + delay, stay.end):
        return Fail(stay.last_error or call.errors.breaker_open(name))
    return Wait(delay, "breaker_open")


CHECKS = (hold, window, budget, pacing, spend, breaker)
"""The checks before every attempt, in order."""

# The checks a stay asks, by (external backend, pacing on): the others never stop a call
# there (they showed in per-call CPU, asked before every attempt).
_APPLICABLE = {
    (external, paced): tuple(
        check
        for check in CHECKS
        if (check is not spend or external) and (check is not pacing or paced)
    )
    for external in (False, True)
    for paced in (False, True)
}


def checks_for(stay: Stay) -> tuple[Check, ...]:
    """The checks that apply to ``stay`` (the spend guard to external backends only,
    pacing when it is on), in ``CHECKS`` order."""
    return _APPLICABLE[stay.backend.external, stay.pacer is not None]
