"""BackendHolds: one Retry-After applies to every call of the client."""

from __future__ import annotations

import asyncio

from herdless._holds import BackendHolds
from herdless.testing import FakeClock


def test_a_block_holds_until_it_elapses() -> None:
    clock = FakeClock()
    holds = BackendHolds(clock=clock)
    assert holds.held("primary") == (0.0, False)
    holds.hold("primary", 2.0)
    clock.advance(1.5)
    assert holds.held("primary") == (0.5, False)
    assert holds.held("hosted") == (0.0, False)  # per backend
    clock.advance(0.5)
    assert holds.held("primary") == (0.0, False)


def test_the_later_end_wins() -> None:
    clock = FakeClock()
    holds = BackendHolds(clock=clock)
    holds.hold("primary", 5.0)
    holds.hold("primary", 1.0)
    assert holds.held("primary") == (5.0, False)
    holds.hold("primary", 8.0)
    assert holds.held("primary") == (8.0, False)


def test_a_drain_sticks_for_its_window() -> None:
    clock = FakeClock()
    holds = BackendHolds(clock=clock)
    holds.hold("primary", 30.0, draining=True)
    holds.hold("primary", 1.0)  # an ordinary 429 meanwhile does not end the drain
    assert holds.held("primary") == (30.0, True)
    clock.advance(30.0)
    holds.hold("primary", 1.0)
    assert holds.held("primary") == (1.0, False)


def test_negative_seconds_do_not_block() -> None:
    holds = BackendHolds(clock=FakeClock())
    holds.hold("primary", -3.0)
    assert holds.held("primary") == (0.0, False)


async def test_tasks_see_one_block() -> None:
    clock = FakeClock()
    holds = BackendHolds(clock=clock)

    async def caller(i: int) -> float:
        if i == 0:
            holds.hold("primary", 3.0)
        await asyncio.sleep(0)
        return holds.held("primary")[0]

    assert await asyncio.gather(*(caller(i) for i in range(10))) == [3.0] * 10
