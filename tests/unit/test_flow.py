"""The call flow, driven by hand: how the generator carries out retries, waits, the
breaker, the budget and fallbacks across attempts, calls and threads (what ``decide``
makes of one attempt, rule by rule, is its table in ``test_decide``).

No HTTP at all: ``flow_driver.Driver`` answers each ``Send`` from a script and
advances a ``FakeClock`` on each ``Sleep``; ``UpperRandom`` makes every jitter take
its upper bound, so delays are exact.
"""

from __future__ import annotations

import heapq
import logging
import math
import pickle
import threading
from typing import Any

import pytest
from tests.unit.flow_driver import HOSTED, PRIMARY, failure, hang, make, ok, status

from herdless._actions import Send, Sleep, SlotWait
from herdless._backend import Backend, Timeouts
from herdless._breaker import BreakerPolicy
from herdless._retry import RetryPolicy
from herdless._routing import FallbackPolicy
from herdless._types import WaitEstimate
from herdless._window import Window, WindowPolicy
from herdless.errors import (
    AllBackendsFailed,
    APIConnectionError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    DeadlineExceeded,
    FallbackNotAllowed,
    RateLimitError,
    ServiceUnavailableError,
    SpendLimitExceeded,
)
from herdless.events import (
    AttemptFailed,
    AttemptStarted,
    BackpressureReceived,
    BreakerStateChanged,
    CallFailed,
    CallFinished,
    FallbackUsed,
    PrimaryDegraded,
    RetryScheduled,
    WaitScheduled,
)

# -- the happy path and the wire -------------------------------------------------------


def test_first_attempt_answers() -> None:
    driver = make()
    accepted = driver.run(request_id="req-42")
    assert accepted.backend is PRIMARY
    assert accepted.fallback_reason is None
    assert [(a.backend, a.attempt, a.kind) for a in accepted.attempts] == [("primary", 1, "ok")]
    (send,) = driver.sends
    assert send.headers == {
        "X-Request-ID": "req-42",
        "X-Herdless-Attempt": "1",
        "X-Herdless-Deadline-Ms": "60000",  # the whole deadline: no fallback to keep time for
        "X-Herdless-Priority": "interactive",
    }
    assert send.model == "llama"
    assert "model" not in send.body
    assert send.timeouts == Timeouts(connect=3.0, first_byte=30.0, read=30.0)
    assert [type(e).__name__ for e in driver.events] == ["AttemptStarted", "CallFinished"]
    assert driver.sleeps == []


def test_call_model_overrides_the_primary_but_a_fallback_keeps_its_own() -> None:
    driver = make([status(500)], [ok()])
    driver.run(model="big")
    assert [s.model for s in driver.sends] == ["big", "mini"]


# -- retries -----------------------------------------------------------------------------


def test_503s_retry_with_full_jitter_and_one_request_id() -> None:
    driver = make([status(503), status(503), ok()])
    accepted = driver.run(request_id="req-7")
    assert driver.sleeps == [0.5, 1.0]
    assert [s.headers["X-Herdless-Attempt"] for s in driver.sends] == ["1", "2", "3"]
    assert {s.headers["X-Request-ID"] for s in driver.sends} == {"req-7"}
    assert [(a.kind, a.status, a.waited) for a in accepted.attempts] == [
        ("status", 503, 0.0),
        ("status", 503, 0.5),
        ("ok", 200, 1.0),
    ]
    retries = driver.of(RetryScheduled)
    assert [(r.attempt, r.delay, r.reason) for r in retries] == [
        (1, 0.5, "status_503"),
        (2, 1.0, "status_503"),
    ]


def test_every_event_is_delivered_before_the_wait_it_announces() -> None:
    driver = make([status(503), ok()])
    driver.run()
    sleep_at = next(i for i, item in enumerate(driver.log) if isinstance(item, Sleep))
    assert isinstance(driver.log[sleep_at - 1], RetryScheduled)


def test_an_error_decide_raises_ends_the_call_at_once_with_its_request_id() -> None:
    # Which statuses no backend can serve is decide's rule 3 (test_decide).
    driver = make([status(400)], [ok()])
    with pytest.raises(BadRequestError) as caught:
        driver.run(request_id="req-9")
    assert driver.sent_to() == ["primary"]  # no retry, no fallback
    assert caught.value.request_id == "req-9"
    assert driver.of(CallFailed)[0].error == "BadRequestError"


def test_a_429_honours_retry_after_as_a_floor() -> None:
    driver = make([status(429, retry_after=2.0), ok()])
    driver.run()
    assert driver.sleeps == [2.5]  # 2 s + 25 % jitter above it
    # A reservation for this call alone: the client-wide hold is for outages.
    assert driver.of(BackpressureReceived) == []
    assert driver.policies.holds.held("primary") == (0.0, False)


def test_a_reserved_retry_spends_no_budget() -> None:
    no_budget = RetryPolicy(budget_floor=0, budget_ratio=0)
    driver = make([status(429, retry_after=1.0)] * 3 + [ok()], retry=no_budget)
    accepted = driver.run()
    assert accepted.backend is PRIMARY
    assert driver.of(WaitScheduled) == []  # never waited for budget: the server invited it
    assert [r.delay for r in driver.of(RetryScheduled)] == [1.25] * 3


def test_a_429_is_not_a_breaker_failure_and_is_retried_until_the_deadline() -> None:
    driver = make([status(429)], breaker=BreakerPolicy(consecutive_failures=1))
    with pytest.raises(RateLimitError):
        driver.run(deadline=200)
    assert driver.policies.breaker(PRIMARY).state == "closed"
    # A live server that refuses is waited for: not capped by max_attempts (5)...
    assert len(driver.sends) > 5
    # ...but never past the deadline.
    assert driver.clock.monotonic() - 1000 <= 200


def test_a_bare_503_from_a_backend_serving_nothing_counts_toward_the_failure_rate() -> None:
    driver = make(
        [status(503)],
        breaker=BreakerPolicy(consecutive_failures=1, min_calls=4, open_for=2.0),
        deadline=30,
    )
    with pytest.raises(ServiceUnavailableError):
        driver.run()
    # Not one refusal opened it (consecutive_failures=1), nor those of its first 2 s
    # (a new backend gets the benefit of the doubt): the rate did, 4 refusals after.
    (opened, *_) = driver.of(BreakerStateChanged)
    assert (opened.new, opened.reason) == ("open", "failure_rate")
    assert opened.at - 1000 > 2.0


def test_bare_503s_from_a_backend_that_serves_never_open_its_breaker() -> None:
    policy = BreakerPolicy(consecutive_failures=1, min_calls=2, failure_rate=0.1)
    driver = make([status(503), status(503), ok()], breaker=policy)
    for _ in range(20):  # refused twice, served, again and again: busy, not dead
        driver.script["primary"] = [status(503), status(503), ok()]
        driver.run()
    assert driver.of(BreakerStateChanged) == []


def test_retries_exhausted_raise_the_last_error_with_every_attempt() -> None:
    driver = make([status(502)], retry=RetryPolicy(max_attempts=3))
    with pytest.raises(ServiceUnavailableError) as caught:
        driver.run()
    assert [a.attempt for a in caught.value.attempts] == [1, 2, 3]
    assert "sk-primary-secret" not in str(caught.value)


def test_the_deadline_bounds_waits_and_attempt_timeouts() -> None:
    driver = make([status(503)], retry=RetryPolicy(max_attempts=100, budget_floor=100))
    with pytest.raises(ServiceUnavailableError):
        driver.run(deadline=5)
    assert sum(driver.sleeps) + 0.01 * len(driver.sends) <= 5
    assert all(s.timeouts.first_byte <= 5 for s in driver.sends)


# -- fallback ------------------------------------------------------------------------------


def test_a_hung_primary_is_not_waited_on_twice() -> None:
    driver = make([hang], [ok()])
    accepted = driver.run(deadline=10)
    assert driver.sent_to() == ["primary", "hosted"]
    # The primary may use the deadline less the 40 % kept for the fallback.
    assert driver.sends[0].timeouts.first_byte == pytest.approx(6.0)
    assert accepted.fallback_reason == "timeout"
    assert [(a.backend, a.kind) for a in accepted.attempts] == [
        ("primary", "first_byte_timeout"),
        ("hosted", "ok"),
    ]
    (used,) = driver.of(FallbackUsed)
    assert (used.from_backend, used.backend, used.reason) == ("primary", "hosted", "timeout")


def test_an_open_breaker_skips_the_primary_without_touching_the_network() -> None:
    driver = make(
        [status(502)],
        [ok()],
        breaker=BreakerPolicy(consecutive_failures=2),
        retry=RetryPolicy(max_attempts=2),
    )
    first = driver.run()
    assert first.fallback_reason == "retries_exhausted"
    assert driver.policies.breaker(PRIMARY).state == "open"
    (opened,) = driver.of(BreakerStateChanged)
    assert (opened.old, opened.new, opened.reason) == ("closed", "open", "consecutive_failures")
    driver.sends.clear()
    second = driver.run()
    assert driver.sent_to() == ["hosted"]
    assert second.fallback_reason == "breaker_open"
    assert second.attempts[0].kind == "skipped_breaker_open"


def test_after_the_open_period_one_probe_closes_the_breaker() -> None:
    driver = make(
        [status(502), status(502), ok()],
        [ok()],
        breaker=BreakerPolicy(consecutive_failures=2, open_for=5.0, open_jitter=0.0),
        retry=RetryPolicy(max_attempts=2),
    )
    driver.run()
    driver.clock.advance(5.0)
    accepted = driver.run()
    assert accepted.backend is PRIMARY
    states = [(e.old, e.new) for e in driver.of(BreakerStateChanged)]
    assert states == [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]


def test_only_one_call_probes_a_half_open_primary() -> None:
    driver = make(
        [status(502), status(502), ok()],
        [ok()],
        breaker=BreakerPolicy(consecutive_failures=2, open_jitter=0.0),
        retry=RetryPolicy(max_attempts=2),
    )
    driver.run()
    driver.clock.advance(60)
    probe = driver.start(request_id="probe").run()
    action = next(probe)
    assert isinstance(action, Send)
    assert action.backend is PRIMARY  # the probe is in flight...
    other = driver.run(request_id="other")  # ...so another call goes to the fallback
    assert other.fallback_reason == "breaker_open"
    with pytest.raises(StopIteration):
        probe.send(ok())


def test_a_closed_flow_frees_its_probe_and_window_slot() -> None:
    driver = make([status(502)], [ok()], breaker=BreakerPolicy(consecutive_failures=1))
    driver.run()
    driver.clock.advance(60)
    steps = driver.start().run()
    next(steps)
    assert driver.policies.window(PRIMARY).in_use == 1
    steps.close()  # the driver was cancelled mid-attempt
    assert driver.policies.window(PRIMARY).in_use == 0
    assert driver.policies.breaker(PRIMARY).acquire()[0].value == "probe"


def test_a_drain_switches_to_the_fallback_now_for_every_call() -> None:
    driver = make([status(503, retry_after=30.0, drain=True, error_code="draining")], [ok()])
    first = driver.run()
    assert first.fallback_reason == "draining"
    assert driver.policies.breaker(PRIMARY).state == "open"
    left, draining = driver.policies.holds.held("primary")
    assert draining
    assert left == pytest.approx(30.0, abs=0.5)
    assert driver.sleeps == []
    second = driver.run()
    assert driver.sent_to() == ["primary", "hosted", "hosted"]
    assert second.fallback_reason == "draining"


def test_another_calls_reservation_does_not_hold_this_call_back() -> None:
    # (A window that room for both: what holds calls back there is tested in test_window.)
    driver = make([status(429, retry_after=2.0), ok()], window=WindowPolicy(minimum=4))
    steps = driver.start().run()
    next(steps)
    assert isinstance(steps.send(status(429, retry_after=2.0)), Sleep)  # first waits 2.5
    driver.script["primary"] = [ok()]
    accepted = driver.run()  # a second call starts during that reservation...
    assert accepted.backend is PRIMARY
    assert driver.sleeps == []  # ...and goes at once: the time was given to the first


def test_an_outage_the_backend_announced_holds_every_call() -> None:
    down = status(503, retry_after=2.0, error_code="upstream_unavailable")
    driver = make([down, ok()])
    first = driver.start().run()
    next(first)
    assert isinstance(first.send(down), Sleep)  # the first call waits out the outage...
    assert driver.policies.holds.held("primary")[0] == pytest.approx(2.0)
    second = driver.start()
    assert isinstance(next(second.run()), Sleep)  # ...and so does a second one, unsent
    waits = [e for e in second.take_events() if isinstance(e, WaitScheduled)]
    assert [w.reason for w in waits] == ["backpressure"]


def test_an_outage_sends_the_call_to_the_fallback_at_once() -> None:
    down = status(503, retry_after=5.0, error_code="upstream_unavailable")
    driver = make([down], [ok()])
    first = driver.run()
    assert first.fallback_reason == "unavailable"
    assert driver.sleeps == []  # no Retry-After wait on a dead path
    second = driver.run()
    assert driver.sent_to() == ["primary", "hosted", "hosted"]  # the hold skips it at once
    assert second.fallback_reason == "unavailable"
    assert driver.policies.breaker(PRIMARY).state == "closed"  # it said so: no failure


def test_all_backends_failing_names_each_error() -> None:
    driver = make([status(502)], [failure("connect")], retry=RetryPolicy(max_attempts=2))
    with pytest.raises(AllBackendsFailed) as caught:
        driver.run()
    assert set(caught.value.errors) == {"primary", "hosted"}
    assert isinstance(caught.value.errors["hosted"], APIConnectionError)
    assert [a.backend for a in caught.value.attempts] == ["primary"] * 2 + ["hosted"] * 2


def test_data_guard_never_sends_to_an_external_fallback() -> None:
    driver = make([status(502)], [ok()], retry=RetryPolicy(max_attempts=1))
    with pytest.raises(FallbackNotAllowed, match="allow_fallback=False"):
        driver.run(allow_fallback=False)
    assert driver.sent_to() == ["primary"]


def test_client_wide_data_guard() -> None:
    driver = make([hang], [ok()], fallback_policy=FallbackPolicy(allow_external=False))
    with pytest.raises(FallbackNotAllowed, match="allow_external=False"):
        driver.run(deadline=3)
    assert set(driver.sent_to()) == {"primary"}


def test_spend_guard_refuses_the_external_fallback() -> None:
    driver = make([status(500)], [ok()], fallback_policy=FallbackPolicy(max_external_per_minute=1))
    assert driver.run().backend is HOSTED
    with pytest.raises(SpendLimitExceeded, match="spend limit"):
        driver.run()
    assert driver.sent_to() == ["primary", "hosted", "primary"]


def test_several_primaries_before_the_fallback() -> None:
    other = Backend(name="gpu2", base_url="http://gpu2/v1")
    driver = make([status(500)], [ok()], primary=[PRIMARY, other])
    driver.script["gpu2"] = [ok()]
    accepted = driver.run()
    assert driver.sent_to() == ["primary", "gpu2"]
    assert accepted.backend is other


# -- budget --------------------------------------------------------------------------------


def test_spent_budget_sends_a_broken_call_to_the_fallback() -> None:
    driver = make([status(502)], [ok()], retry=RetryPolicy(budget_floor=0, budget_ratio=0))
    accepted = driver.run()
    assert accepted.fallback_reason == "budget_exhausted"
    assert driver.sent_to() == ["primary", "hosted"]


def test_spent_budget_waits_then_serves_without_a_fallback() -> None:
    driver = make([status(502), ok()], retry=RetryPolicy(budget_floor=1, budget_window=10))
    driver.policies.budget(PRIMARY).try_acquire()  # another call holds the only unit...
    driver.policies.budget(PRIMARY).settle(failed=True)
    accepted = driver.run(deadline=30)  # ...so this one waits for it instead of failing
    assert accepted.backend is PRIMARY
    assert {w.reason for w in driver.of(WaitScheduled)} == {"budget"}
    assert sum(driver.sleeps) >= 10 - 0.01  # until the spent retry left the window


def test_spent_budget_fails_only_at_the_deadline() -> None:
    driver = make([status(502)], retry=RetryPolicy(budget_floor=0, budget_ratio=0))
    with pytest.raises(ServiceUnavailableError):
        driver.run(deadline=10)
    assert len(driver.sends) == 1
    assert 8 <= sum(driver.sleeps) <= 10


def test_broken_primary_sees_about_one_attempt_per_call() -> None:
    driver = make([status(502)], [ok()])
    for _ in range(200):
        driver.run()
        driver.clock.advance(0.05)
    primary = driver.sent_to().count("primary")
    assert primary / 200 <= 1.1


def test_default_budget_keeps_attempts_near_one_at_five_calls_a_second() -> None:
    # 50 calls per 10 s window: 1 + 0.05 + 2 / 50 attempts per call at most.
    driver = make([status(502)], [ok()])
    for _ in range(200):
        driver.run()
        driver.clock.advance(0.2)
    assert driver.sent_to().count("primary") / 200 <= 1.1


def _crowd(driver: Any, calls: int) -> int:
    """Run ``calls`` flows at once as a crowd would, each resuming at its own time on the
    fake clock; a call waiting for a window slot resumes when a slot is handed to it (or
    at its timeout). Returns how many were served."""
    steps = [driver.start(request_id=f"c{i}").run() for i in range(calls)]
    now = driver.clock.monotonic
    due: list[tuple[float, int, int, Any]] = []  # (when, tiebreak, call, outcome to send)
    order = iter(range(10**9))
    generation = [0] * calls  # a resumption of an older wait is stale
    served = 0

    def resume(index: int, at: float, outcome: Any = None) -> None:
        generation[index] += 1
        heapq.heappush(due, (at, next(order), index, (generation[index], outcome)))

    def act(index: int, action: Any) -> None:
        if isinstance(action, Sleep):
            resume(index, now() + action.seconds)
        elif isinstance(action, SlotWait):
            resume(index, now() + action.timeout)  # the timeout, unless woken sooner
            gen = generation[index]
            action.listen(lambda: generation[index] == gen and resume(index, now()))
        else:
            resume(index, now(), driver.perform(action))

    for index, step in enumerate(steps):
        act(index, next(step))
    while due:
        at, _, index, (gen, outcome) = heapq.heappop(due)
        if gen != generation[index]:
            continue
        driver.clock.advance(max(0.0, at - now()))
        try:
            act(index, steps[index].send(outcome))
        except StopIteration:
            served += 1
    return served


def test_a_busy_blip_that_refuses_a_crowd_serves_every_call() -> None:
    # 40 calls at once against a primary that refuses (503, no time given) for its first
    # second, then serves: the window lets only its size through, the rest wait in the
    # client; the budget lets a few refused ones retry at once and the others wait for it.
    driver = make()
    blip_ends = driver.clock.monotonic() + 1.0
    refused: set[str] = set()

    def blip(send: Send) -> Any:
        if driver.clock.monotonic() >= blip_ends:
            return ok(0.0)
        refused.add(send.headers["X-Request-ID"])
        return status(503, elapsed=0.0)

    driver.script["primary"] = [blip]
    assert _crowd(driver, 40) == 40
    # Only the first window's calls (16) ever met the blip: the others waited in the
    # client, sending nothing, until served calls made room.
    assert refused == {f"c{i}" for i in range(16)}
    assert driver.sent_to().count("primary") <= 40 + 2 * 16


# -- streams, events, stats -------------------------------------------------------------


def test_a_stream_finishes_when_the_driver_says_so() -> None:
    driver = make()
    flow = driver.start(stream=True)
    driver.drive(flow)
    assert driver.sends[0].stream
    assert driver.of(CallFinished) == []
    flow.stream_ended(ok=True)
    assert len(flow.take_events()) == 1


def test_a_stream_cut_counts_against_the_breaker() -> None:
    driver = make(breaker=BreakerPolicy(consecutive_failures=1))
    flow = driver.start(stream=True)
    driver.drive(flow)
    flow.stream_ended(ok=False, message="connection reset")
    events = flow.take_events()
    assert [type(e).__name__ for e in events] == [
        "BreakerStateChanged",
        "AttemptFailed",
        "CallFailed",
    ]
    assert events[1].kind == "stream_cut"  # type: ignore[attr-defined]  # an AttemptFailed
    flow.stream_ended(ok=True)  # reported twice: ignored
    assert flow.take_events() == []


def test_primary_degraded_repeats_while_the_fallback_serves() -> None:
    driver = make([status(500)], [ok()], fallback_policy=FallbackPolicy(degraded_interval=60))
    for _ in range(3):
        driver.run()
        driver.clock.advance(35)
    degraded = driver.of(PrimaryDegraded)
    assert [(d.backend, d.fallbacks) for d in degraded] == [("primary", 1), ("primary", 3)]
    assert degraded[1].since == degraded[0].since
    driver.script["primary"] = [ok()]
    driver.run()
    driver.script["primary"] = [status(500)]
    driver.run()
    assert driver.of(PrimaryDegraded)[-1].fallbacks == 1  # a new period


def test_stats_come_from_the_events() -> None:
    driver = make([status(503), ok(), status(500)], [ok()])
    driver.run()
    driver.run()
    stats = driver.policies.stats()
    assert stats.calls == stats.succeeded == 2
    assert stats.by_backend == {
        "primary": {"attempts": 3, "status_503": 1, "ok": 1, "status_500": 1},
        "hosted": {"attempts": 1, "ok": 1},
    }
    assert stats.fallbacks == {"failed": 1}
    assert (stats.retries, stats.waits, stats.waited) == (1, 1, 0.5)
    assert stats.breakers == {"primary": "closed", "hosted": "closed"}
    assert set(stats.latency) == {"p50", "p90", "p99", "max"}
    assert stats.as_dict()["by_backend"]["hosted"] == {"attempts": 1, "ok": 1}


def test_events_carry_the_call_id_and_no_secret() -> None:
    driver = make([status(401)])
    with pytest.raises(AuthenticationError):
        driver.run(request_id="req-x")
    assert {e.call_id for e in driver.events} == {"req-x"}
    assert all("sk-primary-secret" not in repr(e) for e in driver.events)
    assert [type(e) for e in driver.events] == [AttemptStarted, AttemptFailed, CallFailed]


def test_a_timeout_error_is_typed() -> None:
    driver = make([hang], retry=RetryPolicy(max_attempts=1))
    with pytest.raises(APITimeoutError):
        driver.run(deadline=5)


def test_no_time_for_any_attempt_is_a_deadline_error() -> None:
    driver = make([status(429, retry_after=2.0), ok()])
    steps = driver.start().run()
    next(steps)
    steps.send(status(429, retry_after=2.0))
    with pytest.raises(DeadlineExceeded):
        driver.run(deadline=1)  # blocked 2 s by the other call, 1 s to live


def test_invalid_deadline() -> None:
    with pytest.raises(ValueError, match="deadline"):
        make().start(deadline=0)


def test_threads_starting_calls_on_a_half_open_primary_send_one_probe() -> None:
    driver = make([status(502)], [ok()], breaker=BreakerPolicy(consecutive_failures=1))
    driver.run()
    driver.clock.advance(60)
    first_sends: list[str] = []
    in_flight = []  # kept alive: a dropped flow frees its probe, as it should
    start = threading.Barrier(16)

    def call(n: int) -> None:
        steps = driver.start(request_id=f"t{n}").run()
        in_flight.append(steps)
        start.wait()
        action = next(steps)  # the first Send of each call, all in flight at once
        assert isinstance(action, Send)
        first_sends.append(action.backend.name)

    threads = [threading.Thread(target=call, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(first_sends) == ["hosted"] * 15 + ["primary"]


def test_spend_guard_waits_for_a_slot_when_the_deadline_allows() -> None:
    driver = make([status(500)], [ok()], fallback_policy=FallbackPolicy(max_external_per_minute=1))
    driver.run()
    accepted = driver.run(deadline=100)
    assert accepted.backend is HOSTED
    assert [w.reason for w in driver.of(WaitScheduled)] == ["spend"]
    assert driver.sleeps == [pytest.approx(60.0 - 0.21)]  # the slot used after 0.21 s


def test_the_last_backend_waits_for_its_breaker_probe_when_the_deadline_allows() -> None:
    driver = make(
        [status(502)],
        breaker=BreakerPolicy(consecutive_failures=1, open_for=5.0, open_jitter=0.0),
        retry=RetryPolicy(max_attempts=1),
    )
    with pytest.raises(ServiceUnavailableError):
        driver.run()
    driver.script["primary"] = [ok()]
    accepted = driver.run(deadline=30)
    assert accepted.backend is PRIMARY
    (wait,) = driver.of(WaitScheduled)
    assert wait.reason == "breaker_open"
    assert driver.sleeps == [6.0]  # the open period, with jitter above it (at most 1 s)


def test_the_last_backend_fails_fast_when_its_probe_comes_too_late() -> None:
    driver = make(
        [status(502)],
        breaker=BreakerPolicy(consecutive_failures=1, open_for=50.0),
        retry=RetryPolicy(max_attempts=1),
    )
    with pytest.raises(ServiceUnavailableError):
        driver.run()
    with pytest.raises(APIConnectionError, match="circuit breaker is open") as caught:
        driver.run(deadline=10)
    assert caught.value.kind == "breaker_open"
    assert driver.sleeps == []
    assert len(driver.sends) == 1


def test_a_drained_primary_without_fallback_is_waited_for() -> None:
    drained = status(503, retry_after=2.0, drain=True)
    driver = make([drained, ok()], breaker=BreakerPolicy(open_jitter=0.0))
    accepted = driver.run(deadline=30)
    assert accepted.backend is PRIMARY
    assert [e.draining for e in driver.of(BackpressureReceived)] == [True]
    assert driver.sleeps == [2.5]


def test_a_driver_must_answer_a_send() -> None:
    steps = make().start().run()
    next(steps)
    with pytest.raises(TypeError, match="outcome"):
        steps.send(None)


def test_decisions_are_logged_structured_and_without_secrets(
    caplog: pytest.LogCaptureFixture,
) -> None:
    driver = make([status(401, error_code="sk-primary-secret")])
    with caplog.at_level(logging.DEBUG, logger="herdless"), pytest.raises(AuthenticationError):
        driver.run(request_id="req-log")
    records = [r for r in caplog.records if r.name == "herdless"]
    assert [r.getMessage().split()[0] for r in records] == [
        "AttemptStarted",
        "AttemptFailed",
        "CallFailed",
    ]
    assert [r.levelno for r in records] == [logging.DEBUG, logging.INFO, logging.WARNING]
    assert records[1].herdless["status"] == 401  # type: ignore[attr-defined]  # set by extra=
    assert all(r.herdless["call_id"] == "req-log" for r in records)  # type: ignore[attr-defined]
    assert "sk-primary-secret" not in caplog.text


def test_without_a_hook_a_calls_events_are_counted_the_same() -> None:
    # With no hook and DEBUG logging off, the two events of every call are counted
    # without being built; the numbers must be those a hooked client reports.
    hooked, quiet = make([status(503), ok()]), make([status(503), ok()])
    quiet.policies.keep_events = False
    hooked.run(request_id="r")
    quiet.run(request_id="r")
    assert quiet.events == []  # nothing went to an outbox
    assert quiet.policies.stats() == hooked.policies.stats()
    assert quiet.policies.stats().by_backend["primary"] == {
        "attempts": 2,
        "status_503": 1,
        "ok": 1,
    }


def test_without_a_hook_debug_logging_still_sees_every_event(
    caplog: pytest.LogCaptureFixture,
) -> None:
    driver = make([ok()])
    driver.policies.keep_events = False
    with caplog.at_level(logging.DEBUG, logger="herdless"):
        driver.run(request_id="req-quiet")
    records = [r for r in caplog.records if r.name == "herdless"]
    assert [r.getMessage().split()[0] for r in records] == ["AttemptStarted", "CallFinished"]
    assert driver.events == []


def test_a_call_whose_deadline_passes_while_it_waits_for_a_slot_leaves_typed() -> None:
    driver = make(window=WindowPolicy(initial=1, maximum=1))
    holder = driver.start(request_id="holder").run()
    assert isinstance(next(holder), Send)  # the only slot is taken, its answer pending
    with pytest.raises(DeadlineExceeded, match="busy"):
        driver.run(request_id="late", deadline=3.0)
    # It waited for a slot, sent nothing, and left before its deadline.
    assert driver.sent_to() == []
    assert driver.clock.monotonic() - 1000 <= 3.0
    assert driver.policies.window(PRIMARY).waiting == 0


def _paced_by_two_answers(driver: Any) -> Any:
    """Two calls one after the other through the window's one slot, the second waiting
    for the first, 1 s each: the window knows the pace (1 s a call); then a third holds
    the only slot (returned: it holds it while it lives), and the clump of its
    predecessor is over."""
    window, clock = driver.policies.window(PRIMARY), driver.clock
    tickets = [window.acquire(end=math.inf) for _ in range(2)]
    for ticket in tickets:
        window.sent(ticket)
        clock.advance(1.0)
        window.answered(1.0, ticket)
        window.release(ticket)
    holder = driver.start(request_id="holder").run()
    assert isinstance(next(holder), Send)
    driver.clock.advance(0.05)
    return holder


def test_a_call_the_estimate_sends_to_the_fallback_carries_the_numbers() -> None:
    driver = make([ok(1.0)], [ok(0.1)], window=WindowPolicy(initial=1, maximum=1))
    holder = _paced_by_two_answers(driver)
    # About 0.95 s for the slot, 1 s for the answer: at best (1 - 0.35) * 1.95 = 1.27 s,
    # past the 1.2 s the primary may use of a 2 s deadline (0.8 s kept for the fallback).
    result = driver.run(request_id="late", deadline=2.0)
    assert (result.backend.name, result.fallback_reason) == ("hosted", "busy")
    (moved,) = driver.of(FallbackUsed)
    assert moved.estimate == WaitEstimate(
        wait=pytest.approx(0.95),
        answer=1.0,
        margin=0.35,
        samples=1,
        left=pytest.approx(2.0),
        reserve=pytest.approx(0.8),
    )
    assert moved.estimate.best == pytest.approx(0.65 * 1.95)
    holder.close()


def test_a_call_the_estimate_does_not_send_says_what_it_compared() -> None:
    driver = make([ok(1.0)], window=WindowPolicy(initial=1, maximum=1))
    holder = _paced_by_two_answers(driver)
    # No fallback: the margin doubles (70 %); best case 0.3 * 1.95 = 0.59 s > 0.5 s.
    with pytest.raises(DeadlineExceeded) as caught:
        driver.run(request_id="late", deadline=0.5)
    error = caught.value
    assert error.estimate is not None
    assert (error.estimate.margin, error.estimate.reserve) == (0.7, 0.0)
    message = str(error)
    assert "s for a slot and 1.0 s for its answer (best case 0.6 s, with a 70% margin" in message
    assert "but 0.5 s of its deadline were left" in message
    assert driver.sends == []  # "late" was not sent (nor was "holder" answered)
    assert pickle.loads(pickle.dumps(error)).estimate == error.estimate
    holder.close()


def test_with_no_fallback_a_call_that_may_still_make_it_keeps_its_place() -> None:
    driver = make([ok(1.0)], window=WindowPolicy(initial=1, maximum=1))
    holder = _paced_by_two_answers(driver)
    # The same 2 s deadline that sends a call to a fallback: alone, it waits its turn.
    late = driver.start(request_id="late", deadline=2.0).run()
    assert isinstance(next(late), SlotWait)
    assert driver.policies.window(PRIMARY).waiting == 1
    late.close()
    holder.close()


def test_a_slot_granted_by_another_thread_during_the_review_is_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The window's state is read once per check: a slot granted between the review of
    the line and the check (another thread's answer freed it) is used, not mistaken for a
    call told to leave (which raised DeadlineExceeded after a few ms of a 60 s deadline)."""
    driver = make([ok(), ok()], window=WindowPolicy(initial=1, maximum=1), deadline=60)
    first = driver.start().run()
    assert isinstance(next(first), Send)  # holds the only slot
    second = driver.start().run()
    assert isinstance(next(second), SlotWait)
    window = driver.policies.window(PRIMARY)
    (held,) = list(window._granted)
    review = Window.review

    def review_while_the_first_call_ends(self: Window) -> None:
        if self is window and held.state == "granted":
            self.release(held)  # another thread: the first call's answer frees its slot
        review(self)

    monkeypatch.setattr(Window, "review", review_while_the_first_call_ends)
    assert isinstance(second.send(None), Send)
    first.close()
    second.close()
