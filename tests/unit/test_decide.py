"""``decide``, the pure rule after a failed attempt, as a table: verdict x last backend x
policy -> decision (as urllib3's retry tests chain ``increment()``).

Each row records one attempt's outcome at a fresh visit (``Visit.record``, which the flow
runs first) and asks ``decide``; the numbers are the rules of its docstring. The jitter
is at its ceiling (``UpperRandom``), so every delay is exact.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from tests.unit.flow_driver import PRIMARY, failure, make, status

from herdless._actions import Outcome
from herdless._call.checks import Policy, decide
from herdless._call.decisions import Budgeted, Fail, Move, Requeued, Wait
from herdless._call.visit import Visit
from herdless._retry import RetryPolicy
from herdless._routing import FallbackPolicy
from herdless._window import WindowPolicy
from herdless.errors import (
    AuthenticationError,
    BadRequestError,
    HerdlessError,
    NotFoundError,
    RateLimitError,
    UnprocessableEntityError,
)

NO_WINDOW = {"window": WindowPolicy(enabled=False)}


def _decided(outcome: Outcome, *, last: bool, **options: Any) -> object:
    """One attempt at a fresh visit to the primary, recorded; then ``decide`` (the call's
    deadline ``options["deadline"]``, 10 s unless given)."""
    deadline = options.pop("deadline", 10.0)
    driver = make(**options)
    state = driver.policies
    call = driver.start(deadline=deadline)
    call.begin()
    visit = Visit(call, PRIMARY, end=call.deadline_at, last=last)
    visit.send(driver.clock.monotonic())
    verdict = visit.record(outcome)
    return decide(verdict, visit, Policy(state.config, state.rng), driver.clock.monotonic())


def _summary(decision: object) -> tuple[object, ...]:
    """The decision, less its error and delays' exact bits: what the table compares."""
    if isinstance(decision, Move):
        return ("move", decision.reason)
    if isinstance(decision, Fail):
        return ("fail", type(decision.error).__name__)
    if isinstance(decision, Wait):
        return ("wait", decision.why, decision.seconds, decision.scheduled, decision.until_release)
    if isinstance(decision, Requeued):
        return ("requeued", decision.why)
    assert isinstance(decision, Budgeted)
    return ("budgeted", _summary(decision.wait), _summary(decision.without))


RETRY = RetryPolicy(base=0.5, cap=4.0, max_attempts=3)
NO_BUDGET = RetryPolicy(budget_floor=0, budget_ratio=0)

TABLE: list[tuple[str, Outcome, bool, dict[str, Any], tuple[object, ...]]] = [
    # rule (of decide's docstring), outcome, last backend, options -> decision
    ("1", status(503, drain=True), False, {}, ("move", "draining")),
    ("1", status(503, error_code="upstream_loading"), False, {}, ("move", "unavailable")),
    (
        "2",
        status(429, error_code="deadline_unattainable"),
        False,
        {},
        ("move", "deadline_unattainable"),
    ),
    (
        "2",
        status(429, error_code="deadline_unattainable"),
        True,
        {},
        ("fail", "DeadlineExceeded"),
    ),
    ("4", status(500), False, {}, ("move", "failed")),
    ("4", failure("protocol"), True, {}, ("fail", "APIConnectionError")),
    ("5", failure("first_byte_timeout"), False, {}, ("move", "timeout")),
    (
        "7",
        status(429, retry_after=2.0),
        False,
        {"fallback_policy": FallbackPolicy(on_backpressure="fallback")},
        ("move", "backpressure"),
    ),
    (
        "8",
        status(429, retry_after=3.0),
        False,
        {"fallback_policy": FallbackPolicy(max_busy_wait=2.0)},
        ("move", "busy"),
    ),
    (
        "9",
        status(502),
        True,
        {"retry": RetryPolicy(max_attempts=1)},
        ("fail", "InternalServerError"),
    ),
    (
        "10 another follows",
        status(503, retry_after=30.0),
        False,
        {"deadline": 20.0},
        ("move", "retry_after_exceeds_deadline"),
    ),
    ("10 last", status(429, retry_after=30.0), True, {}, ("fail", "RateLimitError")),
    ("11", status(429, retry_after=1.0), True, {}, ("wait", "status_429", 1.25, True, False)),
    ("12", status(429), True, {"retry": RETRY}, ("wait", "status_429", 0.5, True, False)),
    # A busy backend's retry spends no budget: with none at all, it still waits there.
    (
        "12 no budget",
        status(503),
        False,
        {"retry": NO_BUDGET},
        ("wait", "status_503", 0.5, True, False),
    ),
    (
        "13 broken, another follows",
        status(502),
        False,
        {"retry": RETRY},
        ("budgeted", ("wait", "status_502", 0.5, False, False), ("move", "budget_exhausted")),
    ),
    (
        "13 broken, last",
        status(502),
        True,
        {"retry": RETRY},
        (
            "budgeted",
            ("wait", "status_502", 0.5, False, False),
            ("wait", "budget", 0.5, False, False),
        ),
    ),
    (
        "13 busy, no window",
        status(429),
        False,
        {"retry": RETRY, **NO_WINDOW},
        (
            "budgeted",
            ("wait", "status_429", 0.5, False, False),
            ("wait", "budget", 0.5, False, False),
        ),
    ),
]
# No answer, no fallback behind: retried there (full jitter under the backoff's base).
TABLE += [
    (
        f"13 {kind}, last",
        failure(kind),
        True,
        {},
        ("budgeted", ("wait", kind, 0.5, False, False), ("wait", "budget", 0.5, False, False)),
    )
    for kind in ("connect", "connect_timeout", "read", "first_byte_timeout")
]


@pytest.mark.parametrize(
    ("outcome", "last", "options", "expected"),
    [row[1:] for row in TABLE],
    ids=[row[0] for row in TABLE],
)
def test_decide(
    outcome: Outcome, last: bool, options: dict[str, Any], expected: tuple[object, ...]
) -> None:
    assert _summary(_decided(outcome, last=last, **options)) == expected


@pytest.mark.parametrize(
    ("code", "error"),
    [
        (400, BadRequestError),
        (404, NotFoundError),
        (422, UnprocessableEntityError),
        (401, AuthenticationError),
    ],
)
def test_decide_raises_at_once_for_a_request_no_backend_can_serve(
    code: int, error: type[HerdlessError]
) -> None:
    # Rule 3: a request any backend would refuse: no move, the error itself.
    with pytest.raises(error):
        _decided(status(code), last=False)


def test_decide_a_wait_past_the_deadline_fails_with_the_servers_time() -> None:
    # Rule 10 at the last backend: the error keeps the time the server gave.
    decision = _decided(status(429, retry_after=30.0), last=True)
    assert isinstance(decision, Fail)
    assert isinstance(decision.error, RateLimitError)
    assert decision.error.retry_after == 30.0


def test_decide_writes_nothing_to_the_visit() -> None:
    driver = make(retry=RETRY)
    state = driver.policies
    call = driver.start(deadline=10.0)
    call.begin()
    visit = Visit(call, PRIMARY, end=call.deadline_at, last=False)
    visit.send(driver.clock.monotonic())
    verdict = visit.record(status(502))
    before = {name: getattr(visit, name) for name in Visit.__slots__}
    for _ in range(3):
        decide(verdict, visit, Policy(state.config, state.rng), driver.clock.monotonic())
    assert {name: getattr(visit, name) for name in Visit.__slots__} == before
    assert isinstance(visit.last_error, HerdlessError)


def test_decide_a_call_the_shrunk_window_took_back_is_requeued() -> None:
    # Rule 6: two calls in a window of 2, one refused: the window shrinks to the one the
    # backend still holds and takes the refused call back, first in its line.
    driver = make(window=WindowPolicy(initial=2, minimum=1))
    state = driver.policies
    window = state.window(PRIMARY)
    other = window.acquire(end=math.inf)
    window.sent(other)
    call = driver.start(deadline=10.0)
    call.begin()
    visit = Visit(call, PRIMARY, end=call.deadline_at, last=True)
    visit.take_slot(math.inf, last=True)
    visit.send(driver.clock.monotonic())
    verdict = visit.record(status(429))
    assert visit.phase == "requeued"
    decision = decide(verdict, visit, Policy(state.config, state.rng), driver.clock.monotonic())
    assert decision == Requeued("status_429")
