"""RetryBudget: retries stay a fraction of recent calls, waiting retries included."""

from __future__ import annotations

import threading

from herdless._budget import RetryBudget
from herdless.testing import FakeClock


def _budget(clock: FakeClock, ratio: float = 0.1, floor: int = 2) -> RetryBudget:
    return RetryBudget(ratio=ratio, floor=floor, window=10.0, clock=clock)


def test_the_floor_allows_a_few_retries_with_no_calls() -> None:
    budget = _budget(FakeClock(), floor=2)
    assert [budget.try_acquire() for _ in range(3)] == [True, True, False]


def test_retries_grow_with_calls() -> None:
    budget = _budget(FakeClock(), ratio=0.1, floor=0)
    for _ in range(30):
        budget.record_call()
    granted = 0
    while budget.try_acquire():
        budget.settle(failed=True)
        granted += 1
    assert granted == 3


def test_retries_waiting_in_backoff_count() -> None:
    budget = _budget(FakeClock(), floor=2)
    assert budget.try_acquire()
    assert budget.try_acquire()  # both still waiting, not sent
    assert not budget.try_acquire()
    budget.cancel()  # one call fell back instead
    assert budget.try_acquire()


def test_retries_and_calls_leave_the_window() -> None:
    clock = FakeClock()
    budget = _budget(clock, ratio=0.0, floor=1)
    assert budget.try_acquire()
    budget.settle(failed=True)
    assert not budget.try_acquire()
    clock.advance(9.99)
    assert not budget.try_acquire()  # the failed retry is still in the 10 s window
    clock.advance(0.02)
    assert budget.try_acquire()


def test_overloaded_backend_sees_about_one_attempt_per_call() -> None:
    """Every call fails and wants a retry: attempts stay <= 1 + ratio (+ floor) per call."""
    clock = FakeClock()
    budget = _budget(clock, ratio=0.1, floor=3)
    calls = attempts = 0
    for _ in range(1000):
        calls += 1
        attempts += 1
        budget.record_call()
        if budget.try_acquire():
            budget.settle(failed=True)
            attempts += 1
        clock.advance(0.01)
    assert attempts / calls <= 1.1 + 3 / 1000 * 10


def test_a_served_retry_gives_its_unit_back() -> None:
    budget = _budget(FakeClock(), ratio=0.0, floor=1)
    for _ in range(100):  # a crowd let through one retry at a time, each served
        assert budget.try_acquire()
        budget.settle(failed=False)
    assert budget.try_acquire()
    budget.settle(failed=True)
    assert not budget.try_acquire()


def test_threads_never_overdraw() -> None:
    budget = _budget(FakeClock(), ratio=0.0, floor=5)
    granted: list[bool] = []
    start = threading.Barrier(8)

    def contend() -> None:
        start.wait()
        for _ in range(100):
            granted.append(budget.try_acquire())

    threads = [threading.Thread(target=contend) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert granted.count(True) == 5


def test_a_backend_that_never_fails_keeps_only_a_window_of_calls() -> None:
    # No retry ever asks try_acquire: record_call itself drops what left the window.
    clock = FakeClock()
    budget = _budget(clock)
    for _ in range(800):  # 100 s of calls, 8 a second
        budget.record_call()
        clock.advance(0.125)
    # The last 10 s: 80 intervals, 81 calls (the one exactly 10 s old still counts).
    assert repr(budget).startswith("RetryBudget(calls=81,")
