"""Hostile clients over a real socket: the gateway process answers 4xx or closes, never hangs.

What only a real server shows: request lines and headers that are not HTTP, header
injection attempts, headers over the size limit, and slow clients that trickle (or
stop sending) their body. A slow client must not hold an admission slot, and the
gateway keeps serving everyone else meanwhile.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import pytest

pytest.importorskip("starlette")

import httpx
from tests.fuzz._counts import COUNTS

from herdless.launch.servers import ServerProcess, emulator_process, gateway_process

pytestmark = [pytest.mark.integration, pytest.mark.server]

BODY = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode()


@pytest.fixture(scope="module")
def gateway() -> Iterator[ServerProcess]:
    with (
        emulator_process(speed=20) as vllm,
        gateway_process(upstream=vllm.url, max_concurrency=1, max_queue=0) as server,
    ):
        yield server


def raw_exchange(server: ServerProcess, payload: bytes, *, wait: float = 5.0) -> bytes:
    """Send raw bytes, return what came back before the server closed (or ``wait`` ran out)."""
    with socket.create_connection((server.host, server.port), timeout=wait) as sock:
        sock.sendall(payload)
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
                if b"\r\n\r\n" in b"".join(chunks) and len(chunks) > 1:
                    break
        except TimeoutError:
            pass
    return b"".join(chunks)


def status_of(reply: bytes) -> int | None:
    """The status code of a raw reply, ``None`` for a clean close without an answer."""
    if not reply:
        return None
    return int(reply.split(b" ", 2)[1])


def request(headers: bytes, body: bytes = BODY) -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        + headers
        + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )


def serves(server: ServerProcess) -> bool:
    response = httpx.post(server.url + "/v1/chat/completions", content=BODY, timeout=10.0)
    return response.status_code == 200


BAD_REQUESTS = {
    "not http": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64,
    "header injection in a value": request(b"X-Request-ID: a\rInjected: 1\r\n"),
    "bare LF header": request(b"X-Request-ID: a\nInjected: 1\r\n"),
    "NUL in a header": request(b"X-Request-ID: a\x00b\r\n"),
    "space before colon": request(b"X-Request-ID : a\r\n"),
    "huge header": request(b"X-Big: " + b"a" * 70_000 + b"\r\n"),
    "many headers": request(b"".join(b"X-H%d: v\r\n" % i for i in range(5_000))),
    "bad content-length": request(b"Content-Length: -1\r\n"),
    "two content-lengths": request(b"Content-Length: 3\r\n"),
    "absolute-form target": b"POST http://evil.test/v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
    + b"Content-Length: 2\r\nConnection: close\r\n\r\n{}",
}


@pytest.mark.parametrize("payload", BAD_REQUESTS.values(), ids=BAD_REQUESTS.keys())
def test_malformed_requests_get_4xx_or_a_clean_close(
    gateway: ServerProcess, payload: bytes
) -> None:
    COUNTS["gateway socket: malformed requests"] += 1
    status = status_of(raw_exchange(gateway, payload))
    assert status is None or 400 <= status < 500 or status == 200, status
    assert "Traceback" not in gateway.logs()
    assert serves(gateway)


def test_a_slow_body_holds_no_admission_slot(gateway: ServerProcess) -> None:
    """max_concurrency=1, max_queue=0: a trickling client must not take the only slot."""
    COUNTS["gateway socket: slow clients"] += 1
    with socket.create_connection((gateway.host, gateway.port), timeout=5.0) as slow:
        head = (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(BODY)}\r\n\r\n".encode()
        )
        slow.sendall(head + BODY[:5])  # the body trickles...
        for byte in BODY[5:10]:
            slow.sendall(bytes([byte]))
            time.sleep(0.1)
        # ...and meanwhile everyone else is served.
        assert serves(gateway)
        assert serves(gateway)


def test_a_stalled_body_is_cut_off(gateway: ServerProcess) -> None:
    COUNTS["gateway socket: slow clients"] += 1
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(BODY)}\r\n\r\n".encode()
    )
    with socket.create_connection((gateway.host, gateway.port), timeout=8.0) as stalled:
        stalled.sendall(head + BODY[:5])
        try:
            reply = stalled.recv(65536)  # waits: the gateway should give up on us first
        except TimeoutError:
            reply = b"<still open after 8 s>"
    assert reply == b"" or status_of(reply) == 408, reply[:100]
