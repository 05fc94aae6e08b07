"""The fairness scenarios' figures from call records (pure)."""

from __future__ import annotations

import math

import pytest

from herdless.bench.fairness_report import (
    priority_figures,
    priority_table,
    tokens_figures,
    tokens_table,
)
from herdless.bench.fairness_stats import (
    CallRecord,
    FairnessParams,
    backlogged_throughout,
    cumulative_service,
    service,
    throughput,
    window_jain,
)

STEP = 0.1  # seconds per token


def call(
    user: str, sent: float, ended: float | None, completion: int = 10, **kw: object
) -> CallRecord:
    return CallRecord(user=user, sent=sent, ended=ended, prompt=5, completion=completion, **kw)  # type: ignore[arg-type]


def test_a_calls_tokens_are_spread_over_the_time_it_ran() -> None:
    # Sent at 0, answered at 5, 10 tokens at 0.1 s: it ran from 4 to 5.
    records = [call("a", 0.0, 5.0)]
    assert service(records, start=0, end=4.5, step=STEP) == {"a": pytest.approx(12.5)}
    assert service(records, start=4.5, end=9, step=STEP) == {"a": pytest.approx(12.5)}
    assert throughput(records, start=4, end=5, step=STEP) == pytest.approx(10)
    # Never before it was sent: a call answered at once ran from its sending.
    quick = [call("a", 4.8, 5.0)]
    assert service(quick, start=4.8, end=5.0, step=STEP) == {"a": pytest.approx(25)}


def test_unanswered_calls_serve_nothing() -> None:
    records = [call("a", 0.0, None), call("b", 0.0, 1.0, ok=False)]
    assert service(records, start=0, end=10, step=STEP) == {}


def test_backlogged_means_a_call_outstanding_at_every_instant() -> None:
    records = [
        call("steady", 0.0, 6.0),
        call("steady", 5.5, 12.0),  # overlaps: no gap
        call("gappy", 0.0, 4.0),
        call("gappy", 4.5, 12.0),  # a gap at 4-4.5
        call("late", 1.0, None),  # never answered: outstanding until the run stops
    ]
    assert backlogged_throughout(records, start=0, end=10, stop=20) == {"steady"}
    assert backlogged_throughout(records, start=1, end=10, stop=20) == {"steady", "late"}
    assert backlogged_throughout(records, start=5, end=10, stop=20) == {
        "steady",
        "gappy",
        "late",
    }


def test_jain_per_window_counts_only_the_backlogged_users() -> None:
    records = [
        call("a", 0.0, 10.0, completion=100),  # ran 0-10, backlogged throughout
        call("b", 0.0, 10.0, completion=100),
        call("c", 2.0, 3.0, completion=1),  # asked for little: not counted as starved
    ]
    windows = window_jain(records, start=0, end=10, window=5, step=STEP, stop=10)
    assert windows == [(1.0, 2), (1.0, 2)]
    starved = [*records[:2], call("d", 0.0, None)]  # waiting all along, served nothing
    (first, _) = window_jain(starved, start=0, end=10, window=5, step=STEP, stop=10)
    assert first[1] == 3
    assert first[0] == pytest.approx(2 / 3)


def test_cumulative_service_per_bin() -> None:
    totals = cumulative_service([call("a", 0.0, 2.0, completion=10)], step=STEP, until=3)
    # 5 + 2 x 10 = 25 tokens, ran from 1 to 2.
    assert totals["a"] == pytest.approx([0.0, 25.0, 25.0])


def test_scenario_figures_from_records() -> None:
    p = FairnessParams(warmup=0, seconds=10, window=5, slots=1, speed=1)
    step = p.step
    long = [call("long", 0.0, 10.0, completion=round(10 / step))]
    short = [call("short", 0.0, 10.0, completion=round(10 / step))]
    figures = tokens_figures(long + short, p)
    assert figures["ratio"] == pytest.approx(1.0)
    assert figures["jain"] == pytest.approx(1.0)
    chats = [call("chat-00", 1.0, 2.0), call("chat-01", 1.0, 3.0)]
    batch = [call("batch", 0.0, 5.0, backend="primary"), call("batch", 0.0, 6.0, ok=False)]
    spilled = [call("batch", 0.0, 5.0, backend="hosted")]
    figures = priority_figures(chats + batch + spilled, p)
    assert figures["p95"] == pytest.approx(1.95)
    assert (figures["batch_errors"], figures["batch_spilled"]) == (1, 1)
    runs = {
        "vtc": [figures],
        "fcfs": [dict(figures)],
        "round-robin": [dict(figures)],
        "alone": [priority_figures(chats, p)],
    }
    table = priority_table(runs, p, baseline="alone")
    vtc = next(row for row in table.rows if row["arm"] == "vtc")
    assert vtc["p95_x"] == pytest.approx(1.0)
    assert vtc["throughput_x"] == pytest.approx(1.0)
    alone = next(row for row in table.rows if row["arm"] == "alone")
    assert math.isnan(alone["throughput_x"])
    assert [t.met for t in table.targets] == [True, False, False, True]


@pytest.mark.parametrize("stops", [False, True])
def test_the_two_users_table_and_the_one_of_a_user_who_stops(stops: bool) -> None:
    p = FairnessParams(warmup=0, seconds=10, window=5, slots=1, speed=1)
    long = call("long", 0.0, 10.0, completion=round(10 / p.step))
    short = call("short", 0.0, 10.0, completion=round(5 / p.step))
    unfair = tokens_figures([long, short], p)
    fair = tokens_figures([long, call("short", 0.0, 10.0, completion=round(10 / p.step))], p)
    table = tokens_table({"vtc": [fair], "round-robin": [unfair], "fcfs": [unfair]}, p, stops=stops)
    assert table.name == ("fairness-stops" if stops else "fairness-tokens")
    short_label = "user stopping at 64" if stops else "64-token user"
    assert table.columns[1].label == f"{short_label} (tokens/s)"
    assert [t.met for t in table.targets] == [True, True, False]  # round-robin: 2x, not 4x
    assert any("stop" in note for note in table.notes) is stops
