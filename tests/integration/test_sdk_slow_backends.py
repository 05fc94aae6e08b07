"""Slow backends over real sockets: both clients end by their deadline (issue 15, items 6
and 9), whatever the server trickles.

A socket-level bound cannot be shown on the fake clock: httpcore waits in ``recv`` with
a real timeout, so the cases here (a body or a head trickling one byte per 50 ms, a
trickle that then stalls, a stream that outlasts its ``stream_deadline`` or stalls
mid-way) run a tiny threaded server on 127.0.0.1 and measure real time. Each bound is
checked with a wide margin (the unbounded behaviour takes several times longer), and
every server thread stops when its test ends.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

import herdless

pytestmark = pytest.mark.integration

Behaviour = Callable[[socket.socket, threading.Event], None]

_ANSWER = json.dumps(
    {
        "id": "c",
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi there"}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
    }
).encode()
_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
    b"content-length: " + str(len(_ANSWER)).encode() + b"\r\n\r\n"
)
_SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
_MESSAGES = [{"role": "user", "content": "hi"}]
# Seconds a bounded call may run past its limit here: scheduling on a busy 2-core runner,
# never the unbounded behaviour (several seconds more).
_MARGIN = 0.8


def _chunk(text: str) -> bytes:
    choice = {"index": 0, "delta": {"content": text}, "finish_reason": None}
    return f"data: {json.dumps({'id': 's', 'model': 'm', 'choices': [choice]})}\n\n".encode()


def _drip(conn: socket.socket, stop: threading.Event, data: bytes, step: float) -> None:
    for byte in data:
        if stop.wait(step):
            return
        conn.sendall(bytes([byte]))


def trickle_body(conn: socket.socket, stop: threading.Event) -> None:
    """Status and headers at once, then the body one byte per 50 ms (issue 15's repro)."""
    conn.sendall(_HEAD)
    _drip(conn, stop, _ANSWER, 0.05)


def trickle_head(conn: socket.socket, stop: threading.Event) -> None:
    """The status line and headers one byte per 50 ms."""
    _drip(conn, stop, _HEAD + _ANSWER, 0.05)


def trickle_then_stall(conn: socket.socket, stop: threading.Event) -> None:
    """Headers, 1.6 s of the body one byte per 50 ms, then silence."""
    conn.sendall(_HEAD)
    _drip(conn, stop, _ANSWER[:32], 0.05)
    stop.wait(30)


def slow_stream(conn: socket.socket, stop: threading.Event) -> None:
    """A stream that sends a chunk every 0.2 s for up to 30 s."""
    conn.sendall(_SSE_HEAD)
    for index in range(150):
        conn.sendall(_chunk(f"w{index} "))
        if stop.wait(0.2):
            return


def stream_then_stall(conn: socket.socket, stop: threading.Event) -> None:
    """A stream that sends one chunk, then nothing."""
    conn.sendall(_SSE_HEAD + _chunk("hi"))
    stop.wait(30)


class _Server:
    """Answers every request on 127.0.0.1 with ``behaviour``, on a thread per connection."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.stop = threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                request = b""
                while b"\r\n\r\n" not in request:
                    request += conn.recv(65536)
                self.behaviour(conn, self.stop)
            except OSError:
                pass  # the client hung up: what the bounded clients do

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=5)
        self.sock.close()


@pytest.fixture
def serve() -> Iterator[Callable[[Behaviour], _Server]]:
    servers: list[_Server] = []

    def start(behaviour: Behaviour) -> _Server:
        servers.append(_Server(behaviour))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.fixture(params=["sync", "async"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _call(kind: str, url: str, *, transport: Any = None, **options: Any) -> float:
    """Run one call to its error; the seconds it took. Streams are read to their end."""
    chat = options.pop("chat", {})
    start = time.monotonic()
    if kind == "sync":
        with herdless.Client(url, model="m", env_file=None, transport=transport, **options) as c:
            result = c.chat(_MESSAGES, **chat)
            if chat.get("stream"):
                with result:
                    for _ in result:
                        pass
    else:
        import asyncio

        async def run() -> None:
            async with herdless.AsyncClient(url, model="m", env_file=None, **options) as c:
                result = await c.chat(_MESSAGES, **chat)
                if chat.get("stream"):
                    async with result:
                        async for _ in result:
                            pass

        asyncio.run(run())
    return time.monotonic() - start


def _timed(kind: str, url: str, error: type[Exception], **options: Any) -> float:
    start = time.monotonic()
    with pytest.raises(error):
        _call(kind, url, **options)
    return time.monotonic() - start


_LATE = (herdless.APITimeoutError, herdless.DeadlineExceeded)


def test_a_trickling_body_ends_by_the_deadline(kind: str, serve: Any) -> None:
    server = serve(trickle_body)  # ~190 bytes: 9.5 s unbounded
    elapsed = _timed(kind, server.url, _LATE, deadline=1.0)  # type: ignore[arg-type]
    assert elapsed < 1.0 + _MARGIN


def test_a_trickle_that_stalls_ends_by_the_deadline(kind: str, serve: Any) -> None:
    # Unbounded, the stalled read waits its socket timeout (the deadline) after 1.6 s of
    # trickle: about 3.6 s. The sync client's own HTTP client clips it to the deadline.
    server = serve(trickle_then_stall)
    elapsed = _timed(kind, server.url, _LATE, deadline=2.0)  # type: ignore[arg-type]
    assert elapsed < 2.0 + _MARGIN


def test_a_trickling_head_ends_by_the_deadline(kind: str, serve: Any) -> None:
    server = serve(trickle_head)  # ~270 bytes of head and body: 13 s unbounded
    elapsed = _timed(kind, server.url, _LATE, deadline=1.0)  # type: ignore[arg-type]
    assert elapsed < 1.0 + _MARGIN


def test_a_user_transport_still_stops_a_trickling_body(serve: Any) -> None:
    # With a transport of the user's, the sync client checks its clock between pieces.
    server = serve(trickle_body)
    transport = httpx.HTTPTransport()
    elapsed = _timed("sync", server.url, _LATE, deadline=1.0, transport=transport)  # type: ignore[arg-type]
    assert elapsed < 1.0 + _MARGIN


def test_a_long_stream_ends_at_its_stream_deadline(kind: str, serve: Any) -> None:
    server = serve(slow_stream)  # 30 s of chunks
    chat = {"stream": True, "stream_deadline": 1.5}
    elapsed = _timed(kind, server.url, herdless.StreamDeadlineExceeded, deadline=5.0, chat=chat)
    assert 1.5 - 0.05 < elapsed < 1.5 + _MARGIN


def test_a_stalled_stream_ends_at_its_stream_deadline(kind: str, serve: Any) -> None:
    server = serve(stream_then_stall)
    chat = {"stream": True, "stream_deadline": 1.0}
    elapsed = _timed(kind, server.url, herdless.StreamDeadlineExceeded, chat=chat)
    assert elapsed < 1.0 + _MARGIN


def test_a_streams_gaps_are_bounded_by_read_in_both_clients(kind: str, serve: Any) -> None:
    # The sync client used to bound every read of a stream by first_byte (5 s here).
    server = serve(stream_then_stall)
    limits = herdless.Timeouts(first_byte=5.0, read=0.5)
    elapsed = _timed(
        kind,
        server.url,
        herdless.StreamInterrupted,
        timeouts=limits,
        chat={"stream": True},
    )
    assert elapsed < 0.5 + _MARGIN
