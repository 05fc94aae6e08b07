"""The SDK overhead benchmark runs end to end (its figures are for the benchmark report,
never asserted: the machine is noisy)."""

from __future__ import annotations

import functools
import itertools
import sys
from collections.abc import Iterator

import pytest

from herdless.bench import sdk_overhead
from herdless.bench.overhead import OverheadSizes, _sdk

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


def test_bytecodes_are_counted_and_the_tracer_is_put_back() -> None:
    before = sys.gettrace()
    [result, *_] = sdk_overhead.run(calls=1, rounds=1)
    assert sys.gettrace() is before  # a coverage tracer keeps running
    # One warm call of raw httpx runs thousands of bytecodes; herdless runs httpx too.
    assert result.httpx_bytecodes > 1000
    assert result.herdless_bytecodes > 1000
    assert result.bytecode_ratio == result.herdless_bytecodes / result.httpx_bytecodes


def test_the_count_is_what_most_calls_run() -> None:
    # A third of the calls run a few bytecodes more (a time-driven path, in the bench).
    def call(more: Iterator[bool]) -> None:
        if next(more):
            sum(range(3))

    now_and_then = functools.partial(call, itertools.cycle([True, False, False]))
    never = functools.partial(call, itertools.repeat(False))
    always = functools.partial(call, itertools.repeat(True))
    assert sdk_overhead._bytecodes(now_and_then) == sdk_overhead._bytecodes(never)
    assert sdk_overhead._bytecodes(always) > sdk_overhead._bytecodes(never)


async def test_the_async_count_is_what_most_calls_run() -> None:
    async def call(more: Iterator[bool]) -> None:
        if next(more):
            sum(range(3))

    now_and_then = functools.partial(call, itertools.cycle([True, False, False]))
    never = functools.partial(call, itertools.repeat(False))
    assert await sdk_overhead._abytecodes(now_and_then) == await sdk_overhead._abytecodes(never)


def test_the_report_shows_cpu_bytecodes_and_collector_runs() -> None:
    arm = sdk_overhead.ArmResult(
        name="sync",
        httpx_us=900.0,
        herdless_us=945.0,
        ratio=1.05,
        rounds=3,
        calls=10,
        httpx_bytecodes=20_000,
        herdless_bytecodes=21_000,
        httpx_sweeps=40.0,
        herdless_sweeps=60.0,
    )
    table = _sdk([arm], OverheadSizes()).to_markdown()
    assert "21,000 / 20,000" in table
    assert "1.050" in table  # the bytecode ratio
    assert "60.0 / 40.0" in table  # collector runs per 1,000 calls


def test_the_arms_take_turns_in_blocks_and_each_makes_every_call() -> None:
    blocks = list(sdk_overhead._blocks(2 * sdk_overhead._BLOCK + 7))
    assert [arm for arm, _ in blocks] == [0, 1, 1, 0, 0, 1]  # who goes first alternates
    for arm in (0, 1):
        assert sum(size for a, size in blocks if a == arm) == 2 * sdk_overhead._BLOCK + 7


def _cycles() -> None:
    for _ in range(100):
        node: list[object] = []
        node.append(node)  # garbage only the collector frees


def test_each_arm_pays_for_the_garbage_collection_it_causes() -> None:
    measured = sdk_overhead._round(lambda: None, _cycles, calls=60)
    assert measured.sweeps[0] == 0  # allocates nothing: never collects another's garbage
    assert measured.sweeps[1] > 0
    assert measured.spent[1] > measured.spent[0]


async def test_async_arms_pay_for_their_own_garbage_collection_too() -> None:
    async def nothing() -> None:
        return None

    async def cycles() -> None:
        _cycles()

    measured = await sdk_overhead._around(nothing, cycles, calls=60)
    assert measured.sweeps == [0, measured.sweeps[1]]
    assert measured.sweeps[1] > 0
