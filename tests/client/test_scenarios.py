"""The scenario table, run against both clients (``client_kind``): what a caller sees when
the primary answers, refuses, breaks or hangs, with and without a fallback.

Jitter is at its ceiling (``UpperRandom``), so waits are exact: full jitter before retry
``n`` is ``min(8, 0.5 * 2**n)``; a server's Retry-After ``ra`` gives ``ra + max(0.1, 0.25 * ra)``.
"""

from __future__ import annotations

import json

import httpx
import pytest
from tests.client.client_harness import (
    HOSTED_KEY,
    KEY,
    MESSAGES,
    Harness,
    Scenario,
    run_scenario,
)

import herdless
from herdless.testing import (
    connect_error,
    deadline_unattainable,
    draining,
    hang,
    ok,
    overloaded,
    rate_limited,
    server_error,
    unavailable,
)

SCENARIOS = [
    Scenario("ok", (ok("hi"),), attempt_kinds=("ok",)),
    Scenario(
        "429 with Retry-After waits at least that long",
        (rate_limited(2.0), ok()),
        primary_requests=2,
        sleeps=(2.5,),
        attempt_kinds=("status", "ok"),
    ),
    Scenario(
        "503 with Retry-After waits at least that long",
        (unavailable(1.0), ok()),
        primary_requests=2,
        sleeps=(1.25,),
    ),
    Scenario(
        "502 and 504 retry with full jitter",
        (server_error(502), server_error(504), ok()),
        primary_requests=3,
        sleeps=(0.5, 1.0),
    ),
    Scenario(
        "a connect error retries",
        (connect_error(), ok()),
        primary_requests=2,
        sleeps=(0.5,),
        attempt_kinds=("connect", "ok"),
    ),
    Scenario(
        "500 is not retried",
        (server_error(500), ok()),
        backend=None,
        error=herdless.ServiceUnavailableError,
    ),
    Scenario(
        "400 raises at once with the server's message",
        (server_error(400, "max_tokens is too large"),),
        backend=None,
        error=herdless.BadRequestError,
    ),
    Scenario(
        "400 never falls back",
        (server_error(400),),
        hosted=(ok(),),
        backend=None,
        error=herdless.BadRequestError,
    ),
    Scenario(
        "401 raises at once", (server_error(401),), backend=None, error=herdless.AuthenticationError
    ),
    Scenario(
        "403 raises at once",
        (server_error(403),),
        backend=None,
        error=herdless.PermissionDeniedError,
    ),
    Scenario(
        "404 is a bad request", (server_error(404),), backend=None, error=herdless.BadRequestError
    ),
    Scenario(
        "a hung primary falls back at once",
        (hang(),),
        hosted=(ok("from hosted"),),
        backend="hosted",
        hosted_requests=1,
        fallback_reason="timeout",
        attempt_kinds=("first_byte_timeout", "ok"),
    ),
    Scenario(
        "a hung primary without fallback is retried, then times out",
        (hang(), ok()),
        primary_requests=2,
        sleeps=(0.5,),
    ),
    Scenario(
        "a draining primary falls back at once",
        (draining(30.0),),
        hosted=(ok(),),
        backend="hosted",
        hosted_requests=1,
        fallback_reason="draining",
    ),
    Scenario(
        "a Retry-After longer than the deadline is not waited for",
        (rate_limited(120.0),),
        call={"deadline": 10.0},
        backend=None,
        error=herdless.RateLimitError,
    ),
    Scenario(
        "allow_fallback=False never reaches an external fallback",
        (draining(30.0),),
        hosted=(ok(),),
        call={"allow_fallback": False, "deadline": 10.0},  # the drain outlasts the call
        backend=None,
        error=herdless.FallbackNotAllowed,
    ),
    Scenario(
        "garbage in a 200 is a failed attempt, served by the fallback",
        (lambda request: httpx.Response(200, content=b"<html>oops</html>"),),
        hosted=(ok(),),
        backend="hosted",
        hosted_requests=1,
        attempt_kinds=("protocol", "ok"),
        fallback_reason="failed",
    ),
    Scenario(
        "a busy primary (vLLM's bare 503) is waited for, never spilled while the deadline allows",
        (overloaded(), overloaded(), overloaded(), ok()),
        hosted=(ok(),),
        primary_requests=4,
        sleeps=(0.5, 1.0, 2.0),
        attempt_kinds=("status", "status", "status", "ok"),
    ),
    Scenario(
        "a busy primary's reservation is honoured, and never spilled while it fits",
        (rate_limited(5.0), rate_limited(5.0), ok()),
        hosted=(ok(),),
        primary_requests=3,
        sleeps=(6.0, 6.0),
    ),
    Scenario(
        "a primary that says it is down sends the call to the fallback at once",
        (unavailable(5.0),),
        hosted=(ok(),),
        backend="hosted",
        hosted_requests=1,
        fallback_reason="unavailable",
    ),
    Scenario(
        "the gateway's deadline_unattainable moves the call on at once",
        (deadline_unattainable(429),),
        hosted=(ok(),),
        backend="hosted",
        hosted_requests=1,
        fallback_reason="deadline_unattainable",
    ),
    Scenario(
        "deadline_unattainable with nowhere to go raises at once",
        (deadline_unattainable(429),),
        backend=None,
        error=herdless.DeadlineExceeded,
    ),
    Scenario(
        "a 429 without a time keeps trying until the deadline, not max_attempts",
        (rate_limited(None),),
        call={"deadline": 30.0},
        backend=None,
        error=herdless.RateLimitError,
        primary_requests=-1,
    ),
    Scenario(
        "both backends down: every backend's error is kept",
        (connect_error(),),
        hosted=(connect_error(),),
        call={"deadline": 2.0},
        backend=None,
        error=herdless.AllBackendsFailed,
        primary_requests=-1,  # as many as the deadline allows
        hosted_requests=-1,
    ),
]


@pytest.mark.parametrize("case", SCENARIOS, ids=[s.id for s in SCENARIOS])
async def test_scenario(harness: Harness, case: Scenario) -> None:
    await run_scenario(harness, case)


async def test_one_request_id_across_attempts_and_numbered_attempts(harness: Harness) -> None:
    harness.primary.script(rate_limited(1.0), unavailable(1.0), ok())
    result = await harness.chat()
    sent = harness.primary.requests
    assert {r.headers["x-request-id"] for r in sent} == {result.request_id}
    assert [r.headers["x-herdless-attempt"] for r in sent] == ["1", "2", "3"]
    assert [a.attempt for a in result.attempts] == [1, 2, 3]


async def test_request_carries_model_auth_and_extra_fields(harness: Harness) -> None:
    harness.hosted.script(ok())
    harness.primary.script(draining())
    harness.build(fallback=harness.hosted_backend())
    await harness.chat(max_tokens=5, temperature=0.2, seed=3, response_format={"type": "text"})
    [to_primary] = harness.primary.requests
    [to_hosted] = harness.hosted.requests
    assert to_primary.headers["authorization"] == f"Bearer {KEY}"
    assert to_hosted.headers["authorization"] == f"Bearer {HOSTED_KEY}"
    body = json.loads(to_primary.content)
    assert body == {
        "model": "gemma",
        "messages": MESSAGES,
        "max_tokens": 5,
        "temperature": 0.2,
        "seed": 3,
        "response_format": {"type": "text"},
    }
    # The fallback is asked for its own model, not the primary's.
    assert json.loads(to_hosted.content)["model"] == "gpt-mini"


async def test_per_call_model_override(harness: Harness) -> None:
    await harness.chat(model="gemma-big")
    assert harness.primary.bodies[0]["model"] == "gemma-big"


async def test_result_fields(harness: Harness) -> None:
    harness.primary.script(ok("four words of text"))
    result = await harness.chat()
    assert result.content == "four words of text"
    assert result.model == "gemma"
    assert result.usage == herdless.Usage(prompt_tokens=1, completion_tokens=4, total_tokens=5)
    assert result.finish_reason == "stop"
    assert result.raw["object"] == "chat.completion"
    assert "raw" not in repr(result)


async def test_bad_request_error_carries_the_server_message(harness: Harness) -> None:
    harness.primary.script(server_error(400, "max_tokens=5000 cannot be greater than 2048"))
    with pytest.raises(herdless.BadRequestError) as caught:
        await harness.chat()
    assert caught.value.status == 400
    assert caught.value.server_message == "max_tokens=5000 cannot be greater than 2048"
    assert "max_tokens=5000" in str(caught.value)


async def test_retries_give_up_with_every_attempt_recorded(harness: Harness) -> None:
    harness.primary.script(unavailable(0.5))
    with pytest.raises(herdless.ServiceUnavailableError) as caught:
        await harness.chat()
    error = caught.value
    sent = harness.primary.requests
    assert 1 < len(sent) <= herdless.RetryPolicy().max_attempts
    assert [a.status for a in error.attempts] == [503] * len(sent)
    assert error.retry_after == 0.5
    assert {r.headers["x-request-id"] for r in sent} == {error.request_id}


async def test_breaker_opens_and_skips_the_primary(harness: Harness) -> None:
    harness.primary.script(hang())
    harness.hosted.script(ok())
    harness.build(
        fallback=harness.hosted_backend(),
        breaker=herdless.BreakerPolicy(consecutive_failures=2, open_for=30.0),
    )
    for _ in range(2):
        assert (await harness.chat()).fallback_reason == "timeout"
    result = await harness.chat()
    assert result.fallback_reason == "breaker_open"
    assert len(harness.primary.requests) == 2  # the third call never reached it
    assert result.attempts[0].kind == "skipped_breaker_open"
    assert harness.client.stats().breakers["primary"] == "open"


async def test_stats_count_what_happened(harness: Harness) -> None:
    harness.primary.script(rate_limited(1.0), ok())
    await harness.chat()
    stats = harness.client.stats()
    assert stats.calls == stats.succeeded == 1
    assert stats.retries == 1
    assert stats.by_backend["primary"]["attempts"] == 2


async def test_a_large_answer_is_read_whole_and_an_error_body_is_capped(harness: Harness) -> None:
    big = "x" * 200_000
    harness.primary.script(
        lambda request: httpx.Response(500, content=b"E" * 1_000_000),
        ok(big),
    )
    harness.build(fallback=harness.hosted_backend())
    harness.hosted.script(ok(big))
    result = await harness.chat()
    assert result.content == big  # served by the fallback after the 500
    assert result.attempts[0].status == 500


async def test_bad_arguments_fail_before_any_request(harness: Harness) -> None:
    with pytest.raises(TypeError):
        await harness.chat(messages="hello")
    with pytest.raises(TypeError):
        await harness.chat(messages=[("user", "hello")])
    assert harness.primary.requests == []


async def test_every_attempt_says_how_long_the_caller_waits_for_it(harness: Harness) -> None:
    harness.primary.script(server_error(502), rate_limited(2.0), ok())
    harness.hosted.script(ok())
    harness.build(fallback=harness.hosted_backend())
    await harness.chat(deadline=20.0)
    sent = [int(r.headers["x-herdless-deadline-ms"]) for r in harness.primary.requests]
    # The primary may use the deadline less the 40 % kept for the fallback: 12 s, less
    # what the waits before each attempt used (0.5 s, then 2.5 s).
    assert sent == [12_000, 11_500, 9_000]


async def test_a_reservation_spends_no_retry_budget(harness: Harness) -> None:
    harness.primary.script(rate_limited(1.0), rate_limited(1.0), rate_limited(1.0), ok())
    harness.hosted.script(ok())
    harness.build(
        fallback=harness.hosted_backend(),
        retry=herdless.RetryPolicy(budget_floor=0, budget_ratio=0),  # no budget at all
    )
    result = await harness.chat()
    assert result.backend == "primary"  # invited back each time: no budget needed, no spill
    assert len(harness.primary.requests) == 4
    assert harness.client.stats().waits == 3  # the three reservations, nothing else


async def test_a_drain_holds_every_call_of_the_client(harness: Harness) -> None:
    harness.primary.script(draining(30.0))
    harness.hosted.script(ok())
    harness.build(fallback=harness.hosted_backend())
    first = await harness.chat()
    second = await harness.chat()
    assert (first.fallback_reason, second.fallback_reason) == ("draining", "draining")
    assert len(harness.primary.requests) == 1  # the second call never touched the primary
    assert harness.sleeps == []


async def test_a_busy_primary_with_a_fallback_serves_without_spilling(harness: Harness) -> None:
    refusals = [overloaded()] * 6 + [rate_limited(3.0)] * 3
    harness.primary.script(*refusals, ok())
    harness.hosted.script(ok())
    harness.build(fallback=harness.hosted_backend())
    result = await harness.chat(deadline=120.0)
    assert result.backend == "primary"
    assert harness.hosted.requests == []  # nothing sent out, nothing paid for
    stats = harness.client.stats()
    assert stats.fallbacks == {}
    assert stats.breakers["primary"] == "closed"
