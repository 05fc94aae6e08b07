"""Hedged requests in the call flow, driven by hand in fake time (``flow_driver``).

Each scripted outcome's ``elapsed`` is when it ends after its send; sends of a race run
side by side, so every time below is exact: a hedge starts at ``after`` on the clock,
the first answer wins, the other is cancelled (the driver closes it).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from tests.unit._policy_stubs import UpperRandom
from tests.unit.flow_driver import HOSTED, PRIMARY, Driver, failure, hang, make, ok, status

from herdless._actions import Race, Send
from herdless._backend import Backend, Timeouts
from herdless._config import ClientConfig
from herdless._hedge import FirstByteTimes, HedgeBudget, HedgePolicy, Hedging
from herdless._routing import FallbackPolicy
from herdless._state import ClientState
from herdless._window import WindowPolicy
from herdless.errors import AllBackendsFailed
from herdless.events import (
    AttemptFailed,
    CallFinished,
    FallbackUsed,
    HedgeFinished,
    HedgeStarted,
    PrimaryDegraded,
)
from herdless.testing import FakeClock

START = 1000.0  # FakeClock's start


def hedged(after: float | str = 1.0, **policy: Any) -> HedgePolicy:
    return HedgePolicy(after=after, **policy)  # type: ignore[arg-type]  # "auto" as str


def kinds(accepted: Any) -> list[tuple[str, str]]:
    return [(a.backend, a.kind) for a in accepted.attempts]


# -- the race -------------------------------------------------------------------------------


def test_a_late_primary_is_hedged_exactly_at_after_and_the_first_answer_wins() -> None:
    driver = make([ok(elapsed=5.0)], [ok(elapsed=0.2)], hedge=hedged(1.0))
    accepted = driver.run()
    (started,) = driver.of(HedgeStarted)
    assert (started.at, started.after) == (START + 1.0, 1.0)
    assert (started.backend, started.from_backend, started.attempt) == ("hosted", "primary", 2)
    assert accepted.backend is HOSTED
    assert accepted.fallback_reason == "hedge"
    # The late primary was cancelled when the hedge answered, 1.2 s in.
    assert driver.cancelled == [driver.sends[0]]
    assert kinds(accepted) == [("primary", "cancelled"), ("hosted", "ok")]
    assert accepted.attempts[0].elapsed == pytest.approx(1.2)
    (finished,) = driver.of(HedgeFinished)
    assert (finished.winner, finished.loser_cancelled, finished.at) == ("hosted", True, START + 1.2)
    (done,) = driver.of(CallFinished)
    assert (done.backend, done.latency, done.fallback_reason) == (
        "hosted",
        pytest.approx(1.2),
        "hedge",
    )
    assert [(e.from_backend, e.backend, e.reason) for e in driver.of(FallbackUsed)] == [
        ("primary", "hosted", "hedge")
    ]
    assert driver.race_timeouts == [1.0, None]  # the wait for the first byte, then the race
    stats = driver.policies.stats()
    assert (stats.hedges, stats.hedge_wins) == ({"hosted": 1}, {"hosted": 1})
    assert stats.fallbacks == {"hedge": 1}
    # A late primary is not a failed one: no breaker verdict, no AttemptFailed.
    assert driver.of(AttemptFailed) == []
    assert driver.policies.breaker(PRIMARY).state == "closed"
    # Nothing is held once the call is over.
    for backend in (PRIMARY, HOSTED):
        assert driver.policies.window(backend).in_use == 0


def test_a_primary_that_answers_before_after_is_not_hedged() -> None:
    driver = make([ok(elapsed=0.9)], [ok()], hedge=hedged(1.0))
    accepted = driver.run()
    assert accepted.backend is PRIMARY
    assert accepted.fallback_reason is None
    assert driver.sent_to() == ["primary"]
    assert driver.of(HedgeStarted) == driver.of(HedgeFinished) == []
    assert driver.clock.monotonic() == START + 0.9


def test_a_primary_that_fails_fast_is_not_hedged_and_goes_on_as_usual() -> None:
    # A connect error at 10 ms: retried after its backoff (0.5 s); the retry answers.
    driver = make([failure("connect"), ok(elapsed=0.3)], [ok()], hedge=hedged(1.0))
    accepted = driver.run()
    assert accepted.backend is PRIMARY
    assert driver.sent_to() == ["primary", "primary"]
    assert driver.sleeps == [0.5]
    assert driver.of(HedgeStarted) == []


def test_the_primary_wins_when_it_answers_first_after_the_hedge_started() -> None:
    driver = make([ok(elapsed=1.5)], [ok(elapsed=2.0)], hedge=hedged(1.0))
    accepted = driver.run()
    assert accepted.backend is PRIMARY
    assert accepted.fallback_reason is None
    assert driver.cancelled == [driver.sends[1]]  # the hedge, cancelled at 1.5 s
    assert kinds(accepted) == [("hosted", "cancelled"), ("primary", "ok")]
    (finished,) = driver.of(HedgeFinished)
    assert (finished.winner, finished.loser_cancelled) == ("primary", True)
    assert driver.policies.stats().hedge_wins == {"primary": 1}
    assert driver.of(FallbackUsed) == []


def test_a_hedge_that_fails_leaves_the_call_waiting_for_the_primary() -> None:
    driver = make([ok(elapsed=3.0)], [status(500, elapsed=0.1)], hedge=hedged(1.0))
    accepted = driver.run()
    assert accepted.backend is PRIMARY
    assert driver.clock.monotonic() == START + 3.0  # within the primary's own time
    assert driver.cancelled == []
    assert kinds(accepted) == [("hosted", "status"), ("primary", "ok")]
    (failed,) = driver.of(AttemptFailed)
    assert (failed.backend, failed.status, failed.attempt) == ("hosted", 500, 2)
    (finished,) = driver.of(HedgeFinished)
    assert (finished.winner, finished.loser_cancelled) == ("primary", False)
    assert driver.race_timeouts == [1.0, None, None]
    assert driver.policies.window(HOSTED).in_use == 0  # freed when the hedge failed


def test_a_primary_that_fails_while_the_hedge_runs_hands_the_call_to_the_hedge() -> None:
    driver = make([failure("read", elapsed=1.5)], [ok(elapsed=2.0)], hedge=hedged(1.0))
    accepted = driver.run()
    assert accepted.backend is HOSTED
    assert accepted.fallback_reason == "hedge"
    assert driver.clock.monotonic() == START + 3.0  # the hedge's own answer, not a new one
    assert driver.sent_to() == ["primary", "hosted"]
    assert kinds(accepted) == [("primary", "read"), ("hosted", "ok")]
    (finished,) = driver.of(HedgeFinished)
    assert (finished.winner, finished.loser_cancelled) == ("hosted", False)
    assert [e.reason for e in driver.of(FallbackUsed)] == ["hedge"]
    assert driver.policies.window(PRIMARY).in_use == 0


def test_both_failing_the_hedge_last_the_call_goes_on_from_the_hedges_backend() -> None:
    # The primary breaks at 1.5 s; the hedge's 500 (not retried) at 2.0 s ends the call:
    # it is the route's last backend.
    driver = make([failure("read", elapsed=1.5)], [status(500, elapsed=1.0)], hedge=hedged(1.0))
    with pytest.raises(AllBackendsFailed) as caught:
        driver.run()
    assert [a.describe() for a in caught.value.attempts] == ["primary#1 read", "hosted#2 500"]
    (finished,) = driver.of(HedgeFinished)
    assert (finished.winner, finished.loser_cancelled) == (None, False)
    assert driver.sent_to() == ["primary", "hosted"]


def test_both_failing_the_primary_last_it_retries_as_if_alone() -> None:
    # The hedge's 500 at 1.1 s, the primary's broken connection at 2.0 s: a retry at the
    # primary after its backoff (0.5 s), which answers. One hedge per call.
    driver = make(
        [failure("read", elapsed=2.0), ok(elapsed=3.0)],
        [status(500, elapsed=0.1)],
        hedge=hedged(1.0),
    )
    accepted = driver.run()
    assert accepted.backend is PRIMARY
    assert driver.sent_to() == ["primary", "hosted", "primary"]
    assert driver.sleeps == [0.5]
    assert len(driver.of(HedgeStarted)) == 1  # the retry, late too, is not hedged again
    (finished,) = driver.of(HedgeFinished)
    assert (finished.winner, finished.loser_cancelled) == (None, False)
    assert [(e.backend, e.attempt) for e in driver.of(AttemptFailed)] == [
        ("hosted", 2),
        ("primary", 1),
    ]


def test_a_hung_primary_with_a_hedge_that_answers_never_reaches_its_timeout() -> None:
    driver = make([hang], [ok(elapsed=0.2)], hedge=hedged(2.0))
    accepted = driver.run()
    assert accepted.backend is HOSTED
    assert driver.clock.monotonic() == START + 2.2
    assert driver.cancelled == [driver.sends[0]]


def test_the_hedge_takes_a_slot_at_its_own_backend_not_at_the_primary() -> None:
    driver = make(
        [ok(elapsed=5.0)], [ok(elapsed=0.2)], hedge=hedged(1.0), window=WindowPolicy(initial=1)
    )
    flow = driver.start()
    steps = flow.run()
    action = next(steps)
    assert isinstance(action, Race)
    action = steps.send(driver.race(action))  # after: the hedge is sent
    assert isinstance(action, Race)
    assert action.send is not None
    assert action.send.backend is HOSTED
    # One call, one slot at each backend: the primary's attempt keeps its own, the hedge
    # takes one at the hosted backend.
    assert driver.policies.window(PRIMARY).in_use == 1
    assert driver.policies.window(HOSTED).in_use == 1
    steps.close()


# -- when a hedge may not start -------------------------------------------------------------


def test_the_budget_caps_hedges_at_max_share_of_calls() -> None:
    # 5 % of calls: a bucket of 5 tokens, 0.05 more per call. Every primary is late.
    driver = make([ok(elapsed=5.0)], [ok(elapsed=0.2)], hedge=hedged(1.0, max_share=0.05))
    hedged_calls = []
    for number in range(1, 101):
        before = len(driver.of(HedgeStarted))
        driver.run()
        if len(driver.of(HedgeStarted)) > before:
            hedged_calls.append(number)
    # The first five spend the bucket; then one call in twenty.
    assert hedged_calls == [1, 2, 3, 4, 5, 21, 41, 61, 81]
    assert driver.policies.stats().hedges == {"hosted": 9}


def test_no_hedge_goes_to_an_external_fallback_when_the_call_keeps_data_in() -> None:
    driver = make([ok(elapsed=5.0)], [ok(elapsed=0.2)], hedge=hedged(1.0))
    accepted = driver.run(allow_fallback=False)
    assert accepted.backend is PRIMARY
    assert driver.sent_to() == ["primary"]
    assert driver.raced == []  # no backend to hedge to: a plain attempt


def test_no_hedge_reaches_an_external_backend_when_the_client_keeps_data_in() -> None:
    driver = make(
        [ok(elapsed=5.0)],
        [ok(elapsed=0.2)],
        hedge=hedged(1.0),
        fallback_policy=FallbackPolicy(allow_external=False),
    )
    assert driver.run().backend is PRIMARY
    assert driver.sent_to() == ["primary"]


def test_with_two_primaries_a_guarded_call_hedges_to_the_other_primary_only() -> None:
    second = Backend(name="primary-2", base_url="http://gpu2/v1")
    clock = FakeClock()
    config = ClientConfig.build(
        [PRIMARY, second],
        {"fallback": [HOSTED], "hedge": hedged(1.0), "model": "llama"},
    )
    state = ClientState(config, clock=clock, rng=UpperRandom(), wall=lambda: 0.0)
    script: dict[str, Any] = {
        "primary": [ok(elapsed=5.0)],
        "primary-2": [ok(elapsed=5.0)],
        "hosted": [ok(elapsed=0.1)],
    }
    driver = Driver(state, clock, **script)
    accepted = driver.run(allow_fallback=False)
    assert "hosted" not in driver.sent_to()
    (started,) = driver.of(HedgeStarted)
    assert {started.backend, started.from_backend} == {"primary", "primary-2"}
    assert accepted.backend.name in {"primary", "primary-2"}


def test_the_hedge_counts_toward_the_spend_guard() -> None:
    driver = make(
        [ok(elapsed=5.0)],
        [ok(elapsed=0.2)],
        hedge=hedged(1.0),
        fallback_policy=FallbackPolicy(max_external_per_minute=1),
    )
    assert driver.run().backend is HOSTED  # its hedge used the minute's one external call
    second = driver.run()
    assert second.backend is PRIMARY  # no hedge: the guard is spent, the call waits
    assert len(driver.of(HedgeStarted)) == 1
    assert driver.sent_to() == ["primary", "hosted", "primary"]
    assert driver.policies.spend.admit() > 0  # still spent: the hedge counted


def test_no_hedge_when_the_deadline_cannot_hold_it() -> None:
    # deadline 2 s: a hedge at 1.8 s would leave the hosted backend 0.2 s, under the least
    # an attempt gets (min_attempt, 0.5 s): a plain attempt, no race at all.
    driver = make([ok(elapsed=1.9)], [ok()], hedge=hedged(1.8))
    accepted = driver.run(deadline=2.0)
    assert accepted.backend is PRIMARY
    assert driver.raced == []
    assert driver.of(HedgeStarted) == []


def test_no_hedge_when_the_hedges_backend_usually_takes_longer_than_is_left() -> None:
    driver = make([ok(elapsed=5.0)], [ok(elapsed=4.0)], hedge=hedged(1.0))
    driver.policies.window(HOSTED).answered(4.0)  # it answers in about 4 s
    accepted = driver.run(deadline=4.5)  # at 1 s, 3.5 s are left: too little
    assert accepted.backend is PRIMARY
    assert driver.of(HedgeStarted) == []


def test_no_race_when_the_attempts_own_limit_ends_first() -> None:
    driver = make(
        [hang, ok()], [ok()], hedge=hedged(5.0), timeouts=Timeouts(connect=1, first_byte=2, read=2)
    )
    accepted = driver.run()
    # The usual path: the hung primary times out at 2 s and the call falls back.
    assert accepted.backend is HOSTED
    assert accepted.fallback_reason == "timeout"
    assert driver.raced == []


@pytest.mark.parametrize("obstacle", ["window", "breaker", "gate"])
def test_no_hedge_when_its_backend_would_make_it_wait(obstacle: str) -> None:
    driver = make(
        [ok(elapsed=3.0)],
        [ok(elapsed=0.2)],
        hedge=hedged(1.0),
        window=WindowPolicy(initial=1),
    )
    state = driver.policies
    if obstacle == "window":
        state.window(HOSTED).acquire(end=math.inf)  # another call holds its one slot
    elif obstacle == "breaker":
        state.breaker(HOSTED).force_open(60.0, "test")
    else:
        state.holds.hold("hosted", 60.0)
    tokens = state.hedging.budget.tokens  # type: ignore[union-attr]
    accepted = driver.run()
    assert accepted.backend is PRIMARY
    assert driver.of(HedgeStarted) == []
    assert state.hedging.budget.tokens == tokens  # type: ignore[union-attr]  # refunded
    assert state.window(HOSTED).in_use == (1 if obstacle == "window" else 0)


# -- streams ----------------------------------------------------------------------------------


def test_a_stream_races_only_until_its_first_chunk() -> None:
    driver = make([ok(elapsed=0.3)], [ok()], hedge=hedged(1.0))
    flow = driver.start(stream=True)
    accepted = driver.drive(flow)
    # Accepted at its first chunk, in time: the rest of the stream is no race.
    assert accepted.backend is PRIMARY
    assert driver.of(HedgeStarted) == []
    driver.clock.advance(10.0)  # however slow the rest is
    flow.stream_ended(ok=True)
    assert driver.of(HedgeStarted) == []


def test_a_stream_won_by_its_hedge_holds_the_hedges_slot_until_it_ends() -> None:
    driver = make([ok(elapsed=5.0)], [ok(elapsed=0.2)], hedge=hedged(1.0))
    flow = driver.start(stream=True)
    accepted = driver.drive(flow)
    assert accepted.backend is HOSTED
    assert accepted.fallback_reason == "hedge"
    state = driver.policies
    assert (state.window(PRIMARY).in_use, state.window(HOSTED).in_use) == (0, 1)
    flow.stream_ended(ok=True)
    assert state.window(HOSTED).in_use == 0
    (done,) = [e for e in flow.take_events() if isinstance(e, CallFinished)]
    assert (done.backend, done.fallback_reason) == ("hosted", "hedge")


# -- the caller leaves ----------------------------------------------------------------------


def test_a_call_closed_mid_race_frees_both_slots_and_the_probe() -> None:
    driver = make([ok(elapsed=5.0)], [ok(elapsed=3.0)], hedge=hedged(1.0))
    state = driver.policies
    breaker = state.breaker(PRIMARY)
    while breaker.state == "closed":  # failures open it (a drain would close it on trial)
        breaker.record_failure(breaker.acquire()[0])
    driver.clock.advance(breaker.remaining_open())  # the primary may be probed: by this call
    flow = driver.start()
    steps = flow.run()
    action = next(steps)
    assert isinstance(action, Race)
    action = steps.send(driver.race(action))  # the hedge starts
    assert isinstance(action, Race)
    assert (state.window(PRIMARY).in_use, state.window(HOSTED).in_use) == (1, 1)
    steps.close()  # the caller gave up mid-race (the driver cancels both sends)
    assert (state.window(PRIMARY).in_use, state.window(HOSTED).in_use) == (0, 0)
    assert breaker.acquire()[0].name == "PROBE"  # the probe was given back


# -- events and what else the flow says -------------------------------------------------------


def test_hedge_wins_are_no_degraded_period() -> None:
    driver = make([ok(elapsed=5.0)], [ok(elapsed=0.2)], hedge=hedged(1.0))
    for _ in range(3):
        driver.run()
    assert driver.of(PrimaryDegraded) == []


def test_a_hedge_that_cannot_connect_is_recorded_and_the_primary_awaited() -> None:
    driver = make([ok(elapsed=2.0)], [failure("connect", elapsed=0.01)], hedge=hedged(1.0))
    accepted = driver.run()
    assert accepted.backend is PRIMARY
    assert [(a.backend, a.kind) for a in accepted.attempts] == [
        ("hosted", "connect"),
        ("primary", "ok"),
    ]


def test_a_hedge_handed_the_call_retries_there_by_its_own_rules() -> None:
    # The primary breaks while the hedge runs; the hedge is refused with a Retry-After
    # of 0.5 s and then answers: the call went on at the hosted backend.
    driver = make(
        [failure("read", elapsed=1.2)],
        [status(429, retry_after=0.5, elapsed=0.5), ok(elapsed=0.2)],
        hedge=hedged(1.0),
    )
    accepted = driver.run()
    assert accepted.backend is HOSTED
    assert accepted.fallback_reason == "hedge"
    assert driver.sent_to() == ["primary", "hosted", "hosted"]
    assert driver.sleeps == [0.625]  # ra + max(0.1, 0.25 * ra)


def test_after_a_handoff_the_hedges_backend_retries_until_the_deadline() -> None:
    driver = make(
        [failure("connect", elapsed=1.5)], [failure("connect", elapsed=1.0)], hedge=hedged(1.0)
    )
    with pytest.raises(AllBackendsFailed) as caught:
        driver.run(deadline=4.0)
    # The hedge's connect error at 2 s is retried there (0.5 s backoff); the next one at
    # 3.5 s leaves no time for another wait.
    assert [a.describe() for a in caught.value.attempts] == [
        "primary#1 connect",
        "hosted#2 connect",
        "hosted#3 connect after 0.50s wait",
    ]


# -- "auto" ----------------------------------------------------------------------------------


def test_auto_waits_the_95th_percentile_of_recent_first_bytes_at_least_min_after() -> None:
    hedging = Hedging(HedgePolicy(after="auto", min_after=0.1))
    assert hedging.delay("primary") == 1.0  # nothing measured yet
    for seconds in (0.3, 0.5, 0.2, 0.4):
        hedging.answered("primary", seconds)
    assert hedging.delay("primary") == 1.0  # four are not enough
    hedging.answered("primary", 0.35)
    assert hedging.delay("primary") == 0.5  # five: the slowest of them, until twenty
    hedging.answered("primary", 0.45)
    assert hedging.delay("primary") == 0.5
    hedging = Hedging(HedgePolicy(after="auto", min_after=0.1))
    for index in range(100):
        hedging.answered("primary", 0.01 * (index + 1))  # 0.01 ... 1.00 s
    assert hedging.delay("primary") == pytest.approx(0.96)
    fast = Hedging(HedgePolicy(after="auto", min_after=0.25))
    for _ in range(40):
        fast.answered("primary", 0.02)
    assert fast.delay("primary") == 0.25  # floored


def test_auto_learns_from_the_primarys_answers_in_the_flow() -> None:
    driver = make([ok(elapsed=0.2)], [ok()], hedge=hedged("auto", min_after=0.05))
    for _ in range(20):
        driver.run()
    assert driver.policies.hedging.delay("primary") == pytest.approx(0.2)  # type: ignore[union-attr]


def test_first_byte_times_keep_the_recent_ones() -> None:
    times = FirstByteTimes()
    for _ in range(200):
        times.add(5.0)
    for _ in range(200):
        times.add(0.1)
    assert times.quantile == 0.1


def test_a_fixed_after_learns_nothing() -> None:
    hedging = Hedging(HedgePolicy(after=2.0))
    hedging.answered("primary", 9.0)
    assert hedging.delay("primary") == 2.0


# -- the policy and the budget ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"after": 0}, "after"),
        ({"after": -1.0}, "after"),
        ({"after": math.inf}, "after"),
        ({"after": "soon"}, "after"),
        ({"after": True}, "after"),
        ({"after": 1.0, "max_share": 0.0}, "max_share"),
        ({"after": 1.0, "max_share": 1.5}, "max_share"),
        ({"after": 1.0, "min_after": -0.1}, "min_after"),
    ],
)
def test_a_policy_out_of_range_is_refused(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=f"HedgePolicy.{field}"):
        HedgePolicy(**kwargs)


def test_the_budget_refills_by_max_share_per_call_up_to_its_capacity() -> None:
    budget = HedgeBudget(max_share=0.5)  # capacity 50
    for _ in range(50):
        assert budget.try_take()
    assert not budget.try_take()
    budget.deposit()
    assert not budget.try_take()  # half a token
    budget.deposit()
    assert budget.try_take()
    budget.refund()
    assert budget.tokens == 1.0
    for _ in range(200):
        budget.deposit()
    assert budget.tokens == 50.0


def test_the_sends_of_a_race_carry_the_call_s_headers_and_their_own_attempt() -> None:
    driver = make([ok(elapsed=5.0)], [ok(elapsed=0.2)], hedge=hedged(1.0))
    driver.run(request_id="req-7")
    first, hedge = driver.sends
    assert isinstance(first, Send)
    assert isinstance(hedge, Send)
    assert first.headers["X-Request-ID"] == hedge.headers["X-Request-ID"] == "req-7"
    assert (first.headers["X-Herdless-Attempt"], hedge.headers["X-Herdless-Attempt"]) == ("1", "2")
    assert hedge.model == "mini"  # the fallback's own model
    assert hedge.body == first.body
