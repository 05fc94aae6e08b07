"""API keys never leak from the SDK: not in reprs, settings, events, errors or logs.

Every path a key could take to a log line is driven with a recognisable secret:
successful calls, every failing status, connection errors, fallbacks, the
environment (a malformed setting next to a key), and the pickled errors. TLS
verification is on by default.
"""

from __future__ import annotations

import logging
import pickle
import random
import ssl

import httpx
import pytest

from herdless import Backend, Client, ConfigurationError, HerdlessError, RetryPolicy
from herdless._settings import env_options
from herdless.events import Event
from herdless.testing import FakeClock

PRIMARY_KEY = "sk-primary-SECRET-4a1f"
HOSTED_KEY = "sk-hosted-SECRET-9b2e"
SECRETS = (PRIMARY_KEY, HOSTED_KEY, "SECRET")

OK = {
    "id": "c",
    "object": "chat.completion",
    "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
}


def assert_clean(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{secret!r} leaked into: {text[:300]}"


def make_client(handler: httpx.MockTransport, events: list[Event]) -> Client:
    clock = FakeClock()
    return Client(
        primary=Backend(name="gpu", base_url="http://gpu.test/v1", api_key=PRIMARY_KEY),
        fallback=Backend(
            name="hosted",
            base_url="https://hosted.test/v1",
            api_key=HOSTED_KEY,
            model="mini",
            external=True,
        ),
        model="m",
        retry=RetryPolicy(max_attempts=2),
        deadline=30.0,
        on_event=events.append,
        clock=clock,
        sleep=clock.sleep,
        rng=random.Random(0),
        transport=handler,
        env_file=None,
    )


def answer(status: int, echo_key: bool = False) -> httpx.MockTransport:
    """A backend answering ``status``; with ``echo_key`` its error message repeats the
    Authorization header, as a careless proxy might: the SDK must not pass it on."""

    def handle(request: httpx.Request) -> httpx.Response:
        if status == 200:
            return httpx.Response(200, json=OK)
        message = f"denied for {request.headers.get('authorization')}" if echo_key else "no"
        return httpx.Response(status, json={"error": {"message": message, "code": "x"}})

    return httpx.MockTransport(handle)


def refuse(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError(f"cannot connect to {request.url}", request=request)


def test_reprs_hold_no_key() -> None:
    events: list[Event] = []
    backend = Backend(name="gpu", base_url="http://gpu.test/v1", api_key=PRIMARY_KEY)
    with make_client(answer(200), events) as client:
        assert_clean(repr(backend))
        assert_clean(str(backend))
        assert_clean(repr(client))
        result = client.chat([{"role": "user", "content": "hi"}])
        assert_clean(repr(result))
        assert_clean(repr(client.stats()))
    assert_clean(repr(events))


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422, 429, 500, 502, 503])
def test_errors_events_and_logs_hold_no_key(status: int, caplog: pytest.LogCaptureFixture) -> None:
    events: list[Event] = []
    caplog.set_level(logging.DEBUG)
    with make_client(answer(status, echo_key=False), events) as client:
        try:
            client.chat([{"role": "user", "content": "hi"}])
        except HerdlessError as exc:
            for text in (
                str(exc),
                repr(exc),
                repr(vars(exc)),
                repr(pickle.loads(pickle.dumps(exc))),
            ):
                assert_clean(text)
    assert_clean(repr(events))
    assert_clean(caplog.text)


def test_a_server_echoing_the_key_does_not_put_it_in_the_error() -> None:
    events: list[Event] = []
    client = make_client(answer(401, echo_key=True), events)
    with client, pytest.raises(HerdlessError) as caught:
        client.chat([{"role": "user", "content": "hi"}], allow_fallback=False)
    assert_clean(str(caught.value))
    assert_clean(repr(events))


def test_connection_errors_hold_no_key(caplog: pytest.LogCaptureFixture) -> None:
    events: list[Event] = []
    caplog.set_level(logging.DEBUG)
    client = make_client(httpx.MockTransport(refuse), events)
    with client, pytest.raises(HerdlessError) as caught:
        client.chat([{"role": "user", "content": "hi"}])
    assert_clean(str(caught.value))
    assert_clean(repr(caught.value))
    assert_clean(repr(events))
    assert_clean(caplog.text)


def test_settings_from_the_environment_hold_no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERDLESS_PRIMARY_URL", "http://gpu.test/v1")
    monkeypatch.setenv("HERDLESS_PRIMARY_API_KEY", PRIMARY_KEY)
    monkeypatch.setenv("HERDLESS_FALLBACK_URL", "https://hosted.test/v1")
    monkeypatch.setenv("HERDLESS_FALLBACK_API_KEY", HOSTED_KEY)
    monkeypatch.setenv("HERDLESS_MODEL", "m")
    monkeypatch.setenv("HERDLESS_FALLBACK_MODEL", "mini")
    options = env_options(env_file=None)
    assert_clean(repr(options))
    with Client(env_file=None, transport=answer(200)) as client:
        assert_clean(repr(client))
    # A malformed setting next to the keys: the error names the variable, not the values.
    monkeypatch.setenv("HERDLESS_DEADLINE", "soon")
    with pytest.raises(ConfigurationError) as caught:
        env_options(env_file=None)
    assert_clean(str(caught.value))


def test_tls_verification_is_on_by_default() -> None:
    with Client(primary="https://gpu.test/v1", model="m", env_file=None) as client:
        http = client._http  # white-box: the pool's SSL context is httpx's default
        context = http._transport._pool._ssl_context  # type: ignore[attr-defined]
        assert context.verify_mode == ssl.CERT_REQUIRED
        assert context.check_hostname


def test_the_new_paths_hold_no_key(caplog: pytest.LogCaptureFixture) -> None:
    # A spend cap's refusal, a derived client, extra headers and the token events.
    from herdless import FallbackPolicy, Price, SpendLimitExceeded

    events: list[Event] = []
    caplog.set_level(logging.DEBUG)
    clock = FakeClock()
    with Client(
        primary=Backend(name="gpu", base_url="http://gpu.test/v1", api_key=PRIMARY_KEY),
        fallback=Backend(
            name="hosted",
            base_url="https://hosted.test/v1",
            api_key=HOSTED_KEY,
            model="mini",
            external=True,
            price=Price(input=1.0, output=1.0),
        ),
        model="m",
        retry=RetryPolicy(max_attempts=1),
        fallback_policy=FallbackPolicy(max_external_tokens=0),
        on_event=events.append,
        clock=clock,
        sleep=clock.sleep,
        transport=answer(502),
        env_file=None,
    ) as client:
        derived = client.with_options(deadline=5.0)
        assert_clean(repr(derived))
        with pytest.raises(SpendLimitExceeded) as caught:
            derived.chat([{"role": "user", "content": "hi"}], extra_headers={"X-Tenant": "t"})
        assert_clean(str(caught.value))
        assert_clean(repr(pickle.loads(pickle.dumps(caught.value))))
    assert_clean(repr(events))
    assert_clean(caplog.text)


def test_a_misspelled_key_variable_is_named_without_its_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HERDLESS_PRIMARY_URL", "http://gpu.test/v1")
    monkeypatch.setenv("HERDLESS_PRIMARY_API_KY", PRIMARY_KEY)
    with pytest.warns(UserWarning, match="did you mean") as caught:
        env_options(env_file=None)
    [warning] = caught
    assert "HERDLESS_PRIMARY_API_KEY" in str(warning.message)
    assert_clean(str(warning.message))
