"""Streamed answers: ``chat(stream=True)`` returns a ``Stream`` (``AsyncStream``).

The bookkeeping (decoding, what reached the caller, usage, how the stream ended, the
``StreamInterrupted`` error) lives once in ``_StreamState``; the two wrappers only pull
bytes with ``for`` or ``async for``. A stream is accepted at its first event, so from
then on a failure cannot be retried without the caller seeing text twice: it raises
``StreamInterrupted``, which says how much was delivered, and the flow's breaker and
stats hear about it through ``CallFlow.stream_ended``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Generator, Iterator
from typing import TYPE_CHECKING, Final

import httpx

from herdless._types import AttemptRecord, Chunk, Usage
from herdless._wire import DONE, parse_chunk
from herdless.errors import StreamInterrupted

if TYPE_CHECKING:
    from typing import Self

    from herdless._actions import Accepted
    from herdless._flow import CallFlow
    from herdless._transport import OpenStream
    from herdless.events import Event

__all__ = ["AsyncStream", "Stream"]

# What a broken stream raises while being read: transport errors, and ValueError from a
# garbled or error event.
_BREAKS: Final = (httpx.HTTPError, ValueError)


class _StreamState:
    """One stream's decoding and accounting, shared by both wrappers."""

    __slots__ = (
        "accepted",
        "delivered_chars",
        "delivered_chunks",
        "done",
        "finish_reason",
        "flow",
        "model",
        "opened",
        "reported",
        "request_id",
        "usage",
    )

    def __init__(self, flow: CallFlow, accepted: Accepted, request_id: str) -> None:
        self.flow = flow
        self.accepted = accepted
        self.opened: OpenStream = accepted.response.stream
        self.request_id = request_id
        self.delivered_chunks = 0
        self.delivered_chars = 0
        self.usage: Usage | None = None
        self.finish_reason: str | None = None
        self.model: str | None = None
        self.done = False  # [DONE] seen
        self.reported = False  # the flow heard how the stream ended

    def chunks(self, events: list[str], first: Chunk | None = None) -> list[Chunk]:
        """Decode events into chunks, counting what goes to the caller; ``first`` is
        ``events[0]`` already decoded.

        Raises:
            ValueError: an event is not a chunk (vLLM's in-stream ``{"error": ...}``).
        """
        chunks = []
        for index, data in enumerate(events):
            if data == DONE:
                self.done = True
                break
            chunk = first if index == 0 and first is not None else parse_chunk(data)
            if chunk.content:
                self.delivered_chunks += 1
                self.delivered_chars += len(chunk.content)
            if chunk.usage is not None:
                self.usage = chunk.usage
            if chunk.finish_reason:
                self.finish_reason = chunk.finish_reason
            if self.model is None:
                model = chunk.raw.get("model")
                self.model = model if isinstance(model, str) else None
            chunks.append(chunk)
        return chunks

    def first(self) -> list[Chunk]:
        """The chunks of the events read before the call was accepted."""
        opened = self.opened
        events, opened.events = opened.events, []
        return self.chunks(events, opened.first)

    def feed(self, raw: bytes) -> list[Chunk]:
        """Decode one piece of the body (nothing after ``[DONE]``)."""
        return [] if self.done else self.chunks(self.opened.decoder.feed(raw))

    def tail(self) -> list[Chunk]:
        """The body ended: the chunks of an event the server left unterminated."""
        return [] if self.done else self.chunks(self.opened.decoder.flush())

    def complete(self) -> None:
        """The body ended: check that the stream did, and tell the flow.

        Raises:
            StreamInterrupted: neither ``[DONE]`` nor a finish reason arrived.
        """
        if not (self.done or self.finish_reason):
            raise self.interrupted("the connection closed before the stream's end")
        self._report(ok=True)

    def _report(self, *, ok: bool, message: str = "") -> None:
        if not self.reported:  # once, however the stream ends
            self.reported = True
            self.flow.stream_ended(ok=ok, message=message)

    def interrupted(self, message: str) -> StreamInterrupted:
        """Report the cut to the flow and build the caller's error."""
        self._report(ok=False, message=message)
        backend = self.accepted.backend.name
        record = AttemptRecord(backend=backend, attempt=len(self.attempts), kind="stream_cut")
        return StreamInterrupted(
            f"The stream from {backend} broke after {self.delivered_chunks} chunks "
            f"({self.delivered_chars} characters) reached you: {message}. What you received "
            "is a prefix of the answer; call again to get a whole one.",
            delivered_chunks=self.delivered_chunks,
            delivered_chars=self.delivered_chars,
            request_id=self.request_id,
            attempts=(*self.attempts, record),
            backend=backend,
        )

    def abandoned(self) -> None:
        """The caller closed the stream (early, or after its end): not a backend failure."""
        self._report(ok=True)

    @property
    def attempts(self) -> tuple[AttemptRecord, ...]:
        return self.accepted.attempts


class _StreamBase:
    """Fields and accessors both wrappers share."""

    __slots__ = ("_state",)

    def __init__(self, state: _StreamState) -> None:
        self._state = state

    @property
    def backend(self) -> str:
        """The name of the backend that answers."""
        return self._state.accepted.backend.name

    @property
    def request_id(self) -> str:
        """The call's id, sent as ``X-Request-ID``."""
        return self._state.request_id

    @property
    def attempts(self) -> tuple[AttemptRecord, ...]:
        """The attempts that led to this stream, oldest first."""
        return self._state.attempts

    @property
    def fallback_reason(self) -> str | None:
        """Why a fallback answers; ``None`` when the primary does."""
        return self._state.accepted.fallback_reason

    @property
    def usage(self) -> Usage | None:
        """Token counts, once the server's usage chunk arrived (at the end)."""
        return self._state.usage

    @property
    def finish_reason(self) -> str | None:
        """``"stop"``, ``"length"``, ...; once the last chunk arrived."""
        return self._state.finish_reason

    @property
    def model(self) -> str | None:
        """The model the server says answers."""
        return self._state.model

    def __repr__(self) -> str:
        return f"<{type(self).__name__} backend={self.backend!r} request_id={self.request_id!r}>"


class Stream(_StreamBase):
    """The chunks of a streamed answer; iterate it, inside ``with`` to close the connection.

    >>> with client.chat(messages, stream=True) as stream:  # doctest: +SKIP
    ...     for chunk in stream:
    ...         print(chunk.content, end="")
    ...     print(stream.usage)

    Raises (while iterating):
        StreamInterrupted: the stream broke after chunks reached you.
    """

    __slots__ = ("_dispatch", "_iterator")

    def __init__(self, state: _StreamState, dispatch: Callable[[list[Event]], None]) -> None:
        super().__init__(state)
        self._dispatch = dispatch
        self._iterator = self._chunks()

    def _chunks(self) -> Generator[Chunk, None, None]:
        state = self._state
        try:
            yield from state.first()
            for raw in state.opened.raw:
                yield from state.feed(raw)
                if state.done:
                    break
            yield from state.tail()
            state.complete()
        except _BREAKS as exc:
            raise state.interrupted(str(exc) or type(exc).__name__) from exc
        finally:
            self.close()

    def __iter__(self) -> Iterator[Chunk]:
        return self._iterator

    def __next__(self) -> Chunk:
        return next(self._iterator)

    def close(self) -> None:
        """Close the connection (idempotent). Reading stops here."""
        self._state.abandoned()
        self._state.opened.response.close()
        self._dispatch(self._state.flow.take_events())

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._iterator.close()
        self.close()


class AsyncStream(_StreamBase):
    """The chunks of a streamed answer; ``async for`` it, inside ``async with`` to close
    the connection. See ``Stream``."""

    __slots__ = ("_dispatch", "_iterator")

    def __init__(
        self, state: _StreamState, dispatch: Callable[[list[Event]], Awaitable[None]]
    ) -> None:
        super().__init__(state)
        self._dispatch = dispatch
        self._iterator = self._chunks()

    async def _chunks(self) -> AsyncGenerator[Chunk, None]:
        state = self._state
        try:
            for chunk in state.first():
                yield chunk
            raw, idle = state.opened.raw, state.opened.idle
            while not state.done:
                try:
                    if idle is None:  # the socket's read timeout is the limit
                        data = await anext(raw)
                    else:  # Timeouts.read, shorter than the socket's
                        async with asyncio.timeout(idle):
                            data = await anext(raw)
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    raise httpx.ReadTimeout(f"no chunk within {idle:g} s") from None
                for chunk in state.feed(data):
                    yield chunk
            for chunk in state.tail():
                yield chunk
            state.complete()
        except _BREAKS as exc:
            raise state.interrupted(str(exc) or type(exc).__name__) from exc
        finally:
            await self.aclose()

    def __aiter__(self) -> AsyncIterator[Chunk]:
        return self._iterator

    async def __anext__(self) -> Chunk:
        return await anext(self._iterator)

    async def aclose(self) -> None:
        """Close the connection (idempotent). Reading stops here."""
        self._state.abandoned()
        await self._state.opened.response.aclose()
        await self._dispatch(self._state.flow.take_events())

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._iterator.aclose()
        await self.aclose()
