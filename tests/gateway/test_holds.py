"""Places held for the callers a full queue told a time (pure, fake clock)."""

from __future__ import annotations

import pytest

from herdless.gateway.core.admission import Admission
from herdless.gateway.core.decisions import Admit, Enqueued, Refuse, Ticket
from herdless.gateway.core.holds import GRACE, Holds
from herdless.gateway.core.limits import AdmissionConfig
from herdless.gateway.edge import call_id
from herdless.gateway.runtime import request_id
from herdless.testing import FakeClock

pytestmark = [pytest.mark.server]

CALL = ("key-a", "req-1")


def test_a_place_is_held_from_shortly_before_its_time_until_its_grace_ends() -> None:
    holds = Holds()
    holds.promise(CALL, due=10.0)
    assert holds.held(now=8.0, ahead=1.0) == 0  # the places freeing now are others'
    assert holds.held(now=9.0, ahead=1.0) == 1
    assert holds.held(now=10.0 + GRACE - 0.01, ahead=1.0) == 1
    assert holds.held(now=10.0 + GRACE, ahead=1.0) == 0  # it went elsewhere
    assert len(holds) == 0


def test_a_caller_back_at_its_time_takes_its_place_once() -> None:
    holds = Holds()
    holds.promise(CALL, due=10.0)
    holds.promise(("key-a", "req-2"), due=11.0)
    assert not holds.claim(CALL, now=5.0, ahead=1.0)  # early: judged like anyone
    assert holds.claim(CALL, now=10.2, ahead=1.0)
    assert not holds.claim(CALL, now=10.3, ahead=1.0)
    assert not holds.claim(("key-b", "req-1"), now=10.3, ahead=1.0)  # another key's id
    assert holds.held(now=10.3, ahead=1.0) == 1
    holds.promise(("key-a", "req-2"), due=20.0)  # told again: its new time only
    assert (holds.held(now=10.3, ahead=1.0), len(holds)) == (0, 1)
    assert not holds.claim(("key-a", "req-2"), now=20.0 + GRACE, ahead=1.0)


def full(clock: FakeClock) -> tuple[Admission, Ticket]:
    """2 running (2 s each, a place every second) and 2 queued: the queue is full."""
    adm = Admission(
        AdmissionConfig(max_concurrency=2, max_queue=2, initial_service_time=2.0), clock=clock
    )
    running = [adm.offer("key-a", 10) for _ in range(2)]
    assert all(isinstance(d, Admit) for d in running)
    assert all(isinstance(adm.offer("key-a", 10), Enqueued) for _ in range(2))
    first = running[0]
    assert isinstance(first, Admit)
    return adm, first.ticket


def next_place_frees(adm: Admission, clock: FakeClock, ticket: Ticket) -> None:
    clock.advance(0.9)
    adm.release(ticket)
    assert len(adm.dispatch()) == 1  # the queue's head runs: one place is free


@pytest.mark.parametrize("says_who", [True, False], ids=["herdless", "anonymous"])
def test_a_caller_back_at_its_time_finds_the_place_it_was_told(says_who: bool) -> None:
    """The place that frees before a refused caller's time is kept for it: a newcomer
    that takes it sends the caller, on time, to the back of the line."""
    clock = FakeClock()
    adm, ending = full(clock)
    call = "req-1" if says_who else None
    told = adm.offer("key-a", 10, call=call)
    assert isinstance(told, Refuse)
    assert told.retry_after == pytest.approx(1.0)
    next_place_frees(adm, clock, ending)
    newcomer = adm.offer("key-a", 10)
    clock.advance(told.retry_after - 0.9)
    back = adm.offer("key-a", 10, call=call)
    if says_who:
        assert isinstance(newcomer, Refuse)
        assert newcomer.code == "queue_full"
        assert newcomer.retry_after > told.retry_after - 0.9  # after the held time
        assert isinstance(back, Enqueued)
    else:  # its time was advice only
        assert isinstance(newcomer, Enqueued)
        assert isinstance(back, Refuse)


def test_a_place_held_for_a_caller_that_went_elsewhere_frees_after_its_grace() -> None:
    clock = FakeClock()
    adm, ending = full(clock)
    assert isinstance(adm.offer("key-a", 10, call="req-1"), Refuse)
    next_place_frees(adm, clock, ending)
    assert isinstance(adm.offer("key-a", 10), Refuse)
    clock.advance(0.1 + GRACE)  # the caller spilled to its fallback and never came
    assert isinstance(adm.offer("key-a", 10), Enqueued)


def test_a_caller_let_in_before_its_time_no_longer_holds_a_place() -> None:
    """A herdless client sends a refused call again when its own window frees a slot,
    often before the time it was told. Let in then, it is in the queue: the place held
    for its time counted it twice, and a shared client's next calls were refused for it
    (real vLLM behind 4 + 4: its window fell to 5 and the GPU ran batches a step apart)."""
    clock = FakeClock()
    adm = Admission(
        AdmissionConfig(max_concurrency=2, max_queue=2, initial_service_time=2.0), clock=clock
    )
    running = [adm.offer("key-a", 10) for _ in range(2)]
    assert all(isinstance(adm.offer("key-a", 10), Enqueued) for _ in range(2))
    first = adm.offer("key-a", 10, call="req-0")
    told = adm.offer("key-a", 10, call="req-1")
    assert isinstance(first, Refuse)
    assert isinstance(told, Refuse)
    assert told.retry_after == pytest.approx(2 * first.retry_after)  # a place a second
    clock.advance(0.1)
    for ending in running:
        assert isinstance(ending, Admit)
        adm.release(ending.ticket)
    started = adm.dispatch()
    assert len(started) == 2  # two places free, req-1's time 1.9 s away
    assert isinstance(adm.offer("key-a", 10, call="req-1"), Enqueued)  # early
    clock.advance(first.retry_after - 0.1)
    assert isinstance(adm.offer("key-a", 10, call="req-0"), Enqueued)  # on time
    clock.advance(0.5)
    adm.release(started[0])
    assert len(adm.dispatch()) == 1  # req-1 runs; one place is free before its time
    assert isinstance(adm.offer("key-a", 10), Enqueued)  # nothing is held for it now


def test_a_caller_back_before_its_time_to_a_full_queue_keeps_its_time() -> None:
    """A kept request is offered again where the queue runs dry (the gateway's
    ``Gate.until_place``), often before its time; refused then (a newcomer took the
    place), it keeps the time it was told, and the place held for it then."""
    clock = FakeClock()
    adm, ending = full(clock)
    told = adm.offer("key-a", 10, call="kept 1")
    later = adm.offer("key-a", 10, call="kept 2")
    assert isinstance(told, Refuse)
    assert isinstance(later, Refuse)
    next_place_frees(adm, clock, ending)  # 0.9 s on; kept 2's time is 1.1 s away
    assert isinstance(adm.offer("key-a", 10, call="kept 1"), Enqueued)  # its time is near
    again = adm.offer("key-a", 10, call="kept 2")  # early, to a full queue
    assert isinstance(again, Refuse)
    assert again.code == "queue_full"
    assert again.retry_after == pytest.approx(later.retry_after - 0.9)  # not a later one
    newcomer = adm.offer("key-a", 10, call="kept 3")
    assert isinstance(newcomer, Refuse)
    assert newcomer.retry_after > later.retry_after - 0.9  # told after it


@pytest.mark.parametrize("forgotten", [False, True])
def test_a_place_held_for_a_caller_that_will_not_come_back_frees_at_once(forgotten: bool) -> None:
    """A request the gateway kept waiting for a client that never retries, gone or past
    its hold: nobody comes back for its place."""
    clock = FakeClock()
    adm, ending = full(clock)
    told = adm.offer("key-a", 10, call="kept 1")
    assert isinstance(told, Refuse)
    if forgotten:
        adm.forget("key-a", "kept 1")
    next_place_frees(adm, clock, ending)
    clock.advance(told.retry_after - 0.9)  # the time it was told
    newcomer = adm.offer("key-a", 10)
    assert isinstance(newcomer, Enqueued if forgotten else Refuse)


@pytest.mark.parametrize(
    ("headers", "held_for"),
    [
        ({"x-request-id": "req-1", "x-herdless-attempt": "2"}, "req-1"),
        ({"x-request-id": "req-1"}, None),  # maybe a proxy's id, new on every attempt
        ({"x-herdless-attempt": "1"}, None),  # the gateway made the id: nobody brings it
        ({"x-request-id": "bad id", "x-herdless-attempt": "1"}, None),
    ],
)
def test_only_a_herdless_client_s_own_request_id_holds_a_place(
    headers: dict[str, str], held_for: str | None
) -> None:
    assert call_id(headers, request_id(headers)) == held_for
