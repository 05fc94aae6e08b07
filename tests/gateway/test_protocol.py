"""The gateway's connection guard (``herdless.gateway.protocol``), driven without sockets.

The protocol gets a fake transport and a small ASGI app; time is moved by patching
``loop.time`` (the loop's timers are what the limits use), never by sleeping.
The same rules over real sockets against ``herdless serve``: tests/fuzz/test_gateway_connections.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import resource
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("httptools")

from uvicorn.config import Config
from uvicorn.server import ServerState

from herdless.gateway.connections import ConnectionGuard, ConnectionLimits, raise_file_limit
from herdless.gateway.metrics import GatewayMetrics
from herdless.gateway.protocol import GuardedHttpToolsProtocol, guarded_protocol

pytestmark = [pytest.mark.server]

LIMITS = ConnectionLimits(
    max_head_bytes=256, max_headers=6, head_timeout=10.0, keep_alive_timeout=5.0
)


class FakeTransport(asyncio.Transport):
    """Records what is written; like uvloop, a write after close raises RuntimeError."""

    def __init__(self, peer: str = "10.0.0.1") -> None:
        super().__init__()
        self.peer = peer
        self.written = b""
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        info = {"sockname": ("127.0.0.1", 8080), "peername": (self.peer, 40000)}
        return info.get(name, default)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.closed:
            raise RuntimeError("unable to perform operation on <TCPTransport closed=True>")
        self.written += bytes(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def statuses(self) -> list[int]:
        """The status of every answer written, in order."""
        return [int(status) for status in re.findall(rb"HTTP/1\.1 (\d{3}) ", self.written)]

    def bodies(self) -> list[Any]:
        """The JSON body of every answer written, in order."""
        out, rest = [], self.written
        while rest:
            head, rest = rest.split(b"\r\n\r\n", 1)
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            out.append(json.loads(rest[:length]))
            rest = rest[length:]
        return out


async def echo_app(scope: Any, receive: Any, send: Any) -> None:
    """Reads the whole body, answers 200 with the path and the body's length."""
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        size += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    body = json.dumps({"path": scope["path"], "size": size}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-length", b"%d" % len(body))],
        }
    )
    await send({"type": "http.response.body", "body": body})


class Harness:
    """One server's guard and protocol class; ``connect()`` opens a connection."""

    def __init__(
        self, app: Any = echo_app, limits: ConnectionLimits = LIMITS, file_limit: int = 100_000
    ) -> None:
        self.metrics = GatewayMetrics(dict)
        self.guard = ConnectionGuard(limits, self.metrics, file_limit=file_limit)
        self.config = Config(
            app,
            http=guarded_protocol(self.guard),
            ws="none",
            lifespan="off",
            log_config=None,  # uvicorn's loggers propagate: caplog sees "Exception in ASGI ..."
        )
        self.config.load()
        self.state = ServerState()

    def connect(self, peer: str = "10.0.0.1") -> tuple[GuardedHttpToolsProtocol, FakeTransport]:
        protocol = self.config.http_protocol_class(  # type: ignore[call-arg]  # uvicorn's own call
            config=self.config, server_state=self.state, app_state={}
        )
        transport = FakeTransport(peer)
        protocol.connection_made(transport)
        assert isinstance(protocol, GuardedHttpToolsProtocol)
        return protocol, transport

    async def settle(self) -> None:
        """Let the request tasks run until none is left (bounded)."""
        for _ in range(200):
            await asyncio.sleep(0)
            if not self.state.tasks:
                return
        raise AssertionError("request tasks still running")


def head(path: str = "/x", *headers: bytes, body: bytes = b"") -> bytes:
    lines = [b"POST " + path.encode() + b" HTTP/1.1", b"Host: gw", *headers]
    lines.append(b"Content-Length: %d" % len(body))
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def error_code(transport: FakeTransport) -> str:
    code: str = transport.bodies()[0]["error"]["code"]
    return code


@pytest.fixture
async def advance(monkeypatch: pytest.MonkeyPatch) -> Callable[[float], Any]:
    """``await advance(seconds)``: move the running loop's clock on and run what is due."""
    loop = asyncio.get_running_loop()
    base = loop.time
    offset = 0.0

    async def forward(seconds: float) -> None:
        nonlocal offset
        offset += seconds
        monkeypatch.setattr(loop, "time", lambda: base() + offset)
        for _ in range(5):
            await asyncio.sleep(0)

    return forward


# -- head size ----------------------------------------------------------------------------


async def test_a_head_of_exactly_the_limit_is_served_and_one_byte_more_is_431() -> None:
    harness = Harness()
    exact = head("/x", b"X-Pad: " + b"a" * (256 - len(head("/x", b"X-Pad: "))))
    assert len(exact) == 256
    protocol, transport = harness.connect()
    protocol.data_received(exact)
    await harness.settle()
    assert transport.statuses() == [200]
    assert not transport.closed

    over = exact.replace(b"X-Pad: ", b"X-Pad: a")
    protocol, transport = harness.connect()
    protocol.data_received(over)
    await harness.settle()
    assert transport.statuses() == [431]
    assert error_code(transport) == "head_too_large"
    assert transport.closed
    assert b"connection: close" in transport.written
    assert harness.metrics.connections_closed == {"head_too_large": 1}
    assert harness.metrics.requests == {431: 1}


async def test_the_limit_holds_across_reads_and_nothing_past_it_is_parsed() -> None:
    harness = Harness()
    protocol, transport = harness.connect()
    protocol.data_received(b"GET /x HTTP/1.1\r\nX-Big: ")
    for _ in range(100):  # 100 x 100 bytes of one header that never ends
        protocol.data_received(b"a" * 100)
    assert transport.statuses() == [431]
    assert transport.written.count(b"HTTP/1.1") == 1  # refused once, then nothing is read


async def test_a_head_split_into_single_bytes_is_served() -> None:
    harness = Harness()
    protocol, transport = harness.connect()
    for byte in head("/split", b"X-A: 1", b"X-B: 2", body=b"hello"):
        protocol.data_received(bytes([byte]))
    await harness.settle()
    assert transport.statuses() == [200]
    assert transport.bodies() == [{"path": "/split", "size": 5}]


async def test_a_pipelined_head_that_starts_mid_read_is_checked_when_complete() -> None:
    """The second head begins after the first request's body, in the same read."""
    harness = Harness()
    protocol, transport = harness.connect()
    small = head("/one", body=b"12345")
    protocol.data_received(small + head("/two", b"X-Big: " + b"a" * 300))
    await harness.settle()
    # The first request is answered; then the connection closes without a second answer.
    assert transport.statuses() == [200]
    assert transport.closed
    assert harness.metrics.connections_closed == {"head_too_large": 1}


async def test_pipelined_requests_within_the_limits_are_all_answered_in_order() -> None:
    harness = Harness()
    protocol, transport = harness.connect()
    protocol.data_received(head("/one", body=b"1") + head("/two", body=b"22") + head("/three"))
    for _ in range(3):
        await harness.settle()
    assert transport.statuses() == [200, 200, 200]
    assert [body["path"] for body in transport.bodies()] == ["/one", "/two", "/three"]
    assert not transport.closed


# -- header count -------------------------------------------------------------------------


async def test_more_header_lines_than_the_limit_is_431() -> None:
    harness = Harness()
    protocol, transport = harness.connect()
    protocol.data_received(head("/x", *[b"X-%d: v" % i for i in range(3)]))  # Host, 3, C-L: 5
    await harness.settle()
    assert transport.statuses() == [200]

    protocol, transport = harness.connect()
    protocol.data_received(head("/x", *[b"X-%d: v" % i for i in range(5)]))  # 7 lines
    await harness.settle()
    assert transport.statuses() == [431]
    assert error_code(transport) == "too_many_headers"


async def test_the_header_count_is_checked_before_the_head_ends() -> None:
    harness = Harness()
    protocol, transport = harness.connect()
    protocol.data_received(b"GET /x HTTP/1.1\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(8)))
    assert transport.statuses() == [431]  # no blank line yet: refused at the read's end
    assert transport.closed


# -- time ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "partial",
    [b"GET /x HTTP/1.1\r\nHost: g", b"GE", b"\r\n", b"GET /x HTTP/1.1\r\n"],
    ids=["mid-header", "mid-request-line", "a blank line", "request line only"],
)
async def test_a_head_not_whole_within_head_timeout_is_408_and_closed(
    partial: bytes, advance: Callable[[float], Any]
) -> None:
    harness = Harness()
    protocol, transport = harness.connect()
    protocol.data_received(partial)
    await advance(9.9)
    assert not transport.closed
    await advance(0.2)
    assert transport.statuses() == [408]
    assert error_code(transport) == "head_timeout"
    assert transport.closed
    assert harness.metrics.connections_closed == {"head_timeout": 1}


async def test_a_trickling_head_does_not_restart_the_clock(advance: Callable[[float], Any]) -> None:
    harness = Harness()
    protocol, transport = harness.connect()
    for byte in b"GET /x HTTP/1.1\r\nHost:":
        protocol.data_received(bytes([byte]))
        await advance(0.5)  # 23 bytes x 0.5 s: past the 10 s head timeout
        if transport.closed:
            break
    assert transport.statuses() == [408]


async def test_a_silent_connection_is_closed_after_the_idle_timeout(
    advance: Callable[[float], Any],
) -> None:
    harness = Harness()
    _protocol, transport = harness.connect()
    await advance(4.9)
    assert not transport.closed
    await advance(0.2)
    assert transport.closed
    assert transport.written == b""  # nothing was asked: nothing is answered


async def test_an_idle_keep_alive_connection_is_closed(advance: Callable[[float], Any]) -> None:
    harness = Harness()
    protocol, transport = harness.connect()
    protocol.data_received(head("/x"))
    await harness.settle()
    assert transport.statuses() == [200]
    await advance(5.1)
    assert transport.closed
    assert transport.statuses() == [200]


async def test_a_body_nobody_reads_is_cut_after_head_timeout(
    advance: Callable[[float], Any],
) -> None:
    """Answered at once (the app reads no body); the client keeps sending the body."""

    async def early(scope: Any, receive: Any, send: Any) -> None:
        await send(
            {"type": "http.response.start", "status": 413, "headers": [(b"content-length", b"0")]}
        )
        await send({"type": "http.response.body", "body": b""})

    harness = Harness(app=early)
    protocol, transport = harness.connect()
    protocol.data_received(b"POST /x HTTP/1.1\r\nHost: g\r\nContent-Length: 100000000\r\n\r\n")
    await harness.settle()
    assert transport.statuses() == [413]
    for _ in range(11):
        protocol.data_received(b"a" * 1000)  # keeps uvicorn's idle timer off
        await advance(1.0)
    assert transport.closed
    assert transport.statuses() == [413]  # no second answer
    assert harness.metrics.connections_closed == {"body_timeout": 1}


# -- trailers -----------------------------------------------------------------------------


async def test_oversized_trailers_close_the_connection() -> None:
    harness = Harness()
    protocol, transport = harness.connect()
    protocol.data_received(
        b"POST /x HTTP/1.1\r\nHost: g\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-T: "
    )
    for _ in range(10):
        protocol.data_received(b"a" * 100)
    assert transport.closed
    assert harness.metrics.connections_closed == {"head_too_large": 1}


# -- peers --------------------------------------------------------------------------------


async def test_a_peer_at_its_cap_has_its_next_connection_closed_at_once() -> None:
    harness = Harness(limits=ConnectionLimits(max_connections_per_peer=2))
    first, _ = harness.connect("10.0.0.1")
    harness.connect("10.0.0.1")
    _, third = harness.connect("10.0.0.1")
    assert third.closed
    assert third.written == b""
    _, other = harness.connect("10.0.0.2")
    assert not other.closed
    first.connection_lost(None)
    _, again = harness.connect("10.0.0.1")
    assert not again.closed
    assert harness.metrics.connections_closed == {"peer_limit": 1}
    assert harness.guard.peers == {"10.0.0.1": 2, "10.0.0.2": 1}


def test_a_peer_may_hold_at_most_half_of_the_file_limit() -> None:
    metrics = GatewayMetrics(dict)
    assert ConnectionGuard(ConnectionLimits(), metrics, file_limit=100).peer_cap == 50
    assert ConnectionGuard(ConnectionLimits(), metrics, file_limit=100_000).peer_cap == 1024
    off = ConnectionLimits(max_connections_per_peer=0)
    assert ConnectionGuard(off, metrics, file_limit=100).peer_cap == 0
    guard = ConnectionGuard(off, metrics, file_limit=100)
    assert all(guard.admit("10.0.0.1") for _ in range(500))


# -- clients that leave -------------------------------------------------------------------


async def test_a_client_that_leaves_is_heard_by_every_unanswered_pipelined_request(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """uvicorn alone marks only the newest request; the running one kept writing."""
    release = asyncio.Event()
    heard: list[str] = []

    async def slow(scope: Any, receive: Any, send: Any) -> None:
        await receive()  # the body
        watcher = asyncio.ensure_future(receive())
        await release.wait()
        heard.append((await watcher)["type"])
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
        )
        await send({"type": "http.response.body", "body": b"ok"})

    harness = Harness(app=slow)
    protocol, transport = harness.connect()
    protocol.data_received(head("/one") + head("/two") + head("/three"))
    await asyncio.sleep(0)
    transport.close()
    protocol.connection_lost(None)
    release.set()
    await harness.settle()
    assert heard == ["http.disconnect"]  # the first (running) one heard it; the rest never ran
    assert "Exception in ASGI application" not in caplog.text


async def test_a_write_to_a_transport_closed_under_the_request_is_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """uvloop raises on a write after the peer reset, before connection_lost runs."""
    caplog.set_level(logging.ERROR)
    harness = Harness()
    protocol, transport = harness.connect()
    protocol.data_received(head("/x"))
    transport.closed = True  # the reset: the handle is closed, connection_lost not yet called
    await harness.settle()
    assert "Exception in ASGI application" not in caplog.text
    assert transport.written == b""


async def test_invalid_http_still_gets_uvicorns_400() -> None:
    harness = Harness()
    protocol, transport = harness.connect()
    protocol.data_received(b"GET /x HTTP/1.1\r\nBad Header\r\n\r\n")
    assert transport.statuses() == [400]
    assert transport.closed


# -- settings -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_head_bytes", 0),
        ("max_headers", 0),
        ("head_timeout", 0.0),
        ("keep_alive_timeout", -1.0),
        ("max_connections_per_peer", -1),
    ],
)
def test_limits_out_of_range_name_the_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        ConnectionLimits(**{field: value})


def test_the_soft_file_limit_is_raised_to_the_hard_one(monkeypatch: pytest.MonkeyPatch) -> None:
    limits = {"now": (1024, 524_288)}
    monkeypatch.setattr(resource, "getrlimit", lambda which: limits["now"])
    monkeypatch.setattr(resource, "setrlimit", lambda which, value: limits.update(now=value))
    assert raise_file_limit() == (1024, 524_288)
    assert limits["now"] == (524_288, 524_288)
    assert raise_file_limit() == (524_288, 524_288)  # already there: unchanged

    def refuse(which: int, value: tuple[int, int]) -> None:
        raise ValueError("not permitted")

    limits["now"] = (100, 200)
    monkeypatch.setattr(resource, "setrlimit", refuse)
    assert raise_file_limit() == (100, 100)
