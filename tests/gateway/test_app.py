"""The gateway's HTTP layer, in process: httpx.ASGITransport in front, a fake vLLM behind."""

from __future__ import annotations

import asyncio
import json
import logging
import re

import httpx
import pytest
from tests.gateway.fakes import (
    COMPLETION,
    SSE,
    FakeVllm,
    GatewayFactory,
    RefusingTransport,
    TimingOutTransport,
    chat_body,
    json_lines,
    rendered,
    until,
)

from herdless.gateway.core.decisions import Admit
from herdless.gateway.proxy import AdmittedProxy

pytestmark = [pytest.mark.server]

CHAT_SCOPE = {
    "type": "http",
    "method": "POST",
    "path": "/v1/chat/completions",
    "headers": [(b"content-type", b"application/json")],
}

ADMIN = {"authorization": "Bearer admin-secret"}


def assert_refusal(response: httpx.Response, status: int, code: str) -> dict[str, object]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code
    assert error["message"]
    assert int(response.headers["retry-after"]) >= 1
    assert int(response.headers["retry-after-ms"]) > 0
    if code in RESERVED:  # a chat front-end shows the message: it says when, as the header
        assert str(error["message"]).endswith(f"; retry in {response.headers['retry-after']}s")
    return error


RESERVED = ("queue_full", "queue_timeout", "kv_budget", "displaced", "rate_limited", "token_budget")


# -- proxying ---------------------------------------------------------------------------


async def test_non_streaming_passes_bytes_and_request_id(
    gateway: GatewayFactory, fake_vllm: FakeVllm
) -> None:
    async with gateway() as (client, runtime):
        response = await client.post(
            "/v1/chat/completions",
            json=chat_body(),
            headers={"x-request-id": "rid-1", "x-herdless-attempt": "2"},
        )
    assert response.status_code == 200
    assert response.content == COMPLETION
    assert response.headers["x-request-id"] == "rid-1"
    upstream_headers, _ = fake_vllm.received[0]
    assert upstream_headers["x-request-id"] == "rid-1"
    assert upstream_headers["x-herdless-attempt"] == "2"
    assert (runtime.gate.admission.inflight, runtime.gate.admission.inflight_tokens) == (0, 0)


async def test_streaming_passes_the_sse_bytes_unchanged(
    gateway: GatewayFactory, fake_vllm: FakeVllm
) -> None:
    asked = chat_body(stream=True, stream_options={"include_usage": True})
    async with (
        gateway() as (client, _),
        client.stream("POST", "/v1/chat/completions", json=asked) as response,
    ):
        body = b"".join([chunk async for chunk in response.aiter_raw()])
    assert response.headers["content-type"].startswith("text/event-stream")
    assert body == SSE
    assert json.loads(fake_vllm.received[0][1]) == asked  # a stream without usage: test_usage


async def test_a_request_id_is_made_when_the_client_sends_none(
    gateway: GatewayFactory, fake_vllm: FakeVllm
) -> None:
    async with gateway() as (client, _):
        response = await client.post("/v1/chat/completions", json=chat_body())
    rid = response.headers["x-request-id"]
    assert len(rid) == 32
    assert fake_vllm.received[0][0]["x-request-id"] == rid


async def test_upstream_errors_keep_status_and_json(
    gateway: GatewayFactory, fake_vllm: FakeVllm
) -> None:
    payload = {"error": {"message": "The model `nope` does not exist.", "type": "NotFoundError"}}
    fake_vllm.error = (404, payload)
    async with gateway() as (client, _):
        response = await client.post("/v1/chat/completions", json=chat_body(model="nope"))
    assert response.status_code == 404
    assert response.json() == payload


async def test_an_upstream_503_gets_a_retry_after(
    gateway: GatewayFactory, fake_vllm: FakeVllm
) -> None:
    fake_vllm.error = (503, {"error": {"message": "busy", "type": "Service Unavailable"}})
    async with gateway(upstream_retry_after=3) as (client, _):
        response = await client.post("/v1/chat/completions", json=chat_body())
    assert response.status_code == 503
    assert response.headers["retry-after"] == "3"


async def test_models_are_passed_through(gateway: GatewayFactory) -> None:
    async with gateway() as (client, _):
        response = await client.get("/v1/models")
    assert response.json()["data"][0]["owned_by"] == "vllm"


async def test_client_keys_are_not_sent_upstream_but_the_upstream_key_is(
    gateway: GatewayFactory, fake_vllm: FakeVllm
) -> None:
    async with gateway(api_keys="k1", upstream_api_key="up-key") as (client, _):
        await client.post(
            "/v1/chat/completions", json=chat_body(), headers={"authorization": "Bearer k1"}
        )
    assert fake_vllm.received[0][0]["authorization"] == "Bearer up-key"


# -- bad input never reaches vLLM -------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "param"),
    [
        (b"{not json", None),
        (b"[]", None),
        (b'{"model": "m"}', "messages"),
        (b'{"messages": []}', "messages"),
        (b'{"messages": ["hi"]}', "messages[0]"),
        (b'{"messages": [{"role": "user", "content": 5}]}', "messages[0].content"),
        (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}', "max_tokens"),
        (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": "9"}', "max_tokens"),
        (b'{"messages": [{"role": "user", "content": "x"}], "stream": "yes"}', "stream"),
        (b'{"messages": [{"role": "user", "content": "x"}], "model": 3}', "model"),
    ],
)
async def test_malformed_requests_get_400(
    gateway: GatewayFactory, fake_vllm: FakeVllm, content: bytes, param: str | None
) -> None:
    async with gateway() as (client, _):
        response = await client.post("/v1/chat/completions", content=content)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_request", param)
    assert fake_vllm.received == []


async def test_a_body_over_the_limit_gets_413(gateway: GatewayFactory, fake_vllm: FakeVllm) -> None:
    big = chat_body(messages=[{"role": "user", "content": "x" * 2000}])
    async with gateway(max_body_bytes=1000) as (client, _):
        declared = await client.post("/v1/chat/completions", json=big)

        async def chunks():  # no content-length: the limit is counted while reading
            yield json.dumps(big).encode()

        streamed = await client.post("/v1/chat/completions", content=chunks())
    for response in (declared, streamed):
        assert response.status_code == 413
        assert response.json()["error"]["code"] == "body_too_large"
    assert fake_vllm.received == []


async def test_a_request_larger_than_the_kv_budget_gets_400(gateway: GatewayFactory) -> None:
    async with gateway(max_inflight_tokens=100) as (client, _):
        response = await client.post("/v1/chat/completions", json=chat_body(max_tokens=500))
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "request_too_large"
    assert "retry-after" not in response.headers


# -- admission over HTTP ----------------------------------------------------------------


async def test_queue_full_is_a_429_with_staggered_reservations(
    gateway: GatewayFactory, fake_vllm: FakeVllm
) -> None:
    fake_vllm.hold = asyncio.Event()
    async with gateway(max_concurrency=1, max_queue=1) as (client, runtime):
        running = asyncio.create_task(client.post("/v1/chat/completions", json=chat_body()))
        waiting = asyncio.create_task(client.post("/v1/chat/completions", json=chat_body()))
        await until(lambda: runtime.gate.admission.queue_depth >= 1)
        # Two callers, two bodies (the same body again is a retry: kept, see test_waiting).
        first = await client.post("/v1/chat/completions", json=chat_body(seed=1))
        second = await client.post("/v1/chat/completions", json=chat_body(seed=2))
        fake_vllm.hold.set()
        done = await asyncio.gather(running, waiting)
    assert [r.status_code for r in done] == [200, 200]
    for response in (first, second):
        assert_refusal(response, 429, "queue_full")
        assert response.headers["ratelimit-policy"] == '"queue";q=1'
        assert response.headers["ratelimit"].startswith('"queue";r=0;t=')
    assert int(second.headers["retry-after-ms"]) > int(first.headers["retry-after-ms"])


async def test_queue_timeout_is_a_429(gateway: GatewayFactory, fake_vllm: FakeVllm) -> None:
    fake_vllm.hold = asyncio.Event()
    async with gateway(max_concurrency=1, max_queue=4, queue_timeout=0.01) as (client, runtime):
        running = asyncio.create_task(client.post("/v1/chat/completions", json=chat_body()))
        await until(lambda: runtime.gate.admission.inflight >= 1)
        timed_out = await client.post("/v1/chat/completions", json=chat_body())
        fake_vllm.hold.set()
        await running
    assert_refusal(timed_out, 429, "queue_timeout")
    assert runtime.gate.admission.queue_depth == 0


async def test_rate_limit_is_a_429_per_key(gateway: GatewayFactory) -> None:
    async with gateway(rate=0.5, burst=1, api_keys="k1,k2") as (client, _):

        async def call(key: str) -> httpx.Response:
            headers = {"authorization": f"Bearer {key}"}
            return await client.post("/v1/chat/completions", json=chat_body(), headers=headers)

        assert (await call("k1")).status_code == 200
        limited = await call("k1")
        assert (await call("k2")).status_code == 200
    assert_refusal(limited, 429, "rate_limited")
    assert limited.headers["retry-after"] == "2"
    assert limited.headers["ratelimit-policy"] == '"rate_limited";q=1;w=2'


async def test_token_budget_is_settled_against_real_usage(gateway: GatewayFactory) -> None:
    # Priced at ~9 + 500 tokens; vLLM reports 13 used: the refund lets the next one in.
    async with gateway(tokens_per_minute=600) as (client, runtime):
        body = chat_body(max_tokens=500)
        assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
        assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
        assert runtime.gate.admission.inflight_tokens == 0
        refused = await client.post("/v1/chat/completions", json=chat_body(max_tokens=590))
    assert_refusal(refused, 429, "token_budget")


# -- API keys ---------------------------------------------------------------------------


@pytest.mark.parametrize("authorization", [None, "Bearer wrong", "Basic k1", "Bearer "])
async def test_keys_are_required_when_configured(
    gateway: GatewayFactory, fake_vllm: FakeVllm, authorization: str | None
) -> None:
    headers = {} if authorization is None else {"authorization": authorization}
    async with gateway(api_keys="k1") as (client, _):
        response = await client.post("/v1/chat/completions", json=chat_body(), headers=headers)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"
    assert fake_vllm.received == []


async def test_access_log_has_key_id_and_never_the_key(
    gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="herdless.gateway.access")
    async with gateway(api_keys="sk-very-secret") as (client, runtime):
        await client.post(
            "/v1/chat/completions",
            json=chat_body(),
            headers={"authorization": "Bearer sk-very-secret", "x-request-id": "rid-9"},
        )
    (record,) = [r for r in caplog.records if r.name == "herdless.gateway.access"]
    (line,) = json_lines([record], "herdless.gateway.access")
    assert line["message"] == "POST /v1/chat/completions 200"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line["ts"])
    assert line["request_id"] == "rid-9"
    assert line["key_id"].startswith("key-")
    assert (line["status"], line["reason"]) == (200, None)
    assert line["queue_wait_ms"] >= 0
    assert "sk-very-secret" not in rendered(caplog.records)
    assert "sk-very-secret" not in repr(runtime.keys)
    assert "sk-very-secret" not in repr(runtime.settings)


# -- readiness, upstream down -----------------------------------------------------------


async def test_upstream_refusing_connections_is_a_fast_503(gateway: GatewayFactory) -> None:
    async with gateway(transport=RefusingTransport()) as (client, runtime):
        ready = await client.get("/readyz")
        refused = await client.post("/v1/chat/completions", json=chat_body())
        runtime.gate.set_upstream(ready=True)  # as if it died after the last poll
        # Another request: the same again would be a retry, and wait for the upstream
        # where a poll (every 0.25 s while it is out) found it out again first.
        cut = await client.post("/v1/chat/completions", json=chat_body(seed=1))
        models = await client.get("/v1/models")
        after = await client.get("/readyz")
    assert ready.status_code == 503
    assert ready.json()["upstream_ready"] is False
    assert_refusal(refused, 503, "upstream_unavailable")
    assert_refusal(cut, 503, "upstream_unavailable")
    assert_refusal(models, 503, "upstream_unavailable")
    assert after.status_code == 503
    assert runtime.gate.admission.inflight == 0


async def test_an_upstream_timeout_fails_one_request_not_the_upstream(
    gateway: GatewayFactory,
) -> None:
    async with gateway(transport=TimingOutTransport()) as (client, runtime):
        response = await client.post("/v1/chat/completions", json=chat_body())
        ready = await client.get("/readyz")
    assert_refusal(response, 503, "upstream_unavailable")
    assert ready.status_code == 200
    assert runtime.gate.admission.inflight == 0


async def test_upstream_loading_is_a_503(gateway: GatewayFactory, fake_vllm: FakeVllm) -> None:
    fake_vllm.health_status = 503
    async with gateway() as (client, _):
        response = await client.post("/v1/chat/completions", json=chat_body())
        ready = await client.get("/readyz")
    assert_refusal(response, 503, "upstream_loading")
    assert ready.status_code == 503


# -- operations -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "status"),
    [({}, 401), ({"authorization": "Bearer nope"}, 403), (ADMIN, 200)],
)
async def test_admin_routes_need_the_admin_token(
    gateway: GatewayFactory, headers: dict[str, str], status: int
) -> None:
    async with gateway(admin_token="admin-secret") as (client, _):
        drain = await client.post("/admin/drain", headers=headers)
        resume = await client.post("/admin/resume", headers=headers)
    assert (drain.status_code, resume.status_code) == (status, status)


async def test_admin_is_forbidden_when_no_token_is_configured(gateway: GatewayFactory) -> None:
    async with gateway() as (client, _):
        response = await client.post("/admin/drain", headers=ADMIN)
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "admin_disabled"


async def test_drain_refuses_new_and_waiting_lets_running_finish(
    gateway: GatewayFactory, fake_vllm: FakeVllm
) -> None:
    fake_vllm.hold = asyncio.Event()
    async with gateway(admin_token="admin-secret", max_concurrency=1) as (client, runtime):
        running = asyncio.create_task(client.post("/v1/chat/completions", json=chat_body()))
        waiting = asyncio.create_task(client.post("/v1/chat/completions", json=chat_body()))
        await until(lambda: runtime.gate.admission.queue_depth >= 1)
        drained = await client.post("/admin/drain", headers=ADMIN)
        new = await client.post("/v1/chat/completions", json=chat_body())
        ready = await client.get("/readyz")
        fake_vllm.hold.set()
        finished, waiter = await asyncio.gather(running, waiting)
        await client.post("/admin/resume", headers=ADMIN)
        resumed = await client.post("/v1/chat/completions", json=chat_body())
    assert drained.json()["draining"] is True
    assert finished.status_code == 200
    for response in (waiter, new):
        assert_refusal(response, 503, "draining")
        assert response.headers["x-herdless-drain"] == "1"
    assert ready.status_code == 503
    assert resumed.status_code == 200


async def test_health_metrics_and_json_404(gateway: GatewayFactory) -> None:
    async with gateway(max_concurrency=1, max_queue=0) as (client, _):
        await client.post("/v1/chat/completions", json=chat_body())
        await client.post("/v1/chat/completions", content=b"nope")
        healthz = await client.get("/healthz")
        readyz = await client.get("/readyz")
        missing = await client.get("/nope")
        wrong_method = await client.get("/v1/chat/completions")
        metrics = await client.get("/metrics")
    assert healthz.json() == {"status": "ok"}
    assert readyz.status_code == 200
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"
    assert wrong_method.status_code == 405
    text = metrics.text
    assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
    for line in (
        'herdless_gateway_requests_total{code="200"} 1',
        'herdless_gateway_requests_total{code="400"} 1',
        "herdless_gateway_queue_depth 0",
        "herdless_gateway_inflight 0",
        "herdless_gateway_inflight_tokens 0",
        'herdless_gateway_queue_wait_seconds_bucket{le="+Inf"} 1',
        "herdless_gateway_ttfb_seconds_count 1",
        "herdless_gateway_request_duration_seconds_count 2",
    ):
        assert line in text


async def test_rejections_are_counted_by_reason(gateway: GatewayFactory) -> None:
    async with gateway(rate=0.1, burst=1) as (client, _):
        await client.post("/v1/chat/completions", json=chat_body())
        await client.post("/v1/chat/completions", json=chat_body())
        metrics = await client.get("/metrics")
    assert 'herdless_gateway_rejections_total{reason="rate_limited"} 1' in metrics.text
    assert 'herdless_gateway_requests_total{code="429"} 1' in metrics.text


class _SlowHealth(httpx.AsyncBaseTransport):
    def __init__(self) -> None:
        self.slow = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.slow:
            raise httpx.ReadTimeout("late", request=request)
        return httpx.Response(200)


async def test_health_timeouts_count_only_several_in_a_row(gateway: GatewayFactory) -> None:
    from herdless.gateway.app import _poll_once

    transport = _SlowHealth()
    async with gateway(transport=transport) as (_, runtime):
        transport.slow = True
        assert await _poll_once(runtime, 0) == 1
        assert await _poll_once(runtime, 1) == 2
        assert runtime.gate.admission.upstream_ready
        assert await _poll_once(runtime, 2) == 3
        assert not runtime.gate.admission.upstream_ready
        transport.slow = False
        assert await _poll_once(runtime, 3) == 0
        assert runtime.gate.admission.upstream_ready


# -- bodies that stall, refusals that need no body --------------------------------------


async def test_a_stalled_body_gets_a_408_and_a_close(gateway: GatewayFactory) -> None:
    async with gateway(body_timeout=0.01) as (_, runtime):
        proxy = AdmittedProxy(runtime)
        sent: list[dict[str, object]] = []
        parts = [{"type": "http.request", "body": b'{"messa', "more_body": True}]

        async def receive() -> dict[str, object]:
            if parts:
                return parts.pop()
            await asyncio.Event().wait()  # the rest of the body never comes
            raise AssertionError("unreachable")

        async def send(message: dict[str, object]) -> None:
            sent.append(message)

        await proxy(CHAT_SCOPE, receive, send)  # type: ignore[arg-type]
    assert sent[0]["status"] == 408
    assert (b"connection", b"close") in sent[0]["headers"]  # type: ignore[operator]
    assert json.loads(sent[1]["body"])["error"]["code"] == "body_timeout"  # type: ignore[arg-type]
    assert runtime.metrics.requests[408] == 1


@pytest.mark.parametrize(
    ("header", "status"),
    [
        ((b"x-herdless-attempt", b"1"), 503),  # a drain's, to a herdless client: it decides
        ((b"user-agent", b"ai/6.0.326"), 429),  # the key's rate: a flood stays cheap
    ],
    ids=["a herdless client's drain", "the key's rate"],
)
async def test_a_refusal_whose_retry_is_not_watched_for_needs_no_body(
    gateway: GatewayFactory, header: tuple[bytes, bytes], status: int
) -> None:
    async with gateway(rate=1) as (_, runtime):
        if status == 503:
            runtime.gate.drain()
        else:
            assert isinstance(runtime.gate.offer("anonymous", 1), Admit)  # the bucket's one
        sent: list[dict[str, object]] = []

        async def receive() -> dict[str, object]:
            raise AssertionError("the body was read for a refusal")

        async def send(message: dict[str, object]) -> None:
            sent.append(message)

        scope = CHAT_SCOPE | {"headers": [*CHAT_SCOPE["headers"], header]}
        await AdmittedProxy(runtime)(scope, receive, send)  # type: ignore[arg-type]
    assert sent[0]["status"] == status
    assert len(runtime.gate.comebacks) == 0


async def test_every_chat_answer_advertises_the_capacity(
    gateway: GatewayFactory, fake_vllm: FakeVllm
) -> None:
    async with gateway(max_concurrency=3, max_queue=4) as (client, runtime):
        served = await client.post("/v1/chat/completions", json=chat_body())
        runtime.gate.set_upstream(ready=False)
        refused = await client.post("/v1/chat/completions", json=chat_body())
    assert served.status_code == 200
    assert served.headers["x-herdless-capacity"] == "7"
    assert refused.status_code == 503
    assert refused.headers["x-herdless-capacity"] == "7"


async def test_a_deadline_the_queue_cannot_meet_is_refused_at_once(
    gateway: GatewayFactory, fake_vllm: FakeVllm
) -> None:
    fake_vllm.hold = asyncio.Event()
    async with gateway(max_concurrency=1, max_queue=8) as (client, runtime):
        running = asyncio.create_task(client.post("/v1/chat/completions", json=chat_body()))
        await until(lambda: runtime.gate.admission.inflight >= 1)
        hurried = await client.post(
            "/v1/chat/completions", json=chat_body(), headers={"x-herdless-deadline-ms": "50"}
        )
        garbled = asyncio.create_task(
            client.post(
                "/v1/chat/completions", json=chat_body(), headers={"x-herdless-deadline-ms": "soon"}
            )
        )
        await until(lambda: runtime.gate.admission.queue_depth >= 1)  # queued as before
        fake_vllm.hold.set()
        done = await asyncio.gather(running, garbled)
    assert_refusal(hurried, 429, "deadline_unattainable")
    assert [r.status_code for r in done] == [200, 200]


@pytest.mark.parametrize(
    "header", ["x-herdless-deadline-ms", "x-stainless-retry-count", "x-stainless-timeout"]
)
async def test_a_number_header_in_other_digits_is_ignored_not_a_crash(
    gateway: GatewayFactory, fake_vllm: FakeVllm, header: str
) -> None:
    # "²" is a digit to str.isdigit (and latin-1 on the wire), not to int().
    async with gateway() as (client, _):
        answer = await client.post(
            "/v1/chat/completions", json=chat_body(), headers={header: b"\xb2"}
        )
    assert answer.status_code == 200
