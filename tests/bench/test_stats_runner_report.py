"""The bench's pure parts: statistics, interleaving, result writing."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from herdless.bench.plots import table_bars
from herdless.bench.report import (
    Column,
    Medians,
    ScenarioResult,
    Target,
    knobs,
    medians,
    write_result,
)
from herdless.bench.runner import Arm, interleaved_order, run_arms
from herdless.bench.stats import median, peak_rate, ratio

pytestmark = [pytest.mark.server]


def test_median_ignores_missing_values() -> None:
    assert median([3.0, math.nan, 1.0, 2.0]) == 2.0
    assert math.isnan(median([]))


def test_ratio_is_nan_without_a_baseline() -> None:
    assert ratio(3.0, 2.0) == 1.5
    assert math.isnan(ratio(1.0, 0.0))
    assert math.isnan(ratio(math.nan, 1.0))


def test_peak_rate_slides_the_window_and_ignores_before_start() -> None:
    times = [0.1, 0.2, 1.6, 2.0, 2.1, 2.5, 2.59, 4.0]
    # before start=1.5 nothing counts; the fullest 1 s window is [1.6, 2.6): 5 arrivals
    assert peak_rate(times, start=1.5) == 5.0
    # the fullest 0.5 s window is [2.1, 2.6): 3 arrivals, 6 per second
    assert peak_rate(times, start=1.5, width=0.5) == 6.0
    assert peak_rate([], start=0.0) == 0.0


def test_peak_rate_rejects_empty_window() -> None:
    with pytest.raises(ValueError, match="width"):
        peak_rate([1.0], start=0.0, width=0)


def test_interleaved_order_rotates_the_first_arm() -> None:
    assert interleaved_order(3, 2) == [(0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (1, 0)]
    with pytest.raises(ValueError, match="at least one"):
        interleaved_order(0, 1)


def test_run_arms_gives_each_repetition_its_seed_and_reports_progress() -> None:
    calls: list[tuple[str, int]] = []
    progress: list[str] = []

    def arm(name: str) -> Arm:
        def run(seed: int) -> dict[str, float]:
            calls.append((name, seed))
            return {"x": float(seed)}

        return Arm(name=name, run=run)

    runs = run_arms([arm("a"), arm("b")], repeats=2, seed=10, progress=progress.append)
    assert calls == [("a", 10), ("b", 10), ("b", 11), ("a", 11)]
    assert runs == {"a": [{"x": 10.0}, {"x": 11.0}], "b": [{"x": 10.0}, {"x": 11.0}]}
    assert progress == ["a #1", "b #1", "b #2", "a #2"]
    assert medians(runs) == [{"arm": "a", "x": 10.5}, {"arm": "b", "x": 10.5}]


def test_medians_find_rows_by_arm_add_relative_figures_and_carry_the_runs() -> None:
    runs = {"base": [{"x": 2.0}, {"x": 4.0}], "b": [{"x": 6.0}, {"x": 6.0}], "z": [{"x": 0.0}]}
    table = Medians(runs)
    table.relative("x_rel", "x", base="base")
    assert table["b"] == {"arm": "b", "x": 6.0, "x_rel": 2.0}
    assert table["base"]["x_rel"] == 1.0
    with pytest.raises(KeyError):
        table["missing"]
    result = table.result(name="n", title="t", params={}, columns=[Column(key="x", label="x")])
    assert result.rows is table.rows
    assert result.runs is runs
    assert (result.targets, result.notes, result.plots) == ([], [], [])
    zero = Medians({"a": [{"x": 1.0}], "z": [{"x": 0.0}]})
    zero.relative("x_rel", "x", base="z")
    assert math.isnan(zero["a"]["x_rel"])


def test_knobs_are_the_parameters_fields_in_order_but_those_left_out() -> None:
    from herdless.bench.spill import SpillParams

    p = SpillParams(n=3)
    assert knobs(p, leave_out={"deadline", "short_deadline"}) == {
        "n": 3,
        "slots": p.slots,
        "queue": p.queue,
        "max_tokens": p.max_tokens,
        "window": p.window,
        "repeats": p.repeats,
    }
    assert list(knobs(p))[-3:] == ["short_deadline", "window", "repeats"]


def test_target_met_and_missing() -> None:
    assert Target(label="t", value=1.0, limit=1.5).met
    assert not Target(label="t", value=2.0, limit=1.5).met
    assert Target(label="t", value=0.95, limit=0.9, at_least=True).met
    assert not Target(label="t", value=math.nan, limit=1.0).met


def test_result_is_written_as_markdown_and_json(tmp_path: Path) -> None:
    result = ScenarioResult(
        name="demo",
        title="a title",
        params={"n": 3},
        columns=[Column(key="x", label="x value"), Column(key="y", label="y", fmt="{:.0%}")],
        rows=[{"arm": "a", "x": 1.234, "y": 0.5}, {"arm": "b", "x": math.nan, "y": 1.0}],
        runs={"a": [{"x": 1.234}]},
        targets=[Target(label="x small", value=1.234, limit=1.0)],
        notes=["measured here"],
        plots=[tmp_path / "demo.png"],
    )
    md_path, json_path = write_result(result, tmp_path / "out")
    md = md_path.read_text()
    assert "| a | 1.23 | 50% |" in md
    assert "| b | n/a | 100% |" in md
    assert "| x small | 1.23 | <= 1 | **no** |" in md
    assert "- measured here" in md
    assert "![demo](demo.png)" in md
    data = json.loads(json_path.read_text())
    assert data["rows"][1]["x"] is None  # NaN is not JSON
    assert data["targets"][0]["met"] is False
    assert data["plots"] == ["demo.png"]


def test_a_target_note_gets_its_own_column() -> None:
    result = ScenarioResult(
        name="s",
        title="t",
        params={},
        columns=[],
        rows=[],
        targets=[
            Target(label="a", value=2.0, limit=1.5, note="floor is 2"),
            Target(label="b", value=0.0, limit=0.0),
        ],
    )
    md = result.to_markdown()
    assert "| target | measured | limit | met | note |" in md
    assert "| a | 2 | <= 1.5 | **no** | floor is 2 |" in md
    assert "| b | 0 | <= 0 | yes |  |" in md
    assert result.to_json()["targets"][0]["note"] == "floor is 2"


def test_table_bars_draws_the_numbers_and_skips_an_empty_table(tmp_path: Path) -> None:
    result = ScenarioResult(
        name="overload",
        title="steady load",
        params={},
        columns=[Column(key="g", label="goodput"), Column(key="p99", label="p99 (s)")],
        rows=[
            {"arm": "0.8x", "g": 0.8, "p99": 1.0},
            {"arm": "2x", "g": 0.95, "p99": math.nan},
        ],
    )
    png = table_bars(result, tmp_path / "overload.png")
    assert png == tmp_path / "overload.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    empty = ScenarioResult(name="e", title="t", params={}, columns=[], rows=[])
    assert table_bars(empty, tmp_path / "e.png") is None
    assert not (tmp_path / "e.png").exists()


def test_overload_table_does_not_claim_local_sizes_for_a_target() -> None:
    from herdless.bench.overload import OverloadParams, _params

    remote = _params(OverloadParams(target="https://gpu.example.com/v1"), 30.94)
    assert remote["target"] == "https://gpu.example.com/v1"
    assert remote["capacity_rps"] == 30.9
    assert not {"slots", "queue", "speed"} & remote.keys()
    assert _params(OverloadParams(), 3.0)["slots"] == 16
