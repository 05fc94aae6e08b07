"""The Django example: sync view (WSGI) and async views (ASGI), scripted backends."""

from __future__ import annotations

import json

import django_site
import pytest
from django.test import AsyncClient, Client

from herdless.testing import connect_error, ok, rate_limited, stream

pytest_plugins = ["herdless.testing.pytest_plugin"]

GPU, HOSTED = "http://gpu.test/v1", "http://hosted.test/v1"
BODY = {"data": json.dumps({"message": "Hello"}), "content_type": "application/json"}


@pytest.fixture
async def backends(herdless_env, herdless_backends, herdless_clock):
    herdless_env(primary_url=GPU, model="gemma-4", fallback_url=HOSTED, fallback_model="mini")
    django_site.configure(
        clock=herdless_clock, sleep=herdless_clock.sleep, asleep=herdless_clock.asleep
    )
    yield herdless_backends(GPU), herdless_backends(HOSTED)
    for pending in django_site.close():
        await pending


async def test_sync_view_waits_out_a_429(backends):
    gpu, _ = backends
    gpu.script(rate_limited(1.0), ok("sync answer"))
    # Django's sync test client runs the WSGI handler in a thread here.
    from asgiref.sync import sync_to_async

    response = await sync_to_async(Client().post)("/sync/chat", **BODY)
    assert json.loads(response.content) == {"answer": "sync answer"}
    assert response["x-herdless-attempts"] == "2"


async def test_async_view_falls_back(backends):
    gpu, hosted = backends
    gpu.script(connect_error())
    hosted.script(ok("async fallback"))
    response = await AsyncClient().post("/async/chat", **BODY)
    assert json.loads(response.content) == {"answer": "async fallback"}
    assert response["x-herdless-backend"] == "fallback"


async def test_async_streaming_view(backends):
    gpu, _ = backends
    gpu.script(stream(["Hel", "lo"]))
    response = await AsyncClient().post("/async/chat/stream", **BODY)
    body = b"".join([part async for part in response.streaming_content]).decode()
    assert '{"delta": "Hel"}' in body
    assert body.endswith("data: [DONE]\n\n")


async def test_everything_down_is_a_503(backends):
    gpu, hosted = backends
    gpu.script(connect_error())
    hosted.script(connect_error())
    response = await AsyncClient().post("/async/chat", **BODY)
    assert response.status_code == 503
