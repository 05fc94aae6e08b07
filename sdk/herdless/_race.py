"""Hedged attempts: a late attempt races a copy of itself at the next backend.

``serve`` (``herdless._visit``) hands an attempt here when its stay may hedge
(``Stay.backup``: the route's first backend, a client with a ``HedgePolicy``, another
backend after it, no hedge sent yet in the call). The rule, once, for both clients::

    send the attempt; wait for it at most `after` seconds           Race(attempt, after)
    it ended in time: judge it as usual                               (no hedge)
    else a hedge starts only if, right now: a budget token is left, the deadline leaves
    the next backend time to answer, and its hold, window, pacing, breaker and spend
    guard each let a call through without waiting; if not:
        wait for the attempt, judge it as usual                        Race(None, None)
    else send the same request there (HedgeStarted)                    Race(hedge, None)
        the first answer (a stream: its first chunk) wins: the call takes it, the
            other is cancelled and its connection closed (HedgeFinished)
        a failure while the other runs is recorded (attempt record, breaker, event)
            and the call waits for the other
        the last one standing is judged as if it had been alone: the late attempt's
            backend retries or moves on as usual; after the late attempt failed, the
            call moves to the hedge's backend (``Handoff``), which goes on from its
            attempt in flight (``awaiting``) with its own rules

The hedge's backend is the one the call would fall back to next, so the data guard
(``allow_fallback=False``, ``external``) already kept it out if it must be. A hedge is
sent at most once per call, and a stream races only until its first chunk: it is
accepted there.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeAlias

from herdless._actions import Accepted, Action, Ended, Outcome, Race, Response, Send
from herdless._attempt import judge, send
from herdless._breaker import Permit
from herdless._call import Backup, Call, Stay
from herdless._checks import Fail, Move, Wait
from herdless._types import AttemptRecord
from herdless.events import FallbackUsed, HedgeFinished, HedgeStarted

if TYPE_CHECKING:
    from herdless._hedge import Hedging

__all__ = ["Handoff", "awaiting", "race"]

Verdict: TypeAlias = Accepted | Move | Fail | Wait | None
Steps: TypeAlias = Generator[Action, Any, Verdict]


@dataclass(frozen=True, slots=True)
class Handoff(Move):
    """The late attempt failed while its hedge runs: the call moves to the hedge's
    backend, where ``stay`` holds the attempt in flight (``awaiting`` resumes it)."""

    stay: Stay
    origin: str
    """The backend of the attempt that was hedged."""


class _Duel:
    """The two attempts of a hedge's race, and which of them still run."""

    __slots__ = ("first", "first_at", "first_send", "hedge", "hedge_at", "hedge_send", "running")

    def __init__(
        self,
        first: tuple[Stay, Send, float],
        hedge: tuple[Stay, Send, float],
    ) -> None:
        self.first, self.first_send, self.first_at = first  # (stay, its attempt, sent at)
        self.hedge, self.hedge_send, self.hedge_at = hedge
        self.running = [self.first_send, self.hedge_send]  # by identity: not hashable

    def stay_of(self, sent: Send) -> Stay:
        return self.first if sent is self.first_send else self.hedge


def _answered(outcome: Outcome) -> bool:
    """A 2xx: the attempt's answer (or a stream's first chunk) is in."""
    return type(outcome) is Response and 200 <= outcome.status < 300


def race(call: Call, stay: Stay, attempt: Send) -> Steps:
    """Send ``attempt`` (at ``stay``, which may hedge); hedge it when it is late. Returns
    what ``judge`` would (``Handoff`` when the call moves on to the hedge's attempt)."""
    state = call.state
    hedging: Hedging = state.hedging  # type: ignore[assignment]  # a stay may hedge only then
    backup: Backup = stay.backup  # type: ignore[assignment]  # serve checked it
    clock = state.clock
    sent_at = clock.monotonic()
    after = hedging.delay(stay.backend.name)
    if after >= attempt.timeouts.first_byte or not _holds(call, backup, sent_at + after):
        # The attempt's own limit ends first (then the usual fallback follows), or the
        # deadline could not hold a hedge by then: a plain attempt.
        outcome = yield attempt
        return _alone(call, stay, outcome)
    ended: Ended | None = yield Race(send=attempt, timeout=after)
    if ended is not None:  # in time: no hedge
        return _alone(call, stay, ended.outcome)
    now = clock.monotonic()
    hedge = _open(call, hedging, backup, now)
    if hedge is None:  # no hedge may start now: wait for the attempt alone
        ended = yield Race(send=None, timeout=None)
        assert ended is not None  # no timeout: the driver reports one
        return _alone(call, stay, ended.outcome)
    stay.backup = None  # once per call
    hedge_send = send(call, hedge, now)
    duel = _Duel((stay, attempt, sent_at), (hedge, hedge_send, now))
    call.emit(
        HedgeStarted,
        now,
        backend=hedge.backend.name,
        from_backend=stay.backend.name,
        attempt=hedge_send.attempt,
        after=now - sent_at,
    )
    handed = False
    try:
        ended = yield Race(send=hedge_send, timeout=None)
        while True:
            assert ended is not None  # no timeout: the driver reports one
            sent, outcome = ended.send, ended.outcome
            duel.running = [other for other in duel.running if other is not sent]
            mine = duel.stay_of(sent)
            if _answered(outcome):
                return _won(call, hedging, duel, mine, outcome)
            if not duel.running:  # both failed: the late attempt's backend goes on
                _finished(call, duel, winner=None, cancelled=False)
                return judge(call, mine, outcome)
            judge(call, mine, outcome, decide=False)  # recorded; the other still runs
            if mine is duel.first:
                stay.leave()
                handed = True
                error = stay.last_error or call.errors.deadline(stay.backend.name)
                return Handoff("hedge", error, hedge, stay.backend.name)
            hedge.leave()
            ended = yield Race(send=None, timeout=None)
    finally:
        if not handed:
            hedge.leave()  # won, lost or abandoned (the driver closed the flow mid-race)


def awaiting(call: Call, handoff: Handoff) -> Steps:
    """The hedge's attempt, still in flight when the call moved to its backend: wait for
    it and judge it as usual there (the race is decided either way)."""
    ended: Ended | None = yield Race(send=None, timeout=None)
    assert ended is not None  # no timeout: the driver reports one
    stay = handoff.stay
    outcome = ended.outcome
    call.emit(
        HedgeFinished,
        backend=stay.backend.name,
        from_backend=handoff.origin,
        winner=stay.backend.name if _answered(outcome) else None,
        loser_cancelled=False,
    )
    return judge(call, stay, outcome)


def _alone(call: Call, stay: Stay, outcome: Outcome | None) -> Verdict:
    """The attempt, judged as if nothing had raced it (its first byte is measured)."""
    if outcome is None:
        raise TypeError("the driver must send the outcome of a Send action, not None")
    if _answered(outcome):
        call.state.hedging.answered(stay.backend.name, outcome.elapsed)  # type: ignore[union-attr]  # racing: hedging is on
    return judge(call, stay, outcome)


def _won(call: Call, hedging: Hedging, duel: _Duel, winner: Stay, outcome: Outcome) -> Verdict:
    """``winner`` answered first: cancel the other (when it still runs) and take it."""
    loser = duel.hedge if winner is duel.first else duel.first
    cancelled = bool(duel.running)
    if cancelled:
        _cancelled(call, loser, duel)
    _finished(call, duel, winner=winner.backend.name, cancelled=cancelled)
    if winner is duel.first:
        hedging.answered(winner.backend.name, outcome.elapsed)
        return judge(call, winner, outcome)
    call.emit(
        FallbackUsed,
        backend=winner.backend.name,
        from_backend=duel.first.backend.name,
        reason="hedge",
    )
    accepted = judge(call, winner, outcome)
    if call.stream:
        call.hold_slot(winner)  # the stream holds its slot there until it ends
    assert isinstance(accepted, Accepted)  # a 2xx is always accepted
    return replace(accepted, fallback_reason="hedge")


def _cancelled(call: Call, loser: Stay, duel: _Duel) -> None:
    """The loser is still running: the driver closes it when the flow moves on. Its
    attempt is recorded as ``"cancelled"`` and what it held is given back (no verdict on
    its backend: lateness is not a failure, the breaker hears nothing)."""
    sent_at = duel.first_at if loser is duel.first else duel.hedge_at
    call.records.append(
        AttemptRecord(
            backend=loser.backend.name,
            attempt=loser.attempt,
            kind="cancelled",
            waited=loser.waited,
            elapsed=call.state.clock.monotonic() - sent_at,
        )
    )
    loser.waited = 0.0
    loser.leave()


def _finished(call: Call, duel: _Duel, *, winner: str | None, cancelled: bool) -> None:
    call.emit(
        HedgeFinished,
        backend=duel.hedge.backend.name,
        from_backend=duel.first.backend.name,
        winner=winner,
        loser_cancelled=cancelled,
    )


def _holds(call: Call, backup: Backup, at: float) -> bool:
    """Whether a hedge sent at ``at`` still has the time its backend needs: the least an
    attempt gets (``FallbackPolicy.min_attempt``), or its usual answer time if longer."""
    backend, end, _ = backup
    state = call.state
    need = state.config.fallback_policy.min_attempt
    answer = state.window(backend).answer_time
    if answer is not None and answer > need:
        need = answer
    return at + need <= end


def _open(call: Call, hedging: Hedging, backup: Backup, now: float) -> Stay | None:
    """The hedge's stay at its backend, holding what an attempt there needs, if a hedge
    may start now; else ``None`` (and nothing taken)."""
    if not _holds(call, backup, now) or not hedging.budget.try_take():
        return None
    backend, end, last = backup
    hedge = Stay(call, backend, end=end, last=last)
    if _admitted(call, hedge, now):
        return hedge
    hedge.leave()
    hedging.budget.refund()
    return None


def _admitted(call: Call, hedge: Stay, now: float) -> bool:
    """The checks an attempt passes before it is sent (``herdless._checks``), asked of a
    hedge that never waits: any of them in the way, and there is no hedge. The one that
    counts for good (the spend guard) is asked last."""
    state = call.state
    name = hedge.backend.name
    if state.holds.held(name, now)[0] > 0:
        return False
    hedge.slot = hedge.window.acquire(end=hedge.end, max_wait=0.0)
    if hedge.slot.state != "granted":
        return False  # leave() gives the place up
    pacer = hedge.pacer
    if pacer is not None:
        if pacer.reserve() > 0:
            pacer.refund()
            return False
        hedge.paced = True
    permit, transition = hedge.breaker.acquire()
    call.transition(hedge.backend, transition)
    if permit is Permit.DENIED:
        return False
    hedge.permit = permit
    if not hedge.admitted:  # external: the hedge counts toward the spend guard
        if state.spend.admit() > 0:
            return False
        hedge.admitted = True
    return True
