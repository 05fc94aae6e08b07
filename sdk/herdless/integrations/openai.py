"""The official ``openai`` client on herdless: one changed line, every policy underneath.

``openai.OpenAI`` accepts an ``http_client``; the one built here never opens a socket
itself. It turns each ``POST .../chat/completions`` into one call of a herdless client,
which retries, waits, breaks and falls back as configured, with each backend's own URL,
API key and model (the URL, key and model the openai client was given are not used).
openai's own retries never stack on herdless's: answers carry ``x-should-retry:
false``, and a call herdless gave up on without an answer raises openai's own
``APIConnectionError`` / ``APITimeoutError``, which openai does not retry (an openai
older than 2.31 gets a ``502``/``504`` answer instead), so even an app that keeps
``max_retries`` above zero makes one herdless call per ``create()``::

    import herdless
    from herdless.integrations.openai import openai_client

    client = openai_client(herdless.Client())        # was: client = openai.OpenAI()
    answer = client.chat.completions.create(model="gpt-4o-mini", messages=[...])

Or keep your own construction and pass the http client::

    openai.OpenAI(api_key="unused", base_url="http://herdless/v1", max_retries=0,
                  http_client=http_client(herdless.Client()))

Per call, ``extra_headers={"x-herdless-allow-fallback": "false"}`` keeps the call off
external fallbacks, and ``{"x-herdless-deadline": "5"}`` sets its deadline in seconds.
Responses carry ``x-herdless-backend``, ``x-herdless-attempts`` and
``x-herdless-fallback-reason`` (read them with ``.with_raw_response``).

openai 2.x runs on ``httpx``; openai 3.x on ``httpx2`` (and still accepts ``httpx``).
``flavor`` picks which one the http client is built on; :func:`openai_client` picks the
one the installed openai uses.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import re
from collections.abc import AsyncIterator, Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, overload

import httpx

from herdless.errors import HerdlessError, StreamInterrupted
from herdless.integrations._bridge import (
    DONE,
    Call,
    Failure,
    Reply,
    library_options,
    parse_call,
    reply_for_error,
    reply_for_result,
    reply_for_stream,
    sse,
)
from herdless.integrations._extras import import_extra

if TYPE_CHECKING:
    import openai  # type: ignore[import-not-found, import-untyped, unused-ignore]  # an optional extra

    from herdless._async_client import AsyncClient
    from herdless._client import Client
    from herdless._stream import AsyncStream, Stream

__all__ = [
    "Flavor",
    "async_http_client",
    "async_openai_client",
    "async_transport",
    "http_client",
    "native_flavor",
    "openai_client",
    "transport",
]

Flavor = Literal["httpx", "httpx2"]


# openai-python stamps every request with this header (its attempt number).
_OPENAI_ATTEMPT_HEADER = "x-stainless-retry-count"
# The first openai release that lets an OpenAIError raised by the transport through
# as it is; earlier ones retry anything the transport raises (max_retries times).
_OPENAI_PASSES_ITS_ERRORS = (2, 31)


@functools.cache
def _openai_errors() -> tuple[type[openai.APIConnectionError], type[openai.APITimeoutError]] | None:
    """openai's ``APIConnectionError`` and ``APITimeoutError`` when the installed
    openai passes them through un-retried; ``None`` when it is older (or absent)."""
    try:
        version = importlib.metadata.version("openai")
    except importlib.metadata.PackageNotFoundError:
        return None
    release = tuple(int(part) for part in re.findall(r"\d+", version)[:2])
    if release < _OPENAI_PASSES_ITS_ERRORS:
        return None
    import openai  # type: ignore[import-not-found, import-untyped, unused-ignore]  # an optional extra

    return openai.APIConnectionError, openai.APITimeoutError


def _answer(mod: Any, reply: Reply | Failure, request: Any, cause: Exception | None = None) -> Any:
    """The library's response for ``reply``, or the exception for a ``Failure``.

    herdless already retried and fell back: whoever called must not do it again. An
    exception from the transport is something openai retries (``max_retries`` times,
    with its own sleeps), unless it is openai's own error (2.31 and later). So a
    request from openai gets openai's ``APIConnectionError`` / ``APITimeoutError``
    raised here, or, from an older openai, a ``502``/``504`` answer marked
    ``x-should-retry: false``. Anything else gets httpx's ``ConnectError`` /
    ``ReadTimeout``. Either way the chain is ``library error <- httpx error (with
    herdless's message) <- the herdless error``.
    """
    if not isinstance(reply, Failure):
        return mod.Response(reply.status, headers=reply.headers, content=reply.body)
    transport_error = (mod.ReadTimeout if reply.timeout else mod.ConnectError)(
        reply.message, request=request
    )
    transport_error.__cause__ = cause
    if _OPENAI_ATTEMPT_HEADER not in request.headers:
        raise transport_error
    errors = _openai_errors()
    if errors is None:
        return _answer(mod, reply.as_reply(), request)
    connection_error, timeout_error = errors
    if reply.timeout:
        raise timeout_error(request=request) from transport_error
    raise connection_error(message=reply.message, request=request) from transport_error


@functools.cache
def _classes(mod: ModuleType) -> tuple[type[Any], type[Any]]:
    """The sync and async transport classes for ``httpx`` or ``httpx2`` (same API)."""
    # The bases are httpx's or httpx2's, chosen at run time: mypy sees them as Any.
    sync_base: Any = mod.BaseTransport
    async_base: Any = mod.AsyncBaseTransport
    sync_body_base: Any = mod.SyncByteStream
    async_body_base: Any = mod.AsyncByteStream

    class SyncBody(sync_body_base):  # type: ignore[misc]  # base chosen at run time
        def __init__(self, stream: Stream) -> None:
            self._stream = stream

        def __iter__(self) -> Iterator[bytes]:
            try:
                with self._stream as chunks:
                    for chunk in chunks:
                        yield sse(chunk)
            except StreamInterrupted as exc:
                raise mod.RemoteProtocolError(str(exc)) from exc
            yield DONE

        def close(self) -> None:
            self._stream.close()

    class AsyncBody(async_body_base):  # type: ignore[misc]  # base chosen at run time
        def __init__(self, stream: AsyncStream) -> None:
            self._stream = stream

        async def __aiter__(self) -> AsyncIterator[bytes]:
            try:
                async with self._stream as chunks:
                    async for chunk in chunks:
                        yield sse(chunk)
            except StreamInterrupted as exc:
                raise mod.RemoteProtocolError(str(exc)) from exc
            yield DONE

        async def aclose(self) -> None:
            await self._stream.aclose()

    class HerdlessTransport(sync_base):  # type: ignore[misc]  # base chosen at run time
        """Serves chat completions with a herdless ``Client``."""

        def __init__(self, client: Client, *, pass_model: bool = False) -> None:
            self.client = client
            self._pass_model = pass_model

        def handle_request(self, request: Any) -> Any:
            call = parse_call(
                request.method,
                request.url.path,
                request.headers,
                request.read(),
                pass_model=self._pass_model,
            )
            if not isinstance(call, Call):
                return _answer(mod, call, request)
            try:
                if call.stream:
                    stream = self.client.chat(call.messages, stream=True, **call.kwargs)
                    head = reply_for_stream(stream)
                    return mod.Response(200, headers=head.headers, stream=SyncBody(stream))
                result = self.client.chat(call.messages, stream=False, **call.kwargs)
                return _answer(mod, reply_for_result(result), request)
            except HerdlessError as exc:
                return _answer(mod, reply_for_error(exc), request, exc)

        def close(self) -> None:
            # The library closes its http client, hence this transport: the herdless
            # client goes with it (closing is idempotent, so a shared one may be closed
            # again by its other owner).
            self.client.close()

    class AsyncHerdlessTransport(async_base):  # type: ignore[misc]  # base chosen at run time
        """Serves chat completions with a herdless ``AsyncClient``."""

        def __init__(self, client: AsyncClient, *, pass_model: bool = False) -> None:
            self.client = client
            self._pass_model = pass_model

        async def handle_async_request(self, request: Any) -> Any:
            call = parse_call(
                request.method,
                request.url.path,
                request.headers,
                await request.aread(),
                pass_model=self._pass_model,
            )
            if not isinstance(call, Call):
                return _answer(mod, call, request)
            try:
                if call.stream:
                    stream = await self.client.chat(call.messages, stream=True, **call.kwargs)
                    head = reply_for_stream(stream)
                    return mod.Response(200, headers=head.headers, stream=AsyncBody(stream))
                result = await self.client.chat(call.messages, stream=False, **call.kwargs)
                return _answer(mod, reply_for_result(result), request)
            except HerdlessError as exc:
                return _answer(mod, reply_for_error(exc), request, exc)

        async def aclose(self) -> None:
            await self.client.aclose()

    return HerdlessTransport, AsyncHerdlessTransport


def _module(flavor: Flavor) -> ModuleType:
    if flavor not in ("httpx", "httpx2"):
        raise ValueError(f"flavor must be 'httpx' or 'httpx2', got {flavor!r}")
    if flavor == "httpx":
        return httpx
    return import_extra(
        "httpx2", package="httpx2 (openai 3 brings it)", extra="openai", needed_by="flavor='httpx2'"
    )


def transport(client: Client, *, pass_model: bool = False, flavor: Flavor = "httpx") -> Any:
    """A sync transport (``httpx.BaseTransport``, or httpx2's) that calls ``client``.

    Args:
        client: the herdless client whose policies serve every call.
        pass_model: send the request's ``model`` to the primary instead of the
            backend's or client's own (fallbacks always use their own first).
        flavor: ``"httpx"`` or ``"httpx2"``.
    """
    return _classes(_module(flavor))[0](client, pass_model=pass_model)


def async_transport(
    client: AsyncClient, *, pass_model: bool = False, flavor: Flavor = "httpx"
) -> Any:
    """The async twin of :func:`transport`, for a herdless ``AsyncClient``."""
    return _classes(_module(flavor))[1](client, pass_model=pass_model)


@overload
def http_client(
    client: Client, *, pass_model: bool = ..., flavor: Literal["httpx"] = ...
) -> httpx.Client: ...
@overload
def http_client(client: Client, *, pass_model: bool = ..., flavor: Literal["httpx2"]) -> Any: ...
def http_client(client: Client, *, pass_model: bool = False, flavor: Flavor = "httpx") -> Any:
    """An ``httpx.Client`` (or ``httpx2.Client``) for ``openai.OpenAI(http_client=...)``,
    LangChain's ``ChatOpenAI(http_client=...)`` and LlamaIndex's ``OpenAI(http_client=...)``.

    openai's ``max_retries`` adds no attempt even when left above zero (see the module
    docstring); ``max_retries=0`` says so in the app's code too. Closing the http client
    (or the openai client) closes ``client`` too.
    """
    mod = _module(flavor)
    return mod.Client(transport=transport(client, pass_model=pass_model, flavor=flavor))


@overload
def async_http_client(
    client: AsyncClient, *, pass_model: bool = ..., flavor: Literal["httpx"] = ...
) -> httpx.AsyncClient: ...
@overload
def async_http_client(
    client: AsyncClient, *, pass_model: bool = ..., flavor: Literal["httpx2"]
) -> Any: ...
def async_http_client(
    client: AsyncClient, *, pass_model: bool = False, flavor: Flavor = "httpx"
) -> Any:
    """The async twin of :func:`http_client`, for ``AsyncOpenAI`` and ``http_async_client``."""
    mod = _module(flavor)
    return mod.AsyncClient(transport=async_transport(client, pass_model=pass_model, flavor=flavor))


def native_flavor() -> Flavor:
    """The HTTP library the installed openai is built on: ``httpx2`` from 3.x.

    Raises:
        ImportError: openai is not installed (``pip install 'herdless[openai]'``).
    """
    import_extra("openai", package="openai", extra="openai", needed_by="the openai integration")
    major = int(importlib.metadata.version("openai").split(".")[0])
    return "httpx2" if major >= 3 else "httpx"


def openai_client(client: Client, *, pass_model: bool = False, **kwargs: Any) -> openai.OpenAI:
    """An ``openai.OpenAI`` whose chat completions go through ``client``.

    Args:
        client: the herdless client (its backends decide URL, key and model).
        pass_model: see :func:`transport`.
        **kwargs: more ``openai.OpenAI`` arguments (``organization``, ``default_headers``,
            ...). ``max_retries`` is always 0.

    Raises:
        ImportError: openai is not installed (``pip install 'herdless[openai]'``).
    """
    mod = import_extra("openai", package="openai", extra="openai", needed_by="openai_client()")
    library_options(kwargs)
    # Typed loosely: openai 2.x wants an httpx client, 3.x an httpx2 one.
    http: Any = http_client(client, pass_model=pass_model, flavor=native_flavor())
    built: openai.OpenAI = mod.OpenAI(http_client=http, **kwargs)
    return built


def async_openai_client(
    client: AsyncClient, *, pass_model: bool = False, **kwargs: Any
) -> openai.AsyncOpenAI:
    """The async twin of :func:`openai_client`: an ``openai.AsyncOpenAI`` on ``client``.

    Raises:
        ImportError: openai is not installed (``pip install 'herdless[openai]'``).
    """
    mod = import_extra(
        "openai", package="openai", extra="openai", needed_by="async_openai_client()"
    )
    library_options(kwargs)
    http: Any = async_http_client(client, pass_model=pass_model, flavor=native_flavor())
    built: openai.AsyncOpenAI = mod.AsyncOpenAI(http_client=http, **kwargs)
    return built
