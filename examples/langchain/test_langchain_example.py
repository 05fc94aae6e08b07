"""The LangChain chain on herdless: sync and async paths, retry and fallback, fake time."""

from __future__ import annotations

import pytest

import herdless
from herdless.testing import connect_error, ok, rate_limited, stream

pytest.importorskip("langchain_openai")
from langchain_app import build_chain

pytest_plugins = ["herdless.testing.pytest_plugin"]

GPU, HOSTED = "http://gpu.test/v1", "http://hosted.test/v1"
INPUT = {"language": "Korean", "text": "The GPU is back."}


@pytest.fixture
async def chain(herdless_backends, herdless_clock):
    hosted = herdless.Backend(
        name="hosted", base_url=HOSTED, api_key="sk-h", model="gpt-4o-mini", external=True
    )
    options = {"primary": GPU, "model": "gemma-4", "fallback": hosted, "clock": herdless_clock}
    gpu, fallback = herdless_backends(GPU), herdless_backends(HOSTED)
    with herdless.Client(**options, sleep=herdless_clock.sleep) as sync_client:
        async with herdless.AsyncClient(**options, sleep=herdless_clock.asleep) as async_client:
            yield build_chain(sync_client, async_client), gpu, fallback


def test_invoke_waits_out_a_429(chain):
    runnable, gpu, _ = chain
    gpu.script(rate_limited(1.0), ok("GPU가 돌아왔습니다."))
    assert runnable.invoke(INPUT) == "GPU가 돌아왔습니다."
    assert len(gpu.requests) == 2
    assert gpu.bodies[0]["messages"][0]["role"] == "system"


async def test_ainvoke_falls_back_to_the_hosted_model(chain):
    runnable, gpu, hosted = chain
    gpu.script(connect_error())
    hosted.script(ok("GPU가 돌아왔습니다."))
    assert await runnable.ainvoke(INPUT) == "GPU가 돌아왔습니다."
    assert hosted.bodies[0]["model"] == "gpt-4o-mini"


def test_stream_yields_the_pieces(chain):
    runnable, gpu, _ = chain
    gpu.script(stream(["GPU가 ", "돌아왔습니다."]))
    assert "".join(runnable.stream(INPUT)) == "GPU가 돌아왔습니다."
