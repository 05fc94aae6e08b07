"""The scripted replies drive a real herdless.Client the way the real failures would."""

from __future__ import annotations

import pytest

import herdless
from herdless.testing import draining, hang, ok, rate_limited, stream

pytest_plugins = ["herdless.testing.pytest_plugin"]

GPU, HOSTED = "http://gpu.test/v1", "http://hosted.test/v1"
HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture
def client(herdless_backends, herdless_clock):
    hosted = herdless.Backend(name="hosted", base_url=HOSTED, model="mini", external=True)
    with herdless.Client(
        primary=GPU,
        model="gemma-4",
        fallback=hosted,
        clock=herdless_clock,
        sleep=herdless_clock.sleep,
    ) as client:
        yield client


def test_rate_limited_is_waited_out_in_fake_time(herdless_backends, herdless_clock, client):
    gpu = herdless_backends(GPU).script(rate_limited(2.0), ok("hi"))
    assert client.chat(HELLO).content == "hi"
    assert herdless_clock.monotonic() - 1000.0 >= 2.0
    assert [r.headers["x-herdless-attempt"] for r in gpu.requests] == ["1", "2"]
    assert len({r.headers["x-request-id"] for r in gpu.requests}) == 1


def test_draining_moves_to_the_fallback_at_once(herdless_backends, client):
    gpu = herdless_backends(GPU).script(draining(30))
    herdless_backends(HOSTED).script(ok("from hosted"))
    result = client.chat(HELLO)
    assert (result.backend, result.fallback_reason) == ("hosted", "draining")
    assert len(gpu.requests) == 1


def test_hang_is_a_first_byte_timeout(herdless_backends, client):
    herdless_backends(GPU).script(hang())
    herdless_backends(HOSTED).script(ok("from hosted"))
    result = client.chat(HELLO)
    assert result.backend == "hosted"
    assert result.attempts[0].kind == "first_byte_timeout"


def test_stream_cut_is_stream_interrupted(herdless_backends, client):
    herdless_backends(GPU).script(stream(["a", "b", "c"], cut_after=3))
    received = []
    with client.chat(HELLO, stream=True) as chunks, pytest.raises(herdless.StreamInterrupted):
        received.extend(chunk.content for chunk in chunks)
    assert "".join(received) == "ab"
