"""The call flow: the route walk and the loop at each backend, for both clients, once.

A ``CallFlow`` is one logical call. ``run()`` is a generator (``herdless._actions``
describes the protocol): it yields ``Send`` / ``Sleep`` / ``SlotWait`` / ``Race``,
receives what each came to (``Resume``), and returns ``Accepted`` or raises a
``HerdlessError``. Events go to an outbox the driver drains with ``take_events()`` after
every step, so each event is delivered *before* the wait it announces. The rules it
applies are ``herdless._call.checks``'s and ``herdless._call.race``'s. Read top to
bottom, the layers are:

- ``CallFlow.run``: the route walk. The call visits its route's backends in turn
  (``herdless._routing``: primaries, then fallbacks, less what the data guard keeps
  out) until one answers, the call must move on (the reason becomes
  ``FallbackUsed.reason`` and ``ChatResult.fallback_reason``) or end. The deadline
  covers the whole call: every backend but the last may use it less
  ``FallbackPolicy.reserve``, so a hanging primary always leaves the fallback time.
- ``_visit``: the loop at one backend. Ask the checks (``herdless._call.checks``); none
  in the way: send the attempt (``Visit.send``; raced against a hedge at the next
  backend, ``herdless._call.race``, when the client hedges and this is the route's first
  backend) and ``judge`` its outcome; a wait: announce it (an event), then ``Sleep`` /
  ``SlotWait``.

A stream is accepted at its first chunk; the driver then reports its end with
``stream_ended(ok=...)`` so the breaker, the window and the stats see it.
"""

from __future__ import annotations

import functools
from collections.abc import Generator
from dataclasses import replace
from typing import TypeAlias

from herdless._actions import Accepted, Action, Resume, Sleep, SlotWait
from herdless._backend import Backend
from herdless._breaker import Permit
from herdless._call.checks import Judged, checks_for, judge
from herdless._call.decisions import Fail, Move, Queue, Requeued, Wait
from herdless._call.errors import final_error
from herdless._call.race import Handoff, awaiting, outcome_of, race
from herdless._call.record import Call
from herdless._call.visit import Visit
from herdless.errors import HerdlessError, SpendLimitExceeded
from herdless.events import (
    AttemptFailed,
    CallFailed,
    CallFinished,
    FallbackUsed,
    PrimaryDegraded,
    RetryScheduled,
    WaitScheduled,
)

__all__ = ["CallFlow"]

Steps: TypeAlias = Generator[Action, Resume, Accepted]


class CallFlow(Call):
    """One logical call's decisions, against the client's ``ClientState``; run once.
    The arguments are ``herdless._call.record.Call``'s."""

    __slots__ = ()

    def run(self) -> Steps:
        """The call, as a generator of actions (see the module docstring)."""
        state = self.state
        self.begin()
        state.spend.record_call()
        route = state.route(allow_fallback=self.allow_fallback, batch=self.priority == "batch")
        backends = route.backends
        reserve = state.config.fallback_policy.reserve * self.deadline
        hedging = state.hedging
        if hedging is not None:
            hedging.budget.deposit()
        errors: dict[str, HerdlessError] = {}
        previous: tuple[Backend, str] | None = None
        handoff: Handoff | None = None
        try:
            for index, backend in enumerate(backends):
                if previous is not None:
                    self.emit(
                        FallbackUsed,
                        backend=backend.name,
                        from_backend=previous[0].name,
                        reason=previous[1],
                        estimate=getattr(errors[previous[0].name], "estimate", None),
                    )
                last = index == len(backends) - 1
                end = self.deadline_at if last else self.deadline_at - reserve
                if handoff is not None:  # the hedge's attempt here is in flight
                    result = yield from _visit(handoff.visit, awaiting(handoff))
                    handoff = None
                else:
                    backup = None
                    if hedging is not None and index == 0 and not last:
                        after_last = len(backends) == 2
                        after_end = self.deadline_at if after_last else end
                        backup = (backends[1], after_end, after_last)
                    visit = Visit(self, backend, end=end, last=last, backup=backup)
                    result = yield from _visit(visit)
                if isinstance(result, Accepted):
                    backend = result.backend  # a hedge's, when it won
                    reason = result.fallback_reason
                    if reason is None and previous is not None:
                        reason = previous[1]
                        result = replace(result, fallback_reason=reason)
                    if self.stream:
                        self.streaming = (backend, reason)
                    else:
                        self._finish(backend, reason)
                    return result
                if isinstance(result.error, SpendLimitExceeded):
                    raise result.error  # a cap the user set: say exactly that
                errors[backend.name] = result.error
                if isinstance(result, Fail):
                    break
                if isinstance(result, Handoff):
                    handoff = result
                previous = (backend, result.reason)
            raise final_error(self, errors, route.refused)
        except HerdlessError as error:
            self.emit(
                CallFailed,
                backend=error.backend,
                attempts=self.sent,
                latency=self.elapsed(),
                error=type(error).__name__,
            )
            raise

    def stream_ended(self, *, ok: bool, message: str = "") -> None:
        """The driver reports the end of an accepted stream: complete, or cut mid-way.

        The stream's slot in its backend's window goes to the next waiting call. A cut
        counts against the backend's breaker (it is a failure the caller saw); either way
        the call's ``CallFinished`` / ``CallFailed`` event is emitted now.
        """
        self.release_slot()
        if self.streaming is None:
            return
        (backend, reason), self.streaming = self.streaming, None
        if ok:
            self._finish(backend, reason)
            return
        transition = self.state.breaker(backend).record_failure(Permit.CALL)
        self.transition(backend, transition)
        self.emit(
            AttemptFailed,
            backend=backend.name,
            attempt=self.sent,
            kind="stream_cut",
            message=message,
        )
        self.emit(
            CallFailed,
            backend=backend.name,
            attempts=self.sent,
            latency=self.elapsed(),
            error="StreamInterrupted",
        )

    def _finish(self, backend: Backend, reason: str | None) -> None:
        state = self.state
        now = state.clock.monotonic()
        latency = now - self.start
        state.counts.finished(backend.name, latency)
        if self.watched:
            self.emit(
                CallFinished,
                now,
                counted=True,
                backend=backend.name,
                attempts=self.sent,
                latency=latency,
                fallback_reason=reason,
            )
        if reason == "hedge":
            # A hedge answers for a primary that is late, not down: that is no degraded
            # period (one that is down shows in the calls the hedge budget leaves alone).
            return
        degraded = state.served(backend, reason, now=now)
        if degraded is not None:
            self.emit(PrimaryDegraded, now, **degraded)


def _visit(
    visit: Visit, pending: Generator[Action, Resume, Judged] | None = None
) -> Generator[Action, Resume, Accepted | Move | Fail]:
    """The call's visit to ``visit.backend``, until it answers (``Accepted``), or the call
    moves on (``Move``) or ends (``Fail``); raises at once for a request no backend can
    serve.

    ``pending``: the visit begins with an attempt already in flight (a hedge the call
    moved to, ``herdless._call.race.awaiting``): its verdict comes first, then the loop."""
    call = visit.call
    clock = call.state.clock
    hedging = call.state.hedging
    checks = checks_for(visit)
    accepted = False
    try:
        while True:
            now = clock.monotonic()
            decision: Judged | Queue | None = None
            if pending is not None:
                decision = yield from pending
                pending = None
            else:
                for check in checks:
                    decision = check(visit, now)
                    if decision is not None:
                        break
                else:
                    action = visit.send(now)
                    if visit.backup is None or hedging is None:
                        decision = judge(visit, outcome_of((yield action)))
                    else:  # a client that hedges, at the route's first backend
                        decision = yield from race(visit, action, hedging, visit.backup)
            if isinstance(decision, Wait):
                _announce(visit, decision.seconds, decision.why, retry=decision.retry)
                if decision.until_release and visit.slot is not None:
                    yield SlotWait(
                        listen=functools.partial(visit.window.on_release, visit.slot),
                        timeout=decision.seconds,
                    )
                    visit.waited_for(clock.monotonic() - now)
                else:
                    yield Sleep(seconds=decision.seconds)
                    visit.waited_for(decision.seconds)
            elif isinstance(decision, Queue):
                yield SlotWait(
                    listen=functools.partial(visit.window.listen, decision.ticket),
                    timeout=max(0.0, decision.timeout),
                )
            elif isinstance(decision, Requeued):  # first in the window's line: retry at once
                _announce(visit, 0.0, decision.why, retry=True)
            elif decision is not None:
                accepted = type(decision) is Accepted
                return decision
    finally:
        if accepted and call.stream:
            visit.hand_slot()  # a stream holds its slot until it ends
        visit.leave()


def _announce(visit: Visit, seconds: float, why: str, *, retry: bool) -> None:
    """The event that announces a wait, before it starts."""
    name = visit.backend.name
    if retry:
        visit.call.emit(
            RetryScheduled, backend=name, attempt=visit.attempt, delay=seconds, reason=why
        )
    else:
        visit.call.emit(WaitScheduled, backend=name, delay=seconds, reason=why)
