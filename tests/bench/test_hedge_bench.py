"""The ``hedge`` scenario's arithmetic and outputs, without starting any process."""

from __future__ import annotations

from pathlib import Path

import pytest

from herdless.bench import hedge
from herdless.bench.cli import SCENARIOS


def test_figures_count_shares_and_leave_errors_out_of_the_percentiles() -> None:
    results = [(0.3, "gpu")] * 8 + [(0.6, "hosted"), (9.0, "error: APITimeoutError")]
    figures = hedge._figures(results, hedges=[0.33, 0.34])
    assert figures["p50"] == pytest.approx(0.3)
    assert figures["max"] == 0.6  # the error's 9 s is not a latency
    assert (figures["fallback_share"], figures["errors"]) == (0.1, 0.1)
    assert (figures["hedge_share"], figures["hedge_delay"]) == (0.2, pytest.approx(0.335))
    assert "hedge_share" not in hedge._figures(results, None)


def test_the_targets_follow_the_issue() -> None:
    p = hedge.HedgeParams()
    runs = {
        hedge.NO_HEDGE: [{"p50": 0.33, "p99": 5.0, "fallback_share": 0.0}],
        p.hedged: [{"p50": 0.34, "p99": 0.7, "fallback_share": 0.11, "hedge_delay": 0.3}],
        hedge.OPENAI: [{"p50": 0.33, "p99": 5.0, "fallback_share": 0.0}],
        hedge.REFERENCE: [{"p50": 0.3, "p99": 0.32, "fallback_share": 1.0}],
    }
    result = hedge._result(p, runs)
    p50, tail, share = result.targets
    assert p50.value == pytest.approx(0.34 / 0.33)
    assert p50.met
    assert tail.limit == pytest.approx(0.3 + 0.32 + 0.1)
    assert tail.met
    assert (share.value, share.limit, share.met) == (0.11, 0.12, True)
    assert [row["arm"] for row in result.rows] == list(runs)


def test_the_cdf_is_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    samples = {hedge.NO_HEDGE: [0.3] * 9 + [5.0], hedge.REFERENCE: [0.3, 0.31]}
    path = hedge._cdf(samples, tmp_path / "hedge-cdf.png", hedge.HedgeParams())
    assert path.read_bytes().startswith(b"\x89PNG")


def test_the_scenario_is_registered_with_what_it_needs() -> None:
    scenario = SCENARIOS["hedge"]
    assert "openai" in scenario.needs
    assert scenario.runs(type("Opts", (), {"repeats": 2})()) == 8  # type: ignore[arg-type]
