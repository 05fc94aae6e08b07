"""Building clients: arguments, the environment, event hooks, closing, secrets."""

from __future__ import annotations

import gc
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.client.client_harness import HOSTED_KEY, KEY, MESSAGES, Harness

import herdless
from herdless.events import AttemptStarted, CallFinished, Event
from herdless.testing import ok, rate_limited


async def test_hook_hears_each_wait_before_it_starts(harness: Harness) -> None:
    harness.primary.script(rate_limited(1.0), rate_limited(2.0), ok())
    await harness.chat()
    kinds = [
        "sleep" if isinstance(item, tuple) else type(item).__name__ for item in harness.timeline
    ]
    assert kinds.index("RetryScheduled") < kinds.index("sleep")
    assert harness.sleeps_announced()
    assert isinstance(harness.events[0], AttemptStarted)
    assert isinstance(harness.events[-1], CallFinished)


async def test_a_failing_hook_is_logged_and_never_breaks_the_call(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(event: Event) -> None:
        raise RuntimeError("hook bug")

    harness.build(on_event=broken)
    with caplog.at_level(logging.ERROR, logger="herdless"):
        result = await harness.chat()
    assert result.content
    assert "on_event hook raised" in caplog.text


async def test_async_client_awaits_an_async_hook(router: Any) -> None:
    seen: list[Event] = []

    async def hook(event: Event) -> None:
        seen.append(event)

    harness = Harness("async", router)
    harness.build(on_event=hook)
    await harness.chat()
    await harness.close()
    assert any(isinstance(e, CallFinished) for e in seen)


def test_sync_client_refuses_an_async_hook() -> None:
    async def hook(event: Event) -> None:
        return None

    with pytest.raises(TypeError, match="AsyncClient"):
        herdless.Client(primary="http://gpu.test/v1", on_event=hook)


def test_a_sync_hook_that_returns_a_coroutine_is_reported(
    router: Any, caplog: pytest.LogCaptureFixture
) -> None:
    async def later(event: Event) -> None:
        return None

    harness = Harness("sync", router)
    client = harness.build(on_event=lambda event: later(event))
    with caplog.at_level(logging.ERROR, logger="herdless"), client:
        client.chat(MESSAGES)
    assert "returned an awaitable" in caplog.text


def _open_and_drop() -> None:
    herdless.Client(primary="http://gpu.test/v1", transport=httpx.MockTransport(_never))
    gc.collect()


def test_an_unclosed_client_warns() -> None:
    with pytest.warns(ResourceWarning, match="not closed"):
        _open_and_drop()


def test_a_closed_client_does_not_warn() -> None:
    with herdless.Client(primary="http://gpu.test/v1", transport=httpx.MockTransport(_never)):
        pass
    gc.collect()  # filterwarnings=error would fail the test on a ResourceWarning


async def test_async_client_closes_with_async_with() -> None:
    async with herdless.AsyncClient(
        primary="http://gpu.test/v1", transport=httpx.MockTransport(_never)
    ) as client:
        assert isinstance(client, herdless.AsyncClient)
    gc.collect()


def _never(request: httpx.Request) -> httpx.Response:
    raise AssertionError("no request expected")


def test_primary_may_be_a_url_or_several() -> None:
    with herdless.Client(
        primary=["http://a.test/v1", "http://b.test/v1"], transport=httpx.MockTransport(_never)
    ) as client:
        assert set(client.stats().breakers) == {"primary", "primary-2"}


def test_no_secret_in_reprs() -> None:
    backend = herdless.Backend(name="hosted", base_url="https://h.test/v1", api_key=HOSTED_KEY)
    with herdless.Client(
        primary=herdless.Backend(name="primary", base_url="http://p.test/v1", api_key=KEY),
        fallback=backend,
        transport=httpx.MockTransport(_never),
    ) as client:
        text = repr(client) + repr(backend)
    assert KEY not in text
    assert HOSTED_KEY not in text


def test_no_arguments_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERDLESS_PRIMARY_URL", "http://env.test/v1")
    monkeypatch.setenv("HERDLESS_MODEL", "env-model")
    monkeypatch.setenv("HERDLESS_PRIMARY_API_KEY", KEY)
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"choices": [{"message": {"content": "env"}}]})

    with herdless.Client(transport=httpx.MockTransport(answer), env_file=None) as client:
        assert client.chat(MESSAGES).content == "env"
    assert str(seen[0].url) == "http://env.test/v1/chat/completions"
    assert seen[0].headers["authorization"] == f"Bearer {KEY}"
    assert b'"model":"env-model"' in seen[0].content


async def test_from_env_reads_a_dotenv_file(tmp_path: Path) -> None:
    env = tmp_path / ".env"
    env.write_text("HERDLESS_PRIMARY_URL=http://dotenv.test/v1\nHERDLESS_MODEL=dot\n")
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"choices": [{"message": {"content": "ok"}}]})

    async with herdless.AsyncClient.from_env(
        env_file=env, transport=httpx.MockTransport(answer)
    ) as client:
        await client.chat(MESSAGES)
    assert str(seen[0].url) == "http://dotenv.test/v1/chat/completions"


def test_from_env_without_a_primary_names_the_variable() -> None:
    with pytest.raises(herdless.ConfigurationError) as caught:
        herdless.Client.from_env(env_file=None)
    assert caught.value.variable == "HERDLESS_PRIMARY_URL"


async def test_an_async_hook_that_raises_is_logged(
    router: Any, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken(event: Event) -> None:
        raise RuntimeError("async hook bug")

    harness = Harness("async", router)
    harness.build(on_event=broken)
    with caplog.at_level(logging.ERROR, logger="herdless"):
        assert (await harness.chat()).content
    await harness.close()
    assert "on_event hook raised" in caplog.text


def test_from_env_takes_no_primary() -> None:
    with pytest.raises(TypeError, match="HERDLESS_PRIMARY_URL"):
        herdless.Client.from_env(primary="http://gpu.test/v1")
