"""Percentiles: the bench's and demo's interpolation, the client's nearest rank."""

from __future__ import annotations

import math

import pytest

from herdless._percentiles import nearest_rank, percentile


@pytest.mark.parametrize(
    ("q", "expected"), [(0, 1.0), (50, 2.5), (100, 4.0), (99, 3.97), (25, 1.75)]
)
def test_percentile_interpolates_between_ranks(q: float, expected: float) -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], q) == pytest.approx(expected)


def test_percentile_rejects_out_of_range_q() -> None:
    with pytest.raises(ValueError, match="q must be in"):
        percentile([1.0], 101)


def test_percentile_of_nothing_is_a_missing_figure() -> None:
    assert math.isnan(percentile([], 50))


@pytest.mark.parametrize(
    ("fraction", "expected"), [(0.0, 1.0), (0.5, 3.0), (0.74, 3.0), (0.75, 4.0), (1.0, 4.0)]
)
def test_nearest_rank_is_an_observed_value(fraction: float, expected: float) -> None:
    assert nearest_rank([1.0, 2.0, 3.0, 4.0], fraction) == expected


def test_nearest_rank_of_few_values_is_their_maximum_at_high_fractions() -> None:
    # The hedge's auto delay relies on it: its p95 of fewer than 20 times is the slowest.
    assert nearest_rank([0.1, 0.2, 0.5], 0.95) == 0.5


@pytest.mark.parametrize(("ordered", "fraction"), [([1.0], 1.5), ([1.0], -0.1), ([], 0.5)])
def test_nearest_rank_rejects_what_has_no_rank(ordered: list[float], fraction: float) -> None:
    with pytest.raises(ValueError, match=r"fraction must be in|of no values"):
        nearest_rank(ordered, fraction)
