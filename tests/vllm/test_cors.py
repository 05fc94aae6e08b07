"""A web page's preflight and call, to vLLM and through the gateway: the same answers.

vLLM 0.32 allows no origin by default (``--allowed-origins`` is ``[]``), and neither does
the gateway: a page that could not reach vLLM cannot reach it through the gateway either.
The emulator answers as vLLM does (tests/emulator); tests/clients/test_browser.py runs a
real browser against origins that are allowed.
"""

from __future__ import annotations

import httpx
import pytest
from tests.preflight import PAGE, PREFLIGHT

from herdless.launch.servers import ServerProcess
from herdless.launch.vllm import MODEL_NAME, forced_answer

pytestmark = [pytest.mark.vllm]


@pytest.mark.parametrize("behind", ["vllm", "gateway"])
def test_by_default_a_page_may_call_neither_vllm_nor_the_gateway(
    vllm_url: str, gateway: ServerProcess, behind: str
) -> None:
    base = vllm_url if behind == "vllm" else gateway.url
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hi"}]}
    with httpx.Client(base_url=base, timeout=60) as client:
        asked = client.options("/v1/chat/completions", headers=PREFLIGHT)
        answered = client.post(
            "/v1/chat/completions", json=body | forced_answer(2, ending="stop"), headers=PAGE
        )
    assert asked.status_code == 400
    assert asked.text == "Disallowed CORS origin"
    assert "access-control-allow-origin" not in asked.headers
    assert answered.status_code == 200  # served, but the page may not read it
    assert "access-control-allow-origin" not in answered.headers
