"""The gateway's defences: keys, admin token, limits, and what its errors do not say.

In process (``httpx.ASGITransport``, a scripted vLLM behind): constant-time key
checks, keys kept as digests, the admin token, body limits, the access log, and
error bodies that never name the upstream. Gaps found are ``xfail(strict=True)``
with the defect in the reason, so they stay visible until fixed.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

pytest.importorskip("starlette")

import httpx
from tests.gateway.fakes import FakeVllm, RefusingTransport

from herdless.gateway import settings as gateway_settings
from herdless.gateway.app import create_app
from herdless.gateway.runtime import Runtime
from herdless.gateway.settings import ApiKeys, GatewaySettings, token_matches

pytestmark = [pytest.mark.server]

KEYS = ["key-alpha-SECRET-1", "key-beta-SECRET-2", "key-gamma-SECRET-3"]
ADMIN = "admin-SECRET-token"
UPSTREAM = "http://10.9.8.7:8123"  # never reached (in-process transport); must never be shown
BODY = {"messages": [{"role": "user", "content": "hi"}]}


@asynccontextmanager
async def gateway(
    transport: httpx.AsyncBaseTransport | None = None, **overrides: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, Runtime, FakeVllm]]:
    vllm = FakeVllm()
    settings = GatewaySettings(
        upstream=UPSTREAM,  # type: ignore[arg-type]
        api_keys=",".join(KEYS),  # type: ignore[arg-type]
        admin_token=ADMIN,  # type: ignore[arg-type]
        health_interval=3600,
        **overrides,
    )
    app = create_app(settings, transport=transport or httpx.ASGITransport(app=vllm.app))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client,
    ):
        yield client, app.state.runtime, vllm


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def test_api_keys_are_compared_in_constant_time_over_every_entry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[bytes, bytes]] = []
    compare = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return compare(a, b)

    monkeypatch.setattr(gateway_settings.hmac, "compare_digest", spy)
    table = ApiKeys(KEYS)
    for presented in (KEYS[0], KEYS[2], "wrong", ""):
        calls.clear()
        table.identify(presented)
        # Every stored entry is compared, whether the first one matches or none does.
        assert len(calls) == len(KEYS)
        assert all(len(a) == len(b) == 32 for a, b in calls)  # digests, equal length
    calls.clear()
    assert token_matches(ADMIN, gateway_settings.SecretStr(ADMIN))
    assert len(calls) == 1


def test_api_keys_are_kept_only_as_digests() -> None:
    table = ApiKeys(KEYS)
    held = repr(table) + repr(table._table)  # white-box: what the table holds
    for key in KEYS:
        assert key not in held
        assert key.encode() not in b"".join(digest for digest, _ in table._table)
    assert table.identify(KEYS[1]) is not None
    assert table.identify(KEYS[1]) != KEYS[1]  # the id is not the key


async def test_the_running_gateway_holds_no_raw_key() -> None:
    async with gateway() as (_, runtime, _vllm):
        held = runtime.settings.model_dump()
        raw = [
            value.get_secret_value()
            for value in held.values()
            if hasattr(value, "get_secret_value")
        ]
        assert not any(key in secret for key in [*KEYS, ADMIN] for secret in raw)


async def test_admin_endpoints_need_the_admin_token() -> None:
    async with gateway() as (client, runtime, _vllm):
        for action in ("drain", "resume"):
            assert (await client.post(f"/admin/{action}")).status_code == 401
            assert (
                await client.post(f"/admin/{action}", headers=bearer(KEYS[0]))
            ).status_code == 403
            assert (
                await client.post(f"/admin/{action}", headers=bearer("x" + ADMIN))
            ).status_code == 403
        assert not runtime.gate.admission.draining
        assert (await client.post("/admin/drain", headers=bearer(ADMIN))).status_code == 200
        assert runtime.gate.admission.draining


async def test_no_admin_token_configured_means_no_admin() -> None:
    vllm = FakeVllm()
    app = create_app(
        GatewaySettings(health_interval=3600), transport=httpx.ASGITransport(app=vllm.app)
    )
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client,
    ):
        response = await client.post("/admin/drain", headers=bearer("anything"))
        assert response.status_code == 403
        assert not app.state.runtime.gate.admission.draining


async def test_a_client_key_is_never_forwarded_upstream() -> None:
    async with gateway(upstream_api_key="upstream-SECRET") as (client, _, vllm):
        response = await client.post("/v1/chat/completions", json=BODY, headers=bearer(KEYS[0]))
        assert response.status_code == 200
        headers, _body = vllm.received[-1]
        assert headers.get("authorization") == "Bearer upstream-SECRET"
        assert all(key not in json.dumps(headers) for key in KEYS)


async def test_the_access_log_names_the_key_id_never_the_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="herdless.gateway")
    async with gateway() as (client, _, _vllm):
        await client.post("/v1/chat/completions", json=BODY, headers=bearer(KEYS[0]))
        await client.post("/v1/chat/completions", json=BODY, headers=bearer("wrong-SECRET"))
        await client.post("/admin/drain", headers=bearer(ADMIN))
    lines = [record.getMessage() for record in caplog.records]
    assert any('"key_id":"key-' in line for line in lines)
    for secret in [*KEYS, ADMIN, "wrong-SECRET"]:
        assert secret not in caplog.text


async def test_errors_never_name_the_upstream() -> None:
    async with gateway(transport=RefusingTransport()) as (client, runtime, _vllm):
        runtime.gate.set_upstream(ready=True)  # as if it was up a moment ago
        chat = await client.post("/v1/chat/completions", json=BODY, headers=bearer(KEYS[0]))
        models = await client.get("/v1/models", headers=bearer(KEYS[0]))
        ready = await client.get("/readyz")
    for response in (chat, models):
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "upstream_unavailable"
    for response in (chat, models, ready):
        assert "10.9.8.7" not in response.text
        assert "8123" not in response.text
        assert "Traceback" not in response.text


async def test_body_limit_is_enforced() -> None:
    async with gateway(max_body_bytes=1024) as (client, _, vllm):
        big = {"messages": [{"role": "user", "content": "x" * 2048}]}
        response = await client.post("/v1/chat/completions", json=big, headers=bearer(KEYS[0]))
        assert response.status_code == 413
        assert vllm.received == []


async def test_number_of_messages_is_limited() -> None:
    async with gateway(max_body_bytes=8 * 1024 * 1024) as (client, _, vllm):
        many = {"messages": [{"role": "user", "content": ""}] * 100_000}
        response = await client.post("/v1/chat/completions", json=many, headers=bearer(KEYS[0]))
        assert response.status_code == 400
        assert vllm.received == []


async def test_max_tokens_is_limited_by_default() -> None:
    async with gateway() as (client, _, vllm):
        huge = {**BODY, "max_tokens": 10**9}
        response = await client.post("/v1/chat/completions", json=huge, headers=bearer(KEYS[0]))
        assert response.status_code == 400
        assert vllm.received == []


async def test_max_tokens_beyond_the_kv_budget_is_refused_when_configured() -> None:
    async with gateway(max_inflight_tokens=4096) as (client, _, vllm):
        huge = {**BODY, "max_tokens": 10**9}
        response = await client.post("/v1/chat/completions", json=huge, headers=bearer(KEYS[0]))
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "request_too_large"
        assert vllm.received == []
