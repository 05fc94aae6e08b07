"""The spend guard: per-minute and share caps, tokens and money over a window."""

from __future__ import annotations

import math

import pytest

from herdless._routing import FallbackPolicy
from herdless._spend import SpendGuard
from herdless.testing import FakeClock


def test_spend_guard_per_minute_waits_for_a_slot() -> None:
    clock = FakeClock()
    guard = SpendGuard(FallbackPolicy(max_external_per_minute=2), clock=clock)
    assert guard.admit() == 0.0
    clock.advance(10)
    assert guard.admit() == 0.0
    assert guard.admit() == pytest.approx(50.0)  # the first slot frees 60 s after its use
    clock.advance(50)
    assert guard.admit() == 0.0


def test_spend_guard_share_refuses_past_the_cap() -> None:
    clock = FakeClock()
    guard = SpendGuard(FallbackPolicy(max_external_share=0.25), clock=clock)
    for _ in range(4):
        guard.record_call()
    assert guard.admit() == 0.0  # 1 of 4
    assert guard.admit() == math.inf  # 2 of 4 > 25 %
    for _ in range(4):
        guard.record_call()
    assert guard.admit() == 0.0  # 2 of 8


def test_spend_guard_off_by_default() -> None:
    guard = SpendGuard(FallbackPolicy(), clock=FakeClock())
    assert not guard.active
    assert all(guard.admit() == 0.0 for _ in range(100))


def test_spend_guard_caps_external_tokens_over_its_window() -> None:
    clock = FakeClock()
    guard = SpendGuard(FallbackPolicy(max_external_tokens=1000, spend_window=600), clock=clock)
    assert guard.admit() == 0.0
    guard.record_usage(600, None)
    clock.advance(100)
    assert guard.admit() == 0.0  # 600 < 1000: answers complete so far are under the cap
    guard.record_usage(500, None)
    assert guard.blocking() is not None
    # 1100 >= 1000 until the first answer (600) leaves the window, 600 s after it.
    assert guard.admit() == pytest.approx(500.0)
    limit, why = guard.blocking() or ("", "")
    assert limit == "tokens"
    assert "1100 tokens" in why
    assert "max_external_tokens" in why
    clock.advance(500)
    assert guard.admit() == 0.0
    assert guard.blocking() is None


def test_spend_guard_caps_money_at_the_backends_price() -> None:
    clock = FakeClock()
    guard = SpendGuard(FallbackPolicy(max_external_cost=1.0), clock=clock)
    guard.record_usage(10, 0.4)
    clock.advance(60)
    guard.record_usage(10, 0.7)
    assert guard.admit() == pytest.approx(3600.0 - 60.0)  # the default window is an hour
    limit, why = guard.blocking() or ("", "")
    assert limit == "cost"
    assert "cost 1.1" in why
    clock.advance(3540)
    assert guard.admit() == 0.0  # 0.7 left in the window


def test_a_zero_cap_never_lets_a_call_out() -> None:
    clock = FakeClock()
    guard = SpendGuard(FallbackPolicy(max_external_tokens=0), clock=clock)
    assert guard.active
    assert guard.admit() == math.inf
    assert (guard.blocking() or ("",))[0] == "tokens"


def test_spend_guard_names_the_call_caps_too() -> None:
    clock = FakeClock()
    guard = SpendGuard(FallbackPolicy(max_external_per_minute=1), clock=clock)
    assert guard.admit() == 0.0
    assert (guard.blocking() or ("",))[0] == "calls"
    guard = SpendGuard(FallbackPolicy(max_external_share=0.0), clock=clock)
    guard.record_call()
    assert (guard.blocking() or ("",))[0] == "share"


def test_usage_is_not_kept_without_a_token_or_money_cap() -> None:
    guard = SpendGuard(FallbackPolicy(max_external_per_minute=5), clock=FakeClock())
    guard.record_usage(10**9, 10**6)
    assert guard.admit() == 0.0
    assert guard.blocking() is None


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_external_tokens", -1), ("max_external_cost", -0.5), ("spend_window", 0)],
)
def test_invalid_spend_caps_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"FallbackPolicy.{field}"):
        FallbackPolicy(**{field: value})  # type: ignore[arg-type]  # parametrised
