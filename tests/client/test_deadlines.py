"""The deadline against slow bodies and long streams, on both clients, on the fake clock.

A backend's body here is a byte stream that advances the harness's ``FakeClock`` as it
goes (``_Slow``): status and headers at once, then one piece every ``step`` seconds,
as a trickling server sends them. Nothing sleeps: the clients must notice, from their
clock, that the time is up. (The socket-level bounds, which need real time, are in
``test_slow_backends``.)
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from tests.client.client_harness import Harness

import herdless
from herdless.events import AttemptFailed, CallFailed, CallFinished
from herdless.testing import FakeClock

_ANSWER = json.dumps(
    {
        "id": "c",
        "model": "gemma",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
).encode()


class _Slow(httpx.SyncByteStream, httpx.AsyncByteStream):
    """``pieces``, one every ``step`` seconds of the fake clock."""

    def __init__(self, clock: FakeClock, pieces: list[bytes], step: float) -> None:
        self._clock = clock
        self._pieces = pieces
        self._step = step

    def __iter__(self) -> Iterator[bytes]:
        for piece in self._pieces:
            self._clock.advance(self._step)
            yield piece

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for piece in self:
            yield piece


def _trickle(harness: Harness, step: float = 0.05) -> Any:
    def reply(request: httpx.Request) -> httpx.Response:
        pieces = [bytes([b]) for b in _ANSWER]  # one byte each
        return httpx.Response(
            200,
            headers={"content-type": "application/json"},
            stream=_Slow(harness.clock, pieces, step),
        )

    return reply


def _chunk(text: str, finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
    return f"data: {json.dumps({'id': 's', 'model': 'gemma', 'choices': [choice]})}\n\n".encode()


def _slow_stream(harness: Harness, chunks: int, step: float) -> Any:
    def reply(request: httpx.Request) -> httpx.Response:
        pieces = [_chunk(f"w{i} ") for i in range(chunks)]
        pieces += [_chunk("", "stop"), b"data: [DONE]\n\n"]
        return httpx.Response(
            200,
            headers={"content-type": "text/event-stream"},
            stream=_Slow(harness.clock, pieces, step),
        )

    return reply


async def test_a_trickling_body_ends_at_the_deadline(harness: Harness) -> None:
    harness.primary.script(_trickle(harness))
    start = harness.clock.monotonic()
    with pytest.raises((herdless.APITimeoutError, herdless.DeadlineExceeded)):
        await harness.chat(deadline=3.0)
    # ~190 bytes at 50 ms each would take 9.5 s; the call ends one piece past its deadline.
    assert harness.clock.monotonic() - start <= 3.0 + 0.05 + 1e-9
    failed = [e for e in harness.events if isinstance(e, AttemptFailed)]
    assert failed[0].kind == "first_byte_timeout"
    assert "too slowly" in failed[0].message


async def test_a_trickling_primary_leaves_the_fallback_its_reserve(harness: Harness) -> None:
    harness.primary.script(_trickle(harness))
    harness.build(fallback=harness.hosted_backend())
    start = harness.clock.monotonic()
    result = await harness.chat(deadline=3.0)
    assert result.backend == "hosted"
    assert result.fallback_reason == "timeout"
    # The primary may use the deadline less the reserve kept for the fallback (40 %).
    assert result.attempts[0].elapsed <= 1.8 + 0.05 + 1e-9
    assert harness.clock.monotonic() - start <= 3.0


async def test_a_body_that_is_merely_slow_to_start_still_counts(harness: Harness) -> None:
    harness.primary.script(_trickle(harness, step=0.001))  # 0.19 s in all: in time
    result = await harness.chat(deadline=3.0)
    assert result.content == "hi"


async def test_a_stream_passing_its_stream_deadline_is_closed(harness: Harness) -> None:
    harness.primary.script(_slow_stream(harness, chunks=200, step=0.25))  # exact in binary
    stream = await harness.chat(stream=True, deadline=3.0, stream_deadline=6.0)
    received: list[str] = []

    async def read() -> None:
        if harness.kind == "sync":
            with stream:
                received.extend(chunk.content for chunk in stream)
        else:
            async with stream:
                async for chunk in stream:
                    received.append(chunk.content)

    with pytest.raises(herdless.StreamDeadlineExceeded) as caught:
        await read()
    error = caught.value
    assert isinstance(error, herdless.StreamInterrupted)
    assert isinstance(error, herdless.DeadlineExceeded)
    assert error.deadline == 6.0
    # One chunk per 0.25 s: the 24th at 6.0 is in time, the 25th past it is not delivered.
    assert len(received) == 24
    assert error.delivered_chunks == 24
    assert harness.clock.monotonic() == 1000.0 + 6.0  # nothing read once the time was up
    # The caller's limit, not the backend's failure: served, breaker untouched.
    stats = harness.client.stats()
    assert (stats.succeeded, stats.failed) == (1, 0)
    assert stats.breakers == {"primary": "closed"}
    assert any(isinstance(e, CallFinished) for e in harness.events)
    assert not any(isinstance(e, CallFailed) for e in harness.events)


async def test_without_a_stream_deadline_a_long_stream_runs_to_its_end(harness: Harness) -> None:
    harness.primary.script(_slow_stream(harness, chunks=200, step=0.3))
    _, chunks = await harness.stream(deadline=3.0)
    assert len([c for c in chunks if c.content]) == 200  # 60 s of fake time, then [DONE]


async def test_the_clients_stream_deadline_is_the_default(harness: Harness) -> None:
    harness.primary.script(_slow_stream(harness, chunks=50, step=0.3))
    harness.build(stream_deadline=1.0)
    with pytest.raises(herdless.StreamDeadlineExceeded):
        await harness.stream()
    harness.primary.script(_slow_stream(harness, chunks=5, step=0.3))
    _, chunks = await harness.stream(stream_deadline=10.0)  # a call's own wins
    assert len([c for c in chunks if c.content]) == 5


async def test_the_first_chunk_cannot_wait_past_the_stream_deadline(harness: Harness) -> None:
    harness.primary.script(_slow_stream(harness, chunks=2, step=0.1))
    await harness.stream(deadline=60.0, stream_deadline=2.5)
    # The attempt is told it has 2.5 s for its first chunk, not the call's 60.
    assert harness.primary.requests[0].headers["x-herdless-deadline-ms"] == "2500"


async def test_a_stream_deadline_must_be_positive(harness: Harness) -> None:
    with pytest.raises(ValueError, match="stream_deadline"):
        await harness.chat(stream=True, stream_deadline=0)
    with pytest.raises(ValueError, match="stream_deadline"):
        harness.build(stream_deadline=-1.0)
