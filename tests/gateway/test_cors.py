"""Web pages of other origins (CORS), in process: what a browser is told, and what it is not.

tests/clients/test_browser.py runs the same with a real Chromium and openai-node.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError
from tests.gateway.fakes import FakeVllm, GatewayFactory, chat_body
from tests.preflight import ASKED, PAGE, PREFLIGHT

from herdless.gateway.cors import EXPOSED, parse_origins
from herdless.gateway.settings import GatewaySettings

pytestmark = [pytest.mark.server]


def cors_headers(response: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k.startswith("access-control-")}


def exposed(response: httpx.Response) -> set[str]:
    text = response.headers.get("access-control-expose-headers", "")
    return {name.strip() for name in text.split(",") if name.strip()}


async def test_the_preflight_allows_what_openai_node_sends_and_costs_no_admission(
    gateway: GatewayFactory, fake_vllm: FakeVllm
) -> None:
    async with gateway(allowed_origins="*", max_concurrency=1, max_queue=0) as (client, runtime):
        runtime.gate.drain()  # refusing every request: a preflight is not one
        response = await client.options("/v1/chat/completions", headers=PREFLIGHT)
        assert response.status_code == 200
        assert cors_headers(response) == {
            "access-control-allow-origin": "*",
            "access-control-allow-methods": "GET, POST",
            "access-control-allow-headers": ASKED,
            "access-control-max-age": "600",
        }
        assert runtime.metrics.requests == {}
    assert fake_vllm.received == []


async def test_answers_to_a_page_say_it_may_read_them_and_the_retry_headers(
    gateway: GatewayFactory,
) -> None:
    async with gateway(allowed_origins="*", rate=0.5, burst=1) as (client, _):
        served = await client.post("/v1/chat/completions", json=chat_body(), headers=PAGE)
        refused = await client.post("/v1/chat/completions", json=chat_body(), headers=PAGE)
        streamed = await client.post(
            "/v1/chat/completions", json=chat_body(stream=True), headers=PAGE
        )
        listed = await client.get("/v1/models", headers=PAGE)
    assert [served.status_code, refused.status_code, listed.status_code] == [200, 429, 200]
    for response in (served, refused, streamed, listed):
        assert response.headers["access-control-allow-origin"] == "*"
        assert exposed(response) == set(EXPOSED)
        own = {name for name in response.headers if name.startswith(("retry-", "x-"))}
        assert own <= set(EXPOSED)  # every header of the gateway's own is readable
    assert {"retry-after", "retry-after-ms", "x-should-retry"} <= exposed(refused)


async def test_a_client_that_is_not_a_browser_gets_no_cors_headers(
    gateway: GatewayFactory,
) -> None:
    async with gateway(allowed_origins="*") as (client, _):
        response = await client.post("/v1/chat/completions", json=chat_body())
        preflight = await client.options("/v1/chat/completions")
    assert response.status_code == 200
    assert cors_headers(response) == {}
    assert "vary" not in response.headers
    assert preflight.status_code == 405


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/admin/drain"), ("GET", "/metrics"), ("GET", "/readyz"), ("GET", "/healthz")],
)
async def test_only_v1_is_open_to_pages_not_health_metrics_or_admin(
    gateway: GatewayFactory, method: str, path: str
) -> None:
    asked = {**PREFLIGHT, "access-control-request-method": method}
    async with gateway(allowed_origins="*", admin_token="admin-secret") as (client, runtime):
        preflight = await client.options(path, headers=asked)
        answer = await client.request(method, path, headers=PAGE)
        assert runtime.gate.admission.draining is False
    assert preflight.status_code == 405
    assert cors_headers(preflight) == {}
    assert cors_headers(answer) == {}


async def test_named_origins_are_echoed_and_others_refused(gateway: GatewayFactory) -> None:
    async with gateway(allowed_origins="https://chat.example, http://127.0.0.1:3000/") as (
        client,
        _,
    ):
        allowed = await client.options("/v1/chat/completions", headers=PREFLIGHT)
        served = await client.post("/v1/chat/completions", json=chat_body(), headers=PAGE)
        other = {**PREFLIGHT, "origin": "https://evil.example"}
        refused = await client.options("/v1/chat/completions", headers=other)
        elsewhere = await client.post(
            "/v1/chat/completions", json=chat_body(), headers={"origin": "https://evil.example"}
        )
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == "https://chat.example"
    assert served.headers["access-control-allow-origin"] == "https://chat.example"
    assert "Origin" in served.headers["vary"]
    assert refused.status_code == 400
    assert "access-control-allow-origin" not in refused.headers
    assert "access-control-allow-origin" not in elsewhere.headers  # the page may not read it


async def test_by_default_no_page_may_call_as_with_vllm(gateway: GatewayFactory) -> None:
    async with gateway() as (client, _):
        preflight = await client.options("/v1/chat/completions", headers=PREFLIGHT)
        served = await client.post("/v1/chat/completions", json=chat_body(), headers=PAGE)
    assert preflight.status_code == 400
    assert preflight.text == "Disallowed CORS origin"  # vLLM's words, for the same question
    assert "access-control-allow-origin" not in preflight.headers
    assert served.status_code == 200
    assert "access-control-allow-origin" not in served.headers


async def test_a_reload_names_a_new_origin_without_a_restart(
    gateway: GatewayFactory, tmp_path: Path
) -> None:
    path = tmp_path / "g.toml"
    path.write_text("allowed_origins = 'https://old.example'\n")
    admin = {"authorization": "Bearer admin-secret"}
    async with gateway(config=path, admin_token="admin-secret") as (client, _):
        before = await client.options("/v1/chat/completions", headers=PREFLIGHT)
        path.write_text("allowed_origins = 'https://old.example, https://chat.example'\n")
        reloaded = await client.post("/admin/reload", headers=admin)
        after = await client.options("/v1/chat/completions", headers=PREFLIGHT)
    assert before.status_code == 400
    assert reloaded.json()["changed"] == {
        "allowed_origins": "https://old.example, https://chat.example"
    }
    assert after.status_code == 200
    assert after.headers["access-control-allow-origin"] == "https://chat.example"


@pytest.mark.parametrize(
    ("text", "origins"),
    [
        ("*", ("*",)),
        ("", ()),
        (
            " https://A.example/ , http://127.0.0.1:3000",
            ("https://a.example", "http://127.0.0.1:3000"),
        ),
        ('["https://a.example", "http://[::1]:8080"]', ("https://a.example", "http://[::1]:8080")),
        ("https://a.example,,", ("https://a.example",)),
    ],
)
def test_origins_are_read_comma_separated_or_as_vllms_json_list(
    text: str, origins: tuple[str, ...]
) -> None:
    assert parse_origins(text) == origins


@pytest.mark.parametrize(
    "text", ["chat.example", "https://chat.example/app", "ftp://chat.example", '["a", 1]', "[1"]
)
def test_a_value_that_is_no_origin_is_refused_saying_what_one_is(text: str) -> None:
    with pytest.raises(ValidationError, match="allowed_origins") as caught:
        GatewaySettings(allowed_origins=text)
    expected = "JSON list of strings" if text.startswith("[") else "scheme://host[:port]"
    assert expected in str(caught.value)
