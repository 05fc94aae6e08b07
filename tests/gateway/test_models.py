"""``GET /v1/models``: authenticated like chat, the request id sanitised, fetches shared and cached.

In process (httpx.ASGITransport), a scripted vLLM behind, a ``FakeClock`` ageing the cache.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from tests.gateway.fakes import FakeVllm, RefusingTransport, until

from herdless.gateway.app import create_app
from herdless.gateway.models import ModelList
from herdless.gateway.runtime import Runtime
from herdless.gateway.settings import GatewaySettings
from herdless.gateway.upstream import Upstream, UpstreamUnavailable
from herdless.testing import FakeClock

pytestmark = [pytest.mark.server]

KEY = {"authorization": "Bearer k1"}


@asynccontextmanager
async def started(
    vllm: FakeVllm,
    clock: FakeClock,
    transport: httpx.AsyncBaseTransport | None = None,
    **overrides: Any,
) -> AsyncIterator[tuple[httpx.AsyncClient, Runtime]]:
    settings = GatewaySettings(health_interval=3600, **overrides)
    app = create_app(
        settings, clock=clock, transport=transport or httpx.ASGITransport(app=vllm.app)
    )
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client,
    ):
        yield client, app.state.runtime


async def test_concurrent_callers_share_one_upstream_fetch_and_keep_their_ids() -> None:
    vllm, clock = FakeVllm(), FakeClock()
    vllm.models_hold = asyncio.Event()
    async with started(vllm, clock) as (client, _):
        calls = [
            asyncio.ensure_future(client.get("/v1/models", headers={"x-request-id": f"id-{n}"}))
            for n in range(10)
        ]
        await until(lambda: len(vllm.models_seen) == 1)
        for _ in range(50):
            await asyncio.sleep(0)  # every caller is waiting now
        vllm.models_hold.set()
        answers = await asyncio.gather(*calls)
    assert len(vllm.models_seen) == 1
    assert {answer.status_code for answer in answers} == {200}
    assert [answer.headers["x-request-id"] for answer in answers] == [f"id-{n}" for n in range(10)]
    assert vllm.models_seen[0]["x-request-id"] == "id-0"  # the caller that started the fetch


async def test_a_200_is_reused_for_the_ttl_then_fetched_again() -> None:
    vllm, clock = FakeVllm(), FakeClock()
    async with started(vllm, clock, models_cache_ttl=2.0) as (client, _):
        first = await client.get("/v1/models")
        clock.advance(1.9)
        second = await client.get("/v1/models")
        clock.advance(0.2)
        third = await client.get("/v1/models")
    assert first.content == second.content == third.content
    assert len(vllm.models_seen) == 2


async def test_an_error_is_relayed_and_never_cached() -> None:
    vllm, clock = FakeVllm(), FakeClock()
    vllm.models_status = 503
    async with started(vllm, clock) as (client, _):
        answers = [await client.get("/v1/models") for _ in range(2)]
        vllm.models_status = 200
        recovered = await client.get("/v1/models")
    assert [answer.status_code for answer in answers] == [503, 503]
    assert answers[0].json()["error"]["message"] == "loading"
    assert recovered.status_code == 200
    assert len(vllm.models_seen) == 3


async def test_a_ttl_of_zero_fetches_every_time() -> None:
    vllm, clock = FakeVllm(), FakeClock()
    async with started(vllm, clock, models_cache_ttl=0) as (client, _):
        for _ in range(3):
            assert (await client.get("/v1/models")).status_code == 200
    assert len(vllm.models_seen) == 3


async def test_a_caller_that_leaves_does_not_cancel_the_fetch_of_the_others() -> None:
    vllm, clock = FakeVllm(), FakeClock()
    vllm.models_hold = asyncio.Event()
    upstream = Upstream("http://vllm", transport=httpx.ASGITransport(app=vllm.app))
    models = ModelList(upstream, ttl=1.0, clock=clock)
    try:
        leaving = asyncio.ensure_future(models.get("a"))
        staying = asyncio.ensure_future(models.get("b"))
        await until(lambda: len(vllm.models_seen) == 1)
        leaving.cancel()
        vllm.models_hold.set()
        answer = await staying
    finally:
        await upstream.aclose()
    assert answer.status == 200
    assert leaving.cancelled()


async def test_an_unreachable_upstream_is_a_503_with_the_request_id() -> None:
    vllm, clock = FakeVllm(), FakeClock()
    async with started(vllm, clock, transport=RefusingTransport()) as (client, _):
        answer = await client.get("/v1/models", headers={"x-request-id": "rid-9"})
    assert answer.status_code == 503
    assert answer.json()["error"]["code"] == "upstream_unavailable"
    assert answer.headers["x-request-id"] == "rid-9"
    assert int(answer.headers["retry-after"]) >= 1


async def test_a_fetch_that_gets_no_answer_raises_upstream_unavailable() -> None:
    upstream = Upstream("http://vllm", transport=RefusingTransport())
    try:
        with pytest.raises(UpstreamUnavailable):
            await ModelList(upstream, ttl=1.0, clock=FakeClock()).get("a")
    finally:
        await upstream.aclose()


async def test_models_needs_a_key_when_keys_are_configured() -> None:
    vllm, clock = FakeVllm(), FakeClock()
    async with started(vllm, clock, api_keys="k1,k2") as (client, _):
        missing = await client.get("/v1/models")
        wrong = await client.get("/v1/models", headers={"authorization": "Bearer nope"})
        right = await client.get("/v1/models", headers=KEY)
    for refused in (missing, wrong):
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "invalid_api_key"
        assert refused.headers["www-authenticate"] == "Bearer"
    assert right.status_code == 200
    assert len(vllm.models_seen) == 1
    assert "authorization" not in vllm.models_seen[0]  # the client's key stays here


@pytest.mark.parametrize("rid", ["r" * 6001, "a b", "é", "x" * 129, ""])
async def test_a_hostile_request_id_is_replaced_and_the_new_one_forwarded(rid: str) -> None:
    vllm, clock = FakeVllm(), FakeClock()
    async with started(vllm, clock) as (client, _):
        answer = await client.get("/v1/models", headers={"x-request-id": rid.encode()})
    echoed = answer.headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", echoed)
    assert vllm.models_seen[0]["x-request-id"] == echoed


def test_a_negative_ttl_is_refused() -> None:
    upstream = Upstream("http://vllm")
    with pytest.raises(ValueError, match="ttl"):
        ModelList(upstream, ttl=-1.0, clock=FakeClock())
