"""RetryPolicy, Retry-After parsing and outcome classification: pure, exact delays."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime
from email.utils import format_datetime

import pytest
from tests.unit._policy_stubs import LowerRandom, UpperRandom

from herdless._actions import Response, TransportFailure
from herdless._retry import RetryPolicy, classify, parse_capacity, parse_retry_after

NOW = 1_700_000_000.0  # a fixed wall-clock "now" for HTTP dates


def _response(status: int, headers: dict[str, str] | None = None, body: bytes = b"") -> Response:
    return Response(status=status, headers=headers or {}, body=body, elapsed=0.1)


def _coded(status: int, code: str) -> Response:
    """A refusal with an OpenAI-style error body naming ``code``, as the gateway writes it."""
    body = json.dumps({"error": {"message": "no", "type": "x", "code": code}}).encode()
    return _response(status, body=body)


@pytest.mark.parametrize(
    ("n", "ceiling"),
    [(0, 0.5), (1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 8.0), (30, 8.0), (5000, 8.0)],
)
def test_ceiling_doubles_up_to_the_cap(n: int, ceiling: float) -> None:
    assert RetryPolicy(base=0.5, cap=8.0).ceiling(n) == ceiling


def test_ceiling_reaches_a_cap_that_is_no_power_of_two_of_the_base() -> None:
    assert [RetryPolicy(base=0.3, cap=1.0).ceiling(n) for n in range(4)] == [0.3, 0.6, 1.0, 1.0]
    assert RetryPolicy(base=5.0, cap=1.0).ceiling(0) == 1.0  # a base above the cap: the cap


def test_backoff_is_full_jitter_between_zero_and_the_ceiling() -> None:
    policy = RetryPolicy(base=0.5, cap=8.0)
    assert [policy.backoff(n, UpperRandom()) for n in range(6)] == [0.5, 1, 2, 4, 8, 8]
    assert policy.backoff(3, LowerRandom()) == 0.0
    # A seeded source gives the same delay as uniform(0, ceiling) on the same seed.
    assert policy.backoff(2, random.Random(7)) == random.Random(7).uniform(0, 2.0)


@pytest.mark.parametrize(
    ("retry_after", "expected"),
    [
        (2.0, 2.5),  # floor + 25 %
        (0.0, 0.1),  # at least min_jitter of spread above
        (0.2, 0.3),
        (10.0, 11.0),  # the spread is capped at max_jitter (1 s), not 25 % of 10 s
        (1000.0, 61.0),  # capped at max_retry_after (60) + at most max_jitter
    ],
)
def test_server_time_is_a_floor_with_jitter_above(retry_after: float, expected: float) -> None:
    policy = RetryPolicy()
    assert policy.after_server(retry_after, UpperRandom()) == pytest.approx(expected)
    assert policy.after_server(retry_after, LowerRandom()) == min(retry_after, 60.0)


def test_jitter_bounds_are_validated() -> None:
    with pytest.raises(ValueError, match="min_jitter"):
        RetryPolicy(min_jitter=2.0, max_jitter=1.0)


def test_delay_prefers_the_server_time() -> None:
    policy = RetryPolicy()
    assert policy.delay(0, 3.0, UpperRandom()) == 3.75
    assert policy.delay(2, None, UpperRandom()) == 2.0


def _http_date(offset: float) -> str:
    return format_datetime(datetime.fromtimestamp(NOW + offset, tz=UTC), usegmt=True)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, None),
        ({"retry-after-ms": "1500"}, 1.5),
        ({"retry-after-ms": "1500", "retry-after": "9"}, 1.5),  # precise wins
        ({"retry-after-ms": "nope", "retry-after": "9"}, 9.0),  # falls back to Retry-After
        ({"retry-after-ms": "-5", "retry-after": "2"}, 2.0),
        ({"retry-after-ms": "nan"}, None),
        ({"Retry-After": "3"}, 3.0),  # any case
        ({"retry-after": "1.5"}, 1.5),
        ({"retry-after": " 4 "}, 4.0),
        ({"retry-after": "-1"}, None),
        ({"retry-after": "inf"}, None),
        ({"retry-after": "soon"}, None),
        ({"retry-after": ""}, None),
        ({"retry-after": _http_date(5)}, 5.0),
        ({"retry-after": _http_date(-30)}, 0.0),  # a date in the past: now
        ({"retry-after": "Fri, 31 Dec 1999 23:59:59"}, None),  # no zone: not an HTTP date
    ],
)
def test_parse_retry_after(headers: dict[str, str], expected: float | None) -> None:
    assert parse_retry_after(headers, now=NOW) == expected


def test_classify_success_and_refusals() -> None:
    policy = RetryPolicy()
    ok = classify(_response(200), policy, now=NOW)
    assert (ok.ok, ok.kind, ok.status) == (True, "ok", 200)
    bad = classify(_response(400), policy, now=NOW)
    assert (bad.retryable, bad.fallback_may_help, bad.breaker_failure) == (False, False, False)
    for status in (401, 403, 404, 413, 422):
        assert not classify(_response(status), policy, now=NOW).fallback_may_help


def test_a_429_retries_and_is_not_a_breaker_failure() -> None:
    verdict = classify(_response(429, {"retry-after": "2"}), RetryPolicy(), now=NOW)
    assert verdict.retryable
    assert verdict.fallback_may_help
    assert not verdict.breaker_failure
    assert verdict.retry_after == 2.0


@pytest.mark.parametrize(("status", "retryable"), [(500, False), (502, True), (504, True)])
def test_5xx_are_breaker_failures(status: int, retryable: bool) -> None:
    verdict = classify(_response(status), RetryPolicy(), now=NOW)
    assert verdict.breaker_failure
    assert verdict.fallback_may_help
    assert verdict.retryable is retryable
    assert not verdict.draining
    assert not verdict.busy
    assert not verdict.down


def test_a_bare_503_is_a_busy_refusal_counted_in_the_failure_rate_only() -> None:
    verdict = classify(_response(503), RetryPolicy(), now=NOW)
    assert verdict.busy
    assert verdict.retryable
    assert verdict.fallback_may_help
    assert not verdict.breaker_failure
    assert verdict.breaker_refusal
    assert not verdict.backend_wide


def test_a_503_that_gives_a_time_is_a_reservation() -> None:
    verdict = classify(_response(503, {"Retry-After": "3"}), RetryPolicy(), now=NOW)
    assert verdict.busy
    assert not verdict.breaker_failure
    assert not verdict.breaker_refusal
    assert verdict.retry_after == 3.0


@pytest.mark.parametrize("code", ["upstream_loading", "upstream_unavailable"])
def test_an_outage_the_gateway_names_is_backend_wide(code: str) -> None:
    verdict = classify(_coded(503, code), RetryPolicy(), now=NOW)
    assert verdict.down
    assert verdict.backend_wide
    assert not verdict.busy
    assert not verdict.breaker_failure
    assert not verdict.breaker_refusal


def test_a_429_is_a_busy_refusal_for_this_call_only() -> None:
    verdict = classify(_coded(429, "queue_full"), RetryPolicy(), now=NOW)
    assert verdict.busy
    assert not verdict.backend_wide
    assert not verdict.breaker_failure
    assert not verdict.breaker_refusal


@pytest.mark.parametrize("status", [429, 503])
def test_deadline_unattainable_is_neither_busy_nor_an_outage(status: int) -> None:
    verdict = classify(_coded(status, "deadline_unattainable"), RetryPolicy(), now=NOW)
    assert verdict.unattainable
    assert not verdict.busy
    assert not verdict.backend_wide
    assert not verdict.breaker_failure


@pytest.mark.parametrize(
    ("value", "expected"), [("24", 24), ("0", None), ("-3", None), ("many", None), (None, None)]
)
def test_the_advertised_capacity(value: str | None, expected: int | None) -> None:
    headers = {} if value is None else {"x-herdless-capacity": value}
    assert parse_capacity(headers) == expected


def test_server_retry_after_is_capped() -> None:
    verdict = classify(_response(503, {"retry-after": "3600"}), RetryPolicy(), now=NOW)
    assert verdict.retry_after == 60.0


@pytest.mark.parametrize(
    ("headers", "body"),
    [
        ({"X-Herdless-Drain": "1", "retry-after": "30"}, b"{}"),
        ({"retry-after": "30"}, b'{"error": {"message": "m", "type": "t", "code": "draining"}}'),
    ],
)
def test_draining_503_is_recognised(headers: dict[str, str], body: bytes) -> None:
    verdict = classify(_response(503, headers, body), RetryPolicy(), now=NOW)
    assert verdict.draining
    assert verdict.retry_after == 30.0


def test_other_503_is_not_draining() -> None:
    body = b'{"error": {"message": "m", "type": "t", "code": "upstream_loading"}}'
    assert not classify(_response(503, {}, body), RetryPolicy(), now=NOW).draining
    assert not classify(_response(503, {}, b"not json"), RetryPolicy(), now=NOW).draining


@pytest.mark.parametrize(
    ("kind", "retryable", "timeout"),
    [
        ("connect", True, False),
        ("connect_timeout", True, True),
        ("first_byte_timeout", True, True),
        ("read_timeout", True, True),
        ("read", True, False),
        ("protocol", False, False),
    ],
)
def test_transport_failures(kind: str, retryable: bool, timeout: bool) -> None:
    failure = TransportFailure(kind=kind, message="boom", elapsed=1.0)  # type: ignore[arg-type]  # kinds are parametrised as str
    verdict = classify(failure, RetryPolicy(), now=NOW)
    assert (verdict.retryable, verdict.timeout, verdict.breaker_failure) == (
        retryable,
        timeout,
        True,
    )
    assert verdict.kind == kind
    assert verdict.fallback_may_help


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_attempts", 0), ("base", 0), ("cap", -1), ("max_retry_after", 0), ("budget_ratio", -0.1)],
)
def test_invalid_policy_names_the_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"RetryPolicy.{field}"):
        RetryPolicy(**{field: value})  # type: ignore[arg-type]  # parametrised


# llm-d's x-llm-d-request-dropped-reason (pkg/common/error/error.go): busy, down or a drain.
@pytest.mark.parametrize(
    ("status", "reason", "busy", "down", "draining"),
    [
        (429, "rejected-saturated", True, False, False),
        (429, "rejected-ttl-expired", True, False, False),
        (503, "rejected-ttl-expired", True, False, False),  # older trees' TTL eviction
        (429, "evicted", True, False, False),
        (429, "evicted-priority", True, False, False),
        (503, "rejected-no-endpoints", False, True, False),
        (503, "rejected-shutting-down", False, False, True),
        (503, "a-reason-from-the-future", True, False, False),  # as a bare 503
    ],
)
def test_llm_d_dropped_reason(
    status: int, reason: str, busy: bool, down: bool, draining: bool
) -> None:
    body = b"inference error: ResourceExhausted - request rejected by flow control"
    headers = {"X-Llm-D-Request-Dropped-Reason": reason}
    verdict = classify(_response(status, headers, body), RetryPolicy(), now=NOW)
    assert (verdict.busy, verdict.down, verdict.draining) == (busy, down, draining)
    assert verdict.retryable
    assert verdict.fallback_may_help
    assert not verdict.breaker_failure


@pytest.mark.parametrize("status", [408, 529])
def test_a_queue_timeout_and_dynamos_529_are_busy(status: int) -> None:
    verdict = classify(_response(status), RetryPolicy(), now=NOW)
    assert verdict.busy
    assert verdict.retryable
    assert verdict.fallback_may_help
    assert not verdict.breaker_failure
    assert not verdict.breaker_refusal  # it said why: busy
    assert not verdict.backend_wide


def test_an_smg_preemption_is_a_reservation() -> None:
    headers = {"Retry-After": "1", "X-SMG-Preempted": "true"}
    body = json.dumps({"error": {"code": "scheduler_preempted"}}).encode()
    verdict = classify(_response(503, headers, body), RetryPolicy(), now=NOW)
    assert verdict.busy
    assert verdict.retry_after == 1.0
    assert not verdict.backend_wide
    assert not verdict.breaker_refusal
