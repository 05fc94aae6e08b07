"""The retry budget and the client-wide backend holds as hypothesis state machines.

Budget invariant: a reserved retry never takes the window past
``ratio * calls + floor`` (failed retries in the window plus retries reserved), and
``try_acquire`` answers exactly what that formula says. Holds invariant: a backend is never reported
open before the latest time any Retry-After promised it, and a drain signal is never
forgotten before its own window ends.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from tests.property._profile import PROPERTY

from herdless._budget import RetryBudget
from herdless._holds import BackendHolds
from herdless.testing import FakeClock

BACKENDS = st.sampled_from(["primary", "gpu-2", "hosted"])


class BudgetMachine(RuleBasedStateMachine):
    """Calls, reservations, sends and cancellations in any order, time moving."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.calls: list[float] = []
        self.retries: list[float] = []
        self.waiting = 0
        self.ratio, self.floor, self.window = 0.1, 3, 10.0
        self.budget = self._build()

    def _build(self) -> RetryBudget:
        return RetryBudget(ratio=self.ratio, floor=self.floor, window=self.window, clock=self.clock)

    @initialize(
        ratio=st.sampled_from([0.0, 0.1, 0.5, 1.0]),
        floor=st.integers(0, 4),
        window=st.floats(1.0, 20.0),
    )
    def build(self, ratio: float, floor: int, window: float) -> None:
        self.ratio, self.floor, self.window = ratio, floor, window
        self.budget = self._build()

    def _in_window(self, times: list[float]) -> int:
        horizon = self.clock.monotonic() - self.window
        return sum(t >= horizon for t in times)

    def _allowed(self) -> float:
        return self.ratio * self._in_window(self.calls) + self.floor

    @rule()
    def call(self) -> None:
        self.budget.record_call()
        self.calls.append(self.clock.monotonic())

    @rule()
    def reserve(self) -> None:
        expected = self._in_window(self.retries) + self.waiting + 1 <= self._allowed()
        got = self.budget.try_acquire()
        assert got == expected, f"try_acquire said {got}, the formula says {expected}"
        self.waiting += got

    @precondition(lambda self: self.waiting > 0)
    @rule(failed=st.booleans())
    def settle_reserved(self, failed: bool) -> None:
        # A retry that was answered: a failed one stays counted for the window.
        self.budget.settle(failed=failed)
        self.waiting -= 1
        if failed:
            self.retries.append(self.clock.monotonic())

    @precondition(lambda self: self.waiting > 0)
    @rule()
    def cancel_reserved(self) -> None:
        self.budget.cancel()
        self.waiting -= 1

    @rule(seconds=st.floats(0.0, 8.0))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)


class HoldsMachine(RuleBasedStateMachine):
    """Retry-After and drain signals from several backends; time moving."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.holds = BackendHolds(clock=self.clock)
        self.promised: dict[str, float] = {}  # backend -> latest "not before" time
        self.drain_until: dict[str, float] = {}  # backend -> end of its latest drain window

    @rule(backend=BACKENDS, seconds=st.floats(-1.0, 30.0), draining=st.booleans())
    def block(self, backend: str, seconds: float, draining: bool) -> None:
        self.holds.hold(backend, seconds, draining=draining)
        until = self.clock.monotonic() + max(0.0, seconds)
        self.promised[backend] = max(self.promised.get(backend, 0.0), until)
        if draining:
            self.drain_until[backend] = max(self.drain_until.get(backend, 0.0), until)

    @rule(seconds=st.floats(0.0, 10.0))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @invariant()
    def never_open_before_the_promised_time(self) -> None:
        now = self.clock.monotonic()
        for backend, until in self.promised.items():
            left, draining = self.holds.held(backend)
            assert left >= until - now - 1e-9, f"{backend} open {until - now - left:.3f}s early"
            if now < self.drain_until.get(backend, 0.0):
                assert draining, f"{backend} forgot its drain signal"

    @invariant()
    def unknown_backend_is_open(self) -> None:
        assert self.holds.held("never-blocked") == (0.0, False)


BudgetMachine.TestCase.settings = PROPERTY
HoldsMachine.TestCase.settings = PROPERTY
test_budget_machine = BudgetMachine.TestCase
test_holds_machine = HoldsMachine.TestCase
