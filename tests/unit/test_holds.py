"""BackpressureGate: one Retry-After applies to every call of the client."""

from __future__ import annotations

import asyncio

from herdless._gate import BackpressureGate
from herdless.testing import FakeClock


def test_a_block_holds_until_it_elapses() -> None:
    clock = FakeClock()
    gate = BackpressureGate(clock=clock)
    assert gate.blocked("primary") == (0.0, False)
    gate.block("primary", 2.0)
    clock.advance(1.5)
    assert gate.blocked("primary") == (0.5, False)
    assert gate.blocked("hosted") == (0.0, False)  # per backend
    clock.advance(0.5)
    assert gate.blocked("primary") == (0.0, False)


def test_the_later_end_wins() -> None:
    clock = FakeClock()
    gate = BackpressureGate(clock=clock)
    gate.block("primary", 5.0)
    gate.block("primary", 1.0)
    assert gate.blocked("primary") == (5.0, False)
    gate.block("primary", 8.0)
    assert gate.blocked("primary") == (8.0, False)


def test_a_drain_sticks_for_its_window() -> None:
    clock = FakeClock()
    gate = BackpressureGate(clock=clock)
    gate.block("primary", 30.0, draining=True)
    gate.block("primary", 1.0)  # an ordinary 429 meanwhile does not end the drain
    assert gate.blocked("primary") == (30.0, True)
    clock.advance(30.0)
    gate.block("primary", 1.0)
    assert gate.blocked("primary") == (1.0, False)


def test_negative_seconds_do_not_block() -> None:
    gate = BackpressureGate(clock=FakeClock())
    gate.block("primary", -3.0)
    assert gate.blocked("primary") == (0.0, False)


async def test_tasks_see_one_block() -> None:
    clock = FakeClock()
    gate = BackpressureGate(clock=clock)

    async def caller(i: int) -> float:
        if i == 0:
            gate.block("primary", 3.0)
        await asyncio.sleep(0)
        return gate.blocked("primary")[0]

    assert await asyncio.gather(*(caller(i) for i in range(10))) == [3.0] * 10
