"""Hostile connections over raw sockets against a real ``herdless serve`` process.

Each case is what an attacker (or a broken client) does with a connection rather
than with a request body: heads too large or with too many lines, heads that never
end, connections that stay silent, pipelining and hanging up, one address holding
many sockets, trailers and bodies nobody reads, trailing slashes with a foreign
``Host``, a hostile ``X-Request-ID`` on ``/v1/models``. The gateway runs as
``python -m herdless serve`` (uvicorn, httptools, uvloop: what production runs);
only its time limits are shortened so that the suite takes seconds, and one test
checks the defaults.

Every probe is bounded: it reads until the gateway closes or a hard cap passes.
The tally printed at the end (``hostile connections``) counts the probes, the 5xx
answers seen, the probes the gateway never closed (hung) and those it closed later
than the limit under test allows (late).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

pytest.importorskip("starlette")

import httpx
from tests.fuzz._counts import COUNTS, OUTCOMES

from herdless.launch.servers import ServerProcess, emulator_process, gateway_process

pytestmark = [pytest.mark.integration, pytest.mark.server]

HEAD_TIMEOUT = 2.0
IDLE = 1.0
SLACK = 1.5  # scheduling slack on a busy machine: later than limit + SLACK is "late"
KEY = "conn-key-1"
ADMIN_TOKEN = "conn-admin-token"
ENV = {"HERDLESS_GATEWAY_API_KEYS": KEY, "HERDLESS_GATEWAY_ADMIN_TOKEN": ADMIN_TOKEN}
HOSTILE_PEER = "127.0.0.2"  # loopback too, but another address than the well-behaved client
CHAT = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode()


@dataclass(frozen=True)
class Probe:
    """What a raw connection got back."""

    raw: bytes
    closed: bool  # the gateway closed the connection (EOF or reset)
    seconds: float  # from the last byte sent to the close (or to the cap)

    @property
    def statuses(self) -> list[int]:
        return [int(code) for code in re.findall(rb"HTTP/1\.1 (\d{3}) ", self.raw)]

    def header(self, name: str) -> str | None:
        found = re.search(rb"(?im)^" + name.encode() + rb": ([^\r\n]*)", self.raw)
        return None if found is None else found.group(1).decode("latin-1")

    def json(self) -> dict[str, object]:
        body = self.raw.split(b"\r\n\r\n", 1)[1]
        data: dict[str, object] = json.loads(body)
        return data


def probe(
    server: ServerProcess,
    payload: bytes | list[tuple[bytes, float]],
    *,
    family: str,
    within: float,
    cap: float = 15.0,
    source: str = "127.0.0.1",
) -> Probe:
    """Send ``payload`` (or ``(bytes, pause)`` pieces), read until the gateway closes.

    Tallies the probe: a status >= 500 is a 5xx; no close within ``cap`` is hung;
    a close later than ``within`` seconds after the last byte sent is late.
    """
    pieces = [(payload, 0.0)] if isinstance(payload, bytes) else payload
    COUNTS[f"gateway connections: {family}"] += 1
    OUTCOMES["probes"] += 1
    chunks: list[bytes] = []
    closed = False
    with socket.socket() as sock:
        sock.bind((source, 0))
        sock.connect((server.host, server.port))
        sent_at = time.monotonic()
        try:
            for data, pause in pieces:
                sock.sendall(data)
                sent_at = time.monotonic()
                time.sleep(pause)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the gateway closed first: what it sent is still to be read
        sock.settimeout(0.2)
        while time.monotonic() - sent_at < cap:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            except ConnectionResetError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            chunks.append(chunk)
        seconds = time.monotonic() - sent_at
    result = Probe(b"".join(chunks), closed, seconds)
    OUTCOMES["5xx seen"] += sum(1 for status in result.statuses if status >= 500)
    OUTCOMES["hung"] += not closed
    OUTCOMES["late"] += closed and seconds > within
    return result


def get(path: str, *headers: bytes, host: bytes = b"gw", method: bytes = b"GET") -> bytes:
    lines = [method + b" " + path.encode() + b" HTTP/1.1", b"Host: " + host, *headers]
    return b"\r\n".join([*lines, b"Connection: close", b"", b""])


@pytest.fixture(scope="module")
def vllm() -> Iterator[ServerProcess]:
    with emulator_process(speed=20) as server:
        yield server


@pytest.fixture(scope="module")
def gateway(vllm: ServerProcess) -> Iterator[ServerProcess]:
    with gateway_process(
        upstream=vllm.url,
        head_timeout=HEAD_TIMEOUT,
        keep_alive_timeout=IDLE,
        max_connections_per_peer=40,
        env=ENV,
    ) as server:
        yield server
        assert "Traceback" not in server.logs()
        assert "Exception in ASGI application" not in server.logs()


def healthy(server: ServerProcess) -> float:
    """Seconds a /healthz took from 127.0.0.1 (fails the test unless it is a 200)."""
    start = time.monotonic()
    response = httpx.get(server.url + "/healthz", timeout=5.0)
    assert response.status_code == 200
    return time.monotonic() - start


def metric(server: ServerProcess, line_start: str) -> float:
    for line in httpx.get(server.url + "/metrics").text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


# -- head size and header count ------------------------------------------------------------

BASE = b"GET /healthz HTTP/1.1\r\nHost: gw\r\n"
OVERSIZED = {
    "2 MiB header value": BASE + b"X-Big: " + b"a" * (2 << 20) + b"\r\n\r\n",
    "1 MiB header name": BASE + b"X-" + b"n" * (1 << 20) + b": v\r\n\r\n",
    "100,000 headers": BASE + b"".join(b"X-%d: v\r\n" % i for i in range(100_000)) + b"\r\n",
    "64 KiB target": b"GET /healthz?" + b"q" * 65_536 + b" HTTP/1.1\r\nHost: gw\r\n\r\n",
    "40 KiB of small headers": BASE
    + b"".join(b"X-Pad-%04d: %s\r\n" % (i, b"v" * 30) for i in range(1000))
    + b"\r\n",
    "1 MiB of blank lines, then a request": b"\r\n" * (1 << 19) + BASE + b"\r\n",
}


@pytest.mark.parametrize("payload", OVERSIZED.values(), ids=OVERSIZED.keys())
def test_an_oversized_head_gets_431_and_a_close(gateway: ServerProcess, payload: bytes) -> None:
    got = probe(gateway, payload, family="oversized heads", within=SLACK)
    assert got.statuses == [431], got.raw[:200]
    assert got.json()["error"]["code"] == "head_too_large"  # type: ignore[index]
    assert got.closed
    assert healthy(gateway) < 2.0


def test_a_head_under_the_limit_is_served(gateway: ServerProcess) -> None:
    payload = get("/healthz", b"X-Big: " + b"a" * 30_000)
    got = probe(gateway, payload, family="oversized heads", within=SLACK)
    assert got.statuses == [200]


def test_an_oversized_head_is_refused_before_it_ends(gateway: ServerProcess) -> None:
    """40 KiB of one header that never ends: the answer comes while the client still sends."""
    COUNTS["gateway connections: oversized heads"] += 1
    OUTCOMES["probes"] += 1
    with socket.create_connection((gateway.host, gateway.port), timeout=5.0) as sock:
        sock.sendall(BASE + b"X-Never-Ends: " + b"a" * 40_000)
        reply = sock.recv(65536)  # no blank line was sent: only the limit can answer
    assert reply.startswith(b"HTTP/1.1 431 ")


def test_too_many_header_lines_is_431(gateway: ServerProcess) -> None:
    allowed = get("/healthz", *[b"X-%d: v" % i for i in range(98)])  # + Host, Connection
    over = get("/healthz", *[b"X-%d: v" % i for i in range(99)])
    assert probe(gateway, allowed, family="header count", within=SLACK).statuses == [200]
    got = probe(gateway, over, family="header count", within=SLACK)
    assert got.statuses == [431]
    assert got.json()["error"]["code"] == "too_many_headers"  # type: ignore[index]


# -- time ------------------------------------------------------------------------------------

STALLED = {
    "request line only": [(b"GET /healthz HTTP/1.1\r\n", 0.0)],
    "half a header": [(b"GET /healthz HTTP/1.1\r\nHost: g", 0.0)],
    "half a request line": [(b"POST /v1/chat/comp", 0.0)],
    "blank lines, one every 0.3 s": [(b"\r\n", 0.3)] * 12,
    "a header, one byte every 0.3 s": [(bytes([b]), 0.3) for b in b"GET / HTTP/1.1\r\nX: aaaaa"],
}


@pytest.mark.parametrize("pieces", STALLED.values(), ids=STALLED.keys())
def test_a_head_not_whole_in_time_gets_408_and_a_close(
    gateway: ServerProcess, pieces: list[tuple[bytes, float]]
) -> None:
    start = time.monotonic()
    got = probe(gateway, pieces, family="stalled heads", within=HEAD_TIMEOUT + SLACK)
    assert got.closed
    assert got.statuses == [408]
    assert got.json()["error"]["code"] == "head_timeout"  # type: ignore[index]
    # The clock runs from the first byte and is not restarted by later ones.
    assert time.monotonic() - start < HEAD_TIMEOUT + SLACK + 0.3


def test_a_silent_connection_is_closed_without_an_answer(gateway: ServerProcess) -> None:
    got = probe(gateway, b"", family="idle connections", within=IDLE + SLACK)
    assert got.closed
    assert got.raw == b""


def test_an_idle_keep_alive_connection_is_closed(gateway: ServerProcess) -> None:
    payload = b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n"  # keep-alive: the gateway keeps it open
    got = probe(gateway, payload, family="idle connections", within=IDLE + SLACK)
    assert got.statuses == [200]
    assert got.closed


def test_a_body_nobody_reads_is_cut_off(gateway: ServerProcess) -> None:
    """/healthz answers at once; the client goes on sending a 1 GB body."""
    head = b"GET /healthz HTTP/1.1\r\nHost: gw\r\nContent-Length: 1000000000\r\n\r\n"
    pieces = [(head, 0.05)] + [(b"a" * 4096, 0.05)] * 100  # 5 s of body at most
    got = probe(gateway, pieces, family="unread bodies", within=SLACK, cap=10.0)
    assert got.statuses == [200]
    assert got.closed
    assert metric(gateway, 'herdless_gateway_connections_closed_total{reason="body_timeout"}') >= 1


def test_oversized_trailers_close_the_connection(gateway: ServerProcess) -> None:
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer "
        + KEY.encode()
        + b"\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    trailer = b"%x\r\n%s\r\n0\r\nX-Trailer: " % (len(CHAT), CHAT) + b"a" * (4 << 20)
    got = probe(gateway, head + trailer, family="trailers", within=SLACK)
    assert got.closed
    assert got.statuses == []  # the request was being read: it gets no answer, only a close


# -- pipelining and hanging up --------------------------------------------------------------


def test_pipelined_requests_then_a_hang_up_are_counted_not_crashed() -> None:
    """Three chats on one socket; read the first answer, hang up while the second runs."""
    with (
        emulator_process(speed=20, extra_latency=1.0) as slow_vllm,  # each answer takes 1 s
        gateway_process(upstream=slow_vllm.url, head_timeout=HEAD_TIMEOUT) as gateway,
    ):
        request = (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            + b"Content-Length: %d\r\n\r\n" % len(CHAT)
            + CHAT
        )
        for _ in range(5):
            COUNTS["gateway connections: pipelining and hang-up"] += 1
            OUTCOMES["probes"] += 1
            with socket.create_connection((gateway.host, gateway.port), timeout=10.0) as sock:
                sock.sendall(request * 3)
                reply = b""
                while not reply.endswith(b"\r\n0\r\n\r\n"):  # the first answer, whole (chunked)
                    reply += sock.recv(65536)
            assert reply.startswith(b"HTTP/1.1 200 ")
        deadline = time.monotonic() + 10.0
        while metric(gateway, 'herdless_gateway_requests_total{code="499"}') < 5:
            assert time.monotonic() < deadline, gateway.logs()
            time.sleep(0.05)
        time.sleep(0.5)
        logs = gateway.logs()
        assert metric(gateway, 'herdless_gateway_requests_total{code="499"}') == 5
        assert metric(gateway, 'herdless_gateway_requests_total{code="200"}') == 5
        assert logs.count(" status=499 reason=client_closed ") == 5  # --log-format text
        assert "Exception in ASGI application" not in logs
        assert "Traceback" not in logs


# -- one address, many sockets --------------------------------------------------------------


def test_one_peer_holding_many_sockets_does_not_lock_others_out(gateway: ServerProcess) -> None:
    """200 silent sockets from one address: 40 are held (the cap), the rest closed at once."""
    before = metric(gateway, 'herdless_gateway_connections_closed_total{reason="peer_limit"}')
    held: list[socket.socket] = []
    try:
        for _ in range(200):
            sock = socket.socket()
            sock.bind((HOSTILE_PEER, 0))
            sock.connect((gateway.host, gateway.port))
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: g")  # a head that never ends
            held.append(sock)
        COUNTS["gateway connections: many sockets from one peer"] += len(held)
        OUTCOMES["probes"] += len(held)
        latencies = [healthy(gateway) for _ in range(20)]  # another address, meanwhile
        assert max(latencies) < 2.0, latencies
        refused = metric(gateway, 'herdless_gateway_connections_closed_total{reason="peer_limit"}')
        assert refused - before == 160
        # And the 40 held ones end at the head timeout.
        deadline = time.monotonic() + HEAD_TIMEOUT + SLACK + 1.0
        for sock in held:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                while sock.recv(65536):
                    pass
            except ConnectionResetError:
                pass
            except TimeoutError:
                OUTCOMES["hung"] += 1
                raise
    finally:
        for sock in held:
            sock.close()


# -- redirects ------------------------------------------------------------------------------

SLASHED = [
    "/healthz/",
    "/readyz/",
    "/metrics/",
    "/v1/models/",
    "/v1/chat/completions/",
    "/admin/drain/",
    "/admin/resume/",
]


@pytest.mark.parametrize("method", [b"GET", b"POST"])
@pytest.mark.parametrize("path", SLASHED)
def test_a_trailing_slash_is_a_json_404_never_a_redirect(
    gateway: ServerProcess, path: str, method: bytes
) -> None:
    payload = get(path, b"Content-Length: 0", host=b"evil.example", method=method)
    got = probe(gateway, payload, family="trailing slashes, foreign Host", within=SLACK)
    assert got.statuses == [404]
    assert got.header("location") is None
    assert b"evil.example" not in got.raw
    assert got.json()["error"]["code"] == "not_found"  # type: ignore[index]


# -- /v1/models -----------------------------------------------------------------------------


class _Recorder(BaseHTTPRequestHandler):
    """A stub vLLM: /health, /v1/models (recording its headers) and a fixed chat answer."""

    seen: ClassVar[list[dict[str, str]]] = []

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            type(self).seen.append({k.lower(): v for k, v in self.headers.items()})
            time.sleep(0.05)  # a list that takes a moment: concurrent callers overlap
            self._send(b'{"object":"list","data":[{"id":"m","object":"model"}]}')
        else:
            self._send(b"")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        self._send(b'{"id":"c","object":"chat.completion","choices":[],"usage":{"total_tokens":3}}')

    def _send(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def recorder() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


HOSTILE_IDS = {
    "6,001 characters": b"r" * 6001,
    "a tab": b"a\tb",
    "non-ASCII": "é-ü-漢".encode(),
    "spaces": b"a b c",
    "129 characters": b"x" * 129,
}


@pytest.mark.parametrize("rid", HOSTILE_IDS.values(), ids=HOSTILE_IDS.keys())
def test_models_sanitises_a_hostile_request_id(recorder: str, rid: bytes) -> None:
    _Recorder.seen.clear()
    with gateway_process(upstream=recorder, models_cache_ttl=0, env=ENV) as gateway:
        auth = b"Authorization: Bearer " + KEY.encode()
        got = probe(
            gateway,
            get("/v1/models", auth, b"X-Request-ID: " + rid),
            family="models ids",
            within=SLACK,
        )
        sane = probe(
            gateway,
            get("/v1/models", auth, b"X-Request-ID: rid-42"),
            family="models ids",
            within=SLACK,
        )
    assert got.statuses == [200]
    echoed = got.header("x-request-id")
    assert echoed is not None
    assert re.fullmatch(r"[0-9a-f]{32}", echoed)
    assert _Recorder.seen[0]["x-request-id"] == echoed  # what vLLM saw is the sanitised id
    assert sane.header("x-request-id") == "rid-42"
    assert _Recorder.seen[1]["x-request-id"] == "rid-42"


def test_control_bytes_in_a_header_are_refused_by_the_parser(gateway: ServerProcess) -> None:
    auth = b"Authorization: Bearer " + KEY.encode()
    payload = get("/v1/models", auth, b"X-Request-ID: a\x01b\x7fc")
    got = probe(gateway, payload, family="models ids", within=SLACK)
    assert got.statuses == [400]
    assert got.closed


def test_models_needs_a_key_when_keys_are_configured(gateway: ServerProcess) -> None:
    for headers in (
        [],
        [b"Authorization: Bearer wrong"],
        [b"Authorization: Basic " + KEY.encode()],
    ):
        got = probe(gateway, get("/v1/models", *headers), family="models auth", within=SLACK)
        assert got.statuses == [401]
        assert got.header("www-authenticate") == "Bearer"
    auth = b"Authorization: Bearer " + KEY.encode()
    assert probe(gateway, get("/v1/models", auth), family="models auth", within=SLACK).statuses == [
        200
    ]


def test_a_models_flood_costs_vllm_a_request_per_ttl_and_chats_go_on(recorder: str) -> None:
    """100 callers list models for 2 s while 20 chats run: vLLM sees about one list a second."""
    _Recorder.seen.clear()
    answered: list[float] = []
    with gateway_process(upstream=recorder, models_cache_ttl=1, env=ENV) as gateway:

        async def run() -> tuple[list[int], list[int]]:
            limits = httpx.Limits(max_connections=120)
            async with httpx.AsyncClient(
                base_url=gateway.url,
                headers={"authorization": f"Bearer {KEY}"},
                timeout=10.0,
                limits=limits,
            ) as client:
                stop = time.monotonic() + 2.0
                codes: list[int] = []

                async def flood() -> None:
                    while time.monotonic() < stop:
                        codes.append((await client.get("/v1/models")).status_code)
                        answered.append(time.monotonic())

                async def chat() -> int:
                    return (await client.post("/v1/chat/completions", content=CHAT)).status_code

                flooding = [asyncio.create_task(flood()) for _ in range(100)]
                chats = [await chat() for _ in range(20)]
                await asyncio.gather(*flooding)
                return codes, chats

        codes, chats = asyncio.run(run())
    # How long the flood lasted as the gateway saw it: on a loaded machine the last
    # answers may come well after the 2 s the callers flooded for.
    span = max(answered) - min(answered)
    COUNTS["gateway connections: /v1/models flood"] += len(codes)
    OUTCOMES["probes"] += len(codes)
    OUTCOMES["5xx seen"] += sum(code >= 500 for code in codes)
    assert len(codes) > 100  # a flood indeed (each one a /v1/models call)
    assert set(codes) == {200}
    assert chats == [200] * 20
    # One fetch per second (the TTL) at most while the flood lasted, +2: the first, and
    # the one under way at the end.
    assert 1 <= len(_Recorder.seen) <= math.ceil(span) + 2, (len(_Recorder.seen), span)


# -- the defaults ---------------------------------------------------------------------------


def test_the_default_limits_end_stalled_heads_and_idle_connections(vllm: ServerProcess) -> None:
    """No overrides: 10 s for a head, 10 s of silence, 32 KiB and 100 lines per head."""
    with gateway_process(upstream=vllm.url) as gateway:
        results: dict[str, Probe] = {}

        def run(name: str, payload: bytes, within: float) -> None:
            results[name] = probe(gateway, payload, family="defaults", within=within, cap=20.0)

        threads = [
            threading.Thread(target=run, args=("stalled", BASE, 10.0 + SLACK)),
            threading.Thread(target=run, args=("idle", b"", 10.0 + SLACK)),
        ]
        for thread in threads:
            thread.start()
        big = probe(
            gateway, BASE + b"X: " + b"a" * 32_768 + b"\r\n\r\n", family="defaults", within=SLACK
        )
        many = probe(gateway, BASE + b"X: v\r\n" * 100 + b"\r\n", family="defaults", within=SLACK)
        for thread in threads:
            thread.join(25.0)
    assert big.statuses == [431]
    assert many.statuses == [431]
    assert results["stalled"].statuses == [408]
    assert 9.5 < results["stalled"].seconds < 10.0 + SLACK
    assert results["idle"].raw == b""
    assert results["idle"].closed
    assert 9.5 < results["idle"].seconds < 10.0 + SLACK
