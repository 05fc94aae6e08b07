"""``chat(stream=True)`` on both clients: chunks, usage, retries before the first chunk,
``StreamInterrupted`` after it, and closing the connection."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from tests.client.client_harness import Harness

import herdless
from herdless.testing import hang, ok, rate_limited, stream
from herdless.testing.mock import _SSE


def _events(*payloads: bytes) -> Any:
    """A reply streaming raw SSE ``payloads`` (for framings the mock does not make)."""

    def reply(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=_SSE(list(payloads), None))

    return reply


async def test_stream_yields_deltas_and_captures_usage(harness: Harness) -> None:
    harness.primary.script(stream(["Hel", "lo", "!"]))
    result, chunks = await harness.stream()
    assert "".join(c.content for c in chunks) == "Hello!"
    assert result.usage == herdless.Usage(prompt_tokens=1, completion_tokens=3, total_tokens=4)
    assert result.finish_reason == "stop"
    assert result.backend == "primary"
    assert result.model == "gemma"
    body = harness.primary.bodies[0]
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert harness.primary.requests[0].headers["accept"] == "text/event-stream"
    assert harness.client.stats().succeeded == 1


async def test_failures_before_the_first_chunk_are_retried(harness: Harness) -> None:
    harness.primary.script(rate_limited(1.0), stream(["a"], cut_after=0), stream(["ok"]))
    result, chunks = await harness.stream()
    assert "".join(c.content for c in chunks) == "ok"
    assert [a.kind for a in result.attempts] == ["status", "read", "ok"]
    assert len(harness.primary.requests) == 3


async def test_a_hung_stream_falls_back_before_any_chunk(harness: Harness) -> None:
    harness.primary.script(hang())
    harness.hosted.script(stream(["from hosted"]))
    harness.build(fallback=harness.hosted_backend())
    result, chunks = await harness.stream()
    assert result.backend == "hosted"
    assert result.fallback_reason == "timeout"
    assert "".join(c.content for c in chunks) == "from hosted"


async def test_a_cut_after_chunks_reached_the_caller_raises_stream_interrupted(
    harness: Harness,
) -> None:
    # Events: role, "one", " two", then the connection breaks.
    harness.primary.script(stream(["one", " two", " three"], cut_after=3))
    received: list[str] = []
    result = await harness.chat(stream=True)

    async def read() -> None:
        if harness.kind == "sync":
            with result:
                received.extend(c.content for c in result)
        else:
            async with result:
                async for chunk in result:
                    received.append(chunk.content)

    with pytest.raises(herdless.StreamInterrupted) as caught:
        await read()
    error = caught.value
    assert "".join(received) == "one two"
    assert (error.delivered_chunks, error.delivered_chars) == (2, 7)
    assert error.request_id == result.request_id
    assert error.attempts[-1].kind == "stream_cut"
    assert isinstance(error.__cause__, httpx.RemoteProtocolError)
    assert len(harness.primary.requests) == 1  # never retried once text was delivered
    stats = harness.client.stats()
    assert stats.failed == 1
    assert stats.by_backend["primary"]["stream_cut"] == 1


async def test_a_stream_that_ends_without_finishing_is_interrupted(harness: Harness) -> None:
    harness.primary.script(_events(b'data: {"choices":[{"delta":{"content":"half"}}]}\n\n'))
    with pytest.raises(herdless.StreamInterrupted) as caught:
        await harness.stream()
    assert caught.value.delivered_chars == 4


async def test_an_error_event_before_any_chunk_is_a_failed_attempt(harness: Harness) -> None:
    harness.primary.script(_events(b'data: {"error":{"message":"engine dead"}}\n\n'))
    harness.hosted.script(stream(["fine"]))
    harness.build(fallback=harness.hosted_backend())
    result, _ = await harness.stream()
    assert result.backend == "hosted"
    assert result.attempts[0].kind == "protocol"


async def test_vllm_framing_and_crlf(harness: Harness) -> None:
    harness.primary.script(
        _events(
            b': ping\r\n\r\ndata: {"choices":[{"delta":{"content":"x\xe2\x80\xa8y"}}]}\r\n\r\n',
            b'data: {"choices":[{"delta":{"content":""},"finish_reason":"stop"}]}\r\n\r\n',
            b"data: [DONE]\r\n\r\n",
            b'data: {"ignored": "after done"}\n\n',
        )
    )
    result, chunks = await harness.stream()
    assert [c.content for c in chunks] == ["x\u2028y", ""]
    assert result.finish_reason == "stop"
    assert result.usage is None  # this server sent none


async def test_leaving_early_closes_the_stream_without_error(harness: Harness) -> None:
    harness.primary.script(stream(["a", "b", "c"]))
    result = await harness.chat(stream=True)
    if harness.kind == "sync":
        with result:
            first = next(iter(result))
    else:
        async with result:
            first = await anext(aiter(result))
    assert first.content == ""  # the role chunk
    stats = harness.client.stats()
    assert stats.failed == 0
    assert stats.succeeded == 1


async def test_non_streaming_still_works_after_a_stream(harness: Harness) -> None:
    harness.primary.script(stream(["a"]), ok("b"))
    await harness.stream()
    assert (await harness.chat()).content == "b"


async def test_an_unterminated_last_event_still_reaches_the_caller(harness: Harness) -> None:
    harness.primary.script(
        _events(
            b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n',
            b'data: {"choices":[{"delta":{"content":"b"},"finish_reason":"stop"}]}',
        )
    )
    result, chunks = await harness.stream()
    assert [c.content for c in chunks] == ["a", "b"]
    assert result.finish_reason == "stop"


async def test_closing_after_the_last_chunk_finishes_the_call_once(harness: Harness) -> None:
    harness.primary.script(stream(["a"]))
    result = await harness.chat(stream=True)
    # Read up to the usage chunk, then close before the iterator sees the end.
    if harness.kind == "sync":
        with result:
            for chunk in result:
                if chunk.usage is not None:
                    break
    else:
        async with result:
            async for chunk in result:
                if chunk.usage is not None:
                    break
    stats = harness.client.stats()
    assert (stats.succeeded, stats.failed) == (1, 0)
    finished = [e for e in harness.events if type(e).__name__ == "CallFinished"]
    assert len(finished) == 1
