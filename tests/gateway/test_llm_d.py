"""The gateway speaks llm-d's request headers and names its refusals as llm-d does:
``x-llm-d-inference-fairness-id`` is the fairness user, ``x-llm-d-inference-ttl`` caps a
request's queue wait (never its deadline), and every overload refusal carries
``x-llm-d-request-dropped-reason`` (docs/gateway.md, "llm-d's names for the refusals")."""

from __future__ import annotations

import asyncio
import logging

import pytest
from tests.gateway.fakes import FakeVllm, GatewayFactory, chat_body, json_lines, until

import herdless
from herdless.gateway.core.admission import Admission
from herdless.gateway.core.decisions import Enqueued, Refuse
from herdless.gateway.core.limits import AdmissionConfig
from herdless.gateway.wire import DROPPED_REASONS, refusal_headers, ttl_header, user_header
from herdless.testing import FakeClock

pytestmark = [pytest.mark.server]

CHAT = "/v1/chat/completions"
DROPPED = "x-llm-d-request-dropped-reason"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1500ms", 1.5),
        ("1.5s", 1.5),
        ("2s", 2.0),
        ("1m30s", 90.0),
        ("1h", 3600.0),
        ("250000us", 0.25),
        ("250000µs", 0.25),
        ("500000000ns", 0.5),
        (" 3s ", 3.0),
        ("0s", None),  # not positive: said nothing
        ("1500", None),  # no unit: Go refuses it too
        ("-1s", None),
        ("soon", None),
        ("1.5 s", None),
        ("9" * 50 + "s", None),  # too long to be a TTL
    ],
)
def test_the_queue_ttl_is_a_go_duration(text: str, seconds: float | None) -> None:
    assert ttl_header({"x-llm-d-inference-ttl": text}) == seconds


def test_no_ttl_header_says_nothing() -> None:
    assert ttl_header({}) is None


def test_the_fairness_id_is_the_user_when_x_herdless_user_is_absent() -> None:
    assert user_header({"x-llm-d-inference-fairness-id": " tenant-a "}) == "tenant-a"
    both = {"x-herdless-user": "carol", "x-llm-d-inference-fairness-id": "tenant-a"}
    assert user_header(both) == "carol"
    assert user_header({"x-llm-d-inference-fairness-id": " "}) is None


def _refuse(code: str, status: int = 429, *, drain: bool = False) -> Refuse:
    return Refuse(status=status, code=code, message="no", retry_after=1.0, drain=drain)


@pytest.mark.parametrize(
    ("status", "code", "reason"),
    [
        (429, "queue_full", "rejected-saturated"),
        (429, "kv_budget", "rejected-saturated"),
        (429, "queue_timeout", "rejected-ttl-expired"),
        (429, "deadline_unattainable", "rejected-ttl-expired"),
        (429, "displaced", "evicted-priority"),
        (503, "upstream_loading", "rejected-no-endpoints"),
        (503, "upstream_unavailable", "rejected-no-endpoints"),
        (429, "rate_limited", None),  # a key's own limit: llm-d has no name for it
        (429, "token_budget", None),
        (400, "request_too_large", None),
    ],
)
def test_each_refusal_names_its_llm_d_reason(status: int, code: str, reason: str | None) -> None:
    headers = dict(refusal_headers(_refuse(code, status)))
    assert headers.get(DROPPED.encode()) == (None if reason is None else reason.encode())
    assert b"x-herdless-drain" not in headers


def test_a_drains_two_headers_agree() -> None:
    headers = dict(refusal_headers(_refuse("draining", 503, drain=True)))
    assert headers[b"x-herdless-drain"] == b"1"
    assert headers[DROPPED.encode()] == b"rejected-shutting-down"
    assert DROPPED_REASONS["draining"] == "rejected-shutting-down"


@pytest.mark.parametrize(
    ("wait", "seconds", "ms"), [(0.0004, b"1", b"1"), (1.5, b"2", b"1500"), (2.0, b"2", b"2000")]
)
def test_both_hints_say_the_same_wait_and_neither_says_now(
    wait: float, seconds: bytes, ms: bytes
) -> None:
    """A wait under half a millisecond (an upstream back after a 1 ms 'load', as a test
    flips it) made ``retry-after-ms: 0`` beside ``Retry-After: 1``."""
    refuse = Refuse(status=503, code="upstream_unavailable", message="no", retry_after=wait)
    headers = dict(refusal_headers(refuse))
    assert (headers[b"retry-after"], headers[b"retry-after-ms"]) == (seconds, ms)


# -- the queue TTL in admission -------------------------------------------------------------


def _busy(clock: FakeClock) -> Admission:
    adm = Admission(
        AdmissionConfig(max_concurrency=1, max_queue=10, initial_service_time=10.0), clock=clock
    )
    assert not isinstance(adm.offer("a", 10), Refuse)  # runs: the next ones wait
    return adm


def test_the_queue_ttl_caps_the_hold_and_says_so_when_it_ends() -> None:
    adm = _busy(clock := FakeClock())
    short = adm.offer("a", 10, ttl=1.5)
    long = adm.offer("a", 10, ttl=3600.0)
    assert isinstance(short, Enqueued)
    assert isinstance(long, Enqueued)
    assert short.ticket.hold == 1.5
    assert long.ticket.hold == adm.config.queue_timeout  # a cap only: never longer
    clock.advance(1.5)
    refused = adm.expire(short.ticket)
    assert (refused.status, refused.code) == (429, "queue_timeout")
    assert "queue TTL (1.5s)" in refused.message


def test_the_queue_ttl_is_never_read_as_a_deadline() -> None:
    adm = _busy(FakeClock())
    # The predicted wait (10 s) is past the TTL: with a deadline that would be refused at
    # once; with a TTL it waits, and leaves when the TTL ends.
    assert isinstance(adm.offer("a", 10, ttl=0.5), Enqueued)
    late = adm.offer("a", 10, deadline=0.5)
    assert isinstance(late, Refuse)
    assert late.code == "deadline_unattainable"


def test_a_ttl_shorter_than_an_announced_drain_is_refused_at_once() -> None:
    adm = _busy(FakeClock())
    adm.drain(expect=10.0)
    assert adm.precheck("a") is None  # its hold (30 s) outlasts the window: it waits
    refused = adm.precheck("a", ttl=5.0)
    assert refused is not None
    assert refused.code == "draining"


# -- over HTTP ------------------------------------------------------------------------------


async def test_a_queued_request_leaves_when_its_ttl_ends(
    gateway: GatewayFactory, fake_vllm: FakeVllm
) -> None:
    fake_vllm.hold = asyncio.Event()
    async with gateway(max_concurrency=1, max_queue=4) as (client, runtime):
        running = asyncio.create_task(client.post(CHAT, json=chat_body()))
        await until(lambda: runtime.gate.admission.inflight >= 1)
        ttl = {"x-llm-d-inference-ttl": "20ms"}
        timed_out = await client.post(CHAT, json=chat_body(), headers=ttl)
        fake_vllm.hold.set()
        await running
    assert timed_out.status_code == 429
    assert timed_out.json()["error"]["code"] == "queue_timeout"
    assert timed_out.headers[DROPPED] == "rejected-ttl-expired"
    assert int(timed_out.headers["retry-after"]) >= 1


async def test_a_full_queue_and_a_drain_carry_llm_ds_reason(
    gateway: GatewayFactory, fake_vllm: FakeVllm
) -> None:
    fake_vllm.hold = asyncio.Event()
    admin = {"authorization": "Bearer admin-secret"}
    async with gateway(admin_token="admin-secret", max_concurrency=1, max_queue=0) as (
        client,
        runtime,
    ):
        running = asyncio.create_task(client.post(CHAT, json=chat_body()))
        await until(lambda: runtime.gate.admission.inflight >= 1)
        full = await client.post(CHAT, json=chat_body())
        await client.post("/admin/drain", headers=admin)
        drained = await client.post(CHAT, json=chat_body())
        fake_vllm.hold.set()
        await running
    assert (full.status_code, full.headers[DROPPED]) == (429, "rejected-saturated")
    assert (drained.status_code, drained.headers[DROPPED]) == (503, "rejected-shutting-down")
    assert drained.headers["x-herdless-drain"] == "1"


async def test_the_fairness_id_names_the_user(
    gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="herdless.gateway.access")
    async with gateway() as (client, _):
        await client.post(CHAT, json=chat_body(), headers={"x-herdless-user": "carol"})
        fair = {"x-llm-d-inference-fairness-id": "carol"}
        await client.post(CHAT, json=chat_body(user="mallory"), headers=fair)
    users = [line["user"] for line in json_lines(caplog.records, "herdless.gateway.access")]
    assert users[0] is not None
    assert users == [users[0]] * 2


async def test_the_sdks_headers_round_trip_through_the_gateway(
    gateway: GatewayFactory, fake_vllm: FakeVllm
) -> None:
    """A herdless client's llm-d headers, read by the gateway: the TTL (the attempt's
    time less the least an answer takes) caps the queue wait, and is no deadline."""
    fake_vllm.hold = asyncio.Event()
    async with gateway(max_concurrency=1, max_queue=4) as (client, runtime):
        sdk = herdless.AsyncClient(
            primary="http://gateway/v1",
            model="gemma",
            http_client=client,
            fallback_policy=herdless.FallbackPolicy(min_attempt=15.0),
        )
        running = asyncio.create_task(client.post(CHAT, json=chat_body()))
        await until(lambda: runtime.gate.admission.inflight >= 1)
        call = asyncio.create_task(
            sdk.chat([{"role": "user", "content": "hi"}], user="dave", deadline=20.0)
        )
        await until(lambda: runtime.gate.admission.queue_depth >= 1)
        [waiter] = runtime.gate.admission.queue.waiting()
        hold, user = waiter.hold, waiter.user
        fake_vllm.hold.set()
        await running
        result = await call
        await sdk.aclose()
    # 20 s less FallbackPolicy.min_attempt (15 s): at most 5 s in the queue, not 20 s.
    assert 4.0 < hold <= 5.0
    assert user is not None
    assert result.backend == "primary"


def test_the_docs_table_is_the_codes_table() -> None:
    from pathlib import Path

    page = (Path(__file__).parents[2] / "docs" / "gateway.md").read_text()
    section = page.split("### llm-d's names for the refusals", 1)[1].split("\n### ", 1)[0]
    documented: dict[str, str] = {}
    for row in section.splitlines():
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        if len(cells) == 3 and cells[2].startswith("`") and cells[0].startswith("`"):
            for code in cells[0].split(","):
                documented[code.strip().split()[0].strip("`")] = cells[2].strip("`")
    assert documented == dict(DROPPED_REASONS)
