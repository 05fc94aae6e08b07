"""Each attempt's HTTP request, built as cheaply as httpx allows.

``Endpoints`` holds, per backend, what every attempt sends (URL, headers, the backend's
timeouts in httpcore's form) and builds the attempt's ``httpx.Request`` from a ``Send``:
the body with the backend's model, the attempt's headers, and the timeouts the flow
clipped to the call's deadline. Both drivers send what it builds.

Timeouts (seconds): ``connect`` bounds the connection (and the pool wait, and writing
the small request body); ``first_byte`` bounds every read until the attempt is accepted,
that is the response head and, for a stream, its first event (a vLLM stream sends its
head at once and its first event only when the request left the queue and prefilled, so
"time to first token" is what a hung primary shows); ``read`` bounds each idle gap
between a stream's later chunks (``herdless._outcomes.stream_waits``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypeAlias

import httpx

from herdless._actions import ATTEMPT_HEADER, REQUEST_ID_HEADER, Send
from herdless._backend import Backend, Timeouts
from herdless._version import __version__
from herdless._wire import encode_body, with_model

__all__ = ["USER_AGENT", "Endpoints", "lean_headers", "read_cookies_when_set"]

USER_AGENT = f"herdless/{__version__} python-httpx/{httpx.__version__}"
"""The ``User-Agent`` of the requests of an HTTP client herdless made itself."""

# No Accept for a whole answer: none means any (``lean_headers`` drops httpx's ``*/*``).
_JSON_HEADERS = {"Content-Type": "application/json"}
_SSE_HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream"}


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


class _Cookies(httpx.Cookies):
    """httpx's cookies, read from a response only when it sets one. httpx reads every
    response into its jar, and to do so copies the request's headers into a ``urllib``
    request one lookup at a time (a cost that grows with the square of the headers): a
    sixth of a call's bytecodes, for a jar that a response without ``Set-Cookie``
    leaves as it was."""

    def extract_cookies(self, response: httpx.Response) -> None:
        headers = response.headers
        if "set-cookie" in headers or "set-cookie2" in headers:
            super().extract_cookies(response)


def read_cookies_when_set(http: httpx.Client | httpx.AsyncClient) -> bool:
    """Give the HTTP client herdless made itself a jar that reads only the responses that
    set a cookie (same jar, same cookies); whether it took (``False`` if httpx moved its
    cookies: the client keeps httpx's own, and the test of this function fails loudly).

    httpx takes no class for its cookies, so its private attribute is replaced, checked.
    """
    cookies = getattr(http, "_cookies", None)
    if type(cookies) is not httpx.Cookies:
        return False
    jar = http._cookies = _Cookies(cookies.jar)
    return http.cookies is jar


def _timeout_extension(limits: Timeouts) -> dict[str, float]:
    """httpcore's ``timeout`` request extension (what ``httpx.Timeout.as_dict`` gives)."""
    return {
        "connect": limits.connect,
        "read": limits.first_byte,
        "write": limits.connect,
        "pool": limits.connect,
    }


def lean_headers(http: httpx.Client | httpx.AsyncClient) -> None:
    """Trim the headers of the HTTP client herdless made itself to those that say
    something: httpx's defaults less ``Accept: */*`` (no ``Accept`` means any media type;
    a stream's request sets its own) and ``Connection: keep-alive`` (HTTP/1.1
    connections persist without it), and herdless's ``User-Agent`` in place of httpx's.

    Every header costs each request its encoding here and its parse at the server;
    these two say nothing HTTP/1.1 does not already mean.
    """
    headers = http.headers
    del headers["accept"], headers["connection"]
    headers["user-agent"] = USER_AGENT
