"""The emulator's capacity benchmark runs end to end (a tiny, bounded run; no timing asserts)."""

from __future__ import annotations

import pytest

from herdless.bench.emulator_capacity import CapacityParams, main, run_capacity

pytestmark = [pytest.mark.integration, pytest.mark.server]


def test_a_tiny_capacity_run_reports_every_level() -> None:
    report = run_capacity(CapacityParams(speed=50, max_tokens=8, duration=0.3), levels=(1, 4))
    assert [lv.concurrency for lv in report.levels] == [1, 4]
    for level in report.levels:
        assert level.errors == 0
        assert level.streams >= level.concurrency
        assert level.tokens == 8 * level.streams
    assert "| streams |" in report.to_markdown()


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--levels", "0"]) == 2
    assert "levels" in capsys.readouterr().err
