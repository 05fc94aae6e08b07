"""The drivers' half of a race (``herdless._parallel``) and the sync client's watched
sockets (``herdless._sockets._WatchedStream``), with fake sends and a fake socket: no
HTTP, no server.

Sends here block on events the test sets, so which one ends first never depends on
timing; a race's own timeout is only ever asked to expire at once (``0``).
"""

from __future__ import annotations

import asyncio
import math
import threading
from typing import Any

import httpcore
import pytest

from herdless._actions import Race, Response, Send, TransportFailure
from herdless._backend import Backend, Timeouts
from herdless._parallel import AsyncSends, SyncSends, Workers
from herdless._sockets import AttemptLimit, _WatchedStream

BACKEND = Backend(name="b", base_url="http://b.test/v1")


def _send(attempt: int, *, stream: bool = False) -> Send:
    return Send(
        backend=BACKEND, attempt=attempt, body={}, headers={}, timeouts=Timeouts(), stream=stream
    )


class _Opened:
    """Stands for an accepted stream: ``response.close()`` is recorded."""

    def __init__(self) -> None:
        self.closed = threading.Event()
        self.response = self

    def close(self) -> None:
        self.closed.set()

    async def aclose(self) -> None:
        self.closed.set()


def _stream_answer(opened: _Opened) -> Response:
    return Response(status=200, headers={}, body=b"", elapsed=0.0, opened=opened)


# -- sync ------------------------------------------------------------------------------------


@pytest.fixture
def workers() -> Any:
    pool = Workers()
    yield pool
    pool.shutdown()


def test_sync_the_first_send_to_end_is_reported_and_the_other_closed(workers: Workers) -> None:
    first, second = _send(1, stream=True), _send(2, stream=True)
    go_first, go_second = threading.Event(), threading.Event()
    late = _Opened()
    finished = threading.Event()

    def perform(send: Send) -> Response:
        if send is first:
            go_first.wait(5)
            finished.set()
            return _stream_answer(late)
        go_second.wait(5)
        return Response(status=503, headers={}, body=b"", elapsed=0.0)

    sends = SyncSends(perform, workers, None)
    assert sends.race(Race(send=first, timeout=0.0)) is None  # still running: time is up
    go_second.set()
    ended = sends.race(Race(send=second, timeout=None))
    assert ended is not None
    assert ended.send is second
    sends.cancel()  # the flow moves on: the first is cancelled while it runs
    go_first.set()
    assert finished.wait(5)
    assert late.closed.wait(5)  # its answer, once it came, was closed unread


def test_sync_an_ended_but_unreported_send_is_closed_at_cancel(workers: Workers) -> None:
    first, second = _send(1, stream=True), _send(2, stream=True)
    opened = _Opened()
    go = threading.Event()

    def perform(send: Send) -> Response:
        if send is second:
            go.wait(5)
            return _stream_answer(opened)
        return Response(status=503, headers={}, body=b"", elapsed=0.0)

    sends = SyncSends(perform, workers, None)
    assert sends.race(Race(send=first, timeout=None)) is not None  # the 503, reported
    assert sends.race(Race(send=second, timeout=0.0)) is None  # held: not reported
    go.set()
    for _ in range(500):  # until its answer is in, unreported (bounded)
        if sends._queue.qsize():
            break
        threading.Event().wait(0.01)
    assert not opened.closed.is_set()
    sends.cancel()
    assert opened.closed.is_set()


def test_sync_a_send_that_raises_raises_in_the_callers_thread(workers: Workers) -> None:
    def perform(send: Send) -> Response:
        raise RuntimeError("a bug")

    sends = SyncSends(perform, workers, None)
    with pytest.raises(RuntimeError, match="a bug"):
        sends.race(Race(send=_send(1), timeout=None))


def test_sync_a_race_with_nothing_running_is_a_bug(workers: Workers) -> None:
    with pytest.raises(RuntimeError, match="nothing running"):
        SyncSends(
            lambda send: TransportFailure(kind="connect", message="", elapsed=0), workers, None
        ).race(Race(send=None, timeout=None))


def test_sync_a_racing_send_is_watched_on_its_own_thread(workers: Workers) -> None:
    limit = AttemptLimit()
    seen: list[Any] = []

    def perform(send: Send) -> TransportFailure:
        seen.append(limit.watch)
        return TransportFailure(kind="connect", message="", elapsed=0)

    sends = SyncSends(perform, workers, limit)
    sends.race(Race(send=_send(1), timeout=None))
    assert len(seen) == 1
    assert seen[0] is not None
    assert not seen[0].cancelled
    assert limit.watch is None  # this thread races nothing


# -- async -----------------------------------------------------------------------------------


async def test_async_the_first_send_to_end_is_reported_and_the_other_cancelled() -> None:
    first, second = _send(1), _send(2)
    go_second = asyncio.Event()
    cancelled: list[Send] = []

    async def perform(send: Send) -> Response:
        try:
            if send is first:
                await asyncio.Event().wait()  # never answers
            await go_second.wait()
            return Response(status=200, headers={}, body=b"{}", elapsed=0.0)
        except asyncio.CancelledError:
            cancelled.append(send)
            raise

    sends = AsyncSends(perform)
    assert await sends.race(Race(send=first, timeout=0.0)) is None
    go_second.set()
    ended = await sends.race(Race(send=second, timeout=None))
    assert ended is not None
    assert ended.send is second
    await sends.cancel()
    assert cancelled == [first]


async def test_async_an_ended_but_unreported_stream_is_closed_at_cancel() -> None:
    first, second = _send(1, stream=True), _send(2, stream=True)
    opened = _Opened()
    go = asyncio.Event()

    async def perform(send: Send) -> Response:
        if send is second:
            await go.wait()
            return _stream_answer(opened)
        return Response(status=503, headers={}, body=b"", elapsed=0.0)

    sends = AsyncSends(perform)
    assert await sends.race(Race(send=first, timeout=None)) is not None
    assert await sends.race(Race(send=second, timeout=0.0)) is None
    go.set()
    ((task, _),) = sends._tasks
    await asyncio.wait([task])  # its answer is in, unreported
    assert not opened.closed.is_set()
    await sends.cancel()
    assert opened.closed.is_set()
    with pytest.raises(RuntimeError, match="nothing running"):
        await sends.race(Race(send=None, timeout=None))


# -- the sync client's watched sockets ----------------------------------------------------------


class _Socket(httpcore.NetworkStream):
    """A fake socket: each read times out (a slice ran out) until ``answer_after`` reads."""

    def __init__(self, *, answer_after: float = math.inf, on_read: Any = None) -> None:
        self.reads: list[float | None] = []
        self.answer_after = answer_after
        self.on_read = on_read
        self.written: list[bytes] = []

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        self.reads.append(timeout)
        if self.on_read is not None:
            self.on_read(len(self.reads))
        if len(self.reads) > self.answer_after:
            return b"data"
        raise httpcore.ReadTimeout("slice")

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.written.append(buffer)

    def close(self) -> None:
        pass


class _Watch:
    cancelled = False


def test_a_watched_read_not_racing_is_a_bounded_read() -> None:
    limit = AttemptLimit()
    sock = _Socket(answer_after=0)
    assert _WatchedStream(sock, limit).read(10, 2.0) == b"data"
    assert sock.reads == [2.0]


def test_a_racing_read_waits_in_slices_until_data() -> None:
    limit = AttemptLimit()
    limit.watch = _Watch()
    sock = _Socket(answer_after=3)
    assert _WatchedStream(sock, limit).read(10, 30.0) == b"data"
    assert len(sock.reads) == 4
    assert all(wait is not None and wait <= 0.05 for wait in sock.reads)


def test_a_racing_read_stops_once_cancelled() -> None:
    limit = AttemptLimit()
    watch = _Watch()
    limit.watch = watch

    def cancel_at_third(reads: int) -> None:
        if reads == 3:
            watch.cancelled = True

    sock = _Socket(on_read=cancel_at_third)
    with pytest.raises(httpcore.ReadError, match="cancelled"):
        _WatchedStream(sock, limit).read(10, 30.0)
    assert len(sock.reads) == 3
    with pytest.raises(httpcore.WriteError, match="cancelled"):
        _WatchedStream(sock, limit).write(b"x")
    assert sock.written == []


def test_a_racing_read_past_the_attempts_time_times_out() -> None:
    limit = AttemptLimit()
    limit.watch = _Watch()
    limit.end = 0.0  # long past
    sock = _Socket(answer_after=0)
    with pytest.raises(httpcore.ReadTimeout):
        _WatchedStream(sock, limit).read(10, 30.0)
    assert sock.reads == []
