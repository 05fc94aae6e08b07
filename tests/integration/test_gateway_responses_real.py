"""OpenAI's Responses API (what the OpenAI Agents SDK and Codex speak) through a real
gateway in front of the real emulator, with the official ``openai`` client."""

from __future__ import annotations

import openai
import pytest

from herdless.launch.servers import emulator_process, gateway_process
from herdless.launch.vllm import read_metric

pytestmark = [pytest.mark.integration, pytest.mark.server]

MODEL = "emulated"


def test_responses_whole_and_streamed_are_served_and_settled_on_their_usage() -> None:
    with (
        emulator_process(speed=200, model=MODEL) as vllm,
        gateway_process(upstream=vllm.url) as gateway,
        openai.OpenAI(base_url=gateway.url + "/v1", api_key="-", max_retries=0) as client,
    ):
        whole = client.responses.create(
            model=MODEL, instructions="Be brief.", input="Name three rivers.", max_output_tokens=20
        )
        with client.responses.stream(
            model=MODEL, input="Name three rivers.", max_output_tokens=20
        ) as stream:
            texts = [e.delta for e in stream if e.type == "response.output_text.delta"]
            final = stream.get_final_response()
        served = read_metric(gateway.url, "herdless_gateway_tokens_served_total")
        used = sum(
            read_metric(vllm.url, f"vllm:{kind}_tokens_total") for kind in ("prompt", "generation")
        )
    assert whole.model == MODEL
    assert whole.status in ("completed", "incomplete")
    assert whole.output_text
    assert len(texts) > 1
    assert "".join(texts) == final.output_text
    assert whole.usage is not None
    assert final.usage is not None
    assert whole.usage.input_tokens > final.usage.input_tokens  # its instructions count
    # Each answer is settled on the usage the engine reported.
    assert served == used
    assert used == sum(u.input_tokens + u.output_tokens for u in (whole.usage, final.usage))
