"""THE call flow: every retry, wait, window, breaker, budget, fallback and deadline rule, once.

A ``CallFlow`` is one logical call. ``run()`` is a generator (``herdless._actions``
describes the protocol): it yields ``Send`` / ``Sleep`` / ``SlotWait``, receives each
``Send``'s outcome, and returns ``Accepted`` or raises a ``HerdlessError``. Events go
to an outbox the driver drains with ``take_events()`` after every step, so each event
is delivered *before* the wait it announces::

    flow = CallFlow(state, request_id=rid, body=body, stream=False, ...)
    steps = flow.run()
    try:
        action = next(steps)
        while True:
            dispatch(flow.take_events())
            if isinstance(action, Sleep):
                sleep(action.seconds); action = steps.send(None)
            elif isinstance(action, SlotWait):
                wait_until_woken(action.listen, action.timeout); action = steps.send(None)
            else:
                action = steps.send(perform(action))
    except StopIteration as stop:
        accepted = stop.value
    finally:
        dispatch(flow.take_events())

A stream is accepted at its first chunk; the driver then reports its end with
``stream_ended(ok=...)`` so the breaker, the window and the stats see it.

With a ``HedgePolicy``, an attempt at the route's first backend that is late is raced
against a copy at the next backend (``herdless._race``); the driver then runs two sends
at once (``Race`` actions) and closes the one the flow no longer waits for.

The call walks its route (``herdless._routing``: primaries, then fallbacks, less what
the data guard keeps out). At each backend it runs ``herdless._visit.serve`` until that
backend answers, or the call must move on (the reason becomes ``FallbackUsed.reason``
and ``ChatResult.fallback_reason``), or end. The deadline covers the whole call: every
backend but the last may use it less ``FallbackPolicy.reserve``, so a hanging primary
always leaves the fallback time to answer.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import replace
from typing import TypeAlias

from herdless._actions import Accepted, Action, Ended, Outcome
from herdless._backend import Backend
from herdless._breaker import Permit
from herdless._call import Call, Stay
from herdless._checks import Fail
from herdless._race import Handoff, awaiting
from herdless._visit import serve
from herdless.errors import HerdlessError, SpendLimitExceeded
from herdless.events import (
    AttemptFailed,
    CallFailed,
    CallFinished,
    FallbackUsed,
    PrimaryDegraded,
)

__all__ = ["CallFlow"]

Steps: TypeAlias = Generator[Action, Outcome | Ended | None, Accepted]


class CallFlow(Call):
    """One logical call's decisions, against the client's ``ClientState``; run once.
    The arguments are ``herdless._call.Call``'s."""

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
                    result = yield from serve(self, handoff.stay, awaiting(self, handoff))
                    handoff = None
                else:
                    stay = Stay(self, backend, end=end, last=last)
                    if hedging is not None and index == 0 and not last:
                        after_last = len(backends) == 2
                        after_end = self.deadline_at if after_last else end
                        stay.backup = (backends[1], after_end, after_last)
                    result = yield from serve(self, stay)
                if isinstance(result, Accepted):
                    backend = result.backend  # a hedge's, when it won
                    reason = result.fallback_reason
                    if reason is None and previous is not None:
                        reason = previous[1]
                        result = replace(result, fallback_reason=reason)
                    if self.stream:
                        self.served = (backend, reason)
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
            raise self.errors.final(errors, route.refused)
        except HerdlessError as error:
            self.emit(
                CallFailed,
                backend=error.backend,
                attempts=self.attempt,
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
        if self.served is None:
            return
        (backend, reason), self.served = self.served, None
        if ok:
            self._finish(backend, reason)
            return
        transition = self.state.breaker(backend).record_failure(Permit.CALL)
        self.transition(backend, transition)
        self.emit(
            AttemptFailed,
            backend=backend.name,
            attempt=self.attempt,
            kind="stream_cut",
            message=message,
        )
        self.emit(
            CallFailed,
            backend=backend.name,
            attempts=self.attempt,
            latency=self.elapsed(),
            error="StreamInterrupted",
        )

    def _finish(self, backend: Backend, reason: str | None) -> None:
        state = self.state
        now = state.clock.monotonic()
        latency = now - self.start
        state.counts.finished(backend.name, latency)
        if self.public:
            self.publish(
                CallFinished(
                    call_id=self.request_id,
                    backend=backend.name,
                    at=now,
                    attempts=self.attempt,
                    latency=latency,
                    fallback_reason=reason,
                )
            )
        if reason == "hedge":
            # A hedge answers for a primary that is late, not down: that is no degraded
            # period (one that is down shows in the calls the hedge budget leaves alone).
            return
        degraded = state.served(backend, reason, now=now)
        if degraded is not None:
            self.emit(PrimaryDegraded, now, **degraded)
