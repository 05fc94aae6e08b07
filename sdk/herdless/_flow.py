"""THE call flow: every retry, wait, breaker, budget, fallback and deadline rule, once.

A ``CallFlow`` is one logical call. ``run()`` is a generator (``herdless._actions``
describes the protocol): it yields ``Send`` / ``Sleep``, receives each ``Send``'s
outcome, and returns ``Accepted`` or raises a ``HerdlessError``. Events go to an
outbox the driver drains with ``take_events()`` after every step, so each event is
delivered *before* the wait it announces::

    flow = CallFlow(policies, request_id=rid, body=body, stream=False, ...)
    steps = flow.run()
    try:
        action = next(steps)
        while True:
            dispatch(flow.take_events())
            if isinstance(action, Sleep):
                sleep(action.seconds); action = steps.send(None)
            else:
                action = steps.send(perform(action))
    except StopIteration as stop:
        accepted = stop.value
    finally:
        dispatch(flow.take_events())

A stream is accepted at its first chunk; the driver then reports its end with
``stream_ended(ok=...)`` so the breaker and the stats see a stream cut mid-way.

The call walks its route (``herdless._routing``: primaries, then fallbacks, less what
the data guard keeps out). At each backend it runs ``herdless._visit.serve`` (gate,
budget, pacing, spend guard, breaker, send, judge, retry) until that backend answers,
or the call must move on (the reason becomes ``FallbackUsed.reason`` and
``ChatResult.fallback_reason``), or end. The deadline covers the whole call: every
backend but the last may use it less ``FallbackPolicy.reserve``, so a hanging primary
always leaves the fallback time to answer.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeAlias

from herdless._actions import Accepted, Action, Outcome
from herdless._backend import Backend
from herdless._breaker import Permit, Transition
from herdless._flow_errors import CallErrors
from herdless._types import AttemptRecord
from herdless._visit import Fail, serve
from herdless.errors import HerdlessError, SpendLimitExceeded
from herdless.events import (
    AttemptFailed,
    AttemptStarted,
    BackpressureReceived,
    BreakerStateChanged,
    CallFailed,
    CallFinished,
    Event,
    FallbackUsed,
    PrimaryDegraded,
)

if TYPE_CHECKING:
    from herdless._policies import Policies

__all__ = ["CallFlow"]

Steps: TypeAlias = Generator[Action, Outcome | None, Accepted]


class CallFlow:
    """One logical call's decisions, against the client's ``Policies``; run once.

    Args:
        policies: the client's policies and their shared state.
        request_id: sent as ``X-Request-ID`` on every attempt.
        body: the JSON body without ``model`` (messages, max_tokens, ..., extra fields).
        model: the call's model override; ``None`` uses the backend's, then the client's.
        stream: a streaming call (accepted at its first chunk).
        deadline: seconds for the whole call; ``None`` uses the client's default.
        allow_fallback: ``False`` keeps the call on the primaries (data guard).
    """

    # The public attributes, errors, and the methods without a leading underscore below
    # ``stream_ended``, are for ``herdless._visit`` (the per-backend loop).
    __slots__ = (
        "_attempt",
        "_deadline",
        "_errors",
        "_events",
        "_public",
        "_served",
        "_start",
        "allow_fallback",
        "body",
        "deadline_at",
        "model",
        "policies",
        "records",
        "request_id",
        "stream",
    )

    def __init__(
        self,
        policies: Policies,
        *,
        request_id: str,
        body: Mapping[str, Any],
        model: str | None = None,
        stream: bool = False,
        deadline: float | None = None,
        allow_fallback: bool = True,
    ) -> None:
        self.policies = policies
        self.request_id = request_id
        self.body = body
        self.model = model
        self.stream = stream
        self.allow_fallback = allow_fallback
        self._events: list[Event] = []
        self.records: list[AttemptRecord] = []
        self._attempt = 0  # HTTP attempts sent so far, across backends
        self._deadline = policies.deadline if deadline is None else deadline
        if not self._deadline > 0:
            raise ValueError(f"deadline must be > 0 seconds, got {self._deadline!r}")
        self._start = 0.0
        self.deadline_at = math.inf
        self._served: tuple[Backend, str | None] | None = None  # an accepted stream
        self._errors: CallErrors | None = None
        self._public = False

    @property
    def errors(self) -> CallErrors:
        """The call's error builders (made at the first error: most calls have none)."""
        if self._errors is None:
            self._errors = CallErrors(
                request_id=self.request_id,
                deadline=self._deadline,
                allow_fallback=self.allow_fallback,
                attempts=self.records,
            )
        return self._errors

    @property
    def attempts(self) -> tuple[AttemptRecord, ...]:
        """The call's attempt records so far, oldest first."""
        return tuple(self.records)

    def take_events(self) -> list[Event]:
        """Return and clear the events emitted since the last call (oldest first)."""
        events, self._events = self._events, []
        return events

    def run(self) -> Steps:
        """The call, as a generator of actions (see the module docstring)."""
        policies = self.policies
        self._start = policies.clock.monotonic()
        # Whether the two events of every call (both logged at DEBUG) are built: for the
        # hook, or for the log. Asked once a call: it showed in per-call CPU.
        self._public = policies.publishes(CallFinished)
        self.deadline_at = self._start + self._deadline
        policies.spend.record_call()
        route = policies.route(allow_fallback=self.allow_fallback)
        errors: dict[str, HerdlessError] = {}
        previous: tuple[Backend, str] | None = None
        try:
            for index, backend in enumerate(route.backends):
                if previous is not None:
                    self.emit(
                        FallbackUsed,
                        backend=backend.name,
                        from_backend=previous[0].name,
                        reason=previous[1],
                    )
                last = index == len(route.backends) - 1
                end = self.deadline_at
                if not last:
                    end -= policies.fallback_policy.reserve * self._deadline
                result = yield from serve(self, backend, end=end, last=last)
                if isinstance(result, Accepted):
                    reason = previous[1] if previous is not None else None
                    accepted = result if reason is None else replace(result, fallback_reason=reason)
                    if self.stream:
                        self._served = (backend, reason)
                    else:
                        self._finish(backend, reason)
                    return accepted
                if isinstance(result.error, SpendLimitExceeded):
                    raise result.error  # a cap the user set: say exactly that
                errors[backend.name] = result.error
                if isinstance(result, Fail):
                    break
                previous = (backend, result.reason)
            raise self.errors.final(errors, route.refused)
        except HerdlessError as error:
            self.emit(
                CallFailed,
                backend=error.backend,
                attempts=self._attempt,
                latency=self._elapsed(),
                error=type(error).__name__,
            )
            raise

    def stream_ended(self, *, ok: bool, message: str = "") -> None:
        """The driver reports the end of an accepted stream: complete, or cut mid-way.

        A cut counts against the backend's breaker (it is a failure the caller saw);
        either way the call's ``CallFinished`` / ``CallFailed`` event is emitted now.
        """
        if self._served is None:
            return
        (backend, reason), self._served = self._served, None
        if ok:
            self._finish(backend, reason)
            return
        transition = self.policies.breaker(backend).record_failure(Permit.CALL)
        self.transition(backend, transition)
        self.emit(
            AttemptFailed,
            backend=backend.name,
            attempt=self._attempt,
            kind="stream_cut",
            message=message,
        )
        self.emit(
            CallFailed,
            backend=backend.name,
            attempts=self._attempt,
            latency=self._elapsed(),
            error="StreamInterrupted",
        )

    # -- for the per-backend loop (herdless._visit) --------------------------------

    @property
    def attempt(self) -> int:
        """HTTP attempts sent so far, across backends."""
        return self._attempt

    def next_attempt(self) -> int:
        """Count one more attempt; return its number (1 for the call's first)."""
        self._attempt += 1
        return self._attempt

    def model_for(self, backend: Backend) -> str | None:
        policies = self.policies
        if backend.name in policies.fallback_names:
            # A fallback serves another model than the primary: its own name comes first.
            return backend.model or self.model or policies.model
        return self.model or backend.model or policies.model

    def fits(self, resume_at: float, end: float) -> bool:
        """Whether a wait until ``resume_at`` still leaves an attempt its minimum time."""
        return resume_at + self.policies.fallback_policy.min_attempt <= end

    def _elapsed(self) -> float:
        return self.policies.clock.monotonic() - self._start

    def emit(self, event_type: type[Event], /, now: float | None = None, **fields: Any) -> None:
        """Emit one event of this call, at ``now`` when the caller just read the clock."""
        policies = self.policies
        at = policies.clock.monotonic() if now is None else now
        event = event_type(call_id=self.request_id, at=at, **fields)
        policies.counts.record(event)
        self._publish(event)

    def _publish(self, event: Event) -> None:
        """Hand a counted event to the hook's outbox (when there is a hook) and the log."""
        if self.policies.keep_events:
            self._events.append(event)
        self.policies.log(event)

    # The two events of every call are counted without being built when nobody would
    # see them (no hook, their log level off): building them showed in per-call CPU.

    def attempt_started(
        self, backend: Backend, attempt: int, model: str | None, now: float
    ) -> None:
        """An attempt is about to be sent: ``AttemptStarted``."""
        policies = self.policies
        policies.counts.attempt(backend.name)
        if self._public:
            self._publish(
                AttemptStarted(
                    call_id=self.request_id,
                    backend=backend.name,
                    at=now,
                    attempt=attempt,
                    model=model,
                )
            )

    def transition(self, backend: Backend, transition: Transition | None) -> None:
        if transition is not None:
            self.emit(
                BreakerStateChanged,
                backend=backend.name,
                old=transition.old,
                new=transition.new,
                reason=transition.reason,
                open_for=transition.open_for,
            )

    def backpressure(self, backend: Backend, seconds: float, *, draining: bool) -> None:
        self.policies.gate.block(backend.name, seconds, draining=draining)
        self.emit(
            BackpressureReceived, backend=backend.name, retry_after=seconds, draining=draining
        )

    def _finish(self, backend: Backend, reason: str | None) -> None:
        policies = self.policies
        now = policies.clock.monotonic()
        latency = now - self._start
        policies.counts.finished(backend.name, latency)
        if self._public:
            self._publish(
                CallFinished(
                    call_id=self.request_id,
                    backend=backend.name,
                    at=now,
                    attempts=self._attempt,
                    latency=latency,
                    fallback_reason=reason,
                )
            )
        degraded = policies.served(backend, reason, now=now)
        if degraded is not None:
            self.emit(PrimaryDegraded, now, **degraded)
