"""The scenario table's rows for the serving stacks a herdless client may stand in front
of, run against both clients: each stub answers as that stack does when overloaded, out or
going away, with the status, headers and body its source or docs give.

- llm-d's endpoint picker: ``pkg/common/error/error.go`` (the ``x-llm-d-request-dropped-reason``
  values; ``BuildErrResponse`` writes ``inference error: <code> - <msg>`` as a plain-text
  body, no Retry-After) and ``pkg/epp/requestcontrol/admission.go``
  (``translateFlowControlError``: ``ResourceExhausted`` 429 for ``rejected-saturated`` and
  ``rejected-ttl-expired``; ``ServiceUnavailable`` 503 for ``rejected-no-endpoints`` and
  ``rejected-shutting-down``; older trees answered a TTL eviction with 503), llm-d-router
  main, 2026.
- NVIDIA Dynamo: ``lib/llm/src/http/service/error.rs`` (``DYN_HTTP_OVERLOAD_STATUS_CODE``,
  default 529, no Retry-After) and the router docs' error response
  (``{"message": ..., "type": "Overloaded", "code": 529}``); 503 when no worker exists.
- Ray Serve: ``serve/exceptions.py`` ``BackPressureError`` (``Request dropped due to
  backpressure (...)``, 503), with the static Retry-After of its backpressure config.
- SMG (the SGLang model gateway): the priority scheduler's docs (429
  ``scheduler_queue_full``, 408 ``scheduler_queue_timeout``, 503 ``scheduler_preempted`` with
  ``X-SMG-Preempted: true`` and ``Retry-After: 1``; ``X-SMG-Error-Code`` beside each).

Jitter is at its ceiling (``UpperRandom``): full jitter before retry ``n`` is
``min(8, 0.5 * 2**n)``; a server's Retry-After ``ra`` gives ``ra + max(0.1, 0.25 * ra)``.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from tests.client.client_harness import Harness, Scenario, run_scenario

import herdless
from herdless.testing import Reply, ok

DROPPED = "x-llm-d-request-dropped-reason"


def _reply(status: int, headers: dict[str, str], **body: Any) -> Reply:
    def reply(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, headers=headers, **body)

    return reply


def llmd(status: int, reason: str, code: str, message: str) -> Reply:
    """llm-d's EPP: ``inference error: <code> - <msg>`` as text/plain, the reason header."""
    text = f"inference error: {code} - {message}"
    return _reply(status, {DROPPED: reason, "content-type": "text/plain"}, text=text)


SATURATED = "inference error: ResourceExhausted - request rejected by flow control"


def llmd_saturated() -> Reply:
    return llmd(429, "rejected-saturated", "ResourceExhausted", "request rejected by flow control")


def dynamo(status: int = 529, message: str = "Service temporarily overloaded") -> Reply:
    """Dynamo's frontend: all workers busy (529), no Retry-After."""
    return _reply(status, {}, json={"message": message, "type": "Overloaded", "code": status})


def ray_serve(status: int = 503, retry_after: str | None = "5") -> Reply:
    """Ray Serve's proxy when ``max_queued_requests`` is exceeded."""
    headers = {"retry-after": retry_after} if retry_after is not None else {}
    text = "Request dropped due to backpressure (num_queued_requests=2, max_queued_requests=2)."
    return _reply(status, headers, text=text)


def smg(status: int, code: str, message: str, **headers: str) -> Reply:
    """SMG's scheduler: its error envelope, ``X-SMG-Error-Code`` beside it."""
    body = {"error": {"message": message, "type": "overloaded", "code": code}}
    return _reply(status, {"x-smg-error-code": code, **headers}, json=body)


def smg_preempted() -> Reply:
    return smg(
        503,
        "scheduler_preempted",
        "preempted by a higher-priority request",
        **{"x-smg-preempted": "true", "retry-after": "1"},
    )


STACKS = [
    # -- llm-d ------------------------------------------------------------------------------
    Scenario(
        "llm-d rejected-saturated (429) is busy: waited for, never spilled",
        (llmd_saturated(), llmd_saturated(), ok()),
        hosted=(ok(),),
        primary_requests=3,
        sleeps=(0.5, 1.0),
        attempt_kinds=("status", "status", "ok"),
    ),
    Scenario(
        "llm-d rejected-ttl-expired (429) is busy",
        (
            llmd(429, "rejected-ttl-expired", "ResourceExhausted", "request timed out in queue"),
            ok(),
        ),
        hosted=(ok(),),
        primary_requests=2,
        sleeps=(0.5,),
    ),
    Scenario(
        "llm-d rejected-ttl-expired as older trees sent it (503) is busy",
        (llmd(503, "rejected-ttl-expired", "ServiceUnavailable", "request timed out"), ok()),
        hosted=(ok(),),
        primary_requests=2,
        sleeps=(0.5,),
    ),
    Scenario(
        "llm-d evicted-queue-pressure (429) is busy",
        (llmd(429, "evicted-queue-pressure", "ResourceExhausted", "evicted"), ok()),
        hosted=(ok(),),
        primary_requests=2,
        sleeps=(0.5,),
    ),
    Scenario(
        "llm-d rejected-no-endpoints (503) is down: the fallback at once",
        (llmd(503, "rejected-no-endpoints", "ServiceUnavailable", "no endpoints available"),),
        hosted=(ok(),),
        backend="hosted",
        hosted_requests=1,
        fallback_reason="unavailable",
    ),
    Scenario(
        "llm-d rejected-shutting-down (503) is a drain: the fallback at once",
        (
            llmd(
                503, "rejected-shutting-down", "ServiceUnavailable", "flow controller shutting down"
            ),
        ),
        hosted=(ok(),),
        backend="hosted",
        hosted_requests=1,
        fallback_reason="draining",
    ),
    Scenario(
        "llm-d's plain-text body is the error's server message",
        (llmd_saturated(),),
        call={"deadline": 10.0},
        backend=None,
        error=herdless.RateLimitError,
        primary_requests=-1,
        server_message=SATURATED,
    ),
    # -- NVIDIA Dynamo ----------------------------------------------------------------------
    Scenario(
        "Dynamo 529 (all workers busy) is busy: waited for, never spilled",
        (dynamo(), dynamo(), ok()),
        hosted=(ok(),),
        primary_requests=3,
        sleeps=(0.5, 1.0),
    ),
    Scenario(
        "Dynamo 429 (deadline exceeded) is busy",
        (dynamo(429, "request deadline exceeded"), ok()),
        hosted=(ok(),),
        primary_requests=2,
        sleeps=(0.5,),
    ),
    Scenario(
        "Dynamo 529's message is kept when the deadline runs out",
        (dynamo(),),
        call={"deadline": 10.0},
        backend=None,
        error=herdless.ServiceUnavailableError,
        primary_requests=-1,
        server_message="Service temporarily overloaded",
    ),
    # -- Ray Serve --------------------------------------------------------------------------
    Scenario(
        "Ray Serve 503 with its static Retry-After is a reservation",
        (ray_serve(), ok()),
        hosted=(ok(),),
        primary_requests=2,
        sleeps=(6.0,),  # 5 + the 1 s cap on the spread
    ),
    Scenario(
        "Ray Serve 429 with its static Retry-After is a reservation",
        (ray_serve(429, "2"), ok()),
        hosted=(ok(),),
        primary_requests=2,
        sleeps=(2.5,),
    ),
    Scenario(
        "Ray Serve's plain-text backpressure body is the error's server message",
        (ray_serve(retry_after=None),),
        call={"deadline": 10.0},
        backend=None,
        error=herdless.ServiceUnavailableError,
        primary_requests=-1,
        server_message=(
            "Request dropped due to backpressure (num_queued_requests=2, max_queued_requests=2)."
        ),
    ),
    # -- SMG --------------------------------------------------------------------------------
    Scenario(
        "SMG 429 (queue full) is busy",
        (smg(429, "scheduler_queue_full", "queue full"), ok()),
        hosted=(ok(),),
        primary_requests=2,
        sleeps=(0.5,),
    ),
    Scenario(
        "SMG 408 (queue timeout) is busy, not a bad request",
        (smg(408, "scheduler_queue_timeout", "queue timeout"), ok()),
        hosted=(ok(),),
        primary_requests=2,
        sleeps=(0.5,),
    ),
    Scenario(
        "SMG 408 until the deadline is a RateLimitError",
        (smg(408, "scheduler_queue_timeout", "queue timeout"),),
        call={"deadline": 10.0},
        backend=None,
        error=herdless.RateLimitError,
        primary_requests=-1,
        server_message="queue timeout",
    ),
    Scenario(
        "SMG's preemption (503, X-SMG-Preempted, Retry-After: 1) is a reservation",
        (smg_preempted(), ok()),
        hosted=(ok(),),
        primary_requests=2,
        sleeps=(1.25,),
    ),
]


@pytest.mark.parametrize("case", STACKS, ids=[s.id for s in STACKS])
async def test_stack(harness: Harness, case: Scenario) -> None:
    await run_scenario(harness, case)


async def test_an_smg_preemption_spends_no_retry_budget(harness: Harness) -> None:
    harness.primary.script(smg_preempted(), smg_preempted(), ok())
    harness.hosted.script(ok())
    harness.build(
        fallback=harness.hosted_backend(),
        retry=herdless.RetryPolicy(budget_floor=0, budget_ratio=0),  # no budget at all
    )
    result = await harness.chat()
    assert result.backend == "primary"  # invited back each time: no budget needed, no spill
    assert harness.sleeps == [1.25, 1.25]
    assert harness.client.stats().breakers["primary"] == "closed"


async def test_busy_stacks_never_open_the_breaker(harness: Harness) -> None:
    harness.primary.script(*[dynamo()] * 4, *[llmd_saturated()] * 4, ok())
    harness.hosted.script(ok())
    harness.build(fallback=harness.hosted_backend())
    result = await harness.chat(deadline=120.0)
    assert result.backend == "primary"
    assert harness.hosted.requests == []
    assert harness.client.stats().breakers["primary"] == "closed"


# -- llm-d's request headers, sent beside herdless's own ----------------------------------


async def test_the_call_sends_llm_ds_fairness_id_and_queue_ttl(harness: Harness) -> None:
    await harness.chat(user="alice")
    [sent] = harness.primary.requests
    assert sent.headers["x-llm-d-inference-fairness-id"] == "alice"
    # The attempt waits 60 s for its answer (X-Herdless-Deadline-Ms); it may wait in a
    # queue for that less the least an answer takes (FallbackPolicy.min_attempt, 0.5 s).
    assert sent.headers["x-herdless-deadline-ms"] == "60000"
    assert sent.headers["x-llm-d-inference-ttl"] == "59500ms"


async def test_the_queue_ttl_leaves_the_fallback_its_share(harness: Harness) -> None:
    harness.build(fallback=harness.hosted_backend())
    harness.primary.script(llmd_saturated(), ok())
    await harness.chat(deadline=20.0)
    ttls = [r.headers["x-llm-d-inference-ttl"] for r in harness.primary.requests]
    assert ttls == ["11500ms", "11000ms"]  # 12 s for the primary, then 0.5 s of backoff
    assert "x-llm-d-inference-fairness-id" not in harness.primary.requests[0].headers


async def test_x_herdless_user_is_the_fairness_id_as_the_gateway_reads_it(
    harness: Harness,
) -> None:
    await harness.chat(user="body-user", extra_headers={"X-Herdless-User": "header-user"})
    assert harness.primary.requests[0].headers["x-llm-d-inference-fairness-id"] == "header-user"


async def test_the_callers_own_llm_d_headers_are_kept(harness: Harness) -> None:
    mine = {"x-llm-d-inference-fairness-id": "tenant-a", "X-LLM-D-Inference-TTL": "2s"}
    await harness.chat(user="alice", extra_headers=mine)
    [sent] = harness.primary.requests
    assert sent.headers.get_list("x-llm-d-inference-fairness-id") == ["tenant-a"]
    assert sent.headers.get_list("x-llm-d-inference-ttl") == ["2s"]


async def test_a_user_no_header_can_carry_is_not_sent(harness: Harness) -> None:
    await harness.chat(user="line\nbreak")
    assert "x-llm-d-inference-fairness-id" not in harness.primary.requests[0].headers


async def test_llm_d_headers_can_be_turned_off(harness: Harness) -> None:
    harness.build(llm_d_headers=False)
    await harness.chat(user="alice")
    [sent] = harness.primary.requests
    assert not [name for name in sent.headers if name.startswith("x-llm-d-")]
    assert sent.headers["x-herdless-deadline-ms"] == "60000"
