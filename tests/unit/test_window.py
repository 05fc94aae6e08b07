"""The window (flow control): pure, on a fake clock; then threads and tasks hammering one."""

from __future__ import annotations

import asyncio
import math
import random
import threading

import httpx
import pytest

import herdless
from herdless._breaker import BreakerPolicy, CircuitBreaker
from herdless._window import SlotTicket, Window, WindowPolicy
from herdless.testing import FakeClock

END = 10**9  # a deadline that never matters


def window(**policy: object) -> tuple[Window, FakeClock]:
    clock = FakeClock()
    return Window(WindowPolicy(**policy), clock=clock), clock  # type: ignore[arg-type]  # test knobs


def fill(win: Window, n: int) -> list[SlotTicket]:
    """``n`` calls ask for a slot; those granted send their attempt, as a call does."""
    tickets = [win.acquire(end=END) for _ in range(n)]
    for ticket in tickets:
        if ticket.state == "granted":
            win.sent(ticket)
    return tickets


def test_calls_beyond_the_window_wait_and_get_slots_first_come_first_served() -> None:
    win, _ = window(initial=2)
    tickets = fill(win, 5)
    assert [t.state for t in tickets] == ["granted", "granted", "waiting", "waiting", "waiting"]
    win.release(tickets[1])
    assert [t.state for t in tickets[2:]] == ["granted", "waiting", "waiting"]
    win.release(tickets[0])
    win.release(tickets[2])
    assert [t.state for t in tickets[3:]] == ["granted", "granted"]
    assert (win.in_use, win.waiting) == (2, 0)


def test_a_waiter_that_leaves_gives_its_place_up() -> None:
    win, _ = window(initial=1)
    first, second, third = fill(win, 3)
    win.release(second)  # cancelled (its task, or its deadline) while it waited
    assert second.state == "done"
    win.release(first)
    assert third.state == "granted"
    assert win.waiting == 0


def test_listen_wakes_once_when_the_place_is_decided() -> None:
    win, _ = window(initial=1)
    first, second = fill(win, 2)
    woken: list[str] = []
    win.listen(second, lambda: woken.append("second"))
    win.listen(first, lambda: woken.append("first"))  # decided already: at once
    assert woken == ["first"]
    win.release(first)
    win.release(first)  # twice: nothing more
    assert woken == ["first", "second"]


def _round(win: Window, backlog: list[SlotTicket]) -> None:
    """One round: every call holding a slot now is answered and leaves; waiters refill it
    and send."""
    holding = [t for t in backlog if t.state == "granted"]
    for ticket in holding:
        win.answered(0.5)
        win.release(ticket)
    for ticket in backlog:
        if ticket.state == "granted" and not ticket.sent:
            win.sent(ticket)


def test_slow_start_doubles_the_window_each_round_while_full() -> None:
    win, _ = window(initial=4)
    backlog = fill(win, 100)
    _round(win, backlog)
    assert win.size == 8
    _round(win, backlog)
    assert win.size == 16


def test_a_window_nobody_fills_does_not_grow() -> None:
    win, _ = window(initial=4)
    (ticket,) = fill(win, 1)
    for _ in range(10):
        win.answered(0.5)
    assert win.size == 4
    win.release(ticket)


def test_a_refusal_shrinks_it_to_what_the_backend_held_then_it_grows_one_per_round() -> None:
    win, _ = window(initial=8)
    backlog = fill(win, 100)
    sent = backlog[:8]
    assert win.refused(sent[6]) is True
    assert win.size == 7  # what the backend holds now: the seven others, not refused yet
    assert win.refused(sent[7]) is True  # the last refusal of the burst: six, exactly
    assert win.size == 6
    for ticket in sent[6:]:
        assert win.requeue(ticket)  # beyond the window now: first in line
    _round(win, backlog)
    _round(win, backlog)
    assert 6 < win.size < 8  # about one more per round: no longer doubling


def test_the_window_follows_what_the_backend_holds() -> None:
    win, _ = window(initial=16)
    tickets = fill(win, 16)
    for ticket in tickets[8:]:  # the backend took the first 8 and refused the others
        win.refused(ticket)
    assert win.size == 8


def test_a_window_over_its_size_shrinks_by_its_factor_once_per_round() -> None:
    win, _ = window(initial=8, maximum=16, decrease=0.5)
    win.advertise(8)
    tickets = fill(win, 8)
    win.advertise(4)  # the backend's capacity fell below what is in use
    assert win.size == 4
    assert win.refused(tickets[7]) is True  # what it held (7) says nothing new: factor
    assert win.size == 2
    assert win.refused(tickets[6]) is False  # the same round: once
    assert win.size == 2


def test_a_burst_sent_before_the_capacity_was_known_keeps_the_window_at_it() -> None:
    """A shared client's first burst goes out at its initial window (16) before the
    gateway says it takes 8 of its calls: the 8 it refuses are that overshoot. Cut by
    the factor, the window stayed at 6 (then 5) where the gateway took 8, and a real
    vLLM behind it ran its batches a step apart."""
    win, _ = window(initial=16)
    tickets = fill(win, 20)
    win.advertise(8)
    assert win.size == 8
    for ticket in tickets[8:16]:
        assert win.refused(ticket) is False
        assert win.requeue(ticket)
    assert (win.size, win.in_use) == (8, 8)
    # Sent again after it said so, and refused: that is a sign of less room.
    win.release(tickets[0])
    again = tickets[8]  # the first refused goes first
    assert again.state == "granted"
    win.sent(again)
    assert win.refused(again) is True
    assert win.size < 8


def test_calls_requeued_one_after_another_go_again_in_the_order_they_were_refused() -> None:
    """A gateway told them times in that order: the first refused is the first due (sent
    last first, each came early while the others' places were held past their times)."""
    win, _ = window(initial=4)
    tickets = fill(win, 6)  # four sent, two waiting
    for ticket in tickets[1:4]:
        assert win.refused(ticket) is True  # 4 -> 3 -> 2 -> 1: what the backend held
        assert win.requeue(ticket)
    assert [win.position(t) for t in tickets[1:]] == [0, 1, 2, 3, 4]
    win.release(tickets[0])
    assert [t.state for t in tickets[1:3]] == ["granted", "waiting"]


def test_it_never_shrinks_below_its_minimum() -> None:
    win, _ = window(initial=4, minimum=2, decrease=0.5)
    for _ in range(5):
        (ticket,) = fill(win, 1)
        win.refused(ticket)
        win.release(ticket)
    assert win.size == 2


def test_no_growth_while_a_refused_call_waits_to_retry() -> None:
    win, _ = window(initial=2)
    refused, _served = fill(win, 2)
    win.refused(refused)  # one slot holder waits to retry
    size = win.size
    win.answered(0.5)
    assert win.size == size
    win.sent(refused)
    win.answered(0.5)
    assert win.size > size


def test_a_refused_call_at_the_minimum_keeps_its_slot_and_retries_at_a_release() -> None:
    win, _ = window(initial=1, maximum=2)
    (alone,) = fill(win, 1)
    waiting = win.acquire(end=END)
    win.refused(alone)  # the backend held nothing of ours: the window stays at 1
    assert win.requeue(alone) is False  # at the minimum: it keeps its place
    woken: list[str] = []
    win.on_release(alone, lambda: woken.append("retry"))
    win.sent(alone)  # its backoff ended first: the release listener is dropped
    assert woken == []
    assert waiting.state == "waiting"


def test_the_advertised_capacity_is_the_start_and_the_ceiling() -> None:
    win, _ = window(initial=4, maximum=100)
    win.advertise(24)
    assert win.size == 24
    tickets = fill(win, 24)
    for _ in tickets:
        win.answered(0.5)
    assert win.size == 24  # never above what the server holds for this client
    win.refused(tickets[0])
    win.advertise(30)  # once it learned by a refusal, a larger capacity is a ceiling only
    assert win.size < 24


def test_off_lets_everything_through() -> None:
    win, _ = window(enabled=False)
    tickets = fill(win, 1000)
    assert all(t.state == "granted" for t in tickets)
    assert win.refused(tickets[0]) is False
    assert math.isinf(win.size)


def _one_a_second(win: Window, clock: FakeClock) -> None:
    """Two calls served one after the other through a full window, a second each: slots
    free at 1 a second (the pace measured from one answer to the next)."""
    tickets = [win.acquire(end=END) for _ in range(2)]
    for ticket in tickets:
        win.sent(ticket)
        clock.advance(1.0)
        win.answered(1.0, ticket)
        win.release(ticket)


def test_a_waiter_whose_best_case_cannot_fit_is_told_to_leave_at_once() -> None:
    win, clock = window(initial=1, maximum=1)
    _one_a_second(win, clock)
    holder = win.acquire(end=END)
    assert holder.state == "granted"
    assert win.expected_wait(0) == pytest.approx(1.0)
    now = clock.monotonic()
    # About 1 s for a slot, then about 1 s for the answer; one sample: a 35 % margin,
    # so the best case is 1.3 s: 1.2 s is not enough, 1.5 s is.
    late = win.acquire(end=now + 1.2)
    assert late.state == "spill"
    assert win.estimate(late) == pytest.approx((1.0, 1.0, 0.35, 1))
    assert win.acquire(end=now + 1.5).state == "waiting"
    # Second in line: about 2 s for a slot, over a patience of 0.5 s.
    assert win.acquire(end=END, max_wait=0.5).state == "spill"
    # With no backend after it, the margin doubles: 0.6 s is its best case.
    assert win.acquire(end=now + 3.0, last=True).state == "waiting"


def test_waiters_are_re_checked_at_every_release() -> None:
    win, clock = window(initial=1, maximum=1)
    start = clock.monotonic()
    first = win.acquire(end=END)
    win.sent(first)
    second = win.acquire(end=start + 4.0)  # nothing measured yet: both wait
    third = win.acquire(end=start + 4.5)
    woken: list[str] = []
    win.listen(third, lambda: woken.append("third"))
    clock.advance(1.0)
    win.answered(1.0, first)
    win.release(first)
    assert (second.state, third.state) == ("granted", "waiting")
    win.sent(second)
    clock.advance(2.5)
    win.answered(2.5, second)
    win.release(second)  # now 2.5 s a call: third's slot comes now, its answer (an
    assert third.state == "granted"  # average of 1.3 s) at best 0.85 s later: in time
    win.sent(third)
    fourth = win.acquire(end=clock.monotonic() + 2.0)
    assert fourth.state == "spill"  # (1 - 0.35) * (2.5 s for a slot + 1.3 s) > 2 s
    assert woken == ["third"]


def test_a_waiter_whose_turn_comes_too_late_to_be_answered_leaves_instead() -> None:
    win, clock = window(initial=1, maximum=1)
    _one_a_second(win, clock)
    holder = win.acquire(end=END)
    win.sent(holder)
    doomed = win.acquire(end=clock.monotonic() + 100)
    doomed.end = clock.monotonic() + 1.5  # its deadline came closer (a test's shortcut)
    clock.advance(1.0)
    win.answered(1.0, holder)
    win.release(holder)
    # Its slot is free now, but even at best its answer (0.65 s) ends past its end.
    assert doomed.state == "spill"
    assert win.in_use == 0


def test_a_waiter_counts_the_slots_a_growing_window_adds_before_its_turn() -> None:
    """Issue 24, real vLLM: the window shrank on the burst's refusals (to 6 in one run)
    and grew back toward the gateway's 8 while calls waited; each slot it added brought
    every waiter a place forward, and their predictions were a round late."""
    win, clock = window(initial=8, maximum=8)
    tickets = fill(win, 14)  # 8 at the backend, 6 waiting
    win.refused(tickets[7])  # the 8th refused: the window is what the backend held, 7
    assert win.requeue(tickets[7])  # it gives its slot back, first in line
    assert (win.size, win.waiting) == (7.0, 7)
    # One answer a second, one at a time: the pace is measured once the third lone
    # answer's clump is over (fewer may lead a batch), and the fourth is due then.
    for ticket in tickets[:3]:
        clock.advance(1.0)
        win.answered(1.0, ticket)
        win.release(ticket)
    clock.advance(1.01)
    # Past the threshold it grows by 1 / size an answer, half as fast toward the 8 it
    # was refused at: back to 8 at the 12th answer from now, which gives two slots.
    assert win._slots_after(14) == [*range(12), 13, 14]
    assert win.expected_wait(10) == pytest.approx(10 * 1.0)  # 11 answers
    assert win.expected_wait(11) == pytest.approx(11 * 1.0)  # 12
    assert win.expected_wait(12) == pytest.approx(11 * 1.0)  # also 12, not 13


def test_a_release_without_an_answer_says_nothing_of_the_pace() -> None:
    win, clock = window(initial=1, maximum=1)
    moved = win.acquire(end=END)
    win.sent(moved)
    clock.advance(3.0)
    win.release(moved)  # it moved on (a fallback, an error): no answer
    assert win.expected_wait(0) is None


def test_expected_wait_is_unknown_before_anything_is_measured() -> None:
    win, _ = window(initial=1)
    fill(win, 3)
    assert win.expected_wait(0) is None


def test_threads_hammering_one_window_never_exceed_it_and_lose_no_call() -> None:
    win = Window(WindowPolicy(initial=4), clock=FakeClock())
    lock = threading.Lock()
    at_once = peak = done = 0

    def worker(seed: int) -> None:
        nonlocal at_once, peak, done
        rng = random.Random(seed)
        for _ in range(200):
            ticket = win.acquire(end=END)
            granted = threading.Event()
            win.listen(ticket, granted.set)
            assert granted.wait(10)
            with lock:
                at_once += 1
                peak = max(peak, at_once)
            if rng.random() < 0.1:
                win.refused(ticket)
                win.sent(ticket)
            else:
                win.answered(0.01)
            with lock:
                at_once -= 1
                done += 1
            win.release(ticket)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert done == 8 * 200
    assert peak <= WindowPolicy().maximum
    assert (win.in_use, win.waiting) == (0, 0)


async def test_tasks_sharing_one_async_client_never_exceed_the_window() -> None:
    at_once = peak = 0
    gate = asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal at_once, peak
        at_once += 1
        peak = max(peak, at_once)
        await gate.wait()
        at_once -= 1
        return httpx.Response(200, json={"choices": [{"message": {"content": "ok"}}]})

    async with herdless.AsyncClient(
        primary="http://gpu.test/v1",
        window=herdless.WindowPolicy(initial=5, maximum=5),
        transport=httpx.MockTransport(handler),
    ) as client:
        calls = [
            asyncio.create_task(client.chat([{"role": "user", "content": "hi"}])) for _ in range(40)
        ]
        for _ in range(20):
            await asyncio.sleep(0)
        assert peak == 5  # five sent; thirty-five wait in the client
        assert client.stats().windows == {"primary": 5}
        gate.set()
        results = await asyncio.gather(*calls)
    assert len(results) == 40
    assert peak == 5
    stats = client.stats()
    assert stats.queued == 35
    assert stats.succeeded == 40


def test_threads_sharing_one_client_never_exceed_the_window() -> None:
    lock = threading.Lock()
    at_once = peak = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal at_once, peak
        with lock:
            at_once += 1
            peak = max(peak, at_once)
        threading.Event().wait(0.005)  # a short real answer time, so threads overlap
        with lock:
            at_once -= 1
        return httpx.Response(200, json={"choices": [{"message": {"content": "ok"}}]})

    with herdless.Client(
        primary="http://gpu.test/v1",
        window=herdless.WindowPolicy(initial=3, maximum=3),
        transport=httpx.MockTransport(handler),
    ) as client:
        threads = [
            threading.Thread(target=client.chat, args=([{"role": "user", "content": "hi"}],))
            for _ in range(24)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert client.stats().succeeded == 24
    assert peak <= 3


def test_policy_validation() -> None:
    with pytest.raises(ValueError, match="decrease"):
        WindowPolicy(decrease=1.0)
    with pytest.raises(ValueError, match="minimum <= initial <= maximum"):
        WindowPolicy(initial=2, minimum=4)
    with pytest.raises(ValueError, match="initial"):
        WindowPolicy(initial=0)


def test_a_refused_call_beyond_a_shrunk_window_waits_first_in_line() -> None:
    win, _ = window(initial=4)
    tickets = fill(win, 4)
    newcomer = win.acquire(end=END)
    assert win.refused(tickets[3]) is True  # 4 -> 3: it held the three before it
    assert win.requeue(tickets[3]) is True
    assert tickets[3].state == "waiting"
    assert win.requeue(tickets[1]) is False  # 3 in use, 3 wide: the others keep theirs
    win.release(tickets[2])
    assert (tickets[3].state, newcomer.state) == ("granted", "waiting")  # first in line


def test_a_bare_503_counts_only_after_a_few_answer_times_without_success() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(
        BreakerPolicy(min_calls=2, open_for=5.0), clock=clock, rng=random.Random(0)
    )
    breaker.record_success(breaker.acquire()[0])
    clock.advance(10.0)  # 10 s without a success, but answers here take 7 s: still busy
    for _ in range(4):
        assert breaker.record_refusal(breaker.acquire()[0], answer_time=7.0) is None
    clock.advance(20.0)  # 30 s: over four answer times, the refusal counts
    opened = breaker.record_refusal(breaker.acquire()[0], answer_time=7.0)
    assert opened is not None
    assert opened.reason == "failure_rate"
