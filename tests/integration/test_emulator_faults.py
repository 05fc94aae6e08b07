"""Each fault, the loading delay and client disconnects, on real emulator processes."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from herdless.launch.servers import ServerProcess, emulator_process

pytestmark = [pytest.mark.integration, pytest.mark.server]

BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def metric(url: str, name: str) -> float:
    """The value of the first sample of ``name`` in ``/metrics``."""
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def eventually(check: Callable[[], bool], within: float = 10.0) -> None:
    """Poll ``check`` (bounded) until it holds."""
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def serving(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


@pytest.fixture
def shared(emulator_server: ServerProcess) -> Iterator[str]:
    """The session's emulator, its faults cleared after the test."""
    yield emulator_server.url
    httpx.delete(emulator_server.url + "/_emulator/faults").raise_for_status()


def test_loading_delay_refuses_connections_until_ready() -> None:
    server = ServerProcess(["emulate", "--startup-delay", "1.5", "--speed", "50"], ready_timeout=30)
    try:
        server.start(wait=False)
        with pytest.raises(httpx.ConnectError):
            httpx.get(server.url + "/health")  # loading: the port is not even bound
        server.wait_ready()
        assert httpx.post(server.url + "/v1/chat/completions", json=BODY).status_code == 200
    finally:
        server.stop()
        print(server.logs())


def test_hang_accepts_and_never_answers(shared: str) -> None:
    httpx.post(shared + "/_emulator/faults", json={"hang": True}).raise_for_status()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(shared + "/v1/chat/completions", json=BODY, timeout=0.5)
    with pytest.raises(httpx.ReadTimeout):
        httpx.get(shared + "/health", timeout=0.5)
    httpx.delete(shared + "/_emulator/faults").raise_for_status()
    assert httpx.get(shared + "/health").status_code == 200


def test_error_rate_and_extra_latency(shared: str) -> None:
    faults = {"error_rate": 1.0, "error_status": 503}
    httpx.post(shared + "/_emulator/faults", json=faults).raise_for_status()
    r = httpx.post(shared + "/v1/chat/completions", json=BODY)
    assert r.status_code == 503
    assert r.json()["error"]["code"] == 503
    httpx.post(shared + "/_emulator/faults", json={"extra_latency": 0.3}).raise_for_status()
    started = time.monotonic()
    assert httpx.post(shared + "/v1/chat/completions", json=BODY).status_code == 200
    assert time.monotonic() - started >= 0.3


def test_cut_after_drops_the_connection_mid_stream(shared: str) -> None:
    httpx.post(shared + "/_emulator/faults", json={"cut_after": 2}).raise_for_status()
    received: list[str] = []
    with (
        pytest.raises(httpx.RemoteProtocolError),
        httpx.stream(
            "POST", shared + "/v1/chat/completions", json={**BODY, "stream": True, "max_tokens": 50}
        ) as r,
    ):
        received.extend(line for line in r.iter_lines() if line.startswith("data:"))
    assert len(received) == 2
    assert "data: [DONE]" not in received


def test_disconnect_aborts_the_sequence_and_frees_kv(
    start_emulator: Callable[..., ServerProcess],
) -> None:
    url = start_emulator(speed=1).url  # real time: a 2,000-token answer takes 25 s
    body = {**BODY, "stream": True, "max_tokens": 2000, "ignore_eos": True}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data:")
        assert metric(url, "vllm:num_requests_running") == 1
    eventually(lambda: metric(url, "vllm:num_requests_running") == 0, within=5)
    assert metric(url, "vllm:kv_cache_usage_perc") == 0
    assert 'finished_reason="abort"} 0' in httpx.get(url + "/metrics").text  # as vLLM


def test_refuse_for_closes_the_port_then_reopens(
    start_emulator: Callable[..., ServerProcess],
) -> None:
    url = start_emulator().url
    httpx.post(url + "/_emulator/faults", json={"refuse_for": 1.0}).raise_for_status()
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/health")
    eventually(lambda: serving(url))


def test_maintenance_drops_streams_refuses_then_comes_back(
    start_emulator: Callable[..., ServerProcess],
) -> None:
    url = start_emulator(speed=1).url
    errors: list[BaseException] = []

    def long_stream() -> None:
        body = {**BODY, "stream": True, "max_tokens": 2000, "ignore_eos": True}
        try:
            with httpx.stream("POST", url + "/v1/chat/completions", json=body) as r:
                for _ in r.iter_lines():
                    pass
        except httpx.TransportError as exc:
            errors.append(exc)

    reader = threading.Thread(target=long_stream)
    reader.start()
    eventually(lambda: metric(url, "vllm:num_requests_running") == 1)
    httpx.post(url + "/_emulator/faults", json={"maintenance_for": 1.5}).raise_for_status()
    reader.join(10)
    assert not reader.is_alive()
    assert len(errors) == 1  # the stream was cut, as when vLLM's process goes away
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/health")
    eventually(lambda: serving(url))
    assert httpx.post(url + "/v1/chat/completions", json=BODY).status_code == 200


def test_crash_fault_ends_the_process(start_emulator: Callable[..., ServerProcess]) -> None:
    server = start_emulator()
    httpx.post(server.url + "/_emulator/faults", json={"crash": True})
    assert server.wait_exit(10) == 70


def test_crash_after_flag() -> None:
    with emulator_process(speed=50, crash_after=0.5) as server:
        assert server.wait_exit(10) == 70


def test_kv_exhaustion_crash_mode_ends_the_process(
    start_emulator: Callable[..., ServerProcess],
) -> None:
    server = start_emulator(max_model_len=64, kv_cache_tokens=64, on_kv_exhausted="crash", speed=1)
    body = {**BODY, "max_tokens": 50, "ignore_eos": True}

    def call() -> None:
        # The process dies under us: that is the point.
        with contextlib.suppress(httpx.TransportError):
            httpx.post(server.url + "/v1/chat/completions", json=body, timeout=10)

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert server.wait_exit(10) == 70
    assert "engine died: KV cache exhausted" in server.logs()


def test_settings_come_from_the_environment() -> None:
    with emulator_process(env={"HERDLESS_EMULATOR_MODEL": "from-env"}) as server:
        assert httpx.get(server.url + "/v1/models").json()["data"][0]["id"] == "from-env"


def test_harness_retries_when_its_free_port_was_taken_meanwhile() -> None:
    server = ServerProcess(["emulate", "--speed", "50"])
    taken = server.port
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        with server:
            assert server.port != taken
            assert serving(server.url)
    assert "Address already in use" in server.logs()
