"""What an attempt came to, as the flow's outcome: an answer read, or an error mapped.

The drivers perform a ``Send`` with httpx; what they read or what httpx raised becomes,
here, once for both, the outcome the flow judges: ``accept`` (an answer, a 2xx body
decoded so that garbage is a failed attempt), ``OpenStream`` (an accepted stream up to
its first event), ``failure`` (an httpx exception, or a body that is not the wire
format, as a ``TransportFailure`` of the right kind). ``ERROR_BODY_CAP`` bounds what an
error body may cost to read; ``stream_waits`` sets a stream's body timeouts.

httpcore reads a body with one socket timeout, taken from the request's ``timeout``
extension when the body starts (``_receive_response_body``), so the first event and
the gaps after it share it, and it bounds each read, not their sum: a server that sends
one byte every 50 ms never trips it. ``stream_waits`` sets it to the larger of
``first_byte`` and ``read``; the async driver bounds the whole attempt with a loop timer
and a stream's gaps with ``asyncio.timeout``; the sync driver bounds its own sockets
(``herdless._sockets``). Both drivers also check their clock between the pieces of a
body, which is all they can do with an HTTP client the user gave them.
"""

from __future__ import annotations

import math
from typing import Any, Final

import httpx

from herdless._actions import Response, TransportFailure, TransportFailureKind
from herdless._backend import Timeouts
from herdless._clock import Clock
from herdless._types import Chunk
from herdless._wire import DONE, SSEDecoder, parse_chunk, parse_completion

__all__ = ["ERROR_BODY_CAP", "Body", "OpenStream", "accept", "failure", "stream_waits", "too_slow"]

# An error body is read for its message only; a proxy's HTML page can be large.
ERROR_BODY_CAP: Final = 64 * 1024


def _kind(exc: BaseException) -> TransportFailureKind:
    # Most specific first: the timeouts are TransportErrors too.
    if isinstance(exc, httpx.ReadTimeout):
        return "first_byte_timeout"  # only reads before acceptance happen inside a Send
    if isinstance(exc, httpx.TimeoutException):  # connect, pool, write: nothing was processed
        return "connect_timeout"
    if isinstance(exc, httpx.ConnectError | httpx.WriteError):
        return "connect"
    if isinstance(exc, httpx.ReadError | httpx.RemoteProtocolError | _Ended):
        return "read"  # the server went away mid-answer, or before a stream's first event
    if isinstance(exc, httpx.ProtocolError | httpx.DecodingError | ValueError):
        return "protocol"  # not HTTP, or not the wire format
    return "connect"  # any other transport error (a proxy's, say): nothing was processed


_Ended = StopIteration | StopAsyncIteration


def failure(exc: BaseException, *, elapsed: float) -> TransportFailure:
    """The ``TransportFailure`` for an exception raised while performing a ``Send``.

    ``exc`` is an ``httpx.RequestError``, a ``ValueError`` from decoding the answer, or
    ``StopIteration`` / ``StopAsyncIteration`` for a stream that ended before its first
    event. The message is the exception's text (httpx never puts headers, so never the
    API key, into it).
    """
    if isinstance(exc, _Ended):
        message = "the stream ended before its first event"
    else:
        message = str(exc) or type(exc).__name__
    return TransportFailure(kind=_kind(exc), message=message, elapsed=elapsed)


def accept(response: httpx.Response, body: bytes, *, stream: bool, elapsed: float) -> Response:
    """The ``Response`` outcome for a read answer.

    A 2xx non-streaming body is decoded here, so that a garbled answer is a failed
    attempt the flow can retry elsewhere, not an error after the call was accepted; the
    decoded ``Completion`` travels in ``Response.completion``.

    Raises:
        ValueError: a 2xx non-streaming body is not a chat completion.
    """
    decoded = parse_completion(body) if response.is_success and not stream else None
    return Response(
        status=response.status_code,
        headers=response.headers,
        body=body,
        elapsed=elapsed,
        completion=decoded,
    )


def too_slow(what: str) -> httpx.ReadTimeout:
    """The error for ``what`` (an answer, a stream's first event) that arrived in pieces
    past the attempt's time: ``failure`` makes it a ``first_byte_timeout``."""
    return httpx.ReadTimeout(f"{what} arrived too slowly: the attempt's time ran out")


class Body:
    """A whole answer's body, which the driver reads piece by piece, not with ``read()``:
    a body that trickles in must not outlast the attempt (each socket read alone is
    bounded, not their sum). An error body is read up to ``ERROR_BODY_CAP``, for its
    message only.

    Args:
        response: the answer whose body this is.
        clock: the client's clock.
        end: the clock's time at which the attempt's time runs out.
    """

    __slots__ = ("_cap", "_clock", "_end", "_parts", "_size")

    def __init__(self, response: httpx.Response, clock: Clock, end: float) -> None:
        self._cap = math.inf if response.is_success else ERROR_BODY_CAP
        self._clock = clock
        self._end = end
        self._parts: list[bytes] = []
        self._size = 0

    def add(self, part: bytes) -> bool:
        """Keep ``part``; return whether enough was read (an error body past its cap).

        Raises:
            httpx.ReadTimeout: the attempt's time ran out (``too_slow``).
        """
        self._parts.append(part)
        self._size += len(part)
        if self._size > self._cap:
            return True
        if self._clock.monotonic() > self._end:
            raise too_slow("the answer")
        return False

    def outcome(self, response: httpx.Response, *, stream: bool, elapsed: float) -> Response:
        """The read answer as the flow's outcome (``accept``).

        Raises:
            ValueError: a 2xx non-streaming body is not a chat completion.
        """
        return accept(response, b"".join(self._parts), stream=stream, elapsed=elapsed)


def stream_waits(response: httpx.Response, limits: Timeouts) -> tuple[float | None, float | None]:
    """For the async driver, before a stream's body is read: set the body's socket read
    timeout to ``max(first_byte, read)`` and return the waits to bound on top of it,
    ``(first event, each later chunk)``; ``None`` where the socket's timeout is the one."""
    ceiling = max(limits.first_byte, limits.read)
    response.request.extensions["timeout"]["read"] = ceiling
    return (
        limits.first_byte if limits.first_byte < ceiling else None,
        limits.read if limits.read < ceiling else None,
    )


class OpenStream:
    """An accepted stream: the httpx response, its byte iterator and what was decoded.

    The driver feeds chunks to ``feed`` until ``events`` is not empty (the first event,
    validated: an error event before any chunk is a failed attempt, not a cut stream).
    """

    __slots__ = ("decoder", "events", "first", "idle", "raw", "response")

    def __init__(self, response: httpx.Response, raw: Any, *, idle: float | None = None) -> None:
        self.response = response
        self.raw = raw  # the Iterator / AsyncIterator of body bytes, resumed by the Stream
        self.idle = idle  # seconds the async Stream allows between chunks (None: the socket's)
        self.decoder = SSEDecoder()
        self.events: list[str] = []
        self.first: Chunk | None = None  # events[0] decoded (None for [DONE])

    def feed(self, chunk: bytes) -> bool:
        """Decode ``chunk``; return whether the first event is in.

        Raises:
            ValueError: the first event is not a chunk (e.g. ``{"error": ...}``).
        """
        self.events += self.decoder.feed(chunk)
        if self.events and self.events[0] != DONE:
            self.first = parse_chunk(self.events[0])
        return bool(self.events)

    def outcome(self, *, elapsed: float) -> Response:
        """The accepted ``Response`` that carries this open stream."""
        return Response(
            status=self.response.status_code,
            headers=self.response.headers,
            body=b"",
            elapsed=elapsed,
            opened=self,
        )
