"""Hedged attempts: a late attempt races a copy of itself at the next backend.

The flow (``herdless._call.flow``) hands an attempt here when its visit may hedge
(``Visit.backup``: the route's first backend, a client with a ``HedgePolicy``, another
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

Both visits write their own fields: the race asks the hedge's visit ``try_admit`` (the
checks, never waiting) and has each visit ``record`` its outcome; the rules that follow
are ``judge``'s, as for any attempt.

The hedge's backend is the one the call would fall back to next, so the data guard
(``allow_fallback=False``, ``external``) already kept it out if it must be. A hedge is
sent at most once per call, and a stream races only until its first chunk: it is
accepted there.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypeAlias

from herdless._actions import Accepted, Action, Ended, Outcome, Race, Response, Resume, Send
from herdless._call.checks import Judged, judge, try_admit
from herdless._call.decisions import Move
from herdless._call.errors import deadline_error
from herdless._call.visit import Backup, Visit
from herdless.events import FallbackUsed, HedgeFinished, HedgeStarted

if TYPE_CHECKING:
    from herdless._hedge import Hedging

__all__ = ["Handoff", "awaiting", "outcome_of", "race"]

Steps: TypeAlias = Generator[Action, Resume, Judged]


@dataclass(frozen=True, slots=True)
class Handoff(Move):
    """The late attempt failed while its hedge runs: the call moves to the hedge's
    backend, where ``visit`` holds the attempt in flight (``awaiting`` resumes it)."""

    visit: Visit
    origin: str
    """The backend of the attempt that was hedged."""


class _Duel:
    """The two attempts of a hedge's race, and which of them still run."""

    __slots__ = ("first", "first_at", "first_send", "hedge", "hedge_at", "hedge_send", "running")

    def __init__(self, first: tuple[Visit, Send, float], hedge: tuple[Visit, Send, float]) -> None:
        self.first, self.first_send, self.first_at = first  # (visit, its attempt, sent at)
        self.hedge, self.hedge_send, self.hedge_at = hedge
        self.running = [self.first_send, self.hedge_send]  # by identity: not hashable

    def visit_of(self, sent: Send) -> Visit:
        return self.first if sent is self.first_send else self.hedge


def outcome_of(resumed: Resume) -> Outcome:
    """What the driver sent back for a ``Send``: its outcome."""
    if resumed is None or isinstance(resumed, Ended):
        raise TypeError("the driver must send the outcome of a Send action back")
    return resumed


def _ended(resumed: Resume) -> Ended:
    """What the driver sent back for a ``Race`` without a timeout: the send that ended."""
    if not isinstance(resumed, Ended):
        raise TypeError("the driver must send an Ended back for a Race without timeout")
    return resumed


def _answered(outcome: Outcome) -> bool:
    """A 2xx: the attempt's answer (or a stream's first chunk) is in."""
    return type(outcome) is Response and 200 <= outcome.status < 300


def race(visit: Visit, send: Send, hedging: Hedging, backup: Backup) -> Steps:
    """Send ``send`` (at ``visit``, which may hedge to ``backup``); hedge it when it is
    late. Returns what ``judge`` would (``Handoff`` when the call moves on to the
    hedge's attempt)."""
    call = visit.call
    clock = call.state.clock
    sent_at = clock.monotonic()
    after = hedging.delay(visit.backend.name)
    if after >= send.timeouts.first_byte or not _holds(visit, backup, sent_at + after):
        # The attempt's own limit ends first (then the usual fallback follows), or the
        # deadline could not hold a hedge by then: a plain attempt.
        return _alone(hedging, visit, outcome_of((yield send)))
    resumed = yield Race(send=send, timeout=after)
    if resumed is not None:  # in time: no hedge
        return _alone(hedging, visit, _ended(resumed).outcome)
    now = clock.monotonic()
    hedge = _open(visit, hedging, backup, now)
    if hedge is None:  # no hedge may start now: wait for the attempt alone
        ended = _ended((yield Race(send=None, timeout=None)))
        return _alone(hedging, visit, ended.outcome)
    visit.take_backup()  # once per call
    hedge_send = hedge.send(now)
    duel = _Duel((visit, send, sent_at), (hedge, hedge_send, now))
    call.emit(
        HedgeStarted,
        now,
        backend=hedge.backend.name,
        from_backend=visit.backend.name,
        attempt=hedge_send.attempt,
        after=now - sent_at,
    )
    handed = False
    try:
        ended = _ended((yield Race(send=hedge_send, timeout=None)))
        while True:
            sent, outcome = ended.send, ended.outcome
            duel.running = [other for other in duel.running if other is not sent]
            mine = duel.visit_of(sent)
            if _answered(outcome):
                return _won(hedging, duel, mine, outcome)
            if not duel.running:  # both failed: the late attempt's backend goes on
                _finished(duel, winner=None, cancelled=False)
                return judge(mine, outcome)
            mine.record(outcome)  # the other still runs: it decides what follows
            if mine is duel.first:
                visit.leave()
                handed = True
                error = visit.last_error or deadline_error(call, visit.backend.name)
                return Handoff("hedge", error, hedge, visit.backend.name)
            hedge.leave()
            ended = _ended((yield Race(send=None, timeout=None)))
    finally:
        if not handed:
            hedge.leave()  # won, lost or abandoned (the driver closed the flow mid-race)


def awaiting(handoff: Handoff) -> Steps:
    """The hedge's attempt, still in flight when the call moved to its backend: wait for
    it and judge it as usual there (the race is decided either way)."""
    outcome = _ended((yield Race(send=None, timeout=None))).outcome
    visit = handoff.visit
    visit.call.emit(
        HedgeFinished,
        backend=visit.backend.name,
        from_backend=handoff.origin,
        winner=visit.backend.name if _answered(outcome) else None,
        loser_cancelled=False,
    )
    return judge(visit, outcome)


def _alone(hedging: Hedging, visit: Visit, outcome: Outcome) -> Judged:
    """The attempt, judged as if nothing had raced it (its first byte is measured)."""
    if _answered(outcome):
        hedging.answered(visit.backend.name, outcome.elapsed)
    return judge(visit, outcome)


def _won(hedging: Hedging, duel: _Duel, winner: Visit, outcome: Outcome) -> Judged:
    """``winner`` answered first: cancel the other (when it still runs) and take it."""
    loser = duel.hedge if winner is duel.first else duel.first
    cancelled = bool(duel.running)
    if cancelled:  # the driver closes it when the flow moves on
        loser.cancelled(duel.first_at if loser is duel.first else duel.hedge_at)
    _finished(duel, winner=winner.backend.name, cancelled=cancelled)
    if winner is duel.first:
        hedging.answered(winner.backend.name, outcome.elapsed)
        return judge(winner, outcome)
    call = winner.call
    call.emit(
        FallbackUsed,
        backend=winner.backend.name,
        from_backend=duel.first.backend.name,
        reason="hedge",
    )
    accepted = judge(winner, outcome)
    if call.stream:
        winner.hand_slot()  # the stream holds its slot there until it ends
    assert isinstance(accepted, Accepted)  # a 2xx is always accepted
    return replace(accepted, fallback_reason="hedge")


def _finished(duel: _Duel, *, winner: str | None, cancelled: bool) -> None:
    duel.first.call.emit(
        HedgeFinished,
        backend=duel.hedge.backend.name,
        from_backend=duel.first.backend.name,
        winner=winner,
        loser_cancelled=cancelled,
    )


def _holds(visit: Visit, backup: Backup, at: float) -> bool:
    """Whether a hedge sent at ``at`` still has the time its backend needs: the least an
    attempt gets (``FallbackPolicy.min_attempt``), or its usual answer time if longer."""
    backend, end, _ = backup
    state = visit.call.state
    need = state.config.fallback_policy.min_attempt
    answer = state.window(backend).answer_time
    if answer is not None and answer > need:
        need = answer
    return at + need <= end


def _open(visit: Visit, hedging: Hedging, backup: Backup, now: float) -> Visit | None:
    """The hedge's visit to its backend, holding what an attempt there needs, if a hedge
    may start now; else ``None`` (and nothing taken)."""
    if not _holds(visit, backup, now) or not hedging.budget.try_take():
        return None
    backend, end, last = backup
    hedge = Visit(visit.call, backend, end=end, last=last)
    if try_admit(hedge, now):
        return hedge
    hedge.leave()
    hedging.budget.refund()
    return None
