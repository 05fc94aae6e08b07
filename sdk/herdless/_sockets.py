"""The sync client's own sockets: every wait bounded by the attempt's time.

A thread cannot be interrupted, so the sync driver bounds time where the waiting
happens, in the socket: the ``httpx.Client`` it makes itself (``bounded_http_client``)
reads and writes through ``_BoundedBackend``, which clips every socket timeout to the
calling thread's ``AttemptLimit``. A client that hedges gets ``_WatchedStream`` sockets,
whose reads wait in slices and stop once the racing send they serve is cancelled. An
HTTP client the user gave cannot be bounded this way; the driver's clock checks between
the pieces of a body still bound it.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable
from typing import Any, Final

import httpcore
import httpx

__all__ = ["AttemptLimit", "bounded_http_client"]


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
            raise error("the call's time for this attempt ran out")
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
        timeout = self._limit.clip(timeout, httpcore.WriteTimeout)
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
