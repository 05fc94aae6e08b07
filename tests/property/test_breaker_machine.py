"""The circuit breaker as a hypothesis state machine.

Invariants: never more than one half-open probe in flight; an open breaker denies
every call until its open period elapses; a normal call is granted only while closed;
a draining ``force_open`` holds the backend off for at least the seconds asked.
"""

from __future__ import annotations

import random

from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from tests.property._profile import PROPERTY

from herdless._breaker import BreakerPolicy, CircuitBreaker, Permit
from herdless.testing import FakeClock

SECONDS = st.floats(min_value=0.0, max_value=20.0, allow_nan=False)


class BreakerMachine(RuleBasedStateMachine):
    """Calls acquire, end in any order, time moves, a drain forces the breaker open."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.breaker = CircuitBreaker(BreakerPolicy(), clock=self.clock, rng=random.Random(0))
        self.in_flight: list[Permit] = []  # granted permits not yet answered
        self.hold_until = 0.0  # a force_open promised the backend this much rest

    @initialize(
        consecutive=st.integers(1, 4),
        min_calls=st.integers(1, 6),
        rate=st.sampled_from([0.25, 0.5, 1.0]),
        open_for=st.floats(0.5, 10.0),
        jitter=st.sampled_from([0.0, 0.2]),
        seed=st.integers(0, 2**16),
    )
    def build(
        self,
        consecutive: int,
        min_calls: int,
        rate: float,
        open_for: float,
        jitter: float,
        seed: int,
    ) -> None:
        policy = BreakerPolicy(
            failure_rate=rate,
            window=30.0,
            min_calls=min_calls,
            consecutive_failures=consecutive,
            open_for=open_for,
            max_open_for=open_for * 4,
            open_jitter=jitter,
        )
        self.breaker = CircuitBreaker(policy, clock=self.clock, rng=random.Random(seed))

    @rule()
    def acquire(self) -> None:
        now = self.clock.monotonic()
        state_before = self.breaker.state
        remaining = self.breaker.remaining_open()
        permit, _ = self.breaker.acquire()
        if remaining > 0 or now < self.hold_until:
            assert permit is Permit.DENIED, "an open breaker let a call through early"
        if permit is Permit.CALL:
            assert state_before == "closed"
        if permit is not Permit.DENIED:
            self.in_flight.append(permit)

    @precondition(lambda self: self.in_flight)
    @rule(index=st.integers(0, 50), verdict=st.sampled_from(["success", "failure", "release"]))
    def finish(self, index: int, verdict: str) -> None:
        permit = self.in_flight.pop(index % len(self.in_flight))
        if verdict == "success":
            self.breaker.record_success(permit)
        elif verdict == "failure":
            self.breaker.record_failure(permit)
        else:
            self.breaker.release(permit)

    @rule(seconds=st.floats(0.1, 30.0))
    def drain(self, seconds: float) -> None:
        self.breaker.force_open(seconds, "draining")
        self.hold_until = max(self.hold_until, self.clock.monotonic() + seconds)

    @rule(seconds=SECONDS)
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @invariant()
    def at_most_one_probe(self) -> None:
        probes = sum(permit is Permit.PROBE for permit in self.in_flight)
        assert probes <= 1, f"{probes} half-open probes in flight"

    @invariant()
    def state_is_known(self) -> None:
        assert self.breaker.state in ("closed", "open", "half_open")


BreakerMachine.TestCase.settings = PROPERTY
test_breaker_machine = BreakerMachine.TestCase
