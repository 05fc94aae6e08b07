"""Streamed answers: ``chat(stream=True)`` returns a ``Stream`` (``AsyncStream``).

The bookkeeping (decoding, what reached the caller, usage, tool calls, how the stream
ended, the time it may still take, the errors) lives once in ``StreamState``
(``herdless._stream_state``); the two wrappers here only pull bytes with ``for`` or
``async for``. A stream is accepted at its
first event, so from then on a failure cannot be retried without the caller seeing text
twice: it raises ``StreamInterrupted``, which says how much was delivered, and the
flow's breaker and stats hear about it through ``CallFlow.stream_ended``.

**Time.** The call's ``deadline`` bounds the wait for the first chunk (the call is
accepted then). After it, ``Timeouts.read`` bounds each silence between two chunks, and
``stream_deadline`` (optional, seconds from the call's start) the whole stream: past
it the stream is closed and ``StreamDeadlineExceeded`` raised. That is the caller's
limit, not a backend failure: like a stream the caller closes early, it counts as
served and leaves the breaker alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Generator, Iterator
from typing import TYPE_CHECKING, Final

import httpx

from herdless._types import AttemptRecord, Chunk, ToolCall, Usage

if TYPE_CHECKING:
    from typing import Self

    from herdless._stream_state import StreamState
    from herdless.events import Event

__all__ = ["AsyncStream", "Stream"]

# What a broken stream raises while being read: transport errors, and ValueError from a
# garbled or error event.
_BREAKS: Final = (httpx.HTTPError, ValueError)


class _StreamBase:
    """Fields and accessors both wrappers share."""

    __slots__ = ("_state",)

    def __init__(self, state: StreamState) -> None:
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

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        """The tool calls streamed so far, their pieces joined (whole once the stream ended
        with ``finish_reason == "tool_calls"``)."""
        return self._state.tool_calls

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
        StreamDeadlineExceeded: the stream passed its ``stream_deadline``.
    """

    __slots__ = ("_dispatch", "_iterator")

    def __init__(self, state: StreamState, dispatch: Callable[[list[Event]], None]) -> None:
        super().__init__(state)
        self._dispatch = dispatch
        self._iterator = self._chunks()

    def _chunks(self) -> Generator[Chunk, None, None]:
        state = self._state
        try:
            yield from state.first()
            raw = state.opened.raw
            if state.end is None and (state.limit is None or state.opened.idle is None):
                # No limit of the driver's own on a read: the socket's timeout is the one
                # (the common case, and the per-chunk path of every stream: kept bare).
                for data in raw:
                    yield from state.feed(data)
                    if state.done:
                        break
            else:
                while not state.done:
                    data = state.read(raw)
                    if data is None:
                        break
                    state.arrived()
                    yield from state.feed(data)
            yield from state.tail()
            state.complete()
        except _BREAKS as exc:
            raise state.broken(exc) from exc
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
        self, state: StreamState, dispatch: Callable[[list[Event]], Awaitable[None]]
    ) -> None:
        super().__init__(state)
        self._dispatch = dispatch
        self._iterator = self._chunks()

    async def _chunks(self) -> AsyncGenerator[Chunk, None]:
        state = self._state
        try:
            for chunk in state.first():
                yield chunk
            raw = state.opened.raw
            while not state.done:
                wait = state.wait()
                try:
                    if wait is None:  # the socket's read timeout is the limit
                        data = await anext(raw)
                    else:  # Timeouts.read or what is left of stream_deadline, if shorter
                        async with asyncio.timeout(wait):
                            data = await anext(raw)
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    raise httpx.ReadTimeout(f"no chunk within {wait:g} s") from None
                state.arrived()
                for chunk in state.feed(data):
                    yield chunk
            for chunk in state.tail():
                yield chunk
            state.complete()
        except _BREAKS as exc:
            raise state.broken(exc) from exc
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
