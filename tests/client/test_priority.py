"""``priority=``: sent as X-Herdless-Priority, a client default, and batch work that waits
for the GPU (a displaced call comes back at its reservation; it never spills outside).
Every test runs against both clients."""

from __future__ import annotations

import pytest
from tests.client.client_harness import Harness

import herdless
from herdless.testing import ok, rate_limited


async def test_every_attempt_carries_the_calls_class(harness: Harness) -> None:
    harness.primary.script(rate_limited(1.0), ok(), ok(), ok())
    harness.build()
    await harness.chat(priority="batch")
    await harness.chat()
    await harness.chat(priority="interactive")
    sent = [r.headers["x-herdless-priority"] for r in harness.primary.requests]
    assert sent == ["batch", "batch", "interactive", "interactive"]


async def test_the_client_default_and_a_calls_own_class(harness: Harness) -> None:
    harness.primary.script(ok(), ok())
    harness.build(priority="batch")
    await harness.chat()
    await harness.chat(priority="interactive")
    sent = [r.headers["x-herdless-priority"] for r in harness.primary.requests]
    assert sent == ["batch", "interactive"]


async def test_an_unknown_class_fails_before_any_request(harness: Harness) -> None:
    harness.build()
    with pytest.raises(ValueError, match="priority"):
        await harness.chat(priority="urgent")
    with pytest.raises(ValueError, match="extra_headers may not set X-Herdless-Priority"):
        await harness.chat(extra_headers={"X-Herdless-Priority": "interactive"})
    assert harness.primary.requests == []
    with pytest.raises(ValueError, match="priority"):
        harness.build(priority="low")


async def test_a_displaced_batch_call_waits_for_its_reservation_and_spends_no_budget(
    harness: Harness,
) -> None:
    harness.primary.script(rate_limited(3.0, code="displaced"), ok("served by the GPU"))
    harness.hosted.script(ok("spilled"))
    harness.build(
        fallback=harness.hosted_backend(),
        fallback_policy=herdless.FallbackPolicy(on_backpressure="fallback"),
        retry=herdless.RetryPolicy(budget_floor=0, budget_ratio=0),  # no budget at all
    )
    result = await harness.chat(priority="batch")
    assert (result.backend, result.content) == ("primary", "served by the GPU")
    assert harness.hosted.requests == []
    assert harness.sleeps[0] >= 3.0  # the gateway's time for it (plus jitter), waited
    assert [a.status for a in result.attempts] == [429, 200]
    assert harness.client.stats().fallbacks == {}


async def test_the_same_refusal_sends_an_interactive_call_to_the_fallback(
    harness: Harness,
) -> None:
    harness.primary.script(rate_limited(3.0, code="queue_full"))
    harness.hosted.script(ok("spilled"))
    harness.build(
        fallback=harness.hosted_backend(),
        fallback_policy=herdless.FallbackPolicy(on_backpressure="fallback"),
    )
    result = await harness.chat()
    assert result.backend == "hosted"  # interactive work spills, as configured


async def test_batch_may_use_an_internal_fallback_but_not_an_external_one(
    harness: Harness,
) -> None:
    harness.primary.script(rate_limited(3.0, code="displaced"))
    harness.hosted.script(ok("second GPU"))
    harness.build(
        fallback=harness.hosted_backend(external=False),
        fallback_policy=herdless.FallbackPolicy(on_backpressure="fallback"),
    )
    result = await harness.chat(priority="batch")
    assert result.backend == "hosted"


async def test_a_batch_call_refused_past_its_deadline_fails_without_spilling(
    harness: Harness,
) -> None:
    harness.primary.script(*[rate_limited(4.0, code="displaced")] * 5)
    harness.hosted.script(ok("spilled"))
    harness.build(fallback=harness.hosted_backend())
    with pytest.raises(herdless.HerdlessError):
        await harness.chat(priority="batch", deadline=10.0)
    assert harness.hosted.requests == []
    assert len(harness.primary.requests) >= 2  # it waited for the GPU while it could


async def test_a_derived_client_has_its_own_default_class(harness: Harness) -> None:
    harness.primary.script(ok(), ok())
    parent = harness.build()
    jobs = parent.with_options(priority="batch")
    harness.client = jobs  # the harness calls the derived client (it shares the parent's)
    await harness.chat()
    await harness.chat(priority="interactive")
    harness.client = parent  # the one the harness closes
    sent = [r.headers["x-herdless-priority"] for r in harness.primary.requests]
    assert sent == ["batch", "interactive"]
    with pytest.raises(ValueError, match="priority"):
        jobs.with_options(priority="low")
