"""The gateway's hosted fallback and holds (in process): a fake vLLM as the GPU, a second
one as the hosted model; key policies from a file; the hints every OpenAI client obeys."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.gateway.fakes import FakeVllm, GatewayFactory, RefusingTransport, chat_body, until

from herdless.gateway.runtime import Runtime

ADMIN = {"authorization": "Bearer admin-secret"}
SPILL = {"authorization": "Bearer sk-spill-secret"}
KEEP = {"authorization": "Bearer sk-keep-secret"}
POLICIES = """\
[keys.webui]
key = "sk-spill-secret"
fallback = true
hold = 0.5
user_header = "X-OpenWebUI-User-Id"

[keys.internal]
key = "sk-keep-secret"
hold = 120
priority = "batch"

[fallback]
max_tokens = 20
"""

Started = AbstractAsyncContextManager[tuple[httpx.AsyncClient, Runtime]]


@pytest.fixture
def hosted() -> FakeVllm:
    return FakeVllm()


@pytest.fixture
def spilling(gateway: GatewayFactory, hosted: FakeVllm, tmp_path: Path) -> Callable[..., Started]:
    """A gateway with the two keys above and the hosted fallback."""
    path = tmp_path / "keys.toml"
    path.write_text(POLICIES)

    def start(**overrides: Any) -> Started:
        return gateway(
            fallback_transport=httpx.ASGITransport(app=hosted.app),
            key_policies=path,
            fallback_url="http://hosted.example/v1",
            fallback_model="hosted-model",
            fallback_api_key="sk-hosted-secret",
            admin_token="admin-secret",
            **overrides,
        )

    return start


async def test_a_drained_gpu_spills_a_key_that_may_to_the_hosted_model(
    spilling: Callable[..., Started],
    fake_vllm: FakeVllm,
    hosted: FakeVllm,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="herdless.gateway")
    async with spilling() as (client, _):
        await client.post("/admin/drain?expect=20", headers=ADMIN)
        spilled = await client.post("/v1/chat/completions", json=chat_body(), headers=SPILL)
        sdk = await client.post(
            "/v1/chat/completions",
            json=chat_body(),
            headers=SPILL | {"x-herdless-deadline-ms": "30000"},
        )
        text = await client.post(
            "/v1/completions", json={"model": "m", "prompt": "Hi"}, headers=SPILL
        )
        metrics = (await client.get("/metrics")).text
    assert spilled.status_code == 200
    assert spilled.headers["x-herdless-backend"] == "hosted"
    assert spilled.headers["x-herdless-fallback-reason"] == "draining"
    assert spilled.json()["choices"][0]["message"]["content"] == "Hi"
    assert fake_vllm.received == []
    sent_headers, sent = hosted.received[0]
    assert json.loads(sent)["model"] == "hosted-model"  # the hosted model's name, not the GPU's
    assert sent_headers["authorization"] == "Bearer sk-hosted-secret"
    # A herdless client (it names its deadline) decides itself: told, not spilled; and
    # only chat goes to the hosted model (through the SDK, which speaks chat).
    for told in (sdk, text):
        assert told.status_code == 503
        assert told.json()["error"]["code"] == "draining"
    assert len(hosted.received) == 1
    assert (
        'herdless_gateway_spills_total{key="webui",reason="draining",outcome="served"} 1' in metrics
    )
    assert 'herdless_gateway_spill_tokens_total{key="webui",kind="completion"} 1' in metrics
    audit = [r for r in caplog.records if r.name == "herdless.gateway.audit" and "spill" in r.msg]
    assert len(audit) == 1
    assert "secret" not in caplog.text


async def test_an_upstream_out_for_a_time_no_one_knows_spills_at_once_what_may_spill(
    spilling: Callable[..., Started], fake_vllm: FakeVllm, hosted: FakeVllm
) -> None:
    node = {"user-agent": "node"}  # a client that never retries: one that may not waits
    async with spilling() as (client, runtime):
        runtime.gate.set_upstream(ready=False, code="upstream_unavailable")  # no load known
        first = await client.post("/v1/chat/completions", json=chat_body(), headers=SPILL | node)
        again = await client.post("/v1/chat/completions", json=chat_body(), headers=SPILL | node)
    for spilled in (first, again):  # an outage: the hosted model answers, at once
        assert spilled.status_code == 200
        assert spilled.headers["x-herdless-fallback-reason"] == "upstream_unavailable"
    assert runtime.gate.admission.queue_depth == 0
    assert len(hosted.received) == 2
    assert fake_vllm.received == []


async def test_a_key_that_may_not_spill_waits_out_the_window_and_is_served_after_it(
    spilling: Callable[..., Started], fake_vllm: FakeVllm, hosted: FakeVllm
) -> None:
    async with spilling() as (client, runtime):
        await client.post("/admin/drain?expect=20", headers=ADMIN)
        held = asyncio.create_task(
            client.post("/v1/chat/completions", json=chat_body(), headers=KEEP)
        )
        await until(lambda: runtime.gate.admission.queue_depth == 1)
        assert fake_vllm.received == []
        await client.post("/admin/resume", headers=ADMIN)
        answer = await held
    assert answer.status_code == 200
    assert answer.headers["x-herdless-backend"] == "upstream"
    assert int(answer.headers["x-herdless-queue-ms"]) >= 0  # it waited in the gateway
    assert hosted.received == []
    assert len(fake_vllm.received) == 1


@pytest.mark.parametrize(
    ("expect", "retry_after", "should_retry"), [("40", "40", None), ("300", "59", "false")]
)
async def test_a_window_longer_than_the_hold_is_refused_with_its_end(
    gateway: GatewayFactory, expect: str, retry_after: str, should_retry: str | None
) -> None:
    async with gateway(admin_token="admin-secret", queue_timeout=10) as (client, _):
        await client.post(f"/admin/drain?expect={expect}", headers=ADMIN)
        refused = await client.post("/v1/chat/completions", json=chat_body())
    assert refused.status_code == 503
    assert refused.headers["retry-after"] == retry_after
    millis = int(refused.headers["retry-after-ms"])  # the window's end, less the time passed
    assert int(retry_after) * 1000 - 1000 < millis <= int(retry_after) * 1000
    assert refused.headers.get("x-should-retry") == should_retry
    assert "maintenance" in refused.json()["error"]["message"]


@pytest.mark.parametrize("expect", ["soon", "0", "-5", "1e9"])
async def test_a_bad_window_is_a_400_after_the_token_is_checked(
    gateway: GatewayFactory, expect: str
) -> None:
    async with gateway(admin_token="admin-secret") as (client, runtime):
        denied = await client.post(f"/admin/drain?expect={expect}")
        bad = await client.post(f"/admin/drain?expect={expect}", headers=ADMIN)
        assert runtime.gate.admission.draining is False
    assert denied.status_code == 401
    assert bad.status_code == 400
    assert "expect" in bad.json()["error"]["message"]


async def test_a_full_queue_or_a_wait_past_the_hold_spills_at_once(
    spilling: Callable[..., Started], fake_vllm: FakeVllm, hosted: FakeVllm
) -> None:
    fake_vllm.hold = asyncio.Event()
    async with spilling(max_concurrency=1, max_queue=1) as (client, runtime):
        running = asyncio.create_task(
            client.post("/v1/chat/completions", json=chat_body(), headers=KEEP)
        )
        await until(lambda: runtime.gate.admission.inflight == 1)
        # One running for about a second (the first guess): a wait past the 0.5 s hold.
        late = await client.post("/v1/chat/completions", json=chat_body(), headers=SPILL)
        waiting = asyncio.create_task(
            client.post("/v1/chat/completions", json=chat_body(), headers=KEEP)
        )
        await until(lambda: runtime.gate.admission.queue_depth == 1)
        full = await client.post("/v1/chat/completions", json=chat_body(), headers=SPILL)
        fake_vllm.hold.set()
        done = await asyncio.gather(running, waiting)
    assert [r.status_code for r in done] == [200, 200]
    assert late.headers["x-herdless-fallback-reason"] == "deadline_unattainable"
    # A full queue whose reservation is past the hold too: told as the wait it predicts.
    assert full.headers["x-herdless-fallback-reason"] in {"queue_full", "deadline_unattainable"}
    assert (late.status_code, full.status_code) == (200, 200)
    assert len(hosted.received) == 2


async def test_an_unreachable_or_refusing_upstream_spills(
    spilling: Callable[..., Started], fake_vllm: FakeVllm, hosted: FakeVllm
) -> None:
    async with spilling(transport=RefusingTransport()) as (client, _):
        down = await client.post("/v1/chat/completions", json=chat_body(), headers=SPILL)
    fake_vllm.error = (429, {"error": {"message": "queue full", "code": 429}})
    async with spilling() as (client, _):
        busy = await client.post("/v1/chat/completions", json=chat_body(), headers=SPILL)
        kept = await client.post("/v1/chat/completions", json=chat_body(), headers=KEEP)
    assert down.status_code == 200
    assert down.headers["x-herdless-fallback-reason"] in {
        "upstream_unavailable",
        "upstream_loading",
    }
    assert busy.headers["x-herdless-fallback-reason"] == "upstream_busy"
    assert kept.status_code == 429  # vLLM's own refusal, passed on with hints
    assert kept.headers["retry-after-ms"] == "2000"
    assert len(hosted.received) == 2


async def test_a_spilled_stream_is_reframed_and_keeps_the_usage_only_when_asked(
    spilling: Callable[..., Started],
) -> None:
    async with spilling() as (client, _):
        await client.post("/admin/drain", headers=ADMIN)
        plain = await client.post(
            "/v1/chat/completions", json=chat_body(stream=True), headers=SPILL
        )
        asked = await client.post(
            "/v1/chat/completions",
            json=chat_body(stream=True, stream_options={"include_usage": True}),
            headers=SPILL,
        )
    for response in (plain, asked):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.text.endswith("data: [DONE]\n\n")
    events = [line for line in plain.text.split("\n\n") if line]
    assert len(events) == 3  # role, "Hi", [DONE]: no usage chunk the client did not ask for
    assert '"usage"' not in plain.text
    assert '"usage"' in asked.text


async def test_the_spend_cap_or_a_failing_hosted_model_is_an_answer_not_a_hang(
    spilling: Callable[..., Started], hosted: FakeVllm
) -> None:
    async with spilling() as (client, _):
        await client.post("/admin/drain?expect=20", headers=ADMIN)
        first = await client.post("/v1/chat/completions", json=chat_body(), headers=SPILL)
        hosted.error = (400, {"error": {"message": "bad field", "type": "x", "code": None}})
        failed = await client.post("/v1/chat/completions", json=chat_body(), headers=SPILL)
        hosted.error = None
        for _ in range(2):  # 13 tokens a call, 20 a window: the cap is reached
            capped = await client.post("/v1/chat/completions", json=chat_body(), headers=SPILL)
        metrics = (await client.get("/metrics")).text
    assert first.status_code == 200
    assert failed.status_code == 503
    error = failed.json()["error"]
    assert error["code"] == "fallback_failed"
    assert "maintenance" in error["message"]
    assert "hosted fallback failed too" in error["message"]
    assert capped.status_code == 503
    assert capped.json()["error"]["code"] == "draining"
    assert "retry-after" in capped.headers
    assert 'outcome="spend_cap"} 1' in metrics
    for response in (first, failed, capped):
        assert "secret" not in response.text


async def test_the_key_s_user_header_and_class_apply(
    spilling: Callable[..., Started], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="herdless.gateway.access")
    async with spilling() as (client, runtime):
        await client.post(
            "/v1/chat/completions",
            json=chat_body(user="body-user"),
            headers=SPILL | {"x-openwebui-user-id": "alice@example.com"},
        )
        await client.post("/v1/chat/completions", json=chat_body(), headers=KEEP)
    lines = [r for r in caplog.records if r.name == "herdless.gateway.access"]
    first, second = (line.fields for line in lines)  # type: ignore[attr-defined]
    assert (first["key_id"], first["backend"]) == ("webui", "upstream")
    assert first["user"] == runtime.users("alice@example.com")
    assert first["class"] == "interactive"
    assert second["key_id"] == "internal"
    assert second["class"] == "batch"  # the key's class: it named none
