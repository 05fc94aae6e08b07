"""``FallbackPolicy(max_busy_wait=...)``: an app that prefers speed to cost, both clients."""

from __future__ import annotations

from tests.client.client_harness import Harness

import herdless
from herdless.testing import ok, rate_limited


async def test_a_reservation_past_the_patience_goes_to_the_fallback_at_once(
    harness: Harness,
) -> None:
    harness.primary.script(rate_limited(5.0))
    harness.hosted.script(ok("from hosted"))
    harness.build(
        fallback=harness.hosted_backend(),
        fallback_policy=herdless.FallbackPolicy(max_busy_wait=2.0),
    )
    result = await harness.chat()
    assert (result.backend, result.fallback_reason) == ("hosted", "busy")
    assert harness.sleeps == []  # no wait for a busy GPU beyond the app's patience


async def test_a_reservation_within_the_patience_is_waited_for(harness: Harness) -> None:
    harness.primary.script(rate_limited(1.0), ok())
    harness.hosted.script(ok())
    harness.build(
        fallback=harness.hosted_backend(),
        fallback_policy=herdless.FallbackPolicy(max_busy_wait=2.0),
    )
    result = await harness.chat()
    assert result.backend == "primary"
    assert harness.sleeps == [1.25]


async def test_the_data_guard_outranks_the_patience(harness: Harness) -> None:
    harness.primary.script(rate_limited(5.0), ok())
    harness.hosted.script(ok())
    harness.build(
        fallback=harness.hosted_backend(),
        fallback_policy=herdless.FallbackPolicy(max_busy_wait=2.0),
    )
    result = await harness.chat(allow_fallback=False)
    assert result.backend == "primary"  # nowhere else to go: it waits its turn
    assert harness.hosted.requests == []
