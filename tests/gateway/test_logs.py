"""What the gateway logs for operators: the formats, the effective configuration, upstream
state changes, admin drain and resume, signals and shutdown; and the admin-off answer."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.gateway.fakes import FakeVllm, GatewayFactory, chat_body, json_lines, rendered, until

from herdless.gateway.app import _poll_once
from herdless.gateway.cli import drain_on_signal
from herdless.gateway.logs import JsonFormatter, TextFormatter, configure, event

pytestmark = [pytest.mark.server]

TIMESTAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
SECRETS = {
    "api_keys": "sk-client-SECRET-1,sk-client-SECRET-2",
    "admin_token": "admin-SECRET-token",
    "key_id_secret": "salt-SECRET",
    "upstream_api_key": "sk-upstream-SECRET",
}


def record(text: str, /, **fields: object) -> logging.LogRecord:
    made = logging.LogRecord("herdless.gateway", logging.INFO, __file__, 1, text, None, None)
    made.fields = fields
    return made


# -- formats ------------------------------------------------------------------------------


def test_the_text_format_is_one_line_with_time_level_logger_and_fields() -> None:
    line = TextFormatter().format(
        record("upstream ready", state="ready", previous=None, note="two words", n=3)
    )
    assert re.fullmatch(
        TIMESTAMP + r" INFO herdless\.gateway upstream ready state=ready previous=- "
        r'note="two words" n=3',
        line,
    )


def test_the_json_format_is_one_object_whose_fields_never_hide_the_envelope() -> None:
    line = JsonFormatter().format(record("config", message="spoof", level="x", port=8080))
    parsed = json.loads(line)
    assert "\n" not in line
    assert re.fullmatch(TIMESTAMP, parsed["ts"])
    assert (parsed["level"], parsed["logger"], parsed["message"]) == (
        "INFO",
        "herdless.gateway",
        "config",
    )
    assert parsed["port"] == 8080


@pytest.fixture
def restored_logging() -> Iterator[None]:
    """configure() rewires the root logger: put it back (pytest's capture included)."""
    names = ("", "herdless.gateway", "uvicorn")
    saved = [
        (logging.getLogger(n), logging.getLogger(n).handlers[:], logging.getLogger(n).level)
        for n in names
    ]
    propagate = [logging.getLogger(n).propagate for n in names]
    yield
    for (logger, handlers, level), flag in zip(saved, propagate, strict=True):
        logger.handlers = handlers
        logger.setLevel(level)
        logger.propagate = flag


@pytest.mark.usefixtures("restored_logging")
def test_configure_sends_uvicorn_and_gateway_lines_in_one_json_format(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    configure("info", "json")
    logging.getLogger("uvicorn.error").info("Uvicorn running on %s", "http://127.0.0.1:1")
    event(logging.getLogger("herdless.gateway.access"), logging.INFO, "POST / 200", status=200)
    logging.getLogger("httpx").info("HTTP Request: GET /health")  # a library's chatter: out
    logging.getLogger("some.library").warning("careful")  # its warnings: in, same format
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(line["logger"], line["message"]) for line in lines] == [
        ("uvicorn.error", "Uvicorn running on http://127.0.0.1:1"),
        ("herdless.gateway.access", "POST / 200"),
        ("some.library", "careful"),
    ]
    assert all(re.fullmatch(TIMESTAMP, line["ts"]) for line in lines)
    assert lines[1]["status"] == 200


# -- events -------------------------------------------------------------------------------


async def test_start_logs_the_effective_config_with_secrets_as_set(
    gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="herdless.gateway")
    url = "http://ops:pass-SECRET@10.0.0.5:8000"
    async with gateway(upstream=url, max_concurrency=7, log_format="json", **SECRETS):
        pass
    (config,) = [
        line
        for line in json_lines(caplog.records, "herdless.gateway")
        if line["message"] == "config"
    ]
    for name in SECRETS:
        assert config[name] == "set"
    assert (config["max_concurrency"], config["log_format"]) == (7, "json")
    assert config["upstream"] == "http://10.0.0.5:8000/"
    text = rendered(caplog.records)
    for secret in [*SECRETS.values(), "sk-client-SECRET-1", "pass-SECRET"]:
        assert secret not in text


async def test_the_config_line_shows_paths_and_urls_as_text_in_both_formats(
    gateway: GatewayFactory, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """A path or a URL is not JSON: the text format's line failed with a logging error."""
    policies = tmp_path / "keys.toml"
    policies.write_text('[keys.a]\nkey = "sk-a-SECRET"\n')
    caplog.set_level(logging.INFO, logger="herdless.gateway")
    hosted = {"fallback_url": "https://me:pw-SECRET@api.example/v1", "fallback_model": "m"}
    async with gateway(key_policies=str(policies), **hosted):
        pass
    (record,) = [r for r in caplog.records if r.getMessage() == "config"]
    text, line = TextFormatter().format(record), json.loads(JsonFormatter().format(record))
    assert f"key_policies={policies}" in text
    assert "fallback_url=https://api.example/v1" in text
    assert (line["key_policies"], line["fallback_url"]) == (str(policies), "https://api.example/v1")
    assert "SECRET" not in text + json.dumps(line)


async def test_unset_secrets_are_logged_as_unset(
    gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="herdless.gateway")
    async with gateway():
        pass
    (config,) = [r.fields for r in caplog.records if r.getMessage() == "config"]  # type: ignore[attr-defined]
    assert [config[name] for name in SECRETS] == ["unset"] * 4


class _Health(httpx.AsyncBaseTransport):
    """vLLM's /health as a script: ``loading`` (503), ``ready`` (200) or ``down`` (refused)."""

    def __init__(self) -> None:
        self.state = "loading"

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.state == "down":
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200 if self.state == "ready" else 503)


async def test_each_upstream_state_change_is_logged_once(
    gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="herdless.gateway")
    health = _Health()
    async with gateway(transport=health) as (_, runtime):  # the first poll: loading
        for state in ("loading", "ready", "ready", "ready", "down", "down", "ready"):
            health.state = state
            await _poll_once(runtime)
    changes = [
        (r.fields["state"], r.fields["previous"], r.levelname)  # type: ignore[attr-defined]
        for r in caplog.records
        if r.getMessage().startswith("upstream ")
    ]
    assert changes == [
        ("loading", None, "INFO"),
        ("ready", "loading", "INFO"),
        ("unavailable", "ready", "WARNING"),
        ("ready", "unavailable", "INFO"),
    ]


async def test_drain_and_resume_say_who_when_and_what_they_did(
    gateway: GatewayFactory, fake_vllm: FakeVllm, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="herdless.gateway")
    fake_vllm.hold = asyncio.Event()
    admin = {"authorization": "Bearer admin-SECRET-token"}
    async with gateway(admin_token=SECRETS["admin_token"], max_concurrency=1) as (client, rt):
        running = asyncio.create_task(client.post("/v1/chat/completions", json=chat_body()))
        waiting = asyncio.create_task(client.post("/v1/chat/completions", json=chat_body()))
        await until(lambda: rt.gate.admission.queue_depth >= 1)
        await client.post("/admin/drain", headers=admin)
        fake_vllm.hold.set()
        await asyncio.gather(running, waiting)
        await client.post("/admin/resume", headers=admin)
    drain, resume = json_lines(caplog.records, "herdless.gateway.audit")
    assert (drain["message"], drain["level"]) == ("admin drain done", "WARNING")
    assert (drain["refused_waiting"], drain["inflight"]) == (1, 1)
    assert (resume["message"], resume["inflight"]) == ("admin resume done", 0)
    for line in (drain, resume):
        assert line["caller"] == "127.0.0.1:123"  # httpx.ASGITransport's peer address
        assert re.fullmatch(TIMESTAMP, line["ts"])
    assert "admin-SECRET-token" not in rendered(caplog.records)


async def test_sigterm_drains_and_says_so_and_the_stop_says_how_it_ended(
    gateway: GatewayFactory, fake_vllm: FakeVllm, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="herdless.gateway")
    fake_vllm.hold = asyncio.Event()
    async with gateway(max_concurrency=1, shutdown_grace=12) as (client, rt):
        running = asyncio.create_task(client.post("/v1/chat/completions", json=chat_body()))
        waiting = asyncio.create_task(client.post("/v1/chat/completions", json=chat_body()))
        await until(lambda: rt.gate.admission.queue_depth >= 1)
        drain_on_signal(rt, signal.SIGTERM)
        refused = await waiting
        fake_vllm.hold.set()
        finished = await running
    assert (refused.status_code, finished.status_code) == (503, 200)
    lines = json_lines(caplog.records, "herdless.gateway")
    (sigterm,) = [line for line in lines if line["message"].startswith("SIGTERM")]
    assert sigterm["message"] == "SIGTERM received: draining"
    assert (sigterm["level"], sigterm["signal"]) == ("WARNING", "SIGTERM")
    assert (sigterm["refused_waiting"], sigterm["inflight"], sigterm["shutdown_grace"]) == (
        1,
        1,
        12,
    )
    stopped = lines[-1]
    assert stopped["message"] == "stopped"
    assert (stopped["draining"], stopped["inflight"], stopped["queue_depth"]) == (True, 0, 0)


# -- admin off ----------------------------------------------------------------------------


@pytest.mark.parametrize("headers", [{}, {"authorization": "Bearer anything"}])
@pytest.mark.parametrize("route", ["/admin/drain", "/admin/resume"])
async def test_admin_without_a_configured_token_says_how_to_turn_it_on(
    gateway: GatewayFactory, headers: dict[str, str], route: str
) -> None:
    async with gateway() as (client, runtime):
        response = await client.post(route, headers=headers)
        assert not runtime.gate.admission.draining
    assert response.status_code == 403
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == "admin_disabled"
    assert "HERDLESS_GATEWAY_ADMIN_TOKEN" in error["message"]
    assert "www-authenticate" not in response.headers


def test_the_format_is_a_flag_and_a_variable_text_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from herdless.gateway.cli import load_settings

    assert load_settings([]).log_format == "text"
    monkeypatch.setenv("HERDLESS_GATEWAY_LOG_FORMAT", "json")
    assert load_settings([]).log_format == "json"
    assert load_settings(["--log-format", "text"]).log_format == "text"
