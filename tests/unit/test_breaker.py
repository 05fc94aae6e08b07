"""CircuitBreaker: the state machine with a fake clock, and one probe under contention."""

from __future__ import annotations

import asyncio
import random
import threading

import pytest
from tests.unit._policy_stubs import LowerRandom, UpperRandom

from herdless._actions import Response
from herdless._breaker import BreakerPolicy, CircuitBreaker, Permit, Transition
from herdless._retry import RetryPolicy, classify
from herdless.testing import FakeClock


def _breaker(clock: FakeClock, rng: random.Random | None = None, **policy: float) -> CircuitBreaker:
    settings = {"open_jitter": 0.0, **policy}
    return CircuitBreaker(BreakerPolicy(**settings), clock=clock, rng=rng or LowerRandom())  # type: ignore[arg-type]  # test kwargs


def _fail(breaker: CircuitBreaker) -> Transition | None:
    permit, _ = breaker.acquire()
    return breaker.record_failure(permit)


def _succeed(breaker: CircuitBreaker) -> Transition | None:
    permit, _ = breaker.acquire()
    return breaker.record_success(permit)


def test_opens_after_n_consecutive_failures() -> None:
    breaker = _breaker(FakeClock(), consecutive_failures=3)
    assert _fail(breaker) is None
    assert _fail(breaker) is None
    assert _fail(breaker) == Transition("closed", "open", "consecutive_failures", open_for=5.0)
    assert breaker.state == "open"
    assert breaker.acquire() == (Permit.DENIED, None)


def test_a_success_resets_the_consecutive_count() -> None:
    breaker = _breaker(FakeClock(), consecutive_failures=2, min_calls=100)
    _fail(breaker)
    _succeed(breaker)
    assert _fail(breaker) is None
    assert breaker.state == "closed"


def test_opens_on_failure_rate_once_the_window_has_min_calls() -> None:
    clock = FakeClock()
    breaker = _breaker(clock, failure_rate=0.5, min_calls=4, consecutive_failures=99)
    for outcome in (_succeed, _fail, _succeed):
        assert outcome(breaker) is None
    transition = _fail(breaker)  # 2 failures of 4 calls
    assert transition is not None
    assert transition.reason == "failure_rate"


def test_old_outcomes_leave_the_window() -> None:
    clock = FakeClock()
    breaker = _breaker(clock, failure_rate=0.5, min_calls=4, window=10.0, consecutive_failures=99)
    _fail(breaker)
    _fail(breaker)
    clock.advance(11)  # both failures are now outside the window
    _succeed(breaker)
    _succeed(breaker)
    _succeed(breaker)
    assert _fail(breaker) is None  # 1 failure of 4
    assert breaker.state == "closed"


def test_half_open_admits_exactly_one_probe_then_closes_on_success() -> None:
    clock = FakeClock()
    breaker = _breaker(clock, consecutive_failures=1, open_for=5.0)
    _fail(breaker)
    clock.advance(4.9)
    assert breaker.remaining_open() == pytest.approx(0.1)
    assert breaker.acquire()[0] is Permit.DENIED
    clock.advance(0.1)
    assert breaker.state == "half_open"
    permit, transition = breaker.acquire()
    assert permit is Permit.PROBE
    assert transition == Transition("open", "half_open", "open_elapsed")
    assert breaker.acquire() == (Permit.DENIED, None)  # the probe is in flight
    assert breaker.record_success(permit) == Transition("half_open", "closed", "probe_ok")
    assert breaker.acquire()[0] is Permit.CALL


def test_a_failed_probe_reopens_for_twice_as_long_up_to_the_max() -> None:
    clock = FakeClock()
    breaker = _breaker(clock, consecutive_failures=1, open_for=5.0, max_open_for=12.0)
    _fail(breaker)
    periods = []
    for _ in range(3):
        clock.advance(breaker.remaining_open())
        transition = _fail(breaker)
        assert transition is not None
        assert transition.reason == "probe_failed"
        periods.append(transition.open_for)
    assert periods == [10.0, 12.0, 12.0]
    clock.advance(12.0)
    assert _succeed(breaker) == Transition("half_open", "closed", "probe_ok")
    assert _fail(breaker) == Transition("closed", "open", "consecutive_failures", open_for=5.0)


def test_open_period_is_jittered_upward() -> None:
    breaker = CircuitBreaker(
        BreakerPolicy(consecutive_failures=1, open_for=5.0, open_jitter=0.2),
        clock=FakeClock(),
        rng=UpperRandom(),
    )
    transition = _fail(breaker)
    assert transition is not None
    assert transition.open_for == pytest.approx(6.0)


def test_a_released_probe_frees_the_slot() -> None:
    clock = FakeClock()
    breaker = _breaker(clock, consecutive_failures=1)
    _fail(breaker)
    clock.advance(10)
    permit, _ = breaker.acquire()
    breaker.release(permit)
    assert breaker.acquire()[0] is Permit.PROBE


def test_a_429_style_success_keeps_it_closed() -> None:
    breaker = _breaker(FakeClock(), consecutive_failures=2)
    _fail(breaker)
    _succeed(breaker)  # the flow records 429/4xx as success: the backend is alive
    _fail(breaker)
    assert breaker.state == "closed"


def test_force_open_for_a_drain_denies_until_its_end() -> None:
    clock = FakeClock()
    breaker = _breaker(clock)
    assert breaker.force_open(30.0, "draining") == Transition(
        "closed", "open", "draining", open_for=30.0
    )
    assert breaker.force_open(10.0, "draining") is None  # a shorter hold changes nothing
    clock.advance(29)
    assert breaker.acquire()[0] is Permit.DENIED
    clock.advance(1)
    assert breaker.acquire()[0] is Permit.CALL


def test_a_drain_s_named_time_is_kept_and_only_the_breaker_s_own_period_is_jittered() -> None:
    """The gateway tells a drain's callers its end: a breaker stretched past it kept a
    crowd on the fallback while the GPU served again. Only a drain that named no time
    opens for ``open_for``, spread like any other open period."""
    clock = FakeClock()
    breaker = _breaker(clock, UpperRandom(), open_jitter=0.2, open_for=5.0)
    assert breaker.force_open(12.0, "draining") == Transition(
        "closed", "open", "draining", open_for=12.0
    )
    assert breaker.acquire()[0] is Permit.DENIED
    clock.advance(12.0)
    assert breaker.acquire()[0] is Permit.CALL
    other = _breaker(clock, UpperRandom(), open_jitter=0.2, open_for=5.0)
    transition = other.force_open(None, "draining")
    assert transition is not None
    assert transition.open_for == pytest.approx(6.0)


def test_when_a_drain_s_time_ends_every_call_goes_and_the_first_failure_reopens() -> None:
    """A drain is a live backend that said when it would be back: one probe at a time
    sent a shared client's other calls to the fallback for a whole answer's time while
    the GPU served again. It closes on trial: the first failure opens it, as a failure."""
    clock = FakeClock()
    breaker = _breaker(clock, open_for=5.0, consecutive_failures=5)
    breaker.force_open(3.0, "draining")
    clock.advance(3.0)
    assert breaker.state == "closed"
    assert breaker.acquire() == (Permit.CALL, Transition("open", "closed", "drain_ended"))
    crowd = [breaker.acquire() for _ in range(3)]
    assert crowd == [(Permit.CALL, None)] * 3
    breaker.record_success(Permit.CALL)  # a success ends the trial
    assert [_fail(breaker) for _ in range(4)] == [None] * 4

    breaker.force_open(3.0, "draining")
    clock.advance(3.0)
    first, _ = breaker.acquire()
    second, _ = breaker.acquire()
    assert breaker.record_failure(first) == Transition(
        "closed", "open", "consecutive_failures", open_for=5.0
    )
    assert breaker.record_failure(second) is None  # already open again
    clock.advance(5.0)
    assert breaker.acquire()[0] is Permit.PROBE  # opened by a failure: one probe
    assert breaker.acquire()[0] is Permit.DENIED


def test_the_same_drain_end_told_again_is_no_new_event() -> None:
    """A crowd's refusals name one end (Retry-After counts whole seconds): one event."""
    clock = FakeClock()
    breaker = _breaker(clock)
    assert breaker.force_open(6.0, "draining") is not None
    clock.advance(0.4)
    assert breaker.force_open(6.0, "draining") is None  # 0.4 s later: within a second
    assert breaker.remaining_open() == pytest.approx(6.0)  # the later end is kept
    clock.advance(0.7)
    assert breaker.force_open(7.0, "draining") == Transition(
        "open", "open", "draining", open_for=7.0
    )


def test_outcomes_of_attempts_started_before_opening_are_ignored() -> None:
    breaker = _breaker(FakeClock(), consecutive_failures=1)
    early, _ = breaker.acquire()
    _fail(breaker)
    assert breaker.record_failure(early) is None
    assert breaker.record_success(early) is None
    assert breaker.state == "open"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("failure_rate", 0),
        ("failure_rate", 1.5),
        ("window", 0),
        ("min_calls", 0),
        ("consecutive_failures", 0),
        ("open_for", 0),
        ("open_jitter", -1),
        ("max_open_for", 1),
    ],
)
def test_invalid_policy_names_the_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"BreakerPolicy.{field}"):
        BreakerPolicy(**{field: value})  # type: ignore[arg-type]  # parametrised


def _opened_then_elapsed() -> CircuitBreaker:
    clock = FakeClock()
    breaker = _breaker(clock, consecutive_failures=1)
    _fail(breaker)
    clock.advance(60)
    return breaker


def test_threads_hammering_get_exactly_one_probe() -> None:
    breaker = _opened_then_elapsed()
    start = threading.Barrier(16)
    permits: list[Permit] = []
    lock = threading.Lock()

    def contend() -> None:
        start.wait()
        for _ in range(200):
            permit, _ = breaker.acquire()
            with lock:
                permits.append(permit)

    threads = [threading.Thread(target=contend) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert permits.count(Permit.PROBE) == 1
    assert permits.count(Permit.DENIED) == 16 * 200 - 1


async def test_tasks_hammering_get_exactly_one_probe() -> None:
    breaker = _opened_then_elapsed()

    async def contend() -> list[Permit]:
        got = []
        for _ in range(50):
            got.append(breaker.acquire()[0])
            await asyncio.sleep(0)  # interleave the tasks
        return got

    results = await asyncio.gather(*(contend() for _ in range(20)))
    flat = [permit for permits in results for permit in permits]
    assert flat.count(Permit.PROBE) == 1


def test_a_probe_that_meets_a_drain_opens_for_the_drains_time_not_a_doubled_period() -> None:
    # A draining backend is healthy and says when to come back: its Retry-After, not the
    # failed-probe backoff (which doubled the open period and kept clients away long
    # after the maintenance ended).
    clock = FakeClock()
    breaker = CircuitBreaker(
        BreakerPolicy(consecutive_failures=1, open_for=5.0, open_jitter=0.0),
        clock=clock,
        rng=UpperRandom(),
    )
    permit, _ = breaker.acquire()
    breaker.record_failure(permit)
    clock.advance(5.0)
    probe, _ = breaker.acquire()
    assert probe is Permit.PROBE
    drained = classify(
        Response(
            status=503, headers={"x-herdless-drain": "1", "retry-after": "3"}, body=b"", elapsed=0.1
        ),
        RetryPolicy(),
        now=0.0,
    )
    assert drained.draining
    assert not drained.breaker_failure
    breaker.record_success(probe)
    transition = breaker.force_open(3.0, "draining")
    assert transition is not None
    assert transition.open_for == 3.0
    assert breaker.remaining_open() == 3.0
