"""In-process gateway fixtures: the gateway app over httpx.ASGITransport, a fake vLLM behind."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from tests.gateway.fakes import FakeVllm, GatewayFactory

from herdless.gateway.app import create_app
from herdless.gateway.runtime import Runtime
from herdless.gateway.settings import GatewaySettings


@pytest.fixture
def fake_vllm() -> FakeVllm:
    return FakeVllm()


@pytest.fixture
def gateway(fake_vllm: FakeVllm) -> GatewayFactory:
    """``async with gateway(**settings) as (client, runtime)``: a started gateway
    (``fallback_transport``: the hosted fallback's, with ``fallback_url`` set)."""

    @asynccontextmanager
    async def start(
        transport: httpx.AsyncBaseTransport | None = None,
        fallback_transport: httpx.AsyncBaseTransport | None = None,
        **overrides: Any,
    ) -> AsyncIterator[tuple[httpx.AsyncClient, Runtime]]:
        overrides.setdefault("health_interval", 3600)  # tests flip readiness themselves
        overrides.setdefault("metrics_interval", 3600)  # and read the engine themselves
        settings = GatewaySettings(**overrides)
        app = create_app(
            settings,
            transport=transport or httpx.ASGITransport(app=fake_vllm.app),
            fallback_transport=fallback_transport,
        )
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://gateway"
            ) as client,
        ):
            yield client, app.state.runtime

    return start
