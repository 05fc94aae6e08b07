"""The gateway's defences: keys, admin token, limits, and what its errors do not say.

In process (``httpx.ASGITransport``, a scripted vLLM behind): constant-time key
checks, keys kept as digests, the admin token, body limits, the access log, and
error bodies that never name the upstream. Gaps found are ``xfail(strict=True)``
with the defect in the reason, so they stay visible until fixed.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

pytest.importorskip("starlette")

import httpx
from tests.gateway.fakes import FakeVllm, RefusingTransport, json_lines, rendered

from herdless.gateway import settings as gateway_settings
from herdless.gateway.app import create_app
from herdless.gateway.runtime import Runtime
from herdless.gateway.settings import ApiKeys, GatewaySettings, key_id, token_matches
from herdless.gateway.wire import BadRequest, parse_chat_request

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
    (line, _refused) = json_lines(caplog.records, "herdless.gateway.access")
    assert line["key_id"].startswith("key-")
    text = rendered(caplog.records)
    for secret in [*KEYS, ADMIN, "wrong-SECRET"]:
        assert secret not in text


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
        assert ":8123" not in response.text  # the port (bare digits occur in a float)
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


# -- key ids --------------------------------------------------------------------------------


def test_a_key_id_is_a_keyed_hash_not_a_plain_digest() -> None:
    """An unsalted digest in a log line lets anyone confirm a guess of the key offline."""
    plain = "key-" + hashlib.sha256(KEYS[0].encode()).hexdigest()[:8]
    table = ApiKeys(KEYS)
    found = table.identify(KEYS[0])
    assert found is not None
    assert re.fullmatch(r"key-[0-9a-f]{8}", found)
    assert found != plain
    # Without a configured secret each table draws its own: ids differ between processes.
    assert ApiKeys(KEYS).identify(KEYS[0]) != found


def test_a_key_id_secret_keeps_ids_stable_across_restarts_and_replicas() -> None:
    secret = b"deployment-secret"
    one, two = ApiKeys(KEYS, id_secret=secret), ApiKeys(KEYS, id_secret=secret)
    assert one.identify(KEYS[1]) == two.identify(KEYS[1]) == key_id(KEYS[1], secret)
    expected = hmac.new(secret, KEYS[1].encode(), hashlib.sha256).hexdigest()[:8]
    assert key_id(KEYS[1], secret) == "key-" + expected
    assert ApiKeys(KEYS, id_secret=b"other").identify(KEYS[1]) != one.identify(KEYS[1])


async def test_the_key_id_secret_comes_from_the_environment_and_is_not_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HERDLESS_GATEWAY_KEY_ID_SECRET", "env-SECRET-salt")
    settings = GatewaySettings(api_keys=",".join(KEYS))  # type: ignore[arg-type]
    table = settings.api_key_table()
    assert table is not None
    assert table.identify(KEYS[0]) == key_id(KEYS[0], b"env-SECRET-salt")
    running = settings.without_secrets()
    assert running.key_id_secret is None
    assert "env-SECRET-salt" not in repr(running) + repr(table)


# -- admin audit ----------------------------------------------------------------------------


async def test_drain_and_resume_leave_an_audit_line_with_the_caller_and_the_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="herdless.gateway")
    async with gateway() as (client, _, _vllm):
        await client.post("/admin/drain", headers={**bearer(ADMIN), "x-request-id": "op-1"})
        await client.post("/admin/resume", headers=bearer(ADMIN))
        await client.post("/admin/drain", headers=bearer("wrong-SECRET"))
        await client.post("/admin/drain")
    lines = json_lines(caplog.records, "herdless.gateway.audit")
    assert [(line["action"], line["outcome"]) for line in lines] == [
        ("drain", "done"),
        ("resume", "done"),
        ("drain", "denied 403"),
        ("drain", "denied 401"),
    ]
    for line in lines:
        assert line["event"] == "admin"
        assert line["caller"] == "127.0.0.1:123"  # httpx.ASGITransport's client address
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line["at"])
    assert lines[0]["request_id"] == "op-1"
    assert all(
        record.levelno == logging.WARNING
        for record in caplog.records
        if record.name.endswith("audit")
    )
    text = rendered(caplog.records)
    for secret in (ADMIN, "wrong-SECRET"):
        assert secret not in text


# -- duplicate JSON keys ----------------------------------------------------------------------

DUPLICATED = (
    b'{"messages":[{"role":"user","content":"a"}],'
    b'"max_tokens":100000,"max_tokens":3,"stream":true,"stream":false}'
)


def test_duplicate_json_keys_are_read_last_wins_like_vllm() -> None:
    """vLLM reads bodies with json.loads (last wins); the gateway prices what vLLM will run."""
    request = parse_chat_request(DUPLICATED)
    assert request.max_tokens == 3
    assert request.stream is False
    reversed_body = DUPLICATED.replace(
        b'"max_tokens":100000,"max_tokens":3', b'"max_tokens":3,"max_tokens":100000'
    )
    with pytest.raises(BadRequest) as refused:
        parse_chat_request(reversed_body)
    assert refused.value.code == "request_too_large"


def test_the_emulator_reads_duplicate_keys_as_the_gateway_does() -> None:
    from herdless.emulator import wire as emulator_wire

    body = DUPLICATED.replace(b"{", b'{"model":"m",', 1)
    emulated = emulator_wire.ChatRequest.model_validate_json(body)
    priced = parse_chat_request(body)
    assert (emulated.max_tokens, emulated.stream) == (priced.max_tokens, priced.stream)


async def test_a_duplicated_body_is_forwarded_unchanged_and_priced_by_its_last_keys() -> None:
    async with gateway(max_inflight_tokens=64) as (client, runtime, vllm):
        response = await client.post(
            "/v1/chat/completions",
            content=DUPLICATED,
            headers={**bearer(KEYS[0]), "content-type": "application/json"},
        )
        assert response.status_code == 200  # priced at 3 tokens, not 100,000
        assert vllm.received[-1][1] == DUPLICATED
        assert runtime.gate.admission.inflight_tokens == 0


# -- redirects ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", ["/healthz/", "/metrics/", "/v1/models/", "/v1/chat/completions/", "/admin/drain/"]
)
async def test_a_trailing_slash_is_a_404_without_a_location(path: str) -> None:
    async with gateway() as (client, _, _vllm):
        for method in ("GET", "POST"):
            response = await client.request(method, path, headers={"host": "evil.example"})
            assert response.status_code == 404
            assert "location" not in response.headers
            assert response.json()["error"]["code"] == "not_found"
