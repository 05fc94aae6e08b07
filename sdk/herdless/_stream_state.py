"""One accepted stream's bookkeeping, shared by ``Stream`` and ``AsyncStream``.

``StreamState`` decodes the body's pieces into chunks, counts what reached the caller,
joins tool-call pieces, keeps the usage and finish reason, says how long the next read
may wait (``Timeouts.read``, and what is left of ``stream_deadline``), builds the errors
a broken or late stream raises, and tells the flow how the stream ended
(``CallFlow.stream_ended``), once. See ``herdless._stream`` for the rules.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx

from herdless._call.record import response_received
from herdless._types import AttemptRecord, Chunk, FunctionCall, ToolCall, ToolCallDelta, Usage
from herdless._wire import DONE, parse_chunk
from herdless.errors import HerdlessError, StreamDeadlineExceeded, StreamInterrupted

if TYPE_CHECKING:
    from herdless._actions import Accepted
    from herdless._call.flow import CallFlow
    from herdless._outcomes import OpenStream
    from herdless._sockets import AttemptLimit

__all__ = ["StreamState"]


class StreamState:
    """One stream's decoding, accounting and time, shared by both wrappers.

    Args:
        flow: the call's flow (told how the stream ends).
        accepted: the flow's result, which carries the open stream.
        request_id: the call's id.
        stream_deadline: seconds from the call's start to the stream's end (``None``: no
            total limit).
        limit: the sync driver's per-thread socket limit, when its HTTP client has one.
    """

    __slots__ = (
        "_calls",
        "accepted",
        "by_total",
        "delivered_chars",
        "delivered_chunks",
        "done",
        "end",
        "finish_reason",
        "flow",
        "limit",
        "model",
        "opened",
        "reported",
        "request_id",
        "response_id",
        "stream_deadline",
        "usage",
    )

    def __init__(
        self,
        flow: CallFlow,
        accepted: Accepted,
        request_id: str,
        *,
        stream_deadline: float | None = None,
        limit: AttemptLimit | None = None,
    ) -> None:
        self.flow = flow
        self.accepted = accepted
        self.opened: OpenStream = accepted.response.opened
        self.request_id = request_id
        self.delivered_chunks = 0
        self.delivered_chars = 0
        self.usage: Usage | None = None
        self.finish_reason: str | None = None
        self.model: str | None = None
        self.response_id: str | None = None
        self.done = False  # [DONE] seen
        self.reported = False  # the flow heard how the stream ended
        self.stream_deadline = stream_deadline
        # When the stream must end, on the flow's clock (None: no total limit).
        self.end = None if stream_deadline is None else flow.start + stream_deadline
        self.limit = limit
        self.by_total = False  # the pending read's limit is what is left of stream_deadline
        # Tool calls by index: [id, type, name, pieces of the arguments].
        self._calls: dict[int, list[Any]] = {}

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
            if chunk.tool_calls:
                self._join(chunk.tool_calls)
            if self.model is None:
                model = chunk.raw.get("model")
                self.model = model if isinstance(model, str) else None
                ident = chunk.raw.get("id")
                self.response_id = ident if isinstance(ident, str) else None
            chunks.append(chunk)
        return chunks

    def _join(self, deltas: tuple[ToolCallDelta, ...]) -> None:
        for delta in deltas:
            call = self._calls.setdefault(delta.index, [None, None, None, []])
            call[0] = call[0] or delta.id
            call[1] = call[1] or delta.type
            if delta.function is not None:
                call[2] = call[2] or delta.function.name
                if delta.function.arguments:
                    call[3].append(delta.function.arguments)

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        """The tool calls streamed so far, their pieces joined, in index order."""
        return tuple(
            ToolCall(
                id=ident or "",
                type=kind or "function",
                function=FunctionCall(name=name or "", arguments="".join(pieces)),
            )
            for _, (ident, kind, name, pieces) in sorted(self._calls.items())
        )

    def wait(self) -> float | None:
        """Seconds the next read may wait: the idle limit (``None``: the socket's), or
        less, what is left of ``stream_deadline``.

        Raises:
            StreamDeadlineExceeded: nothing is left of it.
        """
        idle = self.opened.idle
        if self.end is None:
            return idle
        left = self.end - self.flow.state.clock.monotonic()
        if left <= 0:
            raise self.deadline_exceeded()
        self.by_total = idle is None or left <= idle
        return left if self.by_total else idle

    def arrived(self) -> None:
        """A piece of the body arrived: past ``stream_deadline`` it is not delivered (a
        read is bounded by what is left of it, so only a clock that jumped gets here).

        Raises:
            StreamDeadlineExceeded: the piece came too late.
        """
        if self.end is not None and self.flow.state.clock.monotonic() > self.end:
            raise self.deadline_exceeded()

    def read(self, raw: Iterator[bytes]) -> bytes | None:
        """The sync driver's next piece of the body (``None`` at its end), its socket
        waits clipped to ``wait()`` when the HTTP client is the driver's own.

        Raises:
            StreamDeadlineExceeded: nothing is left of ``stream_deadline``.
        """
        wait = self.wait()
        limit = self.limit
        if limit is None or wait is None:
            return next(raw, None)
        limit.end = time.monotonic() + wait
        try:
            return next(raw, None)
        finally:
            limit.end = math.inf  # never past this read: the caller's code runs next

    def broken(self, exc: Exception) -> HerdlessError:
        """The error for a stream that broke while being read with ``exc``."""
        if self.by_total and isinstance(exc, httpx.TimeoutException):
            return self.deadline_exceeded()
        return self.interrupted(str(exc) or type(exc).__name__)

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
            if ok:
                response_received(
                    self.flow,
                    self.accepted.backend,
                    usage=self.usage,
                    model=self.model,
                    finish_reason=self.finish_reason,
                    response_id=self.response_id,
                )
            self.flow.stream_ended(ok=ok, message=message)

    def deadline_exceeded(self) -> StreamDeadlineExceeded:
        """Close the books on a stream past its ``stream_deadline`` (the caller's limit:
        served, like a stream the caller closes), and build the caller's error."""
        self._report(ok=True)
        backend = self.accepted.backend.name
        limit = self.stream_deadline
        return StreamDeadlineExceeded(
            f"The stream from {backend} passed its stream_deadline of {limit:g} s after "
            f"{self.delivered_chunks} chunks ({self.delivered_chars} characters) reached "
            "you, and was closed. What you received is a prefix of the answer; raise "
            "stream_deadline (or set none) for longer answers.",
            delivered_chunks=self.delivered_chunks,
            delivered_chars=self.delivered_chars,
            deadline=limit,
            request_id=self.request_id,
            attempts=self.attempts,
            backend=backend,
        )

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
