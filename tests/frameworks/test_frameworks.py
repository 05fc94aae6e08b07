"""LangChain's ChatOpenAI and LlamaIndex's OpenAI LLM on herdless (skipped when absent)."""

from __future__ import annotations

import pytest

import herdless
from herdless._async_client import AsyncClient
from herdless._client import Client
from herdless.testing import connect_error, ok, rate_limited

pytest_plugins = ["herdless.testing.pytest_plugin"]

GPU, HOSTED = "http://gpu.test/v1", "http://hosted.test/v1"


def _clients(clock):
    hosted = herdless.Backend(
        name="hosted", base_url=HOSTED, api_key="sk-hosted", model="gpt-4o-mini", external=True
    )
    common = {"primary": GPU, "model": "gemma-4", "fallback": hosted, "clock": clock}
    return Client(**common, sleep=clock.sleep), AsyncClient(**common, sleep=clock.asleep)


async def test_langchain_invoke_and_ainvoke_fall_back(herdless_backends, herdless_clock):
    pytest.importorskip("langchain_openai")
    from herdless.integrations.langchain import chat_openai

    gpu, hosted = herdless_backends(GPU), herdless_backends(HOSTED)
    gpu.script(rate_limited(0.1), ok("GPU says hi"))
    sync, aio = _clients(herdless_clock)
    with sync:
        async with aio:
            llm = chat_openai(sync, aio, model="gpt-4o-mini")
            assert llm.invoke("Hello").content == "GPU says hi"
            gpu.script(connect_error())
            hosted.script(ok("hosted says hi"))
            assert (await llm.ainvoke("Hello")).content == "hosted says hi"
    assert llm.max_retries == 0
    assert hosted.bodies[0]["model"] == "gpt-4o-mini"
    assert gpu.bodies[0]["model"] == "gemma-4"


def test_langchain_needs_a_client():
    pytest.importorskip("langchain_openai")
    from herdless.integrations.langchain import chat_openai

    with pytest.raises(ValueError, match="needs a herdless"):
        chat_openai()


async def test_llama_index_complete_and_acomplete(herdless_backends, herdless_clock):
    pytest.importorskip("llama_index.llms.openai")
    from herdless.integrations.llama_index import openai_llm

    gpu, hosted = herdless_backends(GPU), herdless_backends(HOSTED)
    gpu.script(ok("GPU says hi"))
    sync, aio = _clients(herdless_clock)
    with sync:
        async with aio:
            llm = openai_llm(sync, aio, model="gpt-4o-mini")
            assert llm.complete("Hello").text == "GPU says hi"
            gpu.script(connect_error())
            hosted.script(ok("hosted says hi"))
            assert (await llm.acomplete("Hello")).text == "hosted says hi"
    assert gpu.bodies[0]["model"] == "gemma-4"


async def test_langchain_with_one_client_refuses_the_other_path_clearly(
    herdless_backends, herdless_clock
):
    # The sync and async paths are two herdless clients; the path given none must not
    # fall through to LangChain's own client (and its placeholder URL).
    pytest.importorskip("langchain_openai")
    import openai

    from herdless.integrations.langchain import chat_openai

    gpu = herdless_backends(GPU).script(ok("GPU says hi"))
    sync, aio = _clients(herdless_clock)
    with sync:
        llm = chat_openai(sync, model="gpt-4o-mini")
        assert llm.invoke("Hello").content == "GPU says hi"
        with pytest.raises(openai.InternalServerError, match="no herdless AsyncClient") as caught:
            await llm.ainvoke("Hello")
    assert caught.value.status_code == 501
    assert len(gpu.requests) == 1  # the refused call sent nothing
    async with aio:
        only_async = chat_openai(async_client=aio, model="gpt-4o-mini")
        assert (await only_async.ainvoke("Hello")).content == "GPU says hi"
        with pytest.raises(openai.InternalServerError, match="no herdless Client"):
            only_async.invoke("Hello")
    assert len(gpu.requests) == 2
