"""The SDK overhead benchmark runs end to end (its figures are for the benchmark report,
never asserted: the machine is noisy)."""

from __future__ import annotations

import pytest

from herdless.bench import sdk_overhead

pytestmark = [pytest.mark.integration]


def test_every_arm_is_measured_against_raw_httpx() -> None:
    results = sdk_overhead.run(calls=3, rounds=2)
    assert [r.name for r in results] == ["sync", "sync stream", "async"]
    for result in results:
        assert result.rounds == 2
        assert result.calls == 3
        assert result.httpx_us > 0
        assert result.herdless_us > 0
        assert result.ratio > 0


def test_a_benchmark_of_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="calls and rounds"):
        sdk_overhead.run(calls=0, rounds=1)
