"""The gateway's hosted fallback and holds as real processes: ``herdless serve`` with a key
policy file, an emulator as the GPU and another as the hosted model, over real sockets."""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from herdless.launch.servers import ServerProcess, emulator_process, gateway_process

pytestmark = [pytest.mark.integration, pytest.mark.server]

ADMIN = {"authorization": "Bearer admin-secret"}
WEBUI = {"authorization": "Bearer sk-webui-secret"}  # may spill, holds 20 s
INTERNAL = {"authorization": "Bearer sk-internal-secret"}  # may not, holds 60 s
FRONTEND = {"authorization": "Bearer sk-frontend-secret"}  # may not; its clients never retry
POLICIES = """\
[keys.webui]
key = "sk-webui-secret"
fallback = true
hold = 20
user_header = "X-OpenWebUI-User-Id"

[keys.internal]
key = "sk-internal-secret"
hold = 60

[keys.frontend]
key = "sk-frontend-secret"
hold = 30
retries = false
"""


MESSAGES: Any = [{"role": "user", "content": "hello"}]


def chat(**extra: object) -> dict[str, object]:
    return {"model": "gpu-model", "messages": MESSAGES, "max_tokens": 8, **extra}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, ...]]:
    policies = tmp_path_factory.mktemp("keys") / "keys.toml"
    policies.write_text(POLICIES)
    with (
        emulator_process(max_num_seqs=2, speed=20, model="gpu-model") as gpu,
        emulator_process(max_num_seqs=64, speed=50, model="hosted-model") as hosted,
        gateway_process(
            upstream=gpu.url,
            max_concurrency=2,  # the GPU's two sequences, as a cap: the overload test's arithmetic
            max_queue=4,
            key_policies=str(policies),
            fallback_url=f"{hosted.url}/v1",
            fallback_model="hosted-model",
            log_format="json",
            env={
                "HERDLESS_GATEWAY_ADMIN_TOKEN": "admin-secret",
                "HERDLESS_GATEWAY_FALLBACK_API_KEY": "sk-hosted-secret",
            },
        ) as gateway,
    ):
        yield gpu, hosted, gateway


def test_a_maintenance_window_spills_one_key_and_holds_the_other(
    servers: tuple[ServerProcess, ...],
) -> None:
    _, _, gateway = servers
    url = gateway.url
    drained = httpx.post(f"{url}/admin/drain?expect=3", headers=ADMIN, timeout=10)
    assert drained.status_code == 200

    async def run() -> tuple[httpx.Response, httpx.Response, httpx.Response, float]:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            spilled = await client.post("/v1/chat/completions", json=chat(), headers=WEBUI)
            streamed = await client.post(
                "/v1/chat/completions", json=chat(stream=True), headers=WEBUI
            )
            start = time.monotonic()
            held = asyncio.create_task(
                client.post("/v1/chat/completions", json=chat(), headers=INTERNAL)
            )
            await asyncio.sleep(1.0)
            assert not held.done()  # waiting in the gateway, not refused
            await client.post("/admin/resume", headers=ADMIN)
            return spilled, streamed, await held, time.monotonic() - start

    spilled, streamed, held, took = asyncio.run(run())
    assert spilled.status_code == 200
    assert spilled.headers["x-herdless-backend"] == "hosted"
    assert spilled.headers["x-herdless-fallback-reason"] == "draining"
    assert spilled.json()["model"] == "hosted-model"
    assert streamed.headers["content-type"].startswith("text/event-stream")
    chunks = [line[6:] for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert chunks[-1] == "[DONE]"
    assert {json.loads(c)["model"] for c in chunks[:-1]} == {"hosted-model"}
    assert held.status_code == 200
    assert held.headers["x-herdless-backend"] == "upstream"
    assert held.json()["model"] == "gpu-model"
    assert took >= 1.0
    logs = gateway.logs()
    assert logs.count('"event":"spill"') == 2
    for secret in ("sk-webui-secret", "sk-internal-secret", "sk-hosted-secret"):
        assert secret not in logs
    assert '"fallback_api_key":"set"' in logs


def test_a_client_that_never_retries_sees_no_error_under_overload(
    servers: tuple[ServerProcess, ...],
) -> None:
    """Three times what the GPU and the queue hold (2 running + 4 waiting, 2 of them this
    key's share), from one key that may spill, one attempt each, from a client that does
    not show it never retries (httpx's user agent; Open WebUI's own headers would show
    it, and then it waits for its place, as the next test's do): every request is
    answered, by the GPU or the hosted model, and what the gateway held the GPU served."""
    _, _, gateway = servers

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as client:
            return await asyncio.gather(
                *(
                    client.post(
                        "/v1/chat/completions",
                        json=chat(max_tokens=32),
                        headers=WEBUI | {"x-herdless-user": f"user-{i % 3}"},
                    )
                    for i in range(18)
                )
            )

    answers = asyncio.run(run())
    assert [r.status_code for r in answers] == [200] * 18
    backends = [r.headers["x-herdless-backend"] for r in answers]
    assert backends.count("upstream") >= 4
    assert backends.count("hosted") >= 1
    metrics = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    assert 'herdless_gateway_spills_total{key="webui"' in metrics


# Open WebUI's backend sends aiohttp's own user agent: it shows it never retries.
OPEN_WEBUI = INTERNAL | {"user-agent": "Python/3.11 aiohttp/3.11.18"}


@pytest.mark.parametrize(
    "headers", [FRONTEND, OPEN_WEBUI], ids=["retries = false", "no retries line, aiohttp"]
)
def test_a_front_end_that_never_retries_waits_out_a_full_queue(
    servers: tuple[ServerProcess, ...], headers: dict[str, str]
) -> None:
    """The same overload from a key that may not spill, from a front-end that never
    retries: its key says so (``retries = false``), or its user agent does. No 429
    reaches it, the GPU answers every request."""
    _, _, gateway = servers
    before = waited_out(gateway)

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as client:
            return await asyncio.gather(
                *(
                    client.post("/v1/chat/completions", json=chat(max_tokens=32), headers=headers)
                    for _ in range(18)
                )
            )

    answers = asyncio.run(run())
    assert [r.status_code for r in answers] == [200] * 18
    assert {r.headers["x-herdless-backend"] for r in answers} == {"upstream"}
    assert waited_out(gateway) > before  # it met the full queue


def test_an_openai_client_s_retry_says_so_and_comes_back_once(
    servers: tuple[ServerProcess, ...],
) -> None:
    """openai-python with its defaults (2 retries) on a key whose clients retry, 18 calls
    at once: the first attempts that meet the full queue get their 429, and the retry
    says it is one (``X-Stainless-Retry-Count``, read by the gateway)."""
    import openai

    _, _, gateway = servers

    async def run() -> list[Any]:
        async with openai.AsyncOpenAI(
            base_url=f"{gateway.url}/v1", api_key="sk-internal-secret"
        ) as client:
            create = client.chat.completions.with_raw_response.create
            return await asyncio.gather(
                *(create(model="gpu-model", messages=MESSAGES, max_tokens=32) for _ in range(18))
            )

    answers = asyncio.run(run())
    retries = [int(r.http_request.headers["x-stainless-retry-count"]) for r in answers]
    assert max(retries) == 1  # some met the full queue and came back, once


def test_a_retry_that_meets_a_full_queue_waits_for_its_place(
    servers: tuple[ServerProcess, ...],
) -> None:
    """An openai-python request that says it is a retry, on a key whose clients retry,
    meets a full queue (2 long answers running, 2 waiting: the key's half of the queue):
    it waits in the gateway for its place and gets the GPU's answer, where it used to
    get a second 429."""
    import openai

    _, _, gateway = servers
    before = waited_out(gateway)
    long = chat(max_tokens=2000, ignore_eos=True)

    async def run() -> tuple[Any, list[int]]:
        async with (
            httpx.AsyncClient(base_url=gateway.url, timeout=60) as http,
            openai.AsyncOpenAI(
                base_url=f"{gateway.url}/v1", api_key="sk-internal-secret", max_retries=0
            ) as client,
        ):
            post = functools.partial(http.post, "/v1/chat/completions", json=long)
            fill = [asyncio.create_task(post(headers=INTERNAL)) for _ in range(4)]
            for _ in range(250):  # 5 s at most
                if await queue_depth(http) >= 2:
                    break
                await asyncio.sleep(0.02)
            else:
                raise AssertionError("the 4 long requests did not fill the key's queue")
            answer = await client.chat.completions.with_raw_response.create(
                model="gpu-model",
                messages=MESSAGES,
                max_tokens=8,
                extra_headers={"x-stainless-retry-count": "1"},  # as its retry sends it
            )
            return answer, [r.status_code for r in await asyncio.gather(*fill)]

    answer, filled = asyncio.run(run())
    assert filled == [200] * 4
    assert answer.http_response.status_code == 200
    assert answer.headers["x-herdless-backend"] == "upstream"
    assert waited_out(gateway) > before


def waited_out(gateway: ServerProcess) -> float:
    metrics = httpx.get(f"{gateway.url}/metrics", timeout=10).text.splitlines()
    counted = [m for m in metrics if m.startswith("herdless_gateway_waited_out_total{")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in counted)


async def queue_depth(http: httpx.AsyncClient) -> float:
    for line in (await http.get("/metrics")).text.splitlines():
        if line.startswith("herdless_gateway_queue_depth "):
            return float(line.split()[1])
    raise AssertionError("herdless_gateway_queue_depth not exposed")


def test_an_invalid_policy_file_stops_the_start_with_its_line(tmp_path: Path) -> None:
    bad = tmp_path / "keys.toml"
    bad.write_text('[keys.a]\nkey = "sk-a-secret"\nhold = "long"\n')
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "herdless", "serve", "--key-policies", str(bad), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "line 3: keys.a.hold" in done.stderr
    assert "sk-a" not in done.stderr
