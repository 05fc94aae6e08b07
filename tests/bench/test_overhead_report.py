"""The overhead-gateway table: each arm's latency and its server's CPU per request, and the
gateway's CPU against the bare relay's as a target."""

from __future__ import annotations

from dataclasses import replace

from herdless.bench.gateway_overhead import OverheadResult
from herdless.bench.overhead import OverheadSizes, _gateway

FIGURES = OverheadResult(
    direct_p50=0.2,
    direct_p99=0.4,
    direct_failures=0,
    gateway_failures=0,
    gateway_p50=0.5,
    gateway_p99=0.9,
    added_p50=0.3,
    added_p99=0.5,
    relay_p50=0.45,
    relay_p99=0.8,
    relay_failures=0,
    direct_cpu=0.0008,
    relay_cpu=0.0025,
    gateway_cpu=0.0026,
    cpu_ratio=1.04,
    refusals_per_s=6000,
    healthz_per_s=7000,
    refusal_ratio=0.86,
    refusals_per_cpu_s=6000,
    healthz_per_cpu_s=7000,
    refusal_cpu_ratio=0.86,
    overload_callers=960,
    overload_served_per_s=15,
    overload_refused_per_s=3000,
    overload_codes={"200": 10, "429": 100},
    rss_at_rest=50 * 2**20,
    rss_peak=60 * 2**20,
)


def _cpu_target(figures: OverheadResult) -> tuple[float, bool]:
    result = _gateway(figures, OverheadSizes())
    (target,) = [t for t in result.targets if t.label.startswith("gateway CPU per request")]
    return target.value, target.met


def test_each_server_is_shown_with_its_cpu_per_request_in_microseconds() -> None:
    rows = {row["arm"]: row for row in _gateway(FIGURES, OverheadSizes()).rows}
    assert rows["emulator directly"]["cpu"] == 800
    assert rows["through a bare relay"]["cpu"] == 2500
    assert rows["through the gateway"]["cpu"] == 2600
    assert rows["through a bare relay"]["p50"] == 450
    assert "cpu" not in rows["added by the gateway"]


def test_the_gateway_may_cost_a_fifth_more_cpu_than_the_bare_relay() -> None:
    assert _cpu_target(FIGURES) == (1.04, True)
    assert _cpu_target(replace(FIGURES, cpu_ratio=1.2)) == (1.2, True)
    assert _cpu_target(replace(FIGURES, cpu_ratio=1.25)) == (1.25, False)
