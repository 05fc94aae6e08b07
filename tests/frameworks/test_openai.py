"""The openai client on herdless: fallback, model/key rewriting, no stacked retries, streams.

Run against the installed openai (3.x uses httpx2, and also accepts httpx) for both
flavors; the second venv of the report runs the same file under openai 2.x.
"""

from __future__ import annotations

import importlib.util
import random

import httpx
import openai
import pytest

import herdless
from herdless._async_client import AsyncClient
from herdless._client import Client
from herdless.events import CallFailed, Event
from herdless.integrations import openai as hl_openai
from herdless.integrations.openai import (
    async_http_client,
    async_openai_client,
    http_client,
    native_flavor,
    openai_client,
    transport,
)
from herdless.testing import (
    FakeClock,
    connect_error,
    draining,
    hang,
    ok,
    rate_limited,
    server_error,
    stream,
)

pytest_plugins = ["herdless.testing.pytest_plugin"]

GPU, HOSTED = "http://gpu.test/v1", "http://hosted.test/v1"
MESSAGES = [{"role": "user", "content": "Hello"}]
FLAVORS = ["httpx"] + (["httpx2"] if importlib.util.find_spec("httpx2") else [])


def _hosted() -> herdless.Backend:
    return herdless.Backend(
        name="hosted", base_url=HOSTED, api_key="sk-hosted", model="gpt-4o-mini", external=True
    )


@pytest.fixture
def backends(herdless_backends):
    return herdless_backends(GPU), herdless_backends(HOSTED)


@pytest.fixture
def hl(herdless_clock):
    with Client(
        primary=GPU,
        model="gemma-4",
        fallback=_hosted(),
        clock=herdless_clock,
        sleep=herdless_clock.sleep,
    ) as client:
        yield client


def _openai(hl: Client, flavor: str) -> openai.OpenAI:
    if flavor == native_flavor():
        return openai_client(hl)
    return openai.OpenAI(
        api_key="unused",
        base_url="http://x/v1",
        max_retries=0,
        http_client=http_client(hl, flavor=flavor),  # type: ignore[call-overload]
    )


@pytest.mark.parametrize("flavor", FLAVORS)
def test_429_is_retried_by_herdless_once_and_not_by_openai(backends, hl, flavor):
    gpu, hosted = backends
    gpu.script(rate_limited(0.2), ok("from the GPU"))
    raw = _openai(hl, flavor).chat.completions.with_raw_response.create(
        model="gpt-4o", messages=MESSAGES
    )
    answer = raw.parse()
    assert answer.choices[0].message.content == "from the GPU"
    assert raw.headers["x-herdless-backend"] == "primary"
    assert raw.headers["x-herdless-attempts"] == "2"
    assert len(gpu.requests) == 2
    assert not hosted.requests
    # The app's "gpt-4o" is not sent: the GPU is asked for its own model.
    assert [body["model"] for body in gpu.bodies] == ["gemma-4", "gemma-4"]


@pytest.mark.parametrize("flavor", FLAVORS)
def test_fallback_rewrites_url_key_and_model(backends, hl, flavor):
    gpu, hosted = backends
    gpu.script(connect_error())
    hosted.script(ok("from the hosted model"))
    raw = _openai(hl, flavor).chat.completions.with_raw_response.create(
        model="gpt-4o", messages=MESSAGES
    )
    assert raw.parse().choices[0].message.content == "from the hosted model"
    assert raw.headers["x-herdless-backend"] == "hosted"
    assert raw.headers["x-herdless-fallback-reason"]
    assert hosted.bodies[0]["model"] == "gpt-4o-mini"
    assert hosted.requests[0].headers["authorization"] == "Bearer sk-hosted"
    assert "unused" not in hosted.requests[0].headers["authorization"]


@pytest.mark.parametrize("flavor", FLAVORS)
def test_openai_extra_body_and_tool_calls_pass_through(backends, hl, flavor):
    gpu, _ = backends
    weather = {"name": "weather", "arguments": '{"city": "Seoul"}'}
    gpu.script(ok("", tool_calls=[weather]))
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {}}}]
    answer = _openai(hl, flavor).chat.completions.create(
        model="gpt-4o",
        messages=MESSAGES,
        tools=tools,  # type: ignore[arg-type]
        extra_body={"top_k": 5, "guided_decoding_backend": "xgrammar"},
    )
    body = gpu.bodies[0]
    assert (body["tools"], body["top_k"], body["guided_decoding_backend"]) == (
        tools,
        5,
        "xgrammar",
    )
    [call] = answer.choices[0].message.tool_calls or []
    assert call.function.name == "weather"  # type: ignore[union-attr]
    assert answer.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (server_error(400, "bad prompt"), openai.BadRequestError),
        (rate_limited(0.5), openai.RateLimitError),
        (server_error(503, "overloaded"), openai.InternalServerError),
    ],
)
def test_status_errors_become_openai_errors_and_openai_never_retries(
    herdless_backends, herdless_clock, flavor, reply, error
):
    gpu = herdless_backends(GPU)
    sent = []
    for openai_retries in (0, 5):
        gpu.script(reply)
        before = len(gpu.requests)
        with Client(
            primary=GPU,
            model="gemma-4",
            clock=herdless_clock,
            sleep=herdless_clock.sleep,
            rng=random.Random(7),  # the same jitter, so both runs retry as often
        ) as hl:
            client = openai.OpenAI(
                api_key="unused",
                base_url="http://x/v1",
                max_retries=openai_retries,  # even when the app leaves openai's retries on
                http_client=http_client(hl, flavor=flavor),  # type: ignore[call-overload]
            )
            with pytest.raises(error):
                client.chat.completions.create(model="m", messages=MESSAGES)
        sent.append(len(gpu.requests) - before)
    assert sent[0] == sent[1]  # x-should-retry: false: openai added no attempt of its own
    if error is openai.BadRequestError:
        assert sent[0] == 1  # a bad request is never retried, by anyone
    else:
        assert sent[0] > 1  # herdless retried 429/503 itself before giving up


def test_data_guard_header_keeps_the_call_off_the_external_fallback(backends, hl):
    gpu, hosted = backends
    gpu.script(draining(30))
    with pytest.raises(openai.InternalServerError) as caught:
        openai_client(hl).chat.completions.create(
            model="m", messages=MESSAGES, extra_headers={"x-herdless-allow-fallback": "false"}
        )
    assert caught.value.status_code == 503
    assert not hosted.requests


def test_all_backends_down_is_a_connection_error(backends, hl):
    gpu, hosted = backends
    gpu.script(connect_error())
    hosted.script(connect_error())
    with pytest.raises(openai.APIConnectionError):
        openai_client(hl).chat.completions.create(model="m", messages=MESSAGES)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_stream_passes_chunks_and_usage(backends, hl, flavor):
    gpu, _ = backends
    gpu.script(stream(["Hel", "lo"]))
    chunks = list(
        _openai(hl, flavor).chat.completions.create(model="m", messages=MESSAGES, stream=True)
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 2


def test_a_stream_cut_after_chunks_reached_the_app_raises(backends, hl):
    gpu, _ = backends
    gpu.script(stream(["a", "b", "c"], cut_after=3))
    received = []

    def read_all() -> None:
        for chunk in openai_client(hl).chat.completions.create(
            model="m", messages=MESSAGES, stream=True
        ):
            received.append(chunk)

    # openai 3.x wraps the transport's error in APIConnectionError; 2.x lets it through.
    with pytest.raises((openai.APIConnectionError, httpx.RemoteProtocolError)) as caught:
        read_all()
    assert "broke after" in f"{caught.value} {caught.value.__cause__}"
    assert received  # what arrived before the cut reached the app


def test_other_endpoints_are_refused_clearly(backends, hl):
    with pytest.raises(openai.NotFoundError, match="chat/completions only"):
        openai_client(hl).models.list()


@pytest.mark.parametrize("flavor", FLAVORS)
async def test_async_openai_falls_back(backends, herdless_clock, flavor):
    gpu, hosted = backends
    gpu.script(server_error(503))
    hosted.script(ok("async fallback"))
    async with AsyncClient(
        primary=GPU,
        model="gemma-4",
        fallback=_hosted(),
        clock=herdless_clock,
        sleep=herdless_clock.asleep,
    ) as hl:
        if flavor == native_flavor():
            client = async_openai_client(hl)
        else:
            client = openai.AsyncOpenAI(
                api_key="unused",
                base_url="http://x/v1",
                max_retries=0,
                http_client=async_http_client(hl, flavor=flavor),  # type: ignore[call-overload]
            )
        answer = await client.chat.completions.create(model="m", messages=MESSAGES)
        assert answer.choices[0].message.content == "async fallback"
        # The primary's breaker may have opened on its 503s (the jitter is random): then
        # the fallback streams; either way the stream is the same.
        gpu.script(stream(["x", "y"]))
        hosted.script(stream(["x", "y"]))
        hl_stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        parts = [c.choices[0].delta.content async for c in hl_stream if c.choices]
    assert "".join(p or "" for p in parts) == "xy"


def test_unknown_flavor_is_refused(hl):
    with pytest.raises(ValueError, match="flavor"):
        http_client(hl, flavor="requests")  # type: ignore[call-overload]


async def test_async_errors_cuts_and_close(backends, herdless_clock):
    gpu, hosted = backends
    async with AsyncClient(
        primary=GPU,
        model="gemma-4",
        fallback=_hosted(),
        clock=herdless_clock,
        sleep=herdless_clock.asleep,
    ) as hl:
        client = async_openai_client(hl)
        with pytest.raises(openai.NotFoundError):
            await client.models.list()
        gpu.script(connect_error())
        hosted.script(connect_error())
        with pytest.raises(openai.APIConnectionError):
            await client.chat.completions.create(model="m", messages=MESSAGES)
        gpu.script(stream(["a", "b", "c"], cut_after=3))
        cut = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)

        async def read_all() -> None:
            async for _ in cut:
                pass

        with pytest.raises((openai.APIConnectionError, httpx.RemoteProtocolError)) as caught:
            await read_all()
        assert "broke after" in f"{caught.value} {caught.value.__cause__}"
        await client.close()  # closes the herdless client under it (idempotent)


# --- openai's retries never stack on herdless's, even when herdless got no answer ------
#
# The repro: the app builds openai itself, leaves max_retries=2, and nothing
# listens on the primary. openai retries whatever its transport raises, so a give-up
# raised as an httpx error made openai run the whole herdless call 3 times.

NOTHING_LISTENS = "http://127.0.0.1:1/v1"  # port 1: refused at once, no server needed


def _failed_calls(events: list[Event]) -> int:
    return sum(isinstance(event, CallFailed) for event in events)


@pytest.fixture
def repro_env(monkeypatch):
    monkeypatch.setenv("HERDLESS_PRIMARY_URL", NOTHING_LISTENS)
    monkeypatch.setenv("HERDLESS_MODEL", "m")
    monkeypatch.setenv("HERDLESS_DEADLINE", "5")


@pytest.mark.usefixtures("repro_env")
@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("max_retries", [0, 2])
def test_a_connection_give_up_is_one_call_whatever_openais_max_retries(flavor, max_retries):
    events: list[Event] = []
    clock = FakeClock()
    hl = herdless.Client(on_event=events.append, clock=clock, sleep=clock.sleep, env_file=None)
    client = openai.OpenAI(
        api_key="unused",
        base_url="http://herdless/v1",
        max_retries=max_retries,
        http_client=http_client(hl, flavor=flavor),  # type: ignore[call-overload]
    )
    with client, pytest.raises(openai.APIConnectionError) as caught:
        client.chat.completions.create(model="m", messages=MESSAGES)
    assert _failed_calls(events) == 1  # was 3 with max_retries=2
    assert type(caught.value) is openai.APIConnectionError  # not a timeout, not a status
    # herdless's account of the attempts is the message, and the chain ends at its error.
    assert "Connection refused" in str(caught.value)
    assert isinstance(caught.value.__cause__.__cause__, herdless.APIConnectionError)


@pytest.mark.usefixtures("repro_env")
@pytest.mark.parametrize("flavor", FLAVORS)
async def test_async_connection_give_up_is_one_call(flavor):
    events: list[Event] = []
    clock = FakeClock()
    async with herdless.AsyncClient(
        on_event=events.append, clock=clock, sleep=clock.asleep, env_file=None
    ) as hl:
        client = openai.AsyncOpenAI(
            api_key="unused",
            base_url="http://herdless/v1",
            max_retries=2,
            http_client=async_http_client(hl, flavor=flavor),  # type: ignore[call-overload]
        )
        with pytest.raises(openai.APIConnectionError):
            await client.chat.completions.create(model="m", messages=MESSAGES)
    assert _failed_calls(events) == 1


@pytest.mark.parametrize("flavor", FLAVORS)
def test_a_timeout_give_up_is_one_call_and_an_openai_timeout(herdless_backends, flavor):
    gpu = herdless_backends(GPU).script(hang())
    events: list[Event] = []
    clock = FakeClock()
    with Client(
        primary=GPU, model="m", on_event=events.append, clock=clock, sleep=clock.sleep
    ) as hl:
        client = openai.OpenAI(
            api_key="unused",
            base_url="http://herdless/v1",
            max_retries=2,
            http_client=http_client(hl, flavor=flavor),  # type: ignore[call-overload]
        )
        with pytest.raises(openai.APITimeoutError) as caught:
            client.chat.completions.create(model="m", messages=MESSAGES)
    assert _failed_calls(events) == 1
    sent_by_one_herdless_call = len(gpu.requests)
    assert sent_by_one_herdless_call > 1  # herdless retried the hang itself
    assert "no answer" in str(caught.value.__cause__)  # herdless's message, one link down


@pytest.mark.usefixtures("repro_env")
def test_an_openai_that_retries_whatever_its_transport_raises_gets_a_502(monkeypatch):
    # openai before 2.31 retried any exception from its transport, its own included:
    # for it the give-up is an answer it does not retry.
    monkeypatch.setattr(hl_openai, "_openai_errors", lambda: None)
    events: list[Event] = []
    clock = FakeClock()
    hl = herdless.Client(on_event=events.append, clock=clock, sleep=clock.sleep, env_file=None)
    client = openai.OpenAI(
        api_key="unused",
        base_url="http://herdless/v1",
        max_retries=2,
        http_client=http_client(hl, flavor=native_flavor()),  # type: ignore[call-overload]
    )
    with client, pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(model="m", messages=MESSAGES)
    assert _failed_calls(events) == 1
    assert caught.value.status_code == 502
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert "Connection refused" in caught.value.message


@pytest.mark.usefixtures("repro_env")
def test_a_caller_other_than_openai_gets_httpxs_own_error():
    clock = FakeClock()
    hl = herdless.Client(clock=clock, sleep=clock.sleep, env_file=None)
    plain = httpx.Client(transport=transport(hl))
    with plain, pytest.raises(httpx.ConnectError) as caught:
        plain.post("http://herdless/v1/chat/completions", json={"messages": MESSAGES})
    assert "Connection refused" in str(caught.value)
    assert isinstance(caught.value.__cause__, herdless.APIConnectionError)
