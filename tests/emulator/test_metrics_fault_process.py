"""The ``/metrics`` fault and the KV geometry on a real ``herdless emulate`` process.

Each test starts its own emulator on a free loopback port and stops it; windows are
long (a minute) and ended by ``DELETE``, or short and awaited with a bounded poll,
so that nothing here depends on how fast the machine is.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from herdless.launch.servers import ServerProcess, emulator_process

pytestmark = [pytest.mark.integration, pytest.mark.server]


@pytest.fixture
def stalled() -> Iterator[ServerProcess]:
    """An emulator whose ``/metrics`` stalls for its first minute (``--metrics-stall-for``)."""
    with emulator_process(speed=50, metrics_stall_for=60, kv_cache_tokens=60_000) as server:
        yield server
        print(f"----- log of {server} -----\n{server.logs()}")


def eventually(check: Callable[[], bool], within: float = 10.0) -> None:
    """Poll ``check`` (bounded) until it holds."""
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def metrics_status(url: str) -> int:
    return httpx.get(url + "/metrics", timeout=5).status_code


def test_the_stall_flag_holds_metrics_from_the_start_until_cleared(stalled: ServerProcess) -> None:
    url = stalled.url
    with pytest.raises(httpx.ReadTimeout):
        httpx.get(url + "/metrics", timeout=0.5)
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    assert httpx.post(url + "/v1/chat/completions", json=chat, timeout=10).status_code == 200
    httpx.delete(url + "/_emulator/faults", timeout=5).raise_for_status()
    text = httpx.get(url + "/metrics", timeout=5).raise_for_status().text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    [info] = families["vllm:cache_config_info"].samples
    assert (info.labels["num_gpu_blocks"], info.labels["block_size"]) == ("3750", "16")
    assert int(info.labels["num_gpu_blocks"]) * int(info.labels["block_size"]) == 60_000
    assert families["vllm:generation_tokens"].samples[0].value == 4


def test_a_posted_error_window_replaces_the_stall_and_ends_by_itself(
    stalled: ServerProcess,
) -> None:
    url = stalled.url
    faults = url + "/_emulator/faults"
    httpx.post(faults, json={"metrics_error_for": 60}, timeout=5).raise_for_status()
    assert metrics_status(url) == 500
    assert httpx.get(url + "/health", timeout=5).status_code == 200
    httpx.post(faults, json={"metrics_error_for": 0.2}, timeout=5).raise_for_status()
    eventually(lambda: metrics_status(url) == 200)  # the window's timer ended it
