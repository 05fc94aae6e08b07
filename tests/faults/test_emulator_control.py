"""The emulator's fault controls stay reachable while a fault closes the serving port.

``refuse_for`` and ``maintenance_for`` close the port that serves the API, as a
loading vLLM does, so ``DELETE /_emulator/faults`` cannot reach it there. With
``--control-port`` the same server also listens on a second port that serves
``/_emulator/`` only and that no fault closes: a DELETE there ends the fault early.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import httpx
import pytest

pytest.importorskip("starlette")

from herdless.launch.servers import ServerProcess, emulator_process, free_port

pytestmark = [pytest.mark.integration, pytest.mark.server]

LONG = 60.0  # a fault far longer than the test: only the DELETE can end it


def until(condition: Callable[[], bool], timeout: float = 5.0) -> float:
    """Poll ``condition()`` until true; returns the seconds it took (bounded)."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not reached in {timeout} s")
        time.sleep(0.02)
    return time.monotonic() - start


def refused(url: str) -> bool:
    try:
        httpx.get(url + "/health", timeout=1.0)
    except httpx.ConnectError:
        return True
    return False


def serves(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1.0).status_code == 200
    except httpx.TransportError:
        return False


@pytest.fixture
def emulator() -> Iterator[tuple[ServerProcess, str]]:
    port = free_port()
    with emulator_process(speed=50, control_port=port) as server:
        yield server, f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("fault", ["refuse_for", "maintenance_for"])
def test_delete_on_the_control_port_ends_the_fault_early(
    emulator: tuple[ServerProcess, str], fault: str
) -> None:
    server, control = emulator
    assert httpx.post(server.url + "/_emulator/faults", json={fault: LONG}).status_code == 200
    until(lambda: refused(server.url))
    cleared = httpx.delete(control + "/_emulator/faults", timeout=5.0)
    assert cleared.status_code == 200
    assert until(lambda: serves(server.url)) < 5.0
    chat = httpx.post(
        server.url + "/v1/chat/completions",
        json={"model": "emulated-llama-3-8b", "messages": [{"role": "user", "content": "hi"}]},
        timeout=10.0,
    )
    assert chat.status_code == 200
    assert "Traceback" not in server.logs()


def test_maintenance_leaves_control_connections_open(emulator: tuple[ServerProcess, str]) -> None:
    server, control = emulator
    with httpx.Client(base_url=control, timeout=5.0) as client:
        assert client.get("/_emulator/faults").status_code == 200  # a keep-alive connection
        assert client.post("/_emulator/faults", json={"maintenance_for": LONG}).status_code == 200
        until(lambda: refused(server.url))
        assert client.get("/_emulator/faults").status_code == 200  # the same connection
        assert client.delete("/_emulator/faults").status_code == 200
    until(lambda: serves(server.url))


def test_the_control_port_serves_only_the_fault_controls(
    emulator: tuple[ServerProcess, str],
) -> None:
    _, control = emulator
    assert httpx.get(control + "/_emulator/faults").json()["hang"] is False
    for path in ("/health", "/v1/models", "/metrics"):
        answer = httpx.get(control + path)
        assert answer.status_code == 404
        assert answer.json()["error"]["code"] == 404
    refused_chat = httpx.post(control + "/v1/chat/completions", json={})
    assert refused_chat.status_code == 404


def test_without_a_control_port_the_serving_port_is_closed_during_a_refusal() -> None:
    """What the control port is for: on the serving port, the DELETE is refused too."""
    with emulator_process(speed=50) as server:
        httpx.post(server.url + "/_emulator/faults", json={"refuse_for": 1.0})
        until(lambda: refused(server.url))
        with pytest.raises(httpx.ConnectError):
            httpx.delete(server.url + "/_emulator/faults", timeout=1.0)
        until(lambda: serves(server.url))  # it comes back by itself after refuse_for
