"""/v1/completions and /v1/embeddings through a real gateway in front of the real emulator,
with the openai client; the text log format and the SIGTERM lines of a real process."""

from __future__ import annotations

import base64
import re
import signal
import struct
from collections.abc import Iterator

import httpx
import openai
import pytest

from herdless.launch.servers import ServerProcess, emulator_process, gateway_process

pytestmark = [pytest.mark.integration, pytest.mark.server]

TEXT_LINE = re.compile(
    r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR|CRITICAL) \S+ "
)


@pytest.fixture(scope="module")
def vllm() -> Iterator[ServerProcess]:
    with emulator_process(speed=200, max_num_seqs=16) as server:
        yield server


def test_completions_and_embeddings_pass_through_admission(vllm: ServerProcess) -> None:
    env = {"HERDLESS_GATEWAY_API_KEYS": "k1", "HERDLESS_GATEWAY_ADMIN_TOKEN": "admin-SECRET"}
    with (
        gateway_process(upstream=vllm.url, env=env, max_concurrency=4) as gateway,
        openai.OpenAI(base_url=gateway.url + "/v1", api_key="k1", max_retries=0) as client,
    ):
        model = client.models.list().data[0].id
        text = client.completions.create(model=model, prompt="Once upon a time", max_tokens=5)
        chunks = list(
            client.completions.create(
                model=model,
                prompt="a herd",
                max_tokens=4,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        # openai asks for base64 by default: the emulator's packed float32, decoded by openai.
        vectors = client.embeddings.create(model=model, input=["one herd", "two herds"])
        floats = httpx.post(
            gateway.url + "/v1/embeddings",
            json={"model": model, "input": "one herd", "encoding_format": "float"},
            headers={"authorization": "Bearer k1"},
        )
        missing = httpx.post(
            gateway.url + "/v1/audio/speech", json={}, headers={"authorization": "Bearer k1"}
        )
        no_key = httpx.post(gateway.url + "/v1/embeddings", json={"input": "x"})
        metrics = httpx.get(gateway.url + "/metrics").text
        assert gateway.process is not None
        gateway.process.send_signal(signal.SIGTERM)
        gateway.wait_exit(timeout=15)  # uvicorn re-raises the signal once shut down: -15
        logs = gateway.logs(tail=10**8)
    assert text.object == "text_completion"
    assert text.usage is not None
    assert text.usage.completion_tokens >= 1
    assert text.choices[0].text
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens >= 1
    assert [d.index for d in vectors.data] == [0, 1]
    assert len(vectors.data[0].embedding) == 384
    assert vectors.usage.prompt_tokens >= 2
    assert vectors.usage.total_tokens == vectors.usage.prompt_tokens
    # The same input, the same vector, whatever the encoding.
    assert floats.json()["data"][0]["embedding"] == pytest.approx(
        vectors.data[0].embedding, rel=1e-6
    )
    assert missing.status_code == 404
    assert "POST /v1/embeddings" in missing.json()["error"]["message"]
    assert no_key.status_code == 401
    assert 'herdless_gateway_requests_total{code="200"} 4' in metrics
    # The text format, one per line, on every line; what operators need, no secret.
    lines = [line for line in logs.splitlines() if line.strip()]
    assert all(TEXT_LINE.match(line) for line in lines), logs
    assert any(" herdless.gateway config " in line and "admin_token=set" in line for line in lines)
    assert any(" herdless.gateway upstream ready " in line for line in lines)
    assert any("POST /v1/embeddings 200" in line for line in lines)
    assert any("POST /v1/completions 200" in line for line in lines)
    assert any(" WARNING herdless.gateway SIGTERM received: draining " in line for line in lines)
    assert " herdless.gateway stopped draining=true inflight=0" in logs
    assert any(" uvicorn.error " in line for line in lines)
    for secret in ("admin-SECRET", "Bearer k1"):
        assert secret not in logs


def test_struct_is_what_openai_decodes() -> None:
    # openai decodes base64 embeddings as little-endian float32: the emulator packs them so.
    packed = base64.b64encode(struct.pack("<2f", 0.5, -0.25)).decode()
    assert struct.unpack("<2f", base64.b64decode(packed)) == (0.5, -0.25)
