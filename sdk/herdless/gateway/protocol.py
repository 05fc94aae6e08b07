"""The gateway's HTTP/1.1 connections: uvicorn's httptools protocol, with limits per client.

``herdless serve`` runs uvicorn with httptools and uvloop (``uvicorn[standard]``).
httptools bounds neither the size of a request head nor the time a client takes
to send it, and it joins the pieces of a header that arrives over many reads
by concatenation, so a large head costs more than its size. uvicorn's h11
implementation has a head size limit but no head timeout, and its protocol
layer costs about five times as much per request (163 vs 34 us, measured with
the protocol alone on a fake transport). This subclass of uvicorn's
``HttpToolsProtocol`` adds, per connection (every limit a setting, see
:class:`~herdless.gateway.connections.ConnectionLimits`):

* **head size** (``max_head_bytes``): the bytes of a request head (blank lines
  before it, request line, header lines) are counted as they arrive, and
  httptools is fed no more than the limit allows: a head still open at the
  limit is answered ``431`` and the connection closed. A head that starts
  inside a read, after a pipelined request's body, is counted from the next
  read on and checked again, exactly, when it is complete: at most one socket
  read (256 KiB) beyond the limit is ever parsed. Trailers and chunk framing of
  a chunked body count the same way: no more than ``max_head_bytes`` may arrive
  between two pieces of body;
* **header count** (``max_headers``): ``431`` once a head holds more header
  lines, checked at every read and when the head is complete;
* **head timeout** (``head_timeout``): from the first byte of a request to the
  end of its head; a client that has not finished by then gets ``408`` and the
  connection is closed. The rest of a body nobody reads (the request was
  answered early, a 413 or a 401) gets the same time from its first byte after
  the answer, then the connection is closed;
* **idle timeout** (``keep_alive_timeout``): a connection with no request under
  way is closed after that long, from its opening (uvicorn arms no timer on a
  new connection) or from its last answer (uvicorn's keep-alive timer). The
  default, 10 s, is longer than the 5 s for which httpx (the herdless SDK, the
  openai client) keeps an idle connection: the client drops it first, so it
  never sends a request on a connection the gateway is closing at that moment
  (uvicorn's 5 s, equal to httpx's, loses such requests now and then);
* **connections per peer** (``max_connections_per_peer``): an address holding
  that many connections has its next ones closed at once; never more than half
  of the process's file descriptors, so that one address cannot take them all.

It also fixes how uvicorn sees a client that pipelines requests and hangs up:
uvicorn marks only the newest request of a connection as disconnected, so the
one running kept writing to a closed transport (uvloop raises on that; asyncio
ignores it) and never heard ``http.disconnect``. Here every unfinished request
of the connection hears it; and a write that uvloop refuses because the peer
reset the connection a moment before ``connection_lost`` runs is dropped like
a write after a disconnect (:class:`_GuardedCycle`), not raised into the app.

Why a subclass: the limits must act before httptools buffers the head, that is
in ``data_received``, which only the protocol sees; the alternatives were h11
(slower on every request, and still no head timeout) or a server in front. The
subclass uses uvicorn's parser callbacks and a few of its attributes
(``cycle``, ``headers``, ``url``, ``timeout_keep_alive_task``), which the
integration tests exercise against the installed uvicorn.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, ClassVar

import httptools
from uvicorn._types import ASGISendEvent
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

from herdless.gateway.connections import ConnectionGuard
from herdless.gateway.wire import error_body

__all__ = ["GuardedHttpToolsProtocol", "guarded_protocol"]

_REQUEST_LINE_ALLOWANCE = 16  # method, spaces and "HTTP/1.1\r\n" of a completed head


class _HeadRefused(Exception):
    """Raised from a parser callback to stop httptools; the refusal is on the protocol."""


class _GuardedCycle(RequestResponseCycle):
    """uvicorn's request cycle, whose ``send`` survives a transport closed under it."""

    async def send(self, message: ASGISendEvent) -> None:
        try:
            await RequestResponseCycle.send(self, message)
        except RuntimeError:
            # The peer reset the connection and connection_lost has not run yet: uvloop
            # raises on the write (asyncio ignores it). The client left; drop what follows.
            if not self.transport.is_closing():
                raise
            self.disconnected = True
            self.message_event.set()


_Base = HttpToolsProtocol  # called by name below: cheaper than super() on every request


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits of :class:`ConnectionLimits`.

    Use :func:`guarded_protocol` to get a class bound to one server's guard.
    """

    guard: ClassVar[ConnectionGuard]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        limits = self.guard.limits
        self.timeout_keep_alive = limits.keep_alive_timeout  # type: ignore[assignment]  # uvicorn's timer takes float seconds
        self._max_head = limits.max_head_bytes
        self._max_headers = limits.max_headers
        # The state of the request head the connection is waiting for.
        self._head_open = True  # waiting for (the rest of) a head
        self._head_bytes = 0  # bytes counted against the open head
        self._head_begun = False  # its request line has started
        self._heads = 0  # heads completed on this connection
        self._head_exact = True  # it began at a read's start: _head_bytes counts all of it
        self._ended_in_read = False  # a request ended inside the read being parsed
        self._framing = 0  # body-state bytes since the last piece of body (chunk framing, trailers)
        self._head_timer: asyncio.TimerHandle | None = None
        self._cycles: deque[RequestResponseCycle] = deque()  # requests not yet answered
        self._peer: str | None = None
        self._refusal: tuple[int, str, str] | None = None
        self._closed_by_guard = False

    # -- connection ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # uvicorn narrows it too
        _Base.connection_made(self, transport)
        peer = self.client[0] if self.client else None
        if peer is not None:
            if not self.guard.admit(peer):
                self._closed_by_guard = True
                self.guard.closed("peer_limit")
                transport.close()
                return
            self._peer = peer
        # uvicorn arms its idle timer only after an answer: a new connection gets one too.
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )

    def connection_lost(self, exc: Exception | None) -> None:
        # uvicorn marks only the newest request (self.cycle) as disconnected; a pipelined
        # one that is running would keep writing to the closed transport and never hear it.
        for cycle in self._cycles:
            if not cycle.response_complete:
                cycle.disconnected = True
                cycle.message_event.set()
        self._cycles.clear()
        self._cancel_head_timer()
        if self._peer is not None:
            self.guard.release(self._peer)
            self._peer = None
        _Base.connection_lost(self, exc)

    def data_received(self, data: bytes) -> None:
        if self._closed_by_guard:
            return  # refused: the connection ends with the answer being written, or already
        self._unset_keepalive_if_required()
        self._ended_in_read = False
        try:
            if self._head_open:
                self._head_bytes += len(data)
                over = self._head_bytes - self._max_head
                if over > 0:
                    # Parse no more than the limit allows: the head ends in it, or is too big.
                    heads = self._heads
                    self.parser.feed_data(data[: len(data) - over])
                    if self._heads == heads:
                        self._refuse_head_size()
                        return
                    if self._stopped():
                        return
                    data = data[len(data) - over :]
            else:
                self._framing += len(data)
                if self.cycle.response_complete and self._head_timer is None:
                    # Answered before its body arrived whole (an early 4xx): nobody reads the
                    # rest, and data keeps uvicorn's idle timer off. The next head's clock runs.
                    self._arm_head_timer()
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # No WebSocket route (``ws="none"``): the request is served as plain HTTP, as
            # uvicorn does; what followed its head in this read is dropped, as uvicorn does.
            pass
        except httptools.HttpParserError:
            self._parse_failed()
            return
        if self._stopped():
            return
        if self._head_open:
            if self._head_begun and len(self.headers) > self._max_headers:
                self._refuse_header_count()
            elif self._head_timer is None and (self._head_bytes or self._head_begun):
                self._arm_head_timer()
        elif self._framing > self._max_head or len(self.headers) > self._max_headers:
            # Chunk framing or trailers and no body: trailers are a second head. Nothing is
            # answered: the request is being answered already, or has been.
            self._refuse(*_head_size_refusal(self._max_head), answer=False)

    def _stopped(self) -> bool:
        """Whether a callback refused the connection during the last parse."""
        return self._closed_by_guard

    def _parse_failed(self) -> None:
        if self._refusal is not None:  # raised by a callback of ours (_HeadRefused)
            self._refuse(*self._refusal)
            return
        msg = "Invalid HTTP request received."  # uvicorn's words and answer
        self.logger.warning(msg)
        self.send_400_response(msg)

    def _arm_head_timer(self) -> None:
        self._head_timer = self.loop.call_later(
            self.guard.limits.head_timeout, self._head_timed_out
        )

    # -- parser callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        _Base.on_message_begin(self)
        self._head_begun = True
        # A request that begins in the read where the previous one ended began mid-read:
        # its bytes before this read's end were not counted.
        self._head_exact = not self._ended_in_read

    def on_headers_complete(self) -> None:
        self._head_open = False
        self._heads += 1
        self._framing = 0
        if self._head_timer is not None:
            self._cancel_head_timer()
        if len(self.headers) > self._max_headers:
            self._refusal = _header_count_refusal(self._max_headers)
            raise _HeadRefused
        if not self._head_exact and _head_size(self.url, self.headers) > self._max_head:
            self._refusal = _head_size_refusal(self._max_head)
            raise _HeadRefused
        previous = self.cycle
        _Base.on_headers_complete(self)
        cycle = self.cycle
        if cycle is not previous:
            # Same class layout: its send now survives a closed transport (_GuardedCycle).
            cycle.__class__ = _GuardedCycle
            cycles = self._cycles
            while cycles and cycles[0].response_complete:
                cycles.popleft()
            cycles.append(cycle)

    def on_body(self, body: bytes) -> None:
        self._framing = 0
        _Base.on_body(self, body)

    def on_message_complete(self) -> None:
        _Base.on_message_complete(self)
        self._head_open = True
        self._head_bytes = 0
        self._head_begun = False
        self._ended_in_read = True

    # -- refusals ------------------------------------------------------------------------

    def _refuse_head_size(self) -> None:
        self._refuse(*_head_size_refusal(self._max_head))

    def _refuse_header_count(self) -> None:
        self._refuse(*_header_count_refusal(self._max_headers))

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self._closed_by_guard:
            return
        if not self._head_open:
            # The rest of an answered request's body, still coming after head_timeout.
            self._refuse(408, "body_timeout", "", answer=False)
            return
        seconds = self.guard.limits.head_timeout
        self._refuse(408, "head_timeout", f"the request head did not arrive within {seconds:g}s")

    def _refuse(self, status: int, code: str, message: str, *, answer: bool = True) -> None:
        """Close the connection and read nothing more; with ``answer``, send ``status`` first.

        The error (OpenAI-style JSON) answers a request head that got no answer yet.
        """
        self._closed_by_guard = True
        self._cancel_head_timer()
        self.guard.closed(code, status if answer else None)
        running = self._running()
        if running is not None:
            if running.more_body and not running.response_started:
                # Its body can no longer arrive (nothing more is read): it hears a disconnect.
                self.transport.close()
            else:
                # A request read whole is being answered: let it finish, then close.
                running.keep_alive = False
            return
        if self.transport.is_closing():
            return
        if not answer:
            self.transport.close()
            return
        body = error_body(message, code=code, type="invalid_request_error")
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head.append(
            b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
            % len(body)
        )
        self.transport.write(b"".join(head) + body)
        self.transport.close()

    def _running(self) -> RequestResponseCycle | None:
        """The first unanswered request; forgets the answered ones before it."""
        while self._cycles and self._cycles[0].response_complete:
            self._cycles.popleft()
        return self._cycles[0] if self._cycles else None

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None


def _head_size(url: bytes, headers: list[tuple[bytes, bytes]]) -> int:
    """The size of a completed head as parsed (request line, ``name: value\\r\\n`` lines)."""
    return len(url) + _REQUEST_LINE_ALLOWANCE + sum(len(n) + len(v) + 4 for n, v in headers)


def _head_size_refusal(limit: int) -> tuple[int, str, str]:
    return 431, "head_too_large", f"the request head exceeds {limit} bytes"


def _header_count_refusal(limit: int) -> tuple[int, str, str]:
    return 431, "too_many_headers", f"the request has more than {limit} header lines"


def guarded_protocol(guard: ConnectionGuard) -> type[GuardedHttpToolsProtocol]:
    """The protocol class of one server, bound to its guard (uvicorn's ``Config(http=...)``)."""
    return type("GatewayHttpProtocol", (GuardedHttpToolsProtocol,), {"guard": guard})
