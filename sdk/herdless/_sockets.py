"""What both drivers share about performing a ``Send`` with httpx, minus the I/O calls.

The sync and async drivers differ only in ``send`` / ``iter_bytes`` / ``close`` versus
their awaited twins; the request, the timeouts, the mapping of httpx exceptions to
``TransportFailure`` kinds, the body cap and the first-event rule live here, once.

Timeouts (seconds, already clipped by the flow): ``connect`` bounds the connection (and
the pool wait, and writing the small request body); ``first_byte`` bounds every read
until the attempt is accepted, that is the response head and, for a stream, its first
event: a vLLM stream sends its head at once and its first event only when the request
left the queue and prefilled, so "time to first token" is what a hung primary shows.
``read`` bounds each idle gap between a stream's later chunks.

httpcore reads a body with one socket timeout, taken from the request's ``timeout``
extension when the body starts (``_receive_response_body``), so the first event and
the gaps after it share it, and it bounds each read, not their sum: a server that sends
one byte every 50 ms never trips it. ``stream_waits`` sets it to the larger of
``first_byte`` and ``read``; the async driver bounds the whole attempt with a loop timer
and a stream's gaps with ``asyncio.timeout``. A thread cannot be interrupted, so the
sync driver bounds time where the waiting happens, in the socket: the ``httpx.Client``
it makes itself (``bounded_http_client``) reads and writes through ``_BoundedBackend``,
which clips every socket timeout to the calling thread's ``AttemptLimit``. Both drivers
also check their clock between the pieces of a body, which is all they can do with an
HTTP client the user gave them.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any, Final, TypeAlias

import httpcore
import httpx

from herdless._actions import (
    ATTEMPT_HEADER,
    REQUEST_ID_HEADER,
    Response,
    Send,
    TransportFailure,
    TransportFailureKind,
)
from herdless._backend import Backend, Timeouts
from herdless._types import Chunk
from herdless._wire import DONE, SSEDecoder, encode_body, parse_chunk, parse_completion, with_model

__all__ = [
    "ERROR_BODY_CAP",
    "AttemptLimit",
    "Endpoints",
    "OpenStream",
    "accept",
    "bounded_http_client",
    "failure",
    "is_success",
    "stream_waits",
]

# An error body is read for its message only; a proxy's HTML page can be large.
ERROR_BODY_CAP: Final = 64 * 1024

# No Accept for a whole answer: httpx's default (*/*) does, and replacing it costs per call.
_JSON_HEADERS: Final = {"Content-Type": "application/json"}
_SSE_HEADERS: Final = {"Content-Type": "application/json", "Accept": "text/event-stream"}


_Fixed: TypeAlias = tuple[httpx.URL, dict[str, str], list[tuple[bytes, bytes]], frozenset[bytes]]


class Endpoints:
    """What every attempt at a backend sends, computed once per client: the URL (parsed
    once: httpx parses a string URL on every request, a third of building it), the
    headers (content type, accept, ``Authorization``) and httpx's form of the backend's
    unclipped timeouts. Per call, only the attempt's own headers and a clipped timeout
    (near the deadline) are new.

    The request is built as ``httpx.Client.build_request`` builds it: the client's
    headers, less those the attempt sets, then the attempt's. For the client herdless
    made itself (``own=True``: no params, no base URL, ``build_request`` not overridden),
    that merge is done here on the header lists, without httpx's per-header lookups,
    which cost as much as the rest of building the request; a client given by the user,
    or one that picked up cookies, goes through ``build_request`` itself.
    """

    __slots__ = ("_fixed", "_limits")

    def __init__(self, backends: Iterable[Backend], default: Timeouts) -> None:
        # (url, headers, the same as httpx's raw pairs, the lowercase names an attempt sets)
        self._fixed: dict[tuple[str, bool], _Fixed] = {}
        self._limits: dict[str, tuple[Timeouts, dict[str, float]]] = {}
        for backend in backends:
            url = httpx.URL(backend.chat_url)
            for stream in (False, True):
                headers = dict(_SSE_HEADERS if stream else _JSON_HEADERS)
                if backend.api_key:
                    headers["Authorization"] = f"Bearer {backend.api_key}"
                raw = [(k.encode(), v.encode()) for k, v in headers.items()]
                names = frozenset(
                    n.lower().encode() for n in (*headers, REQUEST_ID_HEADER, ATTEMPT_HEADER)
                )
                self._fixed[backend.name, stream] = (url, headers, raw, names)
            limits = backend.timeouts or default
            self._limits[backend.name] = (limits, _timeout_extension(limits))

    def request(
        self,
        http: httpx.Client | httpx.AsyncClient,
        send: Send,
        *,
        own: bool = False,
        extra_headers: Mapping[str, str] | None = None,
    ) -> httpx.Request:
        """The attempt's ``POST {base_url}/chat/completions`` with its body, headers and
        timeouts; ``own``: ``http`` is the client herdless made (see the class);
        ``extra_headers``: the call's own (``chat(extra_headers=...)``, already checked
        not to replace a header herdless sets)."""
        name = send.backend.name
        url, fixed, fixed_raw, names = self._fixed[name, send.stream]
        limits, timeout = self._limits[name]
        content = encode_body(with_model(send.body, send.model))
        # A fresh dict each time: a stream's body timeout is set on it later.
        extensions = {
            "timeout": dict(timeout)
            if send.timeouts is limits
            else _timeout_extension(send.timeouts)
        }
        if not own or http.cookies:
            return http.build_request(
                "POST",
                url,
                content=content,
                headers={**fixed, **(extra_headers or {}), **send.headers},
                extensions=extensions,
            )
        extra = None
        if extra_headers:  # they replace the HTTP client's own headers of the same names
            extra = [(k.encode(), v.encode()) for k, v in extra_headers.items()]
            names = names | {name.lower() for name, _ in extra}
        headers = [item for item in http.headers.raw if item[0].lower() not in names]
        headers += fixed_raw
        if extra:
            headers += extra
        headers += [(k.encode(), v.encode()) for k, v in send.headers.items()]
        return httpx.Request("POST", url, content=content, headers=headers, extensions=extensions)


def _timeout_extension(limits: Timeouts) -> dict[str, float]:
    """httpcore's ``timeout`` request extension (what ``httpx.Timeout.as_dict`` gives)."""
    return {
        "connect": limits.connect,
        "read": limits.first_byte,
        "write": limits.connect,
        "pool": limits.connect,
    }


def is_success(status: int) -> bool:
    """A 2xx status: the attempt is the call's answer."""
    return 200 <= status < 300


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
    decoded ``Completion`` travels in ``Response.stream`` (the driver's slot).

    Raises:
        ValueError: a 2xx non-streaming body is not a chat completion.
    """
    decoded = parse_completion(body) if is_success(response.status_code) and not stream else None
    return Response(
        status=response.status_code,
        headers=response.headers,
        body=body,
        elapsed=elapsed,
        stream=decoded,
    )


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
            stream=self,
        )


class AttemptLimit(threading.local):
    """Per thread: the ``time.monotonic()`` after which the sync client's sockets stop
    waiting (``math.inf``: no limit). The driver sets it around the I/O of an attempt
    and of each read of a stream, and clears it before handing control back."""

    end: float = math.inf
    watch: Any = None
    """A racing send this thread performs (``herdless._parallel``): its ``cancelled``
    flag is read between the slices of a watched socket's reads; ``None``: no race."""

    def clip(self, timeout: float | None, error: type[Exception]) -> float | None:
        """``timeout``, or less: what is left before ``end``.

        Raises:
            error: nothing is left.
        """
        end = self.end
        if end == math.inf:
            return timeout
        left = end - time.monotonic()
        if left <= 0:
            raise error("the call's time for this read ran out")
        return left if timeout is None or timeout > left else timeout


class _BoundedStream(httpcore.NetworkStream):
    """A socket whose every wait is clipped to the thread's ``AttemptLimit``."""

    __slots__ = ("_limit", "_stream")

    def __init__(self, stream: httpcore.NetworkStream, limit: AttemptLimit) -> None:
        self._stream = stream
        self._limit = limit

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        # clip(), inlined: a read is on the per-chunk path of every stream.
        end = self._limit.end
        if end != math.inf:
            left = end - time.monotonic()
            if left <= 0:
                raise httpcore.ReadTimeout("the call's time for this read ran out")
            if timeout is None or timeout > left:
                timeout = left
        return self._stream.read(max_bytes, timeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        end = self._limit.end  # clip(), inlined: every request writes
        if end != math.inf:
            left = end - time.monotonic()
            if left <= 0:
                raise httpcore.WriteTimeout("the call's time for this write ran out")
            if timeout is None or timeout > left:
                timeout = left
        self._stream.write(buffer, timeout)

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self,
        ssl_context: Any,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        timeout = self._limit.clip(timeout, httpcore.ConnectTimeout)
        stream = self._stream.start_tls(ssl_context, server_hostname, timeout)
        return type(self)(stream, self._limit)

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


# Seconds: a racing send's socket read waits at most this long at a time, so that the
# thread notices within it that the race was lost (a thread cannot be interrupted).
_SLICE: Final = 0.05


class _WatchedStream(_BoundedStream):
    """A ``_BoundedStream`` whose reads, on a thread performing a racing send
    (``AttemptLimit.watch``), wait in slices and stop once the send is cancelled: the
    error closes the connection, which is how the server learns that the loser left."""

    __slots__ = ()

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        limit = self._limit
        watch = limit.watch
        if watch is None:  # not racing (a stream read after its call was accepted)
            return super().read(max_bytes, timeout)
        now = time.monotonic()
        until = math.inf if timeout is None else now + timeout
        until = min(until, limit.end)
        while True:
            if watch.cancelled:
                raise httpcore.ReadError("cancelled: the other attempt of the race answered")
            left = until - now
            if left <= 0:
                raise httpcore.ReadTimeout("the call's time for this read ran out")
            try:
                return self._stream.read(max_bytes, min(left, _SLICE))
            except httpcore.ReadTimeout:
                now = time.monotonic()  # a slice ran out: look at the race, then again

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        watch = self._limit.watch
        if watch is not None and watch.cancelled:
            raise httpcore.WriteError("cancelled: the other attempt of the race answered")
        super().write(buffer, timeout)


class _BoundedBackend(httpcore.NetworkBackend):
    """httpcore's network backend, with every socket it opens a ``_BoundedStream`` (a
    ``_WatchedStream`` for a client that races sends)."""

    __slots__ = ("_backend", "_limit", "_stream")

    def __init__(
        self, backend: httpcore.NetworkBackend, limit: AttemptLimit, *, watched: bool = False
    ) -> None:
        self._backend = backend
        self._limit = limit
        self._stream = _WatchedStream if watched else _BoundedStream

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        timeout = self._limit.clip(timeout, httpcore.ConnectTimeout)
        stream = self._backend.connect_tcp(host, port, timeout, local_address, socket_options)
        return self._stream(stream, self._limit)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        timeout = self._limit.clip(timeout, httpcore.ConnectTimeout)
        stream = self._backend.connect_unix_socket(path, timeout, socket_options)
        return self._stream(stream, self._limit)

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


def bounded_http_client(limit: AttemptLimit, *, watched: bool = False) -> tuple[httpx.Client, bool]:
    """The sync client's own ``httpx.Client`` (httpx's defaults), its sockets bounded by
    ``limit``; and whether they are (``False`` if httpx or httpcore moved the network
    backend: the driver's clock checks still bound a trickling body, and the test of
    this function fails loudly on such an upgrade). ``watched``: the client races sends
    (a ``HedgePolicy``), and a racing send's reads stop once it is cancelled.

    httpx takes no network backend, so the one of the transport's httpcore pool is
    wrapped in place: a private attribute on each side, checked here.
    """
    transport = httpx.HTTPTransport()
    pool: Any = getattr(transport, "_pool", None)
    backend = getattr(pool, "_network_backend", None)
    if not isinstance(backend, httpcore.NetworkBackend):
        return httpx.Client(transport=transport), False
    pool._network_backend = _BoundedBackend(backend, limit, watched=watched)
    return httpx.Client(transport=transport), True
