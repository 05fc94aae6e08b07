"""Fair share over HTTP: the user field, X-Herdless-User, X-Herdless-Priority, displacement,
and what /metrics and the access log say of them (in process, a fake vLLM behind)."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import httpx
import pytest
from tests.gateway.fakes import (
    FakeVllm,
    GatewayFactory,
    chat_body,
    json_lines,
    rendered,
    until,
)

pytestmark = [pytest.mark.server]

CHAT = "/v1/chat/completions"
BATCH = {"x-herdless-priority": "batch"}
# vLLM's series with room to spare: the self-sized gateway's caps bind, as the static one's.
ROOMY = (
    'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000000"} 1.0\n'
    'vllm:kv_cache_usage_perc{engine="0"} 0.0\nvllm:num_requests_running{engine="0"} 0.0\n'
    'vllm:num_requests_waiting{engine="0"} 0.0\nvllm:num_preemptions_total{engine="0"} 0.0\n'
)


@pytest.fixture(autouse=True, params=["capped", "self-sized"])
def sizing(request: pytest.FixtureRequest, fake_vllm: FakeVllm) -> None:
    """Every test twice: against an engine without metrics (static limits) and against one
    that publishes its size (the gateway sizes itself; the test's flags are caps)."""
    if request.param == "self-sized":
        if request.node.get_closest_marker("static_only"):
            pytest.skip("a rule of the static limits")
        fake_vllm.metrics = ROOMY


def access_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return json_lines(caplog.records, "herdless.gateway.access")


def metric(text: str, name: str) -> float:
    (line,) = [line for line in text.splitlines() if line.startswith(name + " ")]
    return float(line.split()[-1])


def send_chat(
    client: httpx.AsyncClient, user: str, headers: dict[str, str] | None = None
) -> asyncio.Task[httpx.Response]:
    """A chat of ``user`` sent in the background (it may wait for a place)."""
    return asyncio.create_task(client.post(CHAT, json=chat_body(user=user), headers=headers))


async def test_the_user_field_and_the_class_are_logged_as_a_hash_and_a_name(
    gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="herdless.gateway.access")
    async with gateway() as (client, runtime):
        await client.post(CHAT, json=chat_body(user="alice@example.com"), headers=BATCH)
        await client.post(CHAT, json=chat_body())
    named, anonymous = access_lines(caplog)
    assert str(named["user"]).startswith("u-")
    assert len(str(named["user"])) == 14
    assert named["class"] == "batch"
    assert (anonymous["user"], anonymous["class"]) == (None, "interactive")
    assert "alice" not in rendered(caplog.records)
    assert "alice" not in repr(runtime.users)
    # The usage vLLM reported (12 prompt + 1 completion tokens) settled the counter.
    unit = f"anonymous/{named['user']}"
    assert runtime.gate.admission.queue.counter("batch", unit) == 12 * 1 + 1 * 2


async def test_x_herdless_user_names_the_user_and_wins_over_the_body(
    gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="herdless.gateway.access")
    async with gateway() as (client, _):
        for body_user in ("bob", "mallory", None):
            body = chat_body() if body_user is None else chat_body(user=body_user)
            await client.post(CHAT, json=body, headers={"x-herdless-user": "carol"})
        await client.post(CHAT, json=chat_body(user="carol"))
    users = [line["user"] for line in access_lines(caplog)]
    assert len(set(users)) == 1  # the header, then the body field: the same hash
    assert users[0] is not None


@pytest.mark.parametrize(
    ("headers", "body", "param"),
    [
        ({"x-herdless-priority": "urgent"}, chat_body(), "X-Herdless-Priority"),
        ({"x-herdless-priority": ""}, chat_body(), "X-Herdless-Priority"),
        ({}, chat_body(user=42), "user"),
    ],
)
async def test_a_bad_class_or_user_is_a_400_that_never_reaches_vllm(
    gateway: GatewayFactory,
    fake_vllm: FakeVllm,
    headers: dict[str, str],
    body: dict[str, object],
    param: str,
) -> None:
    async with gateway() as (client, _):
        response = await client.post(CHAT, json=body, headers=headers)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_request", param)
    assert fake_vllm.received == []


async def test_the_class_header_is_read_case_insensitively(gateway: GatewayFactory) -> None:
    async with gateway() as (client, runtime):
        response = await client.post(
            CHAT, json=chat_body(), headers={"X-Herdless-Priority": "Batch"}
        )
        assert response.status_code == 200
        assert runtime.gate.admission.queue.served_tokens["batch"] == 13


async def test_interactive_waiters_reach_vllm_before_batch_ones(
    gateway: GatewayFactory, fake_vllm: FakeVllm
) -> None:
    fake_vllm.hold = asyncio.Event()
    async with gateway(max_concurrency=1, max_queue=4) as (client, runtime):
        adm = runtime.gate.admission
        running = asyncio.create_task(client.post(CHAT, json=chat_body(user="first")))
        await until(lambda: adm.inflight == 1)
        batch = asyncio.create_task(client.post(CHAT, json=chat_body(user="b"), headers=BATCH))
        await until(lambda: adm.queue_depth == 1)
        chat = asyncio.create_task(client.post(CHAT, json=chat_body(user="c")))
        await until(lambda: adm.queue_depth == 2)
        assert (adm.queue.depth("interactive"), adm.queue.depth("batch")) == (1, 1)
        fake_vllm.hold.set()
        answers = await asyncio.gather(running, batch, chat)
    assert [r.status_code for r in answers] == [200, 200, 200]
    users = [json.loads(body)["user"] for _, body in fake_vllm.received]
    assert users == ["first", "c", "b"]


async def test_a_displaced_batch_waiter_gets_a_429_with_a_retry_after_and_no_bytes_before(
    gateway: GatewayFactory, fake_vllm: FakeVllm
) -> None:
    fake_vllm.hold = asyncio.Event()
    async with gateway(max_concurrency=1, max_queue=1) as (client, runtime):
        adm = runtime.gate.admission
        running = asyncio.create_task(client.post(CHAT, json=chat_body(), headers=BATCH))
        await until(lambda: adm.inflight == 1)
        waiting = asyncio.create_task(client.post(CHAT, json=chat_body(), headers=BATCH))
        await until(lambda: adm.queue_depth == 1)
        chat = asyncio.create_task(client.post(CHAT, json=chat_body(user="chat")))
        displaced = await waiting  # answered at once, while vLLM still holds the first
        assert not running.done()
        fake_vllm.hold.set()
        answers = await asyncio.gather(running, chat)
        text = (await client.get("/metrics")).text
    assert displaced.status_code == 429
    error = displaced.json()["error"]
    assert error["code"] == "displaced"
    assert error["type"] == "rate_limit_error"
    assert int(displaced.headers["retry-after"]) >= 1
    assert int(displaced.headers["retry-after-ms"]) > 0
    assert [r.status_code for r in answers] == [200, 200]
    assert len(fake_vllm.received) == 2  # the displaced request never reached vLLM
    assert metric(text, "herdless_gateway_displacements_total") == 1
    assert 'herdless_gateway_rejections_total{reason="displaced"} 1' in text


async def test_a_full_queue_gives_a_herdless_waiter_of_the_busiest_user_to_a_new_user(
    gateway: GatewayFactory, fake_vllm: FakeVllm
) -> None:
    fake_vllm.hold = asyncio.Event()
    herdless = {"x-request-id": "call-7", "x-herdless-attempt": "1"}  # comes back at its time
    async with gateway(max_concurrency=1, max_queue=2) as (client, runtime):
        adm = runtime.gate.admission

        running = send_chat(client, "heavy")
        await until(lambda: adm.inflight == 1)
        returns = send_chat(client, "heavy", herdless)
        await until(lambda: adm.queue_depth == 1)
        plain = send_chat(client, "heavy")  # its client shows a 429 as an error: never displaced
        await until(lambda: adm.queue_depth == 2)
        chat = send_chat(client, "light")
        displaced = await returns  # answered at once, while vLLM still holds the first
        assert not plain.done()
        fake_vllm.hold.set()
        answers = await asyncio.gather(running, plain, chat)
    assert displaced.status_code == 429
    error = displaced.json()["error"]
    assert error["code"] == "displaced"
    assert "fewer places" in error["message"]
    assert int(displaced.headers["retry-after-ms"]) > 0
    assert [r.status_code for r in answers] == [200, 200, 200]
    assert len(fake_vllm.received) == 3  # the displaced request never reached vLLM


async def test_a_full_queue_tells_a_caller_whose_retry_waits_here_the_whole_rate(
    gateway: GatewayFactory, fake_vllm: FakeVllm
) -> None:
    # Two users wait; a third user's refused caller gets a third of the places that free.
    # A herdless client is told that share; another client's retry is known by its body
    # and kept here, so it is told the next place at the whole rate: a third of the time.
    fake_vllm.hold = asyncio.Event()
    herdless = {"x-request-id": "call-9", "x-herdless-attempt": "1"}
    async with gateway(max_concurrency=1, max_queue=2) as (client, runtime):
        adm = runtime.gate.admission

        waiting = [send_chat(client, "a")]
        await until(lambda: adm.inflight == 1)
        waiting += [send_chat(client, "a"), send_chat(client, "b")]
        await until(lambda: adm.queue_depth == 2)
        plain = await send_chat(client, "c")
        told = await send_chat(client, "d", herdless)
        fake_vllm.hold.set()
        answers = await asyncio.gather(*waiting)
    assert [r.status_code for r in answers] == [200, 200, 200]
    assert (plain.status_code, told.status_code) == (429, 429)
    assert plain.json()["error"]["code"] == told.json()["error"]["code"] == "queue_full"
    whole, share = int(plain.headers["retry-after-ms"]), int(told.headers["retry-after-ms"])
    assert share == pytest.approx(3 * whole, abs=3)


async def test_metrics_show_classes_users_and_the_fairness_index(
    gateway: GatewayFactory,
) -> None:
    async with gateway(metrics_top_users=1) as (client, runtime):
        for user in ("u1", "u1", "u2"):
            await client.post(CHAT, json=chat_body(user=user), headers=BATCH)
        await client.post(CHAT, json=chat_body(user="u3"))
        text = (await client.get("/metrics")).text
    lines = text.splitlines()
    assert 'herdless_gateway_tokens_served_total{class="batch"} 39' in lines
    assert 'herdless_gateway_tokens_served_total{class="interactive"} 13' in lines
    assert 'herdless_gateway_class_queue_depth{class="batch"} 0' in lines
    assert 'herdless_gateway_fairness_jain{class="interactive"} 1.0' in lines
    users = [line for line in lines if line.startswith("herdless_gateway_user_weighted_tokens{")]
    # One user named (the top one: u1, two requests of 14 weighted tokens), the rest summed.
    assert len(users) == 2
    assert users[0].endswith(" 28.0")
    assert users[1] == 'herdless_gateway_user_weighted_tokens{user="other"} 28.0'
    assert runtime.gate.admission.displacements == 0


async def test_reference_schedulers_ignore_the_class(gateway: GatewayFactory) -> None:
    async with gateway(scheduler="fcfs") as (client, runtime):
        response = await client.post(CHAT, json=chat_body(), headers=BATCH)
    assert response.status_code == 200
    assert runtime.gate.admission.queue.served_tokens == {"interactive": 13, "batch": 0}


def test_the_settings_validate_the_reserve_and_the_scheduler() -> None:
    from pydantic import ValidationError

    from herdless.gateway.settings import GatewaySettings

    with pytest.raises(ValidationError, match="interactive_reserve"):
        GatewaySettings(max_concurrency=4, interactive_reserve=4)
    with pytest.raises(ValidationError, match="scheduler"):
        GatewaySettings(scheduler="lottery")  # type: ignore[arg-type]
    config = GatewaySettings(max_concurrency=16, scheduler="round-robin").admission_config()
    assert (config.scheduler, config.effective_reserve) == ("round-robin", 2)


def test_user_ids_are_keyed_by_the_key_id_secret() -> None:
    from herdless.gateway.settings import UserIds

    assert UserIds(b"s")("alice") == UserIds(b"s")("alice")
    assert UserIds(b"s")("alice") != UserIds(b"t")("alice")
    assert UserIds()("alice") != UserIds()("alice")  # random secrets: per process
