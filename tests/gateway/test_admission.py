"""Admission core: pure, driven by a FakeClock, no HTTP and no event loop."""

from __future__ import annotations

import math

import pytest

from herdless.gateway.core.admission import Admission
from herdless.gateway.core.decisions import Admit, Enqueued, Refuse, Ticket
from herdless.gateway.core.engine import Reading
from herdless.gateway.core.limits import AdmissionConfig, TokenBucket
from herdless.gateway.core.service import DrainRate
from herdless.testing import FakeClock


def make(clock: FakeClock, **limits: object) -> Admission:
    return Admission(AdmissionConfig(**limits), clock=clock)  # type: ignore[arg-type]


def admit(adm: Admission, key: str = "a", price: int = 10) -> Ticket:
    decision = adm.offer(key, price)
    assert isinstance(decision, Admit), decision
    return decision.ticket


def enqueue(adm: Admission, key: str = "a", price: int = 10) -> Ticket:
    decision = adm.offer(key, price)
    assert isinstance(decision, Enqueued), decision
    return decision.ticket


def refuse(adm: Admission, key: str = "a", price: int = 10) -> Refuse:
    decision = adm.offer(key, price)
    assert isinstance(decision, Refuse), decision
    return decision


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


# -- config ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_concurrency", 0),
        ("max_queue", -1),
        ("queue_timeout", 0),
        ("rate", -1.0),
        ("burst", 0),
        ("tokens_per_minute", 0),
        ("max_inflight_tokens", 0),
        ("key_queue_share", 0),
        ("key_queue_share", 1.5),
        ("ewma_alpha", 0),
        ("max_retry_after", 0),
        ("queue_timeout", float("nan")),  # NaN passes no comparison: refused, not taken
        ("fair_window", 0.5),
    ],
)
def test_config_rejects_bad_values_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        AdmissionConfig(**{field: value})  # type: ignore[arg-type]


def test_config_derived_limits() -> None:
    assert AdmissionConfig(rate=2.5).effective_burst == 3
    assert AdmissionConfig(rate=2.5, burst=7).effective_burst == 7
    assert AdmissionConfig(max_queue=5, key_queue_share=0.5).key_queue_limit == 3


# -- bounded queue ----------------------------------------------------------------------


def test_runs_up_to_concurrency_then_queues_then_refuses(clock: FakeClock) -> None:
    adm = make(clock, max_concurrency=2, max_queue=2)
    admit(adm)
    admit(adm)
    enqueue(adm)
    enqueue(adm)
    refused = refuse(adm)
    assert (refused.status, refused.code) == (429, "queue_full")
    assert refused.retry_after > 0
    assert refused.policy == '"queue";q=2'
    assert (adm.inflight, adm.queue_depth) == (2, 2)


def test_zero_queue_refuses_instead_of_waiting(clock: FakeClock) -> None:
    adm = make(clock, max_concurrency=1, max_queue=0)
    admit(adm)
    assert refuse(adm).code == "queue_full"


def test_release_starts_the_next_waiter_fifo(clock: FakeClock) -> None:
    adm = make(clock, max_concurrency=1, max_queue=5)
    first = admit(adm)
    second, third = enqueue(adm), enqueue(adm)
    clock.advance(2.0)
    adm.release(first)
    assert adm.dispatch() == [second]
    assert second.state == "running"
    assert second.queue_wait == 2.0
    assert third.state == "queued"
    assert adm.dispatch() == []


def test_newcomers_queue_behind_waiters_even_when_a_slot_is_free(clock: FakeClock) -> None:
    adm = make(clock, max_concurrency=1, max_queue=5)
    running = admit(adm)
    waiting = enqueue(adm)
    adm.release(running)  # slot free, but the waiter has not been dispatched yet
    late = enqueue(adm)
    assert adm.dispatch() == [waiting]
    assert late.state == "queued"


def test_release_is_idempotent_and_frees_queued_tickets(clock: FakeClock) -> None:
    adm = make(clock, max_concurrency=1, max_queue=5)
    running = admit(adm)
    waiting = enqueue(adm)
    adm.release(waiting)  # client went away while queued
    adm.release(waiting)
    assert adm.queue_depth == 0
    adm.release(running)
    adm.release(running)
    assert (adm.inflight, adm.inflight_tokens) == (0, 0)


def test_expire_gives_queue_timeout_with_a_reservation(clock: FakeClock) -> None:
    adm = make(clock, max_concurrency=1, max_queue=5, initial_service_time=2.0)
    admit(adm)
    waiting = enqueue(adm)
    clock.advance(30)
    refused = adm.expire(waiting)
    assert (refused.status, refused.code) == (429, "queue_timeout")
    assert refused.retry_after == pytest.approx(2.0)
    assert adm.queue_depth == 0


# -- Retry-After as a reservation -----------------------------------------------------


def test_queue_refusals_are_staggered_by_the_drain_gap(clock: FakeClock) -> None:
    adm = make(clock, max_concurrency=4, max_queue=0, initial_service_time=2.0)
    for _ in range(4):
        admit(adm)
    # 4 running, each 2 s: a slot frees every 0.5 s.
    waits = [refuse(adm).retry_after for _ in range(4)]
    assert waits == pytest.approx([0.5, 1.0, 1.5, 2.0])


def test_reservations_fall_back_to_now_once_the_horizon_passed(clock: FakeClock) -> None:
    adm = make(clock, max_concurrency=1, max_queue=0, initial_service_time=1.0)
    admit(adm)
    assert refuse(adm).retry_after == pytest.approx(1.0)
    assert refuse(adm).retry_after == pytest.approx(2.0)
    clock.advance(10)
    assert refuse(adm).retry_after == pytest.approx(1.0)


def test_drain_gap_follows_the_measured_service_time(clock: FakeClock) -> None:
    adm = make(clock, max_concurrency=1, max_queue=0, initial_service_time=1.0, ewma_alpha=0.5)
    ticket = admit(adm)
    clock.advance(3.0)
    adm.release(ticket)
    assert adm.mean_service_time == pytest.approx(2.0)  # 0.5 * 1 + 0.5 * 3
    admit(adm)
    assert refuse(adm).retry_after == pytest.approx(2.0)


def test_before_a_run_ends_here_the_engines_mean_run_time_spaces_the_refusals(
    clock: FakeClock,
) -> None:
    # A gateway started in front of an engine that has served: 40 runs of 0.2 s on
    # average, not the 1 s guess; 4 running, so a place frees every 0.05 s.
    adm = make(clock, max_concurrency=4, max_queue=0, initial_service_time=1.0, ewma_alpha=0.5)
    adm.observe(Reading(at=0.0, run_seconds=0.0, runs=0))  # an engine that served nothing
    assert adm.mean_service_time == 1.0
    adm.observe(Reading(at=0.0, run_seconds=8.0, runs=40))
    assert adm.mean_service_time == pytest.approx(0.2)
    tickets = [admit(adm) for _ in range(4)]
    assert [refuse(adm).retry_after for _ in range(3)] == pytest.approx([0.05, 0.10, 0.15])
    # Its own runs then move the mean from there, and the engine's no longer replaces it.
    clock.advance(0.4)
    adm.release(tickets[0])
    assert adm.mean_service_time == pytest.approx(0.3)  # 0.5 * 0.2 + 0.5 * 0.4
    adm.observe(Reading(at=0.4, run_seconds=100.0, runs=41))
    assert adm.mean_service_time == pytest.approx(0.3)


def test_retry_after_is_capped(clock: FakeClock) -> None:
    adm = make(clock, max_concurrency=1, max_queue=0, initial_service_time=5, max_retry_after=12)
    admit(adm)
    waits = [refuse(adm).retry_after for _ in range(4)]
    assert waits == pytest.approx([5, 10, 12, 12])


# -- request rate -----------------------------------------------------------------------


def test_rate_bucket_allows_a_burst_then_staggers_the_refused(clock: FakeClock) -> None:
    adm = make(clock, max_concurrency=100, rate=2.0, burst=3)
    for _ in range(3):
        adm.release(admit(adm))
    refusals = [refuse(adm) for _ in range(3)]
    assert {r.code for r in refusals} == {"rate_limited"}
    assert [r.retry_after for r in refusals] == pytest.approx([0.5, 1.0, 1.5])
    assert refusals[0].policy == '"rate_limited";q=3;w=2'
    clock.advance(0.5)
    admit(adm)


def test_rate_buckets_are_per_key(clock: FakeClock) -> None:
    adm = make(clock, max_concurrency=100, rate=1.0, burst=1)
    admit(adm, "a")
    assert refuse(adm, "a").code == "rate_limited"
    admit(adm, "b")


# -- tokens per minute ----------------------------------------------------------------


def test_token_budget_prices_before_and_settles_after(clock: FakeClock) -> None:
    adm = make(clock, max_concurrency=100, tokens_per_minute=600)  # 10 tokens/s
    ticket = admit(adm, price=500)
    refused = refuse(adm, price=200)
    assert refused.code == "token_budget"
    assert refused.retry_after == pytest.approx(10.0)  # 100 left, 100 more at 10/s
    adm.release(ticket, used_tokens=100)  # used far less than priced: refund 400
    admit(adm, price=200)


def test_token_budget_debt_when_usage_exceeds_price(clock: FakeClock) -> None:
    adm = make(clock, max_concurrency=100, tokens_per_minute=600)
    ticket = admit(adm, price=100)
    adm.release(ticket, used_tokens=700)  # level: 600 - 700 = -100
    refused = refuse(adm, price=100)
    assert refused.retry_after == pytest.approx(20.0)


def test_token_refusals_are_staggered_by_their_price(clock: FakeClock) -> None:
    adm = make(clock, max_concurrency=100, tokens_per_minute=60)  # 1 token/s
    admit(adm, price=60)
    waits = [refuse(adm, price=10).retry_after for _ in range(3)]
    assert waits == pytest.approx([10, 20, 30])


def test_a_price_above_the_bucket_passes_when_full(clock: FakeClock) -> None:
    adm = make(clock, max_concurrency=100, tokens_per_minute=60)
    admit(adm, price=100)
    assert refuse(adm, price=100).code == "token_budget"


def test_a_waiter_that_never_ran_gets_its_tokens_back(clock: FakeClock) -> None:
    adm = make(clock, max_concurrency=1, max_queue=5, tokens_per_minute=60)
    admit(adm, price=20)
    waiting = enqueue(adm, price=30)
    assert refuse(adm, price=20).code == "token_budget"
    adm.release(waiting)
    enqueue(adm, price=20)


# -- KV budget --------------------------------------------------------------------------


def test_kv_budget_bounds_the_tokens_running(clock: FakeClock) -> None:
    adm = make(clock, max_concurrency=10, max_queue=1, max_inflight_tokens=1000)
    first = admit(adm, price=600)
    waiting = enqueue(adm, price=600)
    refused = refuse(adm, price=100)
    assert refused.code == "kv_budget"  # slots are free: the KV budget blocks
    assert adm.inflight_tokens == 600
    adm.release(first)
    assert adm.dispatch() == [waiting]
    assert adm.inflight_tokens == 600


def test_head_of_line_is_not_skipped_for_a_smaller_request(clock: FakeClock) -> None:
    adm = make(clock, max_concurrency=10, max_queue=5, max_inflight_tokens=1000)
    admit(adm, "a", price=600)
    big = enqueue(adm, "b", price=600)
    small = enqueue(adm, "c", price=100)
    assert adm.dispatch() == []
    assert (big.state, small.state) == ("queued", "queued")


def test_a_request_that_can_never_fit_is_a_400(clock: FakeClock) -> None:
    adm = make(clock, max_inflight_tokens=1000)
    refused = refuse(adm, price=1001)
    assert (refused.status, refused.code) == (400, "request_too_large")


# -- fairness ---------------------------------------------------------------------------


def test_one_key_cannot_fill_the_queue(clock: FakeClock) -> None:
    adm = make(clock, max_concurrency=1, max_queue=4, key_queue_share=0.5)
    admit(adm, "heavy")
    enqueue(adm, "heavy")
    enqueue(adm, "heavy")
    assert refuse(adm, "heavy").code == "queue_full"
    enqueue(adm, "light")


def test_waiters_are_served_round_robin_between_keys(clock: FakeClock) -> None:
    adm = make(clock, max_concurrency=1, max_queue=10)
    running = admit(adm, "heavy")
    heavy = [enqueue(adm, "heavy") for _ in range(3)]
    light = enqueue(adm, "light")
    order = []
    for _ in range(4):
        adm.release(running)
        (running,) = adm.dispatch()
        order.append(running)
    assert order == [heavy[0], light, heavy[1], heavy[2]]


# -- drain and readiness ----------------------------------------------------------------


def test_drain_refuses_new_and_waiting_but_lets_running_finish(clock: FakeClock) -> None:
    adm = make(clock, max_concurrency=1, max_queue=5, drain_retry_after=30)
    running = admit(adm)
    waiting = enqueue(adm)
    drained = adm.drain()
    assert [t for t, _ in drained] == [waiting]
    refused = drained[0][1]
    assert (refused.status, refused.code, refused.drain) == (503, "draining", True)
    assert refused.retry_after == 30
    assert refuse(adm).code == "draining"
    assert running.state == "running"
    assert not adm.ready
    adm.release(running)
    adm.resume()
    admit(adm)


def test_upstream_not_ready_is_a_503(clock: FakeClock) -> None:
    adm = make(clock, upstream_retry_after=2)
    adm.set_upstream(ready=False, code="upstream_unavailable")
    refused = refuse(adm)
    assert (refused.status, refused.code, refused.retry_after) == (
        503,
        "upstream_unavailable",
        2,
    )
    assert not adm.ready
    adm.set_upstream(ready=True)
    admit(adm)


def waits(adm: Admission, n: int) -> list[float]:
    return [refuse(adm).retry_after for _ in range(n)]


def test_503s_while_loading_are_staggered_at_the_gpu_rate(clock: FakeClock) -> None:
    # 4 slots, 1 s per request (the prior): the GPU takes one every 0.25 s once back.
    adm = make(clock, max_concurrency=4, upstream_retry_after=2, max_retry_after=3)
    adm.set_upstream(ready=False, code="upstream_loading")
    assert waits(adm, 6) == [2.0, 2.25, 2.5, 2.75, 3.0, 3.0]  # the last ones capped
    clock.advance(1)
    # The horizon is an absolute time (t=3): one second later, 2.25 s from now.
    assert waits(adm, 1) == [2.25]


def test_the_503_gap_follows_the_measured_service_time(clock: FakeClock) -> None:
    adm = make(clock, max_concurrency=2, ewma_alpha=1.0, upstream_retry_after=2)
    first, second = admit(adm), admit(adm)
    clock.advance(0.5)
    adm.release(first)
    adm.release(second)
    assert adm.mean_service_time == 0.5
    adm.set_upstream(ready=False, code="upstream_unavailable")
    assert waits(adm, 3) == [2.0, 2.25, 2.5]


def test_serving_again_hands_the_outage_horizon_to_the_queue(clock: FakeClock) -> None:
    # A hold shorter than the load measured: refused, not held through the outage.
    adm = make(clock, max_concurrency=1, max_queue=0, upstream_retry_after=2, queue_timeout=0.25)
    adm.set_upstream(ready=False)
    assert waits(adm, 3) == [2.0, 3.0, 4.0]  # promised up to t=4
    clock.advance(0.5)
    adm.set_upstream(ready=True)
    admit(adm)
    # A full queue sends the next caller after those promised a time (t=4 + 1 s).
    assert refuse(adm).retry_after == 4.5
    # A new outage starts its reservations afresh from its own delay: the load time
    # measured over the last one (0.5 s), no longer the configured guess.
    adm.set_upstream(ready=False)
    assert waits(adm, 2) == [0.5, 1.5]


def test_a_drain_staggers_its_waiters_and_new_callers(clock: FakeClock) -> None:
    adm = make(clock, max_concurrency=2, max_queue=5, drain_retry_after=10)
    admit(adm)
    admit(adm)
    enqueue(adm)
    enqueue(adm)
    drained = [refused.retry_after for _, refused in adm.drain()]
    assert drained == [10.0, 10.5]  # 2 slots, 1 s each: one every 0.5 s
    assert [r.drain for r in (refuse(adm), refuse(adm))] == [True, True]
    adm.resume()
    adm.drain()
    # Resumed in between: this drain's first caller is told the delay, not t=12.
    assert waits(adm, 1) == [10.0]


def test_the_rate_after_an_outage_is_measured_afresh(clock: FakeClock) -> None:
    """An answer every 0.25 s before a 6 s drain and after it: a window that still held
    the answers before would read the drain's quiet as slow service (17 answers in its
    10 s after the resume), and tell a caller refused by the full queue to come back
    2.7 times later than the GPU frees a place."""
    adm = make(clock, max_concurrency=2, max_queue=1)

    def answers(n: int) -> None:
        for _ in range(n):
            ticket = admit(adm)
            clock.advance(0.25)
            adm.release(ticket)

    answers(10)
    adm.drain()
    clock.advance(6.0)  # shorter than the window: only the resume starts a new measure
    adm.resume()
    answers(8)
    assert adm.drain_rate() == pytest.approx(8 / 1.75)  # from the first answer after it
    admit(adm)
    admit(adm)
    enqueue(adm)
    assert refuse(adm).retry_after == pytest.approx(1.75 / 8)


def test_the_rate_after_a_quiet_spell_longer_than_its_window_is_measured_afresh(
    clock: FakeClock,
) -> None:
    """A quiet hour between two busy stretches is not slow service: the morning's first
    answers start a new measure (8 in 1.75 s), not 8 over the window's 10 s."""
    adm = make(clock, max_concurrency=2, max_queue=1)
    for gap in (0.0, 3600.0):
        clock.advance(gap)
        for _ in range(8):
            ticket = admit(adm)
            clock.advance(0.25)
            adm.release(ticket)
    assert adm.drain_rate() == pytest.approx(8 / 1.75)


def test_a_measured_rate_is_not_believed_after_three_of_its_gaps_without_an_answer() -> None:
    """Answers every 0.25 s, then none: the rate is believed until the silence lasts
    three of its gaps (the requests now running are longer), and again once one ends."""
    rate = DrainRate()
    for i in range(1, 9):
        rate.add(0.25 * i)
    assert rate.rate(3.0) == pytest.approx(8 / 2.75)  # 1 s: under three gaps of 0.34 s
    assert rate.rate(3.1) is None
    rate.add(3.2)
    assert rate.rate(3.2) == pytest.approx(9 / 2.95)


def test_a_not_ready_upstream_during_a_drain_shares_one_horizon(clock: FakeClock) -> None:
    adm = make(clock, max_concurrency=1, drain_retry_after=5, upstream_retry_after=2)
    adm.set_upstream(ready=False)
    assert waits(adm, 2) == [2.0, 3.0]
    adm.drain()
    assert waits(adm, 1) == [5.0]  # draining: its own delay, still after t=3
    adm.resume()  # the upstream is still down: not serving, the horizon stays
    assert waits(adm, 1) == [6.0]


# -- the bucket alone -------------------------------------------------------------------


def test_token_bucket_refills_to_capacity(clock: FakeClock) -> None:
    bucket = TokenBucket(capacity=10, refill=2, now=clock.monotonic())
    bucket.take(10)
    clock.advance(2)
    assert bucket.level(clock.monotonic()) == 4
    clock.advance(100)
    assert bucket.level(clock.monotonic()) == 10
    bucket.take(10)
    assert math.isclose(bucket.reserve(clock.monotonic(), 1), 0.5)


def test_precheck_refuses_what_needs_no_price_and_takes_nothing(clock: FakeClock) -> None:
    adm = make(clock, rate=1.0, burst=1)
    assert adm.precheck("a") is None
    assert adm.precheck("a") is None  # nothing was taken
    admit(adm)
    early = adm.precheck("a")
    assert early is not None
    assert early.code == "rate_limited"
    adm.drain()
    drained = adm.precheck("b")
    assert drained is not None
    assert drained.code == "draining"


# -- deadline-aware admission ----------------------------------------------------------


def test_a_caller_that_cannot_wait_long_enough_is_refused_at_once(clock: FakeClock) -> None:
    adm = make(clock, max_concurrency=2, max_queue=10, initial_service_time=1.0)
    admit(adm)
    admit(adm)
    for _ in range(3):
        enqueue(adm)
    # Queued now, it would start after the 3 ahead of it and itself: 4 * 1 s / 2 slots.
    late = adm.offer("a", 10, deadline=1.9)
    assert isinstance(late, Refuse)
    assert (late.status, late.code) == (429, "deadline_unattainable")
    assert late.retry_after == 2.0
    assert adm.queue_depth == 3  # nothing was queued for it
    assert isinstance(adm.offer("a", 10, deadline=2.0), Enqueued)
    assert isinstance(adm.offer("a", 10), Enqueued)  # callers that say nothing: as before


def test_a_caller_that_can_start_now_is_never_refused_for_its_deadline(clock: FakeClock) -> None:
    adm = make(clock, max_concurrency=2, max_queue=10)
    assert isinstance(adm.offer("a", 10, deadline=0.001), Admit)


def test_a_refused_caller_whose_reservation_passes_its_deadline_takes_no_reservation(
    clock: FakeClock,
) -> None:
    adm = make(clock, max_concurrency=1, max_queue=0, initial_service_time=4.0)
    admit(adm)
    unattainable = adm.offer("a", 10, deadline=1.0)
    assert isinstance(unattainable, Refuse)
    assert unattainable.code == "deadline_unattainable"
    # The next refused caller is told the first free time: nobody was given it before.
    first = refuse(adm)
    assert (first.code, first.retry_after) == ("queue_full", 4.0)


def test_while_the_upstream_is_out_an_unattainable_deadline_is_a_503(clock: FakeClock) -> None:
    adm = make(clock, upstream_retry_after=10.0)
    adm.set_upstream(ready=False, code="upstream_unavailable")
    out = adm.offer("a", 10, deadline=5.0)
    assert isinstance(out, Refuse)
    assert (out.status, out.code) == (503, "deadline_unattainable")
    fits = adm.offer("a", 10, deadline=30.0)
    assert isinstance(fits, Refuse)
    assert (fits.status, fits.code, fits.retry_after) == (503, "upstream_unavailable", 10.0)


def test_every_refusal_advertises_the_capacity_of_one_key(clock: FakeClock) -> None:
    adm = make(clock, max_concurrency=8, max_queue=16, key_queue_share=0.5)
    assert adm.key_capacity == 16
    for _ in range(8):
        admit(adm, "a")
    for _ in range(8):
        enqueue(adm, "a")
    refused = refuse(adm, "a")
    assert refused.capacity == 16
    adm.set_upstream(ready=False)
    assert refuse(adm, "b").capacity == 16
