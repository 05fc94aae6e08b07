"""The demo's pure parts: the script of the day, the tally of events, the rendering."""

from __future__ import annotations

import json
import math
import re

import pytest
from rich.console import Console

from herdless.demo.cli import main, settings
from herdless.demo.day import Day
from herdless.demo.summary import day_summary
from herdless.demo.tally import Tally
from herdless.demo.view import accounting, live_panel, summary_table
from herdless.events import (
    AttemptFailed,
    BackpressureReceived,
    BreakerStateChanged,
    CallFailed,
    CallFinished,
    FallbackUsed,
    RetryScheduled,
)

pytestmark = [pytest.mark.server]

START = 1000.0


def test_day_phases_and_crowd() -> None:
    day = Day(length=100, crowd=50)
    assert [day.phase(t).name for t in (0, 20, 50, 70, 90, 150)] == [
        "morning",
        "rush",
        "maintenance",
        "afternoon",
        "evening",
        "evening",
    ]
    assert day.active(0) == 5  # a tenth at dawn
    assert day.active(7.5) == 28  # half-way up the morning ramp
    assert day.active(30) == 50
    assert day.active(100) == 5
    assert day.maintenance == (45.0, 65.0)


@pytest.mark.parametrize(("length", "crowd", "field"), [(0, 1, "length"), (1, 0, "crowd")])
def test_day_rejects_nonsense(length: float, crowd: int, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        Day(length=length, crowd=crowd)


def _tally() -> Tally:
    tally = Tally(start=START)
    events = [
        AttemptFailed(
            call_id="c1", backend="gpu", at=START + 0.5, attempt=1, kind="status", status=429
        ),
        RetryScheduled(
            call_id="c1", backend="gpu", at=START + 0.5, attempt=1, delay=0.8, reason="429"
        ),
        CallFinished(call_id="c1", backend="gpu", at=START + 1.2, attempts=2, latency=1.2),
        AttemptFailed(
            call_id="c1", backend="gpu", at=START + 2.1, attempt=1, kind="status", status=503
        ),
        BackpressureReceived(
            call_id=None, backend="gpu", at=START + 2.1, retry_after=3, draining=True
        ),
        FallbackUsed(
            call_id="c1", backend="hosted", at=START + 2.1, from_backend="gpu", reason="draining"
        ),
        CallFinished(
            call_id="c1",
            backend="hosted",
            at=START + 2.9,
            attempts=2,
            latency=0.9,
            fallback_reason="draining",
        ),
        CallFailed(
            call_id="c1",
            backend="gpu",
            at=START + 3.5,
            attempts=5,
            latency=3.0,
            error="RateLimitError",
        ),
    ]
    for event in events:
        tally.record(event, client=1)
    tally.record(
        BreakerStateChanged(
            call_id=None, backend="gpu", at=START + 2.1, old="closed", new="open", reason="draining"
        ),
        client=1,
    )
    tally.record(
        BreakerStateChanged(
            call_id=None, backend="gpu", at=START + 2.1, old="closed", new="open", reason="draining"
        ),
        client=2,
    )
    tally.record(
        BreakerStateChanged(
            call_id=None, backend="gpu", at=START + 5, old="open", new="half_open", reason="x"
        ),
        client=1,
    )
    return tally


def test_tally_counts_per_second_and_in_total() -> None:
    tally = _tally()
    assert tally.served["gpu"] == {1: 1}
    assert tally.served["hosted"] == {2: 1}
    assert tally.refused == {0: 1}
    assert tally.failed == {3: 1}
    assert tally.refusals_by == {429: 1, 503: 1}
    assert tally.retries == 1
    assert tally.waited == 0.8
    assert tally.fallbacks_by == {"draining": 1}
    assert tally.failed_by == {"RateLimitError": 1}
    assert tally.drains_seen == 1
    assert tally.finished == 3
    assert tally.attempts == [2, 2, 5]
    assert tally.mean_attempts() == 3.0
    assert tally.latency(50) == pytest.approx(1.05)
    # client 1 moved open -> half_open; client 2 stays open
    assert +tally.breakers == {"open": 1, "half_open": 1}


def test_tally_rate_averages_the_last_whole_seconds() -> None:
    tally = _tally()
    # at 3.4 s the last whole seconds are 1 and 2: one call served by gpu in second 1
    assert tally.rate(tally.served["gpu"], START + 3.4) == 0.5
    assert tally.second(START - 5) == 0  # events before the start count in second 0


def test_empty_tally_has_no_figures() -> None:
    tally = Tally(start=START)
    assert math.isnan(tally.mean_attempts())
    assert math.isnan(tally.latency(99))


def test_live_panel_and_summary_show_the_counts() -> None:
    tally = _tally()
    tally.gauges["queue_depth"] = 7
    console = Console(record=True, width=100)
    console.print(
        live_panel(tally, Day(length=10, crowd=20), START + 5.0, primary="gpu", fallback="hosted")
    )
    console.print(summary_table(tally, primary="gpu", fallback="hosted"))
    text = console.export_text()
    assert "maintenance" in text
    assert "draining: 1" in text
    assert "1 (33.3%)" in text  # served by gpu, by hosted and failed: one each
    assert "failed: RateLimitError" in text
    assert "attempts refused with 429" in text
    assert "gateway queue depth" in text


def test_bad_flags_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--crowd", "0"]) == 2
    assert "argument --crowd: Input should be greater than 0" in capsys.readouterr().err


def test_tally_counts_calls_that_end_after_the_deadline() -> None:
    tally = Tally(start=START, deadline=2.0)
    tally.record(CallFinished(call_id="a", backend="gpu", at=START + 1, attempts=1, latency=1.9))
    tally.record(CallFinished(call_id="b", backend="gpu", at=START + 3, attempts=1, latency=2.5))
    tally.record(
        CallFailed(call_id="c", backend="gpu", at=START + 3, attempts=2, latency=2.1, error="X")
    )
    assert tally.late == 2
    assert tally.late_by == pytest.approx(0.5)
    line = accounting(tally, started=3, primary="gpu", fallback=None).plain
    assert line.endswith("2 ended after the 2 s deadline, by 0.50 s at most)")


def test_accounting_adds_up_and_names_what_is_missing() -> None:
    tally = _tally()
    tally.deadline = 20.0
    whole = accounting(tally, started=3, primary="gpu", fallback="hosted").plain
    assert whole == (
        "requests started: 3 = 1 by gpu + 1 by hosted + 1 failed "
        "(all accounted for; none ended after the 20 s deadline)"
    )
    short = accounting(tally, started=4, primary="gpu", fallback=None).plain
    assert "1 unaccounted" in short
    assert "hosted" not in short


def test_flags_come_from_the_environment_and_flags_win(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HERDLESS_DEMO_CROWD", "40")
    monkeypatch.setenv("HERDLESS_DEMO_FALLBACK", "false")
    monkeypatch.setenv("HERDLESS_DEMO_LENGTH", "30")
    opts = settings(["--length", "12"])
    assert (opts.crowd, opts.fallback, opts.length, opts.deadline) == (40, False, 12.0, 20.0)
    monkeypatch.setenv("HERDLESS_DEMO_CROWD", "-3")
    with pytest.raises(SystemExit) as exc:
        settings([])
    assert exc.value.code == 2
    assert "variable HERDLESS_DEMO_CROWD: Input should be greater than 0" in (
        capsys.readouterr().err
    )


def test_the_json_summary_is_the_tally_the_tables_print() -> None:
    tally = _tally()
    tally.deadline = 2.0
    day = Day(length=10, crowd=20)
    summary = day_summary(tally, day, started=3, primary="gpu", fallback="hosted")
    assert json.loads(json.dumps(summary, allow_nan=False)) == summary  # strict JSON
    assert summary["requests"] == {"started": 3, "ended": 3, "unaccounted": 0}
    assert summary["served"] == {"gpu": 1, "hosted": 1}
    assert summary["failed"] == 1
    assert summary["failed_by"] == {"RateLimitError": 1}
    assert summary["fallbacks_by"] == {"draining": 1}
    assert summary["refused_by_status"] == {"429": 1, "503": 1}
    assert summary["retries"] == 1
    assert summary["latency_s"]["p50"] == pytest.approx(tally.latency(50))
    assert summary["latency_s"]["max"] == max(tally.latencies)
    assert summary["attempts"] == {"mean": 3.0, "max": 5}
    assert (summary["deadline_s"], summary["late"]) == (2.0, tally.late)
    assert [p["phase"] for p in summary["phases"]] == [
        "morning", "rush", "maintenance", "afternoon", "evening",
    ]  # fmt: skip
    # As the phase table counts: a phase holds the whole seconds it touches (10 s day:
    # the morning is seconds 0-1, the rush 1-4).
    assert summary["phases"][0]["served"] == {"gpu": 1, "hosted": 0}
    assert summary["phases"][1]["served"] == {"gpu": 1, "hosted": 1}
    assert summary["phases"][1]["hosted_share"] == 0.5
    assert summary["timeline"] is None
    # The table shows the same figures.
    console = Console(record=True, width=100)
    console.print(summary_table(tally, primary="gpu", fallback="hosted", started=3))
    text = console.export_text()
    assert re.search(r"requests started\s+│\s+3\s", text)
    assert re.search(r"served by hosted \(fallback\)\s+│\s+1 \(33.3%\)", text)
    assert "served by gpu (primary)" in text
    assert f"{summary['attempts']['mean']:.2f}" in text


def test_the_json_summary_has_no_nan_without_samples() -> None:
    summary = day_summary(
        Tally(start=START), Day(length=10, crowd=2), started=0, primary="gpu", fallback=None
    )
    assert summary["latency_s"] == {"p50": None, "p95": None, "p99": None, "max": None}
    assert summary["attempts"]["mean"] is None
    assert summary["served"] == {"gpu": 0}
    assert summary["deadline_s"] is None  # no deadline: the tally's is infinite
    assert all(p["hosted_share"] is None for p in summary["phases"])
    json.dumps(summary, allow_nan=False)  # raises on NaN or infinity
