"""THE call flow: every retry, wait, breaker, budget, fallback and deadline rule, once.

A ``CallFlow`` is one logical call. ``run()`` is a generator (``herdless._actions``
describes the protocol): it yields ``Send`` / ``Sleep``, receives each ``Send``'s
outcome, and returns ``Accepted`` or raises a ``HerdlessError``. Events go to an
outbox the driver drains with ``take_events()`` after every step, so each event is
delivered *before* the wait it announces::

    flow = policies.start_call(request_id=rid, body=body, stream=False, ...)
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

Per backend, in order (``herdless._routing``), the flow loops:

1. gate: a running Retry-After window (any call's) -> wait above it with jitter if
   that fits, else the next backend; a drain -> the next backend at once;
2. spend guard (external backends only) -> wait for a slot, or ``SpendLimitExceeded``;
3. breaker: open -> the next backend (the last one waits for the probe time if it fits);
4. send, clipped to the time this backend may use: the whole deadline for the last
   backend, the deadline less ``FallbackPolicy.reserve`` for the others;
5. judge the outcome (``herdless._retry.classify``): 2xx -> done; 4xx other than 429
   -> raise at once (no backend can fix the request); a timeout on a backend with a
   fallback behind it -> the fallback (a hung backend is not waited on twice);
   retryable -> retry if attempts, budget and deadline allow, else the next backend.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeAlias

from herdless._actions import Accepted, Action, Outcome, Response, Send, Sleep
from herdless._backend import Backend, Timeouts
from herdless._breaker import Permit, Transition
from herdless._flow_errors import CallErrors
from herdless._retry import Verdict, classify
from herdless._types import AttemptRecord
from herdless.errors import (
    HerdlessError,
    SpendLimitExceeded,
)
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
    RetryScheduled,
    WaitScheduled,
)

if TYPE_CHECKING:
    from herdless._policies import Policies

__all__ = ["CallFlow", "CallSpec"]

# Seconds: the least a wait loop (budget, breaker) sleeps, so that it can never spin.
_MIN_WAIT = 0.05

Steps: TypeAlias = Generator[Action, Outcome | None, Accepted]


@dataclass(frozen=True, slots=True, kw_only=True)
class CallSpec:
    """What the driver knows about one call.

    Args:
        request_id: sent as ``X-Request-ID`` on every attempt.
        body: the JSON body without ``model`` (messages, max_tokens, ..., extra fields).
        model: the call's model override; ``None`` uses the backend's, then the client's.
        stream: a streaming call (accepted at its first chunk).
        deadline: seconds for the whole call; ``None`` uses the client's default.
        allow_fallback: ``False`` keeps the call on the primaries (data guard).
    """

    request_id: str
    body: Mapping[str, Any]
    model: str | None = None
    stream: bool = False
    deadline: float | None = None
    allow_fallback: bool = True


@dataclass(frozen=True, slots=True)
class _Move:
    """Leave this backend for the next one; ``error`` is why, when there is one."""

    reason: str
    error: HerdlessError


@dataclass(frozen=True, slots=True)
class _Fail:
    """The last backend cannot serve within the deadline."""

    error: HerdlessError


class CallFlow:
    """One logical call's decisions. Create with ``Policies.start_call``; run once."""

    __slots__ = (
        "_attempt",
        "_attempts",
        "_deadline",
        "_deadline_at",
        "_errors",
        "_events",
        "_policies",
        "_served",
        "_spec",
        "_start",
    )

    def __init__(self, policies: Policies, spec: CallSpec) -> None:
        self._policies = policies
        self._spec = spec
        self._events: list[Event] = []
        self._attempts: list[AttemptRecord] = []
        self._attempt = 0  # HTTP attempts sent so far, across backends
        self._deadline = policies.deadline if spec.deadline is None else spec.deadline
        if not self._deadline > 0:
            raise ValueError(f"deadline must be > 0 seconds, got {self._deadline!r}")
        self._start = 0.0
        self._deadline_at = math.inf
        self._served: tuple[Backend, str | None] | None = None  # an accepted stream
        self._errors = CallErrors(
            request_id=spec.request_id,
            deadline=self._deadline,
            allow_fallback=spec.allow_fallback,
            attempts=self._attempts,
        )

    @property
    def attempts(self) -> tuple[AttemptRecord, ...]:
        """The call's attempt records so far, oldest first."""
        return tuple(self._attempts)

    def take_events(self) -> list[Event]:
        """Return and clear the events emitted since the last call (oldest first)."""
        events, self._events = self._events, []
        return events

    def run(self) -> Steps:
        """The call, as a generator of actions (see the module docstring)."""
        policies, spec = self._policies, self._spec
        self._start = policies.clock.monotonic()
        self._deadline_at = self._start + self._deadline
        policies.spend.record_call()
        route = policies.route(allow_fallback=spec.allow_fallback)
        errors: dict[str, HerdlessError] = {}
        previous: tuple[Backend, str] | None = None
        try:
            for index, backend in enumerate(route.backends):
                if previous is not None:
                    self._emit(
                        FallbackUsed,
                        backend=backend.name,
                        from_backend=previous[0].name,
                        reason=previous[1],
                    )
                last = index == len(route.backends) - 1
                end = self._deadline_at
                if not last:
                    end -= policies.fallback_policy.reserve * self._deadline
                result = yield from self._serve(backend, end=end, last=last)
                if isinstance(result, Accepted):
                    reason = previous[1] if previous is not None else None
                    accepted = result if reason is None else replace(result, fallback_reason=reason)
                    if spec.stream:
                        self._served = (backend, reason)
                    else:
                        self._finish(backend, reason)
                    return accepted
                if isinstance(result.error, SpendLimitExceeded):
                    raise result.error  # a cap the user set: say exactly that
                errors[backend.name] = result.error
                if isinstance(result, _Fail):
                    break
                previous = (backend, result.reason)
            raise self._errors.final(errors, route.refused)
        except HerdlessError as error:
            self._emit(
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
        transition = self._policies.breaker(backend).record_failure(Permit.CALL)
        self._transition(backend, transition)
        self._emit(
            AttemptFailed,
            backend=backend.name,
            attempt=self._attempt,
            kind="stream_cut",
            message=message,
        )
        self._emit(
            CallFailed,
            backend=backend.name,
            attempts=self._attempt,
            latency=self._elapsed(),
            error="StreamInterrupted",
        )

    # -- one backend ---------------------------------------------------------------

    def _serve(
        self, backend: Backend, *, end: float, last: bool
    ) -> Generator[Action, Outcome | None, Accepted | _Move | _Fail]:
        policies = self._policies
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

        def give_up(reason: str, error: HerdlessError | None) -> _Move | _Fail:
            error = error or self._errors.deadline(name)
            return _Fail(error) if last else _Move(reason, error)

        try:
            while True:
                now = clock.monotonic()
                blocked, draining = gate.blocked(name)
                if blocked > 0:
                    if not last and (draining or fallback_policy.on_backpressure == "fallback"):
                        return _Move(
                            "draining" if draining else "backpressure", self._errors.blocked(name)
                        )
                    delay = retry.after_server(blocked, rng)
                    if not self._fits(now + delay, end):
                        return give_up("retry_after_exceeds_deadline", last_error)
                    why = "draining" if draining else "backpressure"
                    waited += yield from self._pause(name, delay, why)
                    continue
                # A retry at the last backend that found the budget spent (the others
                # move on instead) waits here until budget frees or the deadline nears.
                if sent and not reserved:
                    if budget.try_acquire():
                        reserved = True
                    else:
                        delay = max(retry.backoff(waits, rng), _MIN_WAIT)
                        waits += 1
                        if not self._fits(now + delay, end):
                            return give_up("deadline", last_error)
                        waited += yield from self._pause(name, delay, "budget")
                        continue
                if not paced and pacer is not None:
                    delay = pacer.reserve()
                    paced = True
                    if delay > 0:
                        if not self._fits(now + delay, end):
                            return give_up("deadline", last_error)
                        waited += yield from self._pause(name, delay, "pacing")
                        continue
                if not admitted:
                    delay = policies.spend.admit()
                    if delay > 0:
                        if not self._fits(now + delay, end):
                            return _Fail(self._errors.spend(name))
                        waited += yield from self._pause(name, delay, "spend")
                        continue
                    admitted = True
                permit, transition = breaker.acquire()
                self._transition(backend, transition)
                if permit is Permit.DENIED:
                    if not last:
                        self._attempts.append(
                            AttemptRecord(backend=name, attempt=0, kind="skipped_breaker_open")
                        )
                        return _Move("breaker_open", last_error or self._errors.breaker_open(name))
                    # The last backend: wait for its probe time (or, while another call
                    # probes, a jittered moment) when the deadline allows.
                    delay = breaker.remaining_open()
                    delay = retry.after_server(delay, rng) if delay else retry.backoff(waits, rng)
                    delay = max(delay, _MIN_WAIT)
                    waits += 1
                    if not self._fits(now + delay, end):
                        return _Fail(last_error or self._errors.breaker_open(name))
                    waited += yield from self._pause(name, delay, "breaker_open")
                    continue

                # -- send ------------------------------------------------------------
                if not reserved:
                    budget.record_call()
                sent += 1
                outcome = yield from self._send(backend, permit, now=now, end=end)
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
                self._attempts.append(
                    AttemptRecord(
                        backend=name,
                        attempt=self._attempt,
                        kind=verdict.kind,
                        status=verdict.status,
                        waited=waited,
                        elapsed=outcome.elapsed,
                    )
                )
                waited = 0.0
                if verdict.ok and isinstance(outcome, Response):
                    self._transition(backend, breaker.record_success(permit))
                    return Accepted(backend=backend, response=outcome, attempts=self.attempts)
                record = (
                    breaker.record_failure if verdict.breaker_failure else breaker.record_success
                )
                self._transition(backend, record(permit))
                last_error = self._errors.attempt(backend, outcome, verdict)
                self._emit(
                    AttemptFailed,
                    backend=name,
                    attempt=self._attempt,
                    kind=verdict.kind,
                    status=verdict.status,
                    retry_after=verdict.retry_after,
                    message=verdict.message,
                )
                if verdict.draining:
                    hold = verdict.retry_after or policies.breaker_policy.open_for
                    self._backpressure(backend, hold, draining=True)
                    self._transition(backend, breaker.force_open(hold, "draining"))
                    if not last:
                        return _Move("draining", last_error)
                elif verdict.retry_after is not None:
                    self._backpressure(backend, verdict.retry_after, draining=False)
                    if not last and fallback_policy.on_backpressure == "fallback":
                        return _Move("backpressure", last_error)
                if not verdict.fallback_may_help:
                    raise last_error  # a request no backend can serve: 400, 401, 403, ...
                if not verdict.retryable:
                    return give_up("failed", last_error)
                if verdict.timeout and not last:
                    return _Move("timeout", last_error)
                if sent >= retry.max_attempts:
                    return give_up("retries_exhausted", last_error)
                now = clock.monotonic()
                delay = retry.delay(sent - 1, verdict.retry_after, rng)
                if not self._fits(now + delay, end):
                    too_long = verdict.retry_after is not None
                    return give_up(
                        "retry_after_exceeds_deadline" if too_long else "deadline", last_error
                    )
                reserved = budget.try_acquire()
                if not reserved:
                    if not last:
                        return _Move("budget_exhausted", last_error)
                    # Wait anyway; the loop's budget check waits more if still spent.
                    self._emit(WaitScheduled, backend=name, delay=delay, reason="budget")
                else:
                    self._emit(
                        RetryScheduled,
                        backend=name,
                        attempt=self._attempt,
                        delay=delay,
                        reason=_retry_reason(verdict),
                    )
                yield Sleep(seconds=delay)
                waited += delay
        finally:
            if reserved:  # leaving (fallback, error, or the driver closed us) with a unit held
                budget.cancel()

    def _pause(self, name: str, delay: float, reason: str) -> Generator[Action, Any, float]:
        """Announce a wait that is not a retry's backoff, then take it."""
        self._emit(WaitScheduled, backend=name, delay=delay, reason=reason)
        yield Sleep(seconds=delay)
        return delay

    def _send(
        self, backend: Backend, permit: Permit, *, now: float, end: float
    ) -> Generator[Action, Outcome | None, Outcome]:
        policies = self._policies
        self._attempt += 1
        model = self._model(backend)
        limits = backend.timeouts or policies.timeouts
        left = max(end - now, 1e-3)
        # Reading a stream happens after the call is accepted, when no fallback is possible
        # any more: its idle limit is clipped to the whole call's deadline, not this backend's.
        read_left = max(self._deadline_at - now, 1e-3)
        timeouts = limits
        if max(limits.connect, limits.first_byte) > left or limits.read > read_left:
            timeouts = Timeouts(
                connect=min(limits.connect, left),
                first_byte=min(limits.first_byte, left),
                read=min(limits.read, read_left),
            )
        self._emit(AttemptStarted, backend=backend.name, attempt=self._attempt, model=model)
        action = Send(
            backend=backend,
            attempt=self._attempt,
            model=model,
            body=self._spec.body,
            headers={
                "X-Request-ID": self._spec.request_id,
                "X-Herdless-Attempt": str(self._attempt),
            },
            timeouts=timeouts,
            stream=self._spec.stream,
        )
        policies.enter(backend)
        answered = False
        try:
            outcome = yield action
            if outcome is None:
                raise TypeError("the driver must send the outcome of a Send action, not None")
            answered = True
            return outcome
        finally:
            policies.leave(backend)
            if not answered:  # the driver closed the flow mid-attempt: free a probe
                policies.breaker(backend).release(permit)

    # -- helpers -------------------------------------------------------------------

    def _model(self, backend: Backend) -> str | None:
        policies = self._policies
        if backend in policies.fallbacks:
            # A fallback serves another model than the primary: its own name comes first.
            return backend.model or self._spec.model or policies.model
        return self._spec.model or backend.model or policies.model

    def _fits(self, resume_at: float, end: float) -> bool:
        """Whether a wait until ``resume_at`` still leaves an attempt its minimum time."""
        return resume_at + self._policies.fallback_policy.min_attempt <= end

    def _elapsed(self) -> float:
        return self._policies.clock.monotonic() - self._start

    def _emit(self, event_type: type[Event], /, **fields: Any) -> None:
        fields.setdefault("call_id", self._spec.request_id)
        event = event_type(at=self._policies.clock.monotonic(), **fields)
        self._events.append(event)
        self._policies.observe(event)

    def _transition(self, backend: Backend, transition: Transition | None) -> None:
        if transition is not None:
            self._emit(
                BreakerStateChanged,
                backend=backend.name,
                old=transition.old,
                new=transition.new,
                reason=transition.reason,
                open_for=transition.open_for,
            )

    def _backpressure(self, backend: Backend, seconds: float, *, draining: bool) -> None:
        self._policies.gate.block(backend.name, seconds, draining=draining)
        self._emit(
            BackpressureReceived, backend=backend.name, retry_after=seconds, draining=draining
        )

    def _finish(self, backend: Backend, reason: str | None) -> None:
        self._emit(
            CallFinished,
            backend=backend.name,
            attempts=self._attempt,
            latency=self._elapsed(),
            fallback_reason=reason,
        )
        degraded = self._policies.served(backend, reason)
        if degraded is not None:
            self._emit(PrimaryDegraded, **degraded)


def _retry_reason(verdict: Verdict) -> str:
    return f"status_{verdict.status}" if verdict.status is not None else verdict.kind
