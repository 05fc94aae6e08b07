"""The one-line change: the unchanged openai code now retries, falls back and reports."""

from __future__ import annotations

import functools
import importlib
import sys

import pytest

import herdless
from herdless.testing import connect_error, ok, rate_limited

pytest_plugins = ["herdless.testing.pytest_plugin"]

GPU, HOSTED = "http://gpu.test/v1", "http://hosted.test/v1"


@pytest.fixture
def bot(herdless_env, herdless_backends, herdless_clock, monkeypatch):
    herdless_env(
        primary_url=GPU,
        model="gemma-4",
        fallback_url=HOSTED,
        fallback_api_key="sk-hosted",
        fallback_model="gpt-4o-mini",
    )
    backends = herdless_backends(GPU), herdless_backends(HOSTED)
    # The app's herdless.Client() waits on a fake clock here: no real sleeping.
    fake_time = functools.partial(herdless.Client, clock=herdless_clock, sleep=herdless_clock.sleep)
    monkeypatch.setattr(herdless, "Client", fake_time)
    # The app builds its client at import, from HERDLESS_*: import it afresh per test.
    sys.modules.pop("support_bot", None)
    module = importlib.import_module("support_bot")
    yield module, *backends
    module.client.close()  # closes the herdless client underneath too


def test_the_gpu_serves_with_its_own_model(bot):
    module, gpu, hosted = bot
    gpu.script(ok("Use the self-service portal."))
    assert module.answer("VPN?") == "Use the self-service portal."
    assert gpu.bodies[0]["model"] == "gemma-4"  # not the "gpt-4o-mini" the code asks for
    assert not hosted.requests


def test_a_dead_gpu_falls_back_without_touching_the_app_code(bot):
    module, gpu, hosted = bot
    gpu.script(connect_error())
    hosted.script(ok("From the hosted model."))
    assert module.answer("VPN?") == "From the hosted model."
    assert hosted.requests[0].headers["authorization"] == "Bearer sk-hosted"


def test_the_apps_own_error_handling_still_works(bot):
    module, gpu, hosted = bot
    gpu.script(connect_error())
    hosted.script(connect_error())
    assert module.answer("VPN?") == "Sorry, the assistant is unavailable right now."


def test_herdless_retries_and_openai_does_not(bot):
    module, gpu, _ = bot
    gpu.script(rate_limited(0.01), ok("ok"))
    assert module.answer("VPN?") == "ok"
    assert module.client.max_retries == 0
    assert len(gpu.requests) == 2  # herdless's one retry; openai added none
