"""Fixtures: ``client_kind`` runs every test against ``Client`` and ``AsyncClient``;
``harness`` builds that client with fakes (see ``client_harness``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import respx
from tests.client.client_harness import Harness


@pytest.fixture(params=["sync", "async"])
def client_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def router() -> respx.MockRouter:
    # Used as the clients' transport (see Harness.build), not patched into httpx: no
    # global state, and no TLS context built per client.
    return respx.MockRouter(assert_all_called=False)


@pytest.fixture
async def harness(client_kind: str, router: respx.MockRouter) -> AsyncIterator[Harness]:
    h = Harness(client_kind, router)
    yield h
    await h.close()
