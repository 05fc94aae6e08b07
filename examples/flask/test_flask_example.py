"""The Flask example against scripted backends: no network, no real waiting."""

from __future__ import annotations

import pytest
from flask_app import create_app

from herdless.testing import connect_error, ok, rate_limited, stream

pytest_plugins = ["herdless.testing.pytest_plugin"]

GPU, HOSTED = "http://gpu.test/v1", "http://hosted.test/v1"


@pytest.fixture
def backends(herdless_env, herdless_backends):
    herdless_env(primary_url=GPU, model="gemma-4", fallback_url=HOSTED, fallback_model="mini")
    return herdless_backends(GPU), herdless_backends(HOSTED)


@pytest.fixture
def http(backends, herdless_clock):
    app = create_app(clock=herdless_clock, sleep=herdless_clock.sleep)
    yield app.test_client()
    app.extensions["herdless"].close()


def test_429_then_ok(backends, http):
    gpu, _ = backends
    gpu.script(rate_limited(2.0), ok("from the GPU"))
    response = http.post("/chat", json={"message": "Hello"})
    assert response.json == {"answer": "from the GPU"}
    assert response.headers["x-herdless-attempts"] == "2"


def test_fallback_is_visible(backends, http):
    gpu, hosted = backends
    gpu.script(connect_error())
    hosted.script(ok("from the hosted model"))
    response = http.post("/chat", json={"message": "Hello"})
    assert response.json == {"answer": "from the hosted model"}
    assert response.headers["x-herdless-backend"] == "fallback"


def test_private_calls_fail_instead_of_leaving(backends, http):
    gpu, hosted = backends
    gpu.script(connect_error())
    assert http.post("/chat", json={"message": "x", "private": True}).status_code == 503
    assert not hosted.requests


def test_streaming_with_stream_with_context(backends, http):
    gpu, _ = backends
    gpu.script(stream(["Hel", "lo"]))
    response = http.post("/chat/stream", json={"message": "Hello"})
    text = response.get_data(as_text=True)
    assert '{"delta": "Hel"}' in text
    assert text.endswith("data: [DONE]\n\n")
