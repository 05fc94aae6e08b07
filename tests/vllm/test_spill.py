"""The gateway's holds and hosted fallback in front of a real vLLM (the session's: four
sequences, four queued), with an emulator as the hosted model: a maintenance window
spills one key and holds the other, and vLLM's own 429 is spilled or passed on with
the hints every OpenAI client obeys."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from herdless.launch.servers import ServerProcess, emulator_process, gateway_process
from herdless.launch.vllm import MODEL_NAME, forced_answer

pytestmark = [pytest.mark.vllm]

ADMIN = {"authorization": "Bearer admin-secret"}
WEBUI = {"authorization": "Bearer sk-webui-secret"}
INTERNAL = {"authorization": "Bearer sk-internal-secret"}
POLICIES = """\
[keys.webui]
key = "sk-webui-secret"
fallback = true
hold = 600

[keys.internal]
key = "sk-internal-secret"
hold = 600
"""


def chat(**extra: object) -> dict[str, object]:
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hi"}]}
    return body | forced_answer(4, ending="length") | extra


@pytest.fixture(scope="module")
def spilling(vllm_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """No cap: the gateway sizes itself from vLLM; the hosted model is an emulator."""
    policies: Path = tmp_path_factory.mktemp("keys") / "keys.toml"
    policies.write_text(POLICIES)
    with (
        emulator_process(model="hosted-model", speed=50) as hosted,
        gateway_process(
            upstream=vllm_url,
            key_policies=str(policies),
            fallback_url=f"{hosted.url}/v1",
            fallback_model="hosted-model",
            log_format="json",
            env={"HERDLESS_GATEWAY_ADMIN_TOKEN": "admin-secret"},
        ) as gateway,
    ):
        yield gateway
        print(f"----- log of {gateway} -----\n{gateway.logs()}")


async def test_a_window_spills_one_key_and_holds_the_other_for_vllm(
    spilling: ServerProcess,
) -> None:
    async with httpx.AsyncClient(base_url=spilling.url, timeout=300) as client:
        before = await client.post("/v1/chat/completions", json=chat(), headers=WEBUI)
        (await client.post("/admin/drain?expect=30", headers=ADMIN)).raise_for_status()
        spilled = await client.post("/v1/chat/completions", json=chat(), headers=WEBUI)
        streamed = await client.post("/v1/chat/completions", json=chat(stream=True), headers=WEBUI)
        held = asyncio.create_task(
            client.post("/v1/chat/completions", json=chat(), headers=INTERNAL)
        )
        await asyncio.sleep(1.0)
        waited = not held.done()
        (await client.post("/admin/resume", headers=ADMIN)).raise_for_status()
        after = await held
    assert before.status_code == 200
    assert (before.headers["x-herdless-backend"], before.json()["model"]) == (
        "upstream",
        MODEL_NAME,
    )
    assert spilled.status_code == 200
    assert spilled.headers["x-herdless-fallback-reason"] == "draining"
    assert spilled.json()["model"] == "hosted-model"
    events = [line[6:] for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert {json.loads(e)["model"] for e in events[:-1]} == {"hosted-model"}
    assert waited, "the held request was answered while the gateway drained"
    assert after.status_code == 200
    assert after.headers["x-herdless-backend"] == "upstream"
    assert after.json()["usage"]["completion_tokens"] == 4
