"""The FastAPI example against scripted backends: no network, no real waiting."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from fastapi_app import create_app

from herdless.testing import connect_error, ok, rate_limited, stream

pytest_plugins = ["herdless.testing.pytest_plugin"]

GPU, HOSTED = "http://gpu.test/v1", "http://hosted.test/v1"


@pytest.fixture
def backends(herdless_env, herdless_backends):
    herdless_env(
        primary_url=GPU,
        model="gemma-4",
        fallback_url=HOSTED,
        fallback_api_key="sk-hosted",
        fallback_model="gpt-4o-mini",
    )
    return herdless_backends(GPU), herdless_backends(HOSTED)


@pytest.fixture
def http(backends, herdless_clock):
    app = create_app(clock=herdless_clock, sleep=herdless_clock.asleep)
    with TestClient(app) as client:  # runs the lifespan: one herdless client
        yield client


def test_a_full_gpu_is_waited_for_and_the_wait_is_visible(backends, http, herdless_clock):
    gpu, hosted = backends
    gpu.script(rate_limited(1.0), ok("from the GPU"))
    response = http.post("/chat", json={"message": "Hello"})
    assert response.status_code == 200
    assert response.json() == {"answer": "from the GPU"}
    assert response.headers["x-herdless-backend"] == "primary"
    assert response.headers["x-herdless-attempts"] == "2"
    assert herdless_clock.monotonic() - 1000.0 >= 1.0  # it honoured Retry-After (fake time)
    assert not hosted.requests


def test_a_dead_gpu_falls_back_and_says_why(backends, http):
    gpu, hosted = backends
    gpu.script(connect_error())
    hosted.script(ok("from the hosted model"))
    response = http.post("/chat", json={"message": "Hello"})
    assert response.json() == {"answer": "from the hosted model"}
    assert response.headers["x-herdless-backend"] == "fallback"  # HERDLESS_FALLBACK_URL's name
    assert response.headers["x-herdless-fallback-reason"]
    assert hosted.bodies[0]["model"] == "gpt-4o-mini"


def test_private_data_never_reaches_the_hosted_model(backends, http):
    gpu, hosted = backends
    gpu.script(connect_error())
    response = http.post("/chat", json={"message": "my salary is ...", "private": True})
    assert response.status_code == 503
    assert not hosted.requests


def test_sse_stream_relays_deltas(backends, http):
    gpu, _ = backends
    gpu.script(stream(["Hel", "lo"]))
    response = http.post("/chat/stream", json={"message": "Hello"})
    assert response.headers["x-herdless-backend"] == "primary"
    events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert "".join(json.loads(e)["delta"] for e in events[:-1]) == "Hello"


def test_a_stream_cut_mid_way_ends_with_an_error_event(backends, http):
    gpu, _ = backends
    gpu.script(stream(["a", "b", "c"], cut_after=3))
    response = http.post("/chat/stream", json={"message": "Hello"})
    assert "event: error" in response.text
    assert "[DONE]" not in response.text


def test_stats_count_what_happened(backends, http):
    gpu, _ = backends
    gpu.script(connect_error())
    http.post("/chat", json={"message": "Hello"})
    stats = http.get("/stats").json()
    assert stats["succeeded"] == 1
    assert sum(stats["fallbacks"].values()) == 1
