"""``Timeouts.first_byte`` and ``Timeouts.read`` on a stream's body.

httpcore reads a body under one socket timeout, fixed when the body starts; the async
client bounds the tighter of the two limits itself (``asyncio.timeout``), the sync client
keeps ``first_byte`` for every read of the body (the limitation ``Timeouts`` documents).
The stalls below wait on an event that never comes, bounded by timeouts of 20 ms: no
sleeping, and no assert on how long anything took.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

import herdless
from herdless._outcomes import stream_waits

_FIRST = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
_REST = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
_PRIMARY = herdless.Backend(name="primary", base_url="http://gpu.test/v1")
_HOSTED = herdless.Backend(name="hosted", base_url="http://hosted.test/v1")
_MESSAGES = [{"role": "user", "content": "hi"}]


class _Body(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A stream body that may stall (await forever) before or after its first event, and
    records the socket read timeout httpcore would read the body with."""

    def __init__(self, request: httpx.Request, stall: str | None) -> None:
        self._request = request
        self._stall = stall
        self.read_timeout: list[float | None] = []

    def _start(self) -> None:
        self.read_timeout.append(self._request.extensions["timeout"]["read"])

    def __iter__(self) -> Iterator[bytes]:
        self._start()
        yield _FIRST
        yield _REST

    async def __aiter__(self) -> AsyncIterator[bytes]:
        self._start()
        if self._stall == "first":
            await asyncio.Event().wait()
        yield _FIRST
        if self._stall == "gap":
            await asyncio.Event().wait()
        yield _REST


def _transport(stall: str | None, bodies: list[_Body]) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        body = _Body(request, stall if request.url.host == "gpu.test" else None)
        bodies.append(body)
        return httpx.Response(200, stream=body, headers={"content-type": "text/event-stream"})

    return httpx.MockTransport(handler)


@pytest.mark.parametrize(
    ("first_byte", "read", "socket", "waits"),
    [
        (4.0, 9.0, 9.0, (4.0, None)),  # the first event gets first_byte, gaps the socket's
        (9.0, 2.0, 9.0, (None, 2.0)),  # gaps get read, the first event the socket's
        (5.0, 5.0, 5.0, (None, None)),  # the socket's timeout is both
    ],
)
def test_stream_waits_split_the_limits_between_socket_and_driver(
    first_byte: float, read: float, socket: float, waits: tuple[float | None, float | None]
) -> None:
    request = httpx.Request("POST", "http://gpu.test/v1/chat/completions")
    request.extensions["timeout"] = {"connect": 1.0, "read": first_byte}
    response = httpx.Response(200, request=request)
    limits = herdless.Timeouts(first_byte=first_byte, read=read)
    assert stream_waits(response, limits) == waits
    assert request.extensions["timeout"]["read"] == socket


async def test_async_stream_idle_longer_than_read_is_interrupted() -> None:
    bodies: list[_Body] = []
    async with herdless.AsyncClient(
        _PRIMARY,
        timeouts=herdless.Timeouts(first_byte=5.0, read=0.02),
        transport=_transport("gap", bodies),
        env_file=None,
    ) as client:
        stream = await client.chat(_MESSAGES, stream=True)
        received: list[str] = []

        async def read() -> None:
            async with stream:
                async for chunk in stream:
                    received.append(chunk.content)

        with pytest.raises(herdless.StreamInterrupted, match=r"no chunk within 0\.02 s") as caught:
            await read()
    assert received == ["hi"]
    assert caught.value.delivered_chunks == 1
    assert bodies[0].read_timeout == [5.0]  # the socket's limit is the larger one


async def test_async_stream_silent_before_its_first_event_falls_back() -> None:
    bodies: list[_Body] = []
    async with (
        herdless.AsyncClient(
            _PRIMARY,
            fallback=_HOSTED,
            timeouts=herdless.Timeouts(first_byte=0.02, read=5.0),
            transport=_transport("first", bodies),
            env_file=None,
        ) as client,
        await client.chat(_MESSAGES, stream=True) as stream,
    ):
        chunks = [chunk.content async for chunk in stream]
    assert chunks == ["hi", ""]
    assert stream.backend == "hosted"
    assert stream.fallback_reason == "timeout"
    assert [(a.backend, a.kind) for a in stream.attempts] == [
        ("primary", "first_byte_timeout"),
        ("hosted", "ok"),
    ]
    assert bodies[0].read_timeout == [5.0]  # gaps may last up to read, not first_byte


async def test_async_attempt_stalled_before_any_answer_is_bounded_and_falls_back() -> None:
    # httpx's limits are per operation (a MockTransport applies none at all): a handler
    # that never answers stands for a crowded pool or a server that takes the connection
    # and stays silent. The whole attempt must still end within first_byte.
    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "gpu.test":
            await asyncio.Event().wait()
        return httpx.Response(200, json={"choices": [{"message": {"content": "hi"}}]})

    async with herdless.AsyncClient(
        _PRIMARY,
        fallback=_HOSTED,
        timeouts=herdless.Timeouts(first_byte=0.02),
        transport=httpx.MockTransport(handler),
        env_file=None,
    ) as client:
        # wait_for only turns a hang into a failure; the assertion is on the attempts.
        result = await asyncio.wait_for(client.chat(_MESSAGES), timeout=10)
    assert result.content == "hi"
    assert [(a.backend, a.kind) for a in result.attempts] == [
        ("primary", "first_byte_timeout"),
        ("hosted", "ok"),
    ]


def test_sync_stream_body_reads_keep_first_byte() -> None:
    bodies: list[_Body] = []
    with (
        herdless.Client(
            _PRIMARY,
            timeouts=herdless.Timeouts(first_byte=4.0, read=9.0),
            transport=_transport(None, bodies),
            env_file=None,
        ) as client,
        client.chat(_MESSAGES, stream=True) as stream,
    ):
        assert [chunk.content for chunk in stream] == ["hi", ""]
    assert bodies[0].read_timeout == [4.0]  # one socket timeout for the whole body


async def test_async_attempt_cancelled_by_the_caller_is_not_a_timeout() -> None:
    # The attempt's own timer turns its expiry into a failed attempt; a cancellation from
    # outside (the caller gave up) must propagate, not move the call to the fallback.
    started = asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "gpu.test":
            started.set()
            await asyncio.Event().wait()
        return httpx.Response(200, json={"choices": [{"message": {"content": "hi"}}]})

    async with herdless.AsyncClient(
        _PRIMARY,
        fallback=_HOSTED,
        timeouts=herdless.Timeouts(first_byte=30.0),
        transport=httpx.MockTransport(handler),
        env_file=None,
    ) as client:
        task = asyncio.create_task(client.chat(_MESSAGES))
        await asyncio.wait_for(started.wait(), timeout=10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task  # a timeout would have been answered by the hosted fallback
