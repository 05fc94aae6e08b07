"""python -m herdless.bench.emulator_capacity: its options default to CapacityParams's fields."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from herdless.bench import emulator_capacity
from herdless.bench.emulator_capacity import LEVELS, CapacityParams, CapacityReport


def _asked(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> tuple[CapacityParams, list[int]]:
    asked: list[tuple[CapacityParams, list[int]]] = []

    def run_capacity(params: CapacityParams, *, levels: Sequence[int]) -> CapacityReport:
        asked.append((params, list(levels)))
        return CapacityReport(params=params, levels=[])

    monkeypatch.setattr(emulator_capacity, "run_capacity", run_capacity)
    assert emulator_capacity.main(argv) == 0
    return asked[0]


def test_no_options_measure_with_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _asked(monkeypatch, []) == (CapacityParams(), list(LEVELS))


def test_options_replace_their_knob_only(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["--levels", "2,3", "--max-tokens", "8", "--stream-interval", "4"]
    params, levels = _asked(monkeypatch, argv)
    assert params == CapacityParams(max_tokens=8, stream_interval=4)
    assert levels == [2, 3]
