"""Route plans: order, data guard, power of two choices; FallbackPolicy's checks."""

from __future__ import annotations

import pytest
from tests.unit._policy_stubs import UpperRandom

from herdless._backend import Backend
from herdless._routing import FallbackPolicy, plan_route

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
