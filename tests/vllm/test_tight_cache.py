"""A real vLLM whose KV cache holds about one context, behind the self-sized gateway.

vLLM starts only if its cache holds one request of ``--max-model-len`` (2,048 here);
``--num-gpu-blocks-override 17`` gives it 17 blocks of 128 tokens, 2,176 tokens: a
"maximum concurrency" of about 1x, as a large model on one GPU reports. A context near
the whole cache is beyond the gateway's 99 % budget with its last block counted; alone,
it must start (vLLM runs it), not wait out its hold for a 429.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from herdless.gateway.watcher import parse_metrics
from herdless.gateway.wire import parse_chat_request
from herdless.launch.servers import ServerProcess, gateway_process
from herdless.launch.vllm import MODEL_NAME, VllmServer

pytestmark = [pytest.mark.vllm]

HOLD_S = 300.0  # the gateway's queue timeout: a request held past it gets a 429


@pytest.fixture(scope="module")
def tight_vllm(vllm_server: VllmServer) -> Iterator[VllmServer]:
    with VllmServer(vllm_server.home, extra_args=["--num-gpu-blocks-override", "17"]) as server:
        yield server


@pytest.fixture(scope="module")
def sized_gateway(tight_vllm: VllmServer) -> Iterator[ServerProcess]:
    with gateway_process(upstream=tight_vllm.url, access_log=False, queue_timeout=HOLD_S) as server:
        yield server
        print(f"----- log of {server} -----\n{server.logs()}")


def test_a_context_about_the_whole_cache_runs_alone(
    tight_vllm: VllmServer, sized_gateway: ServerProcess
) -> None:
    reading = parse_metrics(httpx.get(f"{tight_vllm.url}/metrics", timeout=10).text, 0.0)
    assert reading.kv_capacity is not None
    assert reading.block_size is not None
    assert reading.kv_capacity < 2 * 2048  # about one context
    shown = httpx.get(f"{sized_gateway.url}/metrics", timeout=10).text
    assert 'herdless_gateway_sizing_mode{mode="engine"} 1' in shown
    # English words estimate at four characters a token: "hello world " is 3 estimated,
    # 2 real. The engine's count fits its context; the gateway's, with a block, is over
    # 99 % of the cache (its first request: no answer or prompt measured to go by).
    asked = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": "hello world " * 650}],
        "max_tokens": 80,
        "ignore_eos": True,
    }
    price = parse_chat_request(json.dumps(asked).encode()).price(0)
    assert price + reading.block_size > 0.99 * reading.kv_capacity
    answered = httpx.post(
        f"{sized_gateway.url}/v1/chat/completions", json=asked, timeout=HOLD_S + 60
    )
    assert answered.status_code == 200, answered.text
    usage = answered.json()["usage"]
    assert usage["completion_tokens"] == 80
    assert usage["prompt_tokens"] + 80 <= 2048
