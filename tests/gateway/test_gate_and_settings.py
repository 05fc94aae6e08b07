"""The async driver of admission, the settings, the key table and the CLI's flag handling."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

import pytest
from tests.by_name import assert_built_by_name
from tests.gateway.fakes import until

from herdless._exposition import Exposition, Histogram
from herdless.bench.vtime import VirtualClock, run_virtual
from herdless.gateway.cli import load_settings, main
from herdless.gateway.core.admission import Admission
from herdless.gateway.core.decisions import Admit, Enqueued, Refuse
from herdless.gateway.core.limits import AdmissionConfig
from herdless.gateway.gate import Gate
from herdless.gateway.settings import ApiKeys, GatewaySettings
from herdless.gateway.usage import UsageSniffer
from herdless.gateway.wire import BadRequest, parse_chat_request
from herdless.testing import FakeClock

pytestmark = [pytest.mark.server]


def gate(**limits: object) -> Gate:
    return Gate(Admission(AdmissionConfig(**limits), clock=FakeClock()))  # type: ignore[arg-type]


async def test_a_waiter_is_woken_when_a_slot_frees() -> None:
    g = gate(max_concurrency=1, max_queue=2)
    first = g.offer("a", 1)
    second = g.offer("a", 1)
    assert isinstance(first, Admit)
    assert isinstance(second, Enqueued)
    waiter = asyncio.create_task(g.wait(second.ticket))
    await until(lambda: second.ticket.id in g._waiters)
    g.release(first.ticket)
    assert await waiter is None
    assert second.ticket.state == "running"


async def test_a_cancelled_waiter_frees_its_place() -> None:
    g = gate(max_concurrency=1, max_queue=2)
    g.offer("a", 1)
    queued = g.offer("a", 1)
    assert isinstance(queued, Enqueued)
    waiter = asyncio.create_task(g.wait(queued.ticket))
    await until(lambda: queued.ticket.id in g._waiters)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert g.admission.queue_depth == 0
    assert g._waiters == {}


async def test_drain_wakes_waiters_with_a_503() -> None:
    g = gate(max_concurrency=1, max_queue=2)
    g.offer("a", 1)
    queued = g.offer("a", 1)
    assert isinstance(queued, Enqueued)
    waiter = asyncio.create_task(g.wait(queued.ticket))
    await until(lambda: queued.ticket.id in g._waiters)
    g.drain()
    refused = await waiter
    assert refused is not None
    assert (refused.status, refused.code) == (503, "draining")


async def test_a_displaced_waiter_is_woken_with_its_refusal() -> None:
    g = gate(max_concurrency=1, max_queue=1)
    g.offer("a", 1, priority="batch")
    queued = g.offer("a", 1, priority="batch")
    assert isinstance(queued, Enqueued)
    waiter = asyncio.create_task(g.wait(queued.ticket))
    await until(lambda: queued.ticket.id in g._waiters)
    chat = g.offer("a", 1, user="u-chat")
    assert isinstance(chat, Enqueued)
    refused = await waiter
    assert refused is not None
    assert (refused.status, refused.code) == (429, "displaced")


async def test_a_waiter_refused_before_it_waits_still_hears_why() -> None:
    g = gate(max_concurrency=1, max_queue=1)
    g.offer("a", 1, priority="batch")
    queued = g.offer("a", 1, priority="batch")
    assert isinstance(queued, Enqueued)
    g.offer("a", 1, user="u-chat")  # displaced before its caller came to wait
    refused = await g.wait(queued.ticket)
    assert refused is not None
    assert refused.code == "displaced"
    assert g._early == {}
    g.release(queued.ticket)


# -- settings and CLI -------------------------------------------------------------------


def test_flags_override_the_environment() -> None:
    os.environ["HERDLESS_GATEWAY_MAX_QUEUE"] = "7"
    os.environ["HERDLESS_GATEWAY_RATE"] = "3"
    settings = load_settings(["--rate", "5", "--no-access-log"])
    assert (settings.max_queue, settings.rate, settings.access_log) == (7, 5.0, False)
    assert settings.admission_config().rate == 5.0


def test_key_share_applies_only_with_keys() -> None:
    assert GatewaySettings().admission_config().key_queue_share == 1.0
    assert GatewaySettings(api_keys="k").admission_config().key_queue_share == 0.5


@pytest.mark.parametrize(
    ("build", "unnamed"),
    [
        (GatewaySettings.admission_config, {"initial_service_time", "ewma_alpha", "stale_after"}),
        (GatewaySettings.connection_limits, set()),
    ],
)
def test_each_config_field_is_the_setting_of_its_name(
    build: Callable[[GatewaySettings], object], unnamed: set[str]
) -> None:
    # The configs are built by name: a field is the setting of its name, of the same type
    # and value, but for the few no setting names (a renamed setting would land here).
    settings = GatewaySettings(api_keys="k", rate=3.0, max_head_bytes=2048, max_headers=9)
    assert_built_by_name(build(settings), settings, unnamed)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max-concurrency", "0"], "--max-concurrency: Input should be greater than 0"),
        (["--port", "x"], "--port: Input should be a valid integer"),
        (["--upstream", "nope"], "--upstream:"),
        (["--log-level", "loud"], "--log-level:"),
    ],
)
def test_bad_settings_exit_2_with_a_clear_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_secrets_are_not_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--api-keys", "k"]) == 2
    assert main(["--help"]) == 0
    assert "HERDLESS_GATEWAY_API_KEYS" in capsys.readouterr().out


def test_blank_api_keys_are_rejected() -> None:
    with pytest.raises(ValueError, match="at least one key"):
        GatewaySettings(api_keys=" , ")


def test_api_keys_are_hashed_and_identified() -> None:
    keys = ApiKeys(["alpha", "beta"])
    assert keys.identify("alpha") != keys.identify("beta")
    assert (
        keys.identify(
            "alpha",
        )
        is not None
    )
    assert keys.identify("gamma") is None
    assert "alpha" not in repr(keys)
    assert len(keys) == 2


# -- small pure pieces ------------------------------------------------------------------


def test_price_estimate() -> None:
    request = parse_chat_request(
        b'{"messages":[{"role":"system","content":"abcdefgh"},'
        b'{"role":"user","content":[{"type":"text","text":"abcd"}]}],"max_completion_tokens":7}'
    )
    assert (request.prompt_tokens, request.max_tokens) == (3 + 8, 7)
    assert request.price(default_max_tokens=100) == 18
    assert not request.open_ended
    unbounded = parse_chat_request(b'{"messages":[{"role":"user"}]}')
    assert (unbounded.price(100), unbounded.open_ended) == (104, True)  # the default assumed


def test_usage_sniffer_finds_the_last_total_across_chunks() -> None:
    sniffer = UsageSniffer()
    assert sniffer.total_tokens is None
    sniffer.feed(b'data: {"usage":{"prompt_tokens":3,"total_to')
    sniffer.feed(b'kens":42,"completion_tokens":39,"completion_tokens_details":null}}')
    sniffer.feed(b"\n\ndata: [DONE]\n\n")
    assert sniffer.total_tokens == 42
    assert (sniffer.prompt_tokens, sniffer.completion_tokens) == (3, 39)


def test_histogram_is_cumulative() -> None:
    histogram = Histogram(bounds=(0.1, 1))
    for value in (0.05, 0.5, 5):
        histogram.observe(value)
    out = Exposition()
    out.histogram("x_seconds", "help", histogram, model='a "b"')
    lines = out.text().splitlines()
    assert 'x_seconds_bucket{model="a \\"b\\"",le="0.1"} 1' in lines
    assert 'x_seconds_bucket{model="a \\"b\\"",le="1.0"} 2' in lines
    assert 'x_seconds_bucket{model="a \\"b\\"",le="+Inf"} 3' in lines
    assert 'x_seconds_count{model="a \\"b\\""} 3' in lines
    assert 'x_seconds_sum{model="a \\"b\\""} 5.55' in lines
    assert histogram.count == 3


def test_message_count_and_max_tokens_are_capped() -> None:
    two = b'{"messages":[{"role":"user"},{"role":"user"}],"max_tokens":8}'
    assert parse_chat_request(two, max_messages=2, max_tokens_cap=8).max_tokens == 8
    with pytest.raises(BadRequest, match="at most 1") as many:
        parse_chat_request(two, max_messages=1)
    assert (many.value.code, many.value.param) == ("request_too_large", "messages")
    with pytest.raises(BadRequest, match="at most 7") as big:
        parse_chat_request(two, max_tokens_cap=7)
    assert (big.value.code, big.value.param) == ("request_too_large", "max_tokens")


def test_default_max_tokens_must_fit_the_cap() -> None:
    with pytest.raises(ValueError, match="max_tokens_cap"):
        GatewaySettings(max_tokens_cap=100, default_max_tokens=200)


def test_the_running_settings_keep_no_client_secret() -> None:
    settings = GatewaySettings(api_keys="k1,k2", admin_token="adm", upstream_api_key="up")
    bare = settings.without_secrets()
    assert (bare.api_keys, bare.admin_token) == (None, None)
    assert bare.upstream_api_key is not None  # sent upstream as is: it must stay
    assert settings.admin_token is not None  # the original is not changed


def test_a_waiter_is_dropped_when_its_callers_deadline_passes() -> None:
    async def scenario() -> tuple[float, Refuse | None, int]:
        loop = asyncio.get_running_loop()
        config = AdmissionConfig(max_concurrency=1, max_queue=4, queue_timeout=30.0)
        gate = Gate(Admission(config, clock=VirtualClock(loop)))
        assert isinstance(gate.offer("a", 1), Admit)
        queued = gate.offer("a", 1, deadline=5.0)  # predicted 1 s: queued
        assert isinstance(queued, Enqueued)
        refused = await gate.wait(queued.ticket, deadline=5.0)
        return loop.time(), refused, gate.admission.queue_depth

    at, refused, depth = run_virtual(scenario())
    assert at == 5.0  # dropped when its caller stopped waiting, not at the queue timeout
    assert refused is not None
    assert refused.code == "deadline_unattainable"
    assert depth == 0
