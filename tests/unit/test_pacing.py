"""Client-side pacing: an adaptive token bucket per backend, and the flow waiting for it."""

from __future__ import annotations

import pytest
from tests.unit.flow_driver import make, ok, status

from herdless._pacing import Pacer, PacingPolicy
from herdless.events import WaitScheduled
from herdless.testing import FakeClock


def test_sends_are_spread_one_over_rate_apart() -> None:
    pacer = Pacer(PacingPolicy(rate=4.0), clock=FakeClock())
    assert [pacer.reserve() for _ in range(4)] == [0.0, 0.25, 0.5, 0.75]


def test_a_quiet_period_refills_up_to_the_burst() -> None:
    clock = FakeClock()
    pacer = Pacer(PacingPolicy(rate=2.0, burst=3), clock=clock)
    assert [pacer.reserve() for _ in range(4)] == [0.0, 0.0, 0.0, 0.5]
    clock.advance(100)
    assert [pacer.reserve() for _ in range(4)] == [0.0, 0.0, 0.0, 0.5]


def test_429_halves_the_rate_and_successes_raise_it_slowly() -> None:
    pacer = Pacer(PacingPolicy(rate=10.0, min_rate=2.0, increase=0.1), clock=FakeClock())
    pacer.throttled()
    assert pacer.rate == 5.0
    pacer.throttled()
    pacer.throttled()
    assert pacer.rate == 2.0  # the floor
    for _ in range(3):
        pacer.succeeded()
    assert pacer.rate == pytest.approx(5.0)
    for _ in range(100):
        pacer.succeeded()
    assert pacer.rate == 10.0  # the ceiling


@pytest.mark.parametrize(
    ("field", "value"),
    [("rate", 0), ("burst", 0), ("min_rate", 0), ("decrease", 1.0), ("increase", 0)],
)
def test_invalid_policy_names_the_field(field: str, value: float) -> None:
    settings = {"rate": 1.0, field: value}
    with pytest.raises(ValueError, match=f"PacingPolicy.{field}"):
        PacingPolicy(**settings)  # type: ignore[arg-type]  # parametrised


def test_the_flow_waits_for_its_pacing_slot_and_backs_off_on_429() -> None:
    driver = make([ok()], pacing=PacingPolicy(rate=2.0))
    for _ in range(3):
        driver.run()
    # ok() takes 0.2 s: the second call waits the rest of its 0.5 s slot, and so on.
    assert driver.sleeps == [pytest.approx(0.3), pytest.approx(0.3)]
    assert {w.reason for w in driver.of(WaitScheduled)} == {"pacing"}
    driver.script["primary"] = [status(429), ok()]
    driver.run()
    pacer = driver.policies.pacer(driver.sends[0].backend)
    assert pacer is not None
    assert pacer.rate == pytest.approx(1.0 + 0.1)  # halved, then one success


def test_no_pacing_by_default() -> None:
    driver = make([ok()])
    assert driver.policies.pacer(driver.policies.config.primaries[0]) is None
