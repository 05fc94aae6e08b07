"""Route plans: order, data guard, power of two choices, spend guard."""

from __future__ import annotations

import math

import pytest
from tests.unit._policy_stubs import UpperRandom

from herdless._backend import Backend
from herdless._routing import FallbackPolicy, SpendGuard, plan_route
from herdless.testing import FakeClock

P1 = Backend(name="gpu1", base_url="http://gpu1/v1")
P2 = Backend(name="gpu2", base_url="http://gpu2/v1")
P3 = Backend(name="gpu3", base_url="http://gpu3/v1")
INTERNAL = Backend(name="spare", base_url="http://spare/v1")
HOSTED = Backend(name="hosted", base_url="https://api.example/v1", external=True)


def _plan(
    primaries: list[Backend],
    fallbacks: list[Backend],
    *,
    allow_fallback: bool = True,
    allow_external: bool = True,
    down: frozenset[str] = frozenset(),
    load: dict[str, int] | None = None,
) -> tuple[list[str], list[str]]:
    route = plan_route(
        primaries,
        fallbacks,
        allow_fallback=allow_fallback,
        allow_external=allow_external,
        healthy=lambda b: b.name not in down,
        in_flight=lambda b: (load or {}).get(b.name, 0),
        rng=UpperRandom(),
    )
    return [b.name for b in route.backends], [b.name for b in route.refused]


def test_primary_then_fallbacks_in_order() -> None:
    assert _plan([P1], [INTERNAL, HOSTED]) == (["gpu1", "spare", "hosted"], [])


def test_allow_fallback_false_keeps_the_call_on_the_primary() -> None:
    assert _plan([P1], [INTERNAL, HOSTED], allow_fallback=False) == (
        ["gpu1"],
        ["spare", "hosted"],
    )


def test_client_wide_policy_keeps_calls_off_external_backends() -> None:
    assert _plan([P1], [INTERNAL, HOSTED], allow_external=False) == (["gpu1", "spare"], ["hosted"])


def test_power_of_two_choices_takes_the_less_loaded_of_two() -> None:
    # UpperRandom.sample picks the first two healthy primaries: gpu1 and gpu2.
    assert _plan([P1, P2, P3], [HOSTED], load={"gpu1": 5, "gpu2": 1, "gpu3": 0})[0] == [
        "gpu2",
        "gpu3",
        "gpu1",
        "hosted",
    ]
    assert _plan([P1, P2, P3], [], load={"gpu1": 0, "gpu2": 1})[0][0] == "gpu1"  # tie-free


def test_unhealthy_primaries_are_skipped_in_the_choice_and_tried_last() -> None:
    assert _plan([P1, P2, P3], [HOSTED], down=frozenset({"gpu1"}), load={"gpu2": 3})[0] == [
        "gpu3",
        "gpu2",
        "gpu1",
        "hosted",
    ]
    assert _plan([P1, P2], [], down=frozenset({"gpu1"}))[0] == ["gpu2", "gpu1"]


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


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("reserve", 1.0),
        ("on_backpressure", "maybe"),
        ("max_external_share", 2.0),
        ("max_external_per_minute", -1),
        ("min_attempt", -1),
    ],
)
def test_invalid_fallback_policy_names_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"FallbackPolicy.{field}"):
        FallbackPolicy(**{field: value})  # type: ignore[arg-type]  # parametrised


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
