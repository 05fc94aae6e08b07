"""``AsyncClient``: the asyncio driver over the call flow (``Client``'s twin,
``herdless._client``).

It performs what the sans-I/O ``CallFlow`` yields as ``Client`` does, in the same loop
awaited (``herdless._drive.adrive``):
``Send`` with ``httpx.AsyncClient`` (the whole attempt bounded by one loop timer),
``Sleep`` with the injected async ``sleep``, ``SlotWait`` on a future woken from any
thread, ``Race`` as tasks. Hooks may be coroutine functions (``events.EventHook``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Unpack, overload

import httpx

from herdless._actions import Ended, Outcome, Race, Send, SlotWait
from herdless._backend import Backend
from herdless._base import _BaseClient, hooks_of
from herdless._config import ChatOptions, ClientOptions
from herdless._drive import adrive
from herdless._outcomes import Body, OpenStream, failure, stream_waits, too_slow
from herdless._parallel import AsyncSends
from herdless._request import lean_headers, read_cookies_when_set
from herdless._stream import AsyncStream
from herdless._stream_state import StreamState
from herdless._types import ChatResult

if TYPE_CHECKING:
    from typing import Self

    from herdless._call.flow import CallFlow
    from herdless.events import Event, EventHook

__all__ = ["AsyncClient"]

logger = logging.getLogger("herdless")


def _expire(task: asyncio.Task[Any], fired: list[bool]) -> None:
    """An async attempt's time is up: cancel its task (``AsyncClient._perform``)."""
    fired.append(True)
    task.cancel()


async def _slot_wait(action: SlotWait) -> None:
    """Wait until the window decides the call's place (a slot freed on any thread or
    task), at most ``action.timeout`` seconds."""
    loop = asyncio.get_running_loop()
    woken: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not woken.done():
            woken.set_result(None)

    def wake_soon() -> None:  # from any thread: the one that freed the slot
        loop.call_soon_threadsafe(wake)

    action.listen(wake_soon)
    with contextlib.suppress(TimeoutError):  # the flow looks at the place again and decides
        await asyncio.wait_for(woken, action.timeout)


class _Performer:
    """How ``AsyncClient`` performs the actions of one call (``herdless._drive``)."""

    __slots__ = ("_client", "_flow", "_headers", "_hooked", "_sends")

    def __init__(
        self, client: AsyncClient, flow: CallFlow, headers: Mapping[str, str] | None
    ) -> None:
        self._client = client
        self._flow = flow
        self._headers = headers
        self._hooked = bool(client._hooks)
        self._sends: AsyncSends | None = None  # a hedge's race: its sends as tasks

    async def deliver(self) -> None:
        if self._hooked:
            await self._client._dispatch(self._flow.take_events())

    async def send(self, send: Send, /) -> Outcome:
        outcome = await self._client._perform(send, self._headers)
        self._client._answered(self._flow, send, outcome)
        return outcome

    async def sleep(self, seconds: float, /) -> None:
        await self._client._sleep(seconds)

    async def slot_wait(self, wait: SlotWait, /) -> None:
        await _slot_wait(wait)

    async def race(self, race: Race, /) -> Ended | None:
        if self._sends is None:
            self._sends = AsyncSends(
                functools.partial(self._client._perform, headers=self._headers)
            )
        ended = await self._sends.race(race)
        if ended is not None:
            self._client._answered(self._flow, ended.send, ended.outcome)
        return ended

    async def cancel(self) -> None:
        if self._sends is not None:
            await self._sends.cancel()


class AsyncClient(_BaseClient):
    """An asyncio herdless client; the arguments are ``Client``'s, except that ``on_event``
    may also be (or hold) coroutine functions, ``sleep`` is awaited (``asyncio.sleep``;
    ``FakeClock.asleep`` in tests), and ``http_client`` / ``transport`` are async.

    >>> async with AsyncClient(primary="http://127.0.0.1:8080/v1") as client:  # doctest: +SKIP
    ...     result = await client.chat([{"role": "user", "content": "Hi"}])
    """

    def __init__(
        self,
        primary: str | Backend | Sequence[str | Backend] | None = None,
        *,
        on_event: EventHook | Sequence[EventHook] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        http_client: httpx.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        **options: Unpack[ClientOptions],
    ) -> None:
        super().__init__(primary, hooks_of(on_event), options)
        self._sleep = sleep
        self._owns_http = http_client is None
        self._http = http_client or httpx.AsyncClient(transport=transport)
        if self._owns_http:
            read_cookies_when_set(self._http)
            lean_headers(self._http)

    @overload
    async def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        stream: Literal[False] = ...,
        **options: Unpack[ChatOptions],
    ) -> ChatResult: ...
    @overload
    async def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        stream: Literal[True],
        **options: Unpack[ChatOptions],
    ) -> AsyncStream: ...
    async def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        stream: bool = False,
        **options: Unpack[ChatOptions],
    ) -> ChatResult | AsyncStream:
        """Ask for a chat completion; see ``Client.chat``."""
        flow, request_id, total, headers = self._start(messages, stream, options)
        accepted = await adrive(flow.run(), _Performer(self, flow, headers))
        if stream:
            state = StreamState(flow, accepted, request_id, stream_deadline=total)
            return AsyncStream(state, self._dispatch)
        return self._result(accepted, request_id)

    async def _perform(self, send: Send, headers: Mapping[str, str] | None = None) -> Outcome:
        start = self._clock.monotonic()
        limit = send.timeouts.first_byte
        # The whole attempt (pool wait, connect, send, first answer) within the time the
        # flow gave it: httpx's limits are per operation, and under load their sum (a
        # crowded pool, then a slow connect, then the read) outlasted the deadline.
        # asyncio.timeout's rule, on a bare loop timer (its context manager costs more;
        # herdless.bench.sdk_overhead measures it).
        task = asyncio.current_task()
        if task is None:  # not in a task (a bare coroutine driven by hand): no timer
            return await self._exchange(send, start, headers)
        loop = asyncio.get_running_loop()
        cancelling = task.cancelling()
        fired: list[bool] = []
        timer = loop.call_at(loop.time() + limit, _expire, task, fired)
        try:
            return await self._exchange(send, start, headers)
        except asyncio.CancelledError:
            # Ours, unless someone else cancelled the task too: then theirs wins.
            if fired and task.uncancel() <= cancelling:
                timeout = httpx.ReadTimeout(f"no answer within {limit:g} s")
                return failure(timeout, elapsed=self._clock.monotonic() - start)
            raise
        finally:
            timer.cancel()

    async def _exchange(
        self, send: Send, start: float, headers: Mapping[str, str] | None = None
    ) -> Outcome:
        end = start + send.timeouts.first_byte  # the timer's limit, on the client's clock
        response = None
        try:
            request = self._endpoints.request(
                self._http, send, own=self._owns_http, extra_headers=headers
            )
            response = await self._http.send(request, stream=True)
            if send.stream and response.is_success:
                first, idle = stream_waits(response, send.timeouts)
                opened = OpenStream(response, response.aiter_bytes(), idle=idle)
                try:
                    async with asyncio.timeout(first):
                        while not opened.feed(await anext(opened.raw)):
                            if self._clock.monotonic() > end:
                                raise too_slow("the stream's first event")
                except TimeoutError:
                    raise httpx.ReadTimeout(f"no first event within {first:g} s") from None
                return opened.outcome(elapsed=self._clock.monotonic() - start)
            body = Body(response, self._clock, end)
            async for part in response.aiter_bytes():
                if body.add(part):
                    break
            await response.aclose()
            elapsed = self._clock.monotonic() - start
            return body.outcome(response, stream=send.stream, elapsed=elapsed)
        except (httpx.RequestError, ValueError, StopAsyncIteration) as exc:
            if response is not None:
                await response.aclose()
            return failure(exc, elapsed=self._clock.monotonic() - start)
        except asyncio.CancelledError:  # the attempt's time is up (or the caller gave up)
            if response is not None:
                await response.aclose()
            raise

    async def _dispatch(self, events: list[Event]) -> None:
        for event in events:
            for hook in self._hooks:
                result = self._call_hook(hook, event)
                if inspect.isawaitable(result):
                    try:
                        await result
                    except Exception:
                        logger.exception(
                            "herdless on_event hook raised on %s", type(event).__name__
                        )

    async def aclose(self) -> None:
        """Close the connections (idempotent)."""
        self._closed[0] = True
        if self._owns_http and self._closes_http:
            await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
