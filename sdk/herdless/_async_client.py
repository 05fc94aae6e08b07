"""``Client`` and ``AsyncClient``: two thin drivers over one call flow.

Every decision (retry, wait, breaker, budget, fallback, deadline) is made by the
sans-I/O ``CallFlow`` (``herdless._flow``). A driver only performs what the flow yields:
``Send`` with httpx, ``Sleep`` with the injected ``sleep``; it hands the flow's events to
``on_event`` after every step, so a hook hears of a wait before it starts. What both
drivers share (arguments, environment, request body, result building, hooks,
``with_options``) lives in ``herdless._base``; what differs is the ``await``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Unpack, overload

import httpx

from herdless._actions import Accepted, Outcome, Race, Send, Sleep, SlotWait
from herdless._backend import Backend
from herdless._base import SyncHooks, _BaseClient, hooks_of, is_async_hook
from herdless._config import ClientOptions
from herdless._fields import check_extra_headers
from herdless._outcomes import ERROR_BODY_CAP, OpenStream, accept, failure, stream_waits
from herdless._parallel import AsyncSends, SyncSends, Workers
from herdless._sockets import AttemptLimit, bounded_http_client
from herdless._stream import AsyncStream, Stream, _StreamState
from herdless._types import ChatResult

if TYPE_CHECKING:
    from typing import Self

    from herdless.events import Event, EventHook

__all__ = ["AsyncClient", "Client"]

logger = logging.getLogger("herdless")


def _too_slow(what: str) -> httpx.ReadTimeout:
    return httpx.ReadTimeout(f"{what} arrived too slowly: the attempt's time ran out")


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


class Client(_BaseClient):
    """A synchronous herdless client. Thread-safe: share one per process.

    Args:
        primary: the primary's API root (``"http://gateway:8080/v1"``), a ``Backend``, or
            several (each call picks the less busy of two). ``None`` reads the environment
            (``HERDLESS_*``, see ``from_env``) for everything not given.
        on_event: called with every event (``herdless.events``): one callable or a
            sequence of them, each a plain callable.
        sleep: how to wait (``time.sleep``; ``FakeClock.sleep`` in tests).
        http_client: an ``httpx.Client`` to send with (not closed by this client).
        transport: an httpx transport for the client's own ``httpx.Client``
            (``httpx.MockTransport`` in tests).
        **options: the options both clients share (``ClientOptions``), below.

    Other Parameters:
        fallback (Backend | Sequence[Backend] | None): backends to fall back to, in order.
        model (str | None): the model asked of the primary.
        retry (RetryPolicy | None): retry, backoff and retry-budget policy.
        breaker (BreakerPolicy | None): circuit-breaker policy (one breaker per backend,
            per client).
        deadline (float | None): seconds for a whole call, waits included (default 60);
            for a stream, until its first chunk.
        stream_deadline (float | None): seconds from a streamed call's start to the
            stream's end (default: none; ``Timeouts.read`` bounds each silence).
        timeouts (Timeouts | None): per-attempt limits for backends that set none.
        fallback_policy (FallbackPolicy | None): when to leave a backend, where a call may
            not go.
        window (WindowPolicy | None): flow control: how many of this client's calls may be
            at one backend at once; the others wait in the client.
        pacing (PacingPolicy | None): a rate the client never exceeds toward each backend
            (off by default).
        hedge (HedgePolicy | None): after ``HedgePolicy.after`` seconds without a first
            byte from the primary, send the same request to the next backend and keep
            the first answer (off by default; at most ``max_share`` of calls).
        clock (Clock): monotonic clock (a ``herdless.testing.FakeClock`` in tests).
        rng (random.Random | None): random source for jitter (seeded in tests).
        env_file (str | Path | None): the ``.env`` file read when configuring from the
            environment.

    >>> with Client(primary="http://127.0.0.1:8080/v1", model="gemma") as client:  # doctest: +SKIP
    ...     print(client.chat([{"role": "user", "content": "Hi"}]).content)

    Raises:
        TypeError: a hook in ``on_event`` is a coroutine function (use ``AsyncClient``),
            or an option is unknown (the message names the closest one).
        ConfigurationError: configured from the environment, and a variable is wrong.
        ValueError: an argument is out of range.
    """

    def __init__(
        self,
        primary: str | Backend | Sequence[str | Backend] | None = None,
        *,
        on_event: SyncHooks | None = None,
        sleep: Callable[[float], None] = time.sleep,
        http_client: httpx.Client | None = None,
        transport: httpx.BaseTransport | None = None,
        **options: Unpack[ClientOptions],
    ) -> None:
        hooks = hooks_of(on_event)
        if any(is_async_hook(hook) for hook in hooks):
            raise TypeError(
                "Client needs plain on_event callables; use AsyncClient for async hooks"
            )
        super().__init__(primary, hooks, options)
        self._sleep = sleep
        self._owns_http = http_client is None
        # Its own HTTP client bounds every socket wait by the attempt's time (see
        # herdless._sockets); a client or transport of the user's cannot be.
        self._limit: AttemptLimit | None = None
        self._workers = Workers()  # threads for hedges' races, started at the first one
        if http_client is not None:
            self._http = http_client
        elif transport is not None:
            self._http = httpx.Client(transport=transport)
        else:
            limit = AttemptLimit()
            hedges = self.config.hedge is not None
            self._http, bounded = bounded_http_client(limit, watched=hedges)
            self._limit = limit if bounded else None

    @overload
    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        model: str | None = ...,
        max_tokens: int | None = ...,
        temperature: float | None = ...,
        stream: Literal[False] = ...,
        deadline: float | None = ...,
        stream_deadline: float | None = ...,
        allow_fallback: bool = ...,
        extra_body: Mapping[str, Any] | None = ...,
        extra_headers: Mapping[str, str] | None = ...,
        **extra: Any,
    ) -> ChatResult: ...
    @overload
    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        model: str | None = ...,
        max_tokens: int | None = ...,
        temperature: float | None = ...,
        stream: Literal[True],
        deadline: float | None = ...,
        stream_deadline: float | None = ...,
        allow_fallback: bool = ...,
        extra_body: Mapping[str, Any] | None = ...,
        extra_headers: Mapping[str, str] | None = ...,
        **extra: Any,
    ) -> Stream: ...
    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        model: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        stream: bool = False,
        deadline: float | None = None,
        stream_deadline: float | None = None,
        allow_fallback: bool = True,
        extra_body: Mapping[str, Any] | None = None,
        extra_headers: Mapping[str, str] | None = None,
        **extra: Any,
    ) -> ChatResult | Stream:
        """Ask for a chat completion (``POST {base_url}/chat/completions``).

        Args:
            messages: the conversation, e.g. ``[{"role": "user", "content": "Hi"}]``.
            model: this call's model for the primary (a fallback keeps its own).
            max_tokens: the most tokens to generate.
            temperature: sampling temperature.
            stream: return a ``Stream`` of chunks, once the first one arrived.
            deadline: seconds for this call, waits included (the client's by default);
                for a stream, until its first chunk.
            stream_deadline: seconds from this streamed call's start to the stream's end
                (the client's by default: none); past it the stream is closed and
                ``StreamDeadlineExceeded`` raised.
            allow_fallback: ``False`` keeps the call off fallbacks (data guard).
            extra_body: request fields herdless does not know, sent unchanged (as
                openai-python's ``extra_body``).
            extra_headers: headers sent with every attempt of this call, to every
                backend it tries; not ``Authorization`` (each backend has its key) nor
                the headers herdless sets itself.
            **extra: the OpenAI and vLLM request fields herdless knows (``seed``,
                ``stop``, ``response_format``, ``tools``, ``tool_choice``, ``top_p``,
                ``n``, ``user``, ``logit_bias``, ``min_tokens``, ``ignore_eos``, ...;
                ``herdless._fields.BODY_FIELDS`` lists them), sent unchanged.

        Returns:
            A ``ChatResult``, or a ``Stream`` with ``stream=True``.

        Raises:
            TypeError: an unknown keyword argument (the message names the closest one).
            HerdlessError: a subclass saying what failed (``herdless.errors``).
        """
        headers = check_extra_headers(extra_headers) if extra_headers else None
        flow, request_id, total = self._start(
            messages,
            model=model,
            max_tokens=max_tokens,
            temperature=temperature,
            stream=stream,
            deadline=deadline,
            stream_deadline=stream_deadline,
            allow_fallback=allow_fallback,
            extra_body=extra_body,
            extra=extra,
        )
        steps = flow.run()
        hooked = bool(self._hooks)
        sends: SyncSends | None = None  # a hedge's race: its sends on worker threads
        try:
            action = next(steps)
            while True:
                if hooked:
                    self._dispatch(flow.take_events())
                if type(action) is Send:
                    outcome = self._perform(action, headers)
                    self._answered(flow, action, outcome)
                    action = steps.send(outcome)
                elif isinstance(action, Sleep):
                    self._sleep(action.seconds)
                    action = steps.send(None)
                elif isinstance(action, SlotWait):
                    woken = threading.Event()
                    action.listen(woken.set)
                    woken.wait(action.timeout)
                    action = steps.send(None)
                else:
                    if sends is None:
                        perform = functools.partial(self._perform, headers=headers)
                        sends = SyncSends(perform, self._workers, self._limit)
                    ended = sends.race(action)  # type: ignore[arg-type]  # the last kind: Race
                    if ended is not None:
                        self._answered(flow, ended.send, ended.outcome)
                    action = steps.send(ended)
                    if not isinstance(action, Race):
                        sends.cancel()  # the flow waits for none of them any more
        except StopIteration as stop:
            accepted: Accepted = stop.value
        finally:
            if sends is not None:
                sends.cancel()
            steps.close()  # the driver stopped early (KeyboardInterrupt): free what the flow holds
            if hooked:
                self._dispatch(flow.take_events())
        if stream:
            state = _StreamState(
                flow, accepted, request_id, stream_deadline=total, limit=self._limit
            )
            return Stream(state, self._dispatch)
        return self._result(accepted, request_id)

    def _perform(self, send: Send, headers: Mapping[str, str] | None = None) -> Outcome:
        start = self._clock.monotonic()
        end = start + send.timeouts.first_byte  # the whole attempt, as AsyncClient's timer
        limit = self._limit
        if limit is not None:
            limit.end = time.monotonic() + send.timeouts.first_byte
        response = None
        try:
            request = self._endpoints.request(
                self._http, send, own=self._owns_http, extra_headers=headers
            )
            response = self._http.send(request, stream=True)
            if send.stream and response.is_success:
                idle = None
                if limit is not None and send.timeouts.read != send.timeouts.first_byte:
                    # The limit bounds the first event; the socket (or the limit) each gap.
                    _, idle = stream_waits(response, send.timeouts)
                opened = OpenStream(response, response.iter_bytes(), idle=idle)
                while not opened.feed(next(opened.raw)):
                    if self._clock.monotonic() > end:
                        raise _too_slow("the stream's first event")
                return opened.outcome(elapsed=self._clock.monotonic() - start)
            # Piece by piece, not read(): a body that trickles in must not outlast the
            # attempt (each read alone is bounded by the socket, not their sum).
            parts: list[bytes] = []
            size = 0
            cap = math.inf if response.is_success else ERROR_BODY_CAP
            for part in response.iter_bytes():
                parts.append(part)
                size += len(part)
                if size > cap:
                    break  # an error body is read for its message only
                if self._clock.monotonic() > end:
                    raise _too_slow("the answer")
            response.close()
            return accept(
                response,
                b"".join(parts),
                stream=send.stream,
                elapsed=self._clock.monotonic() - start,
            )
        except (httpx.RequestError, ValueError, StopIteration) as exc:
            if response is not None:
                response.close()
            return failure(exc, elapsed=self._clock.monotonic() - start)
        finally:
            if limit is not None:
                limit.end = math.inf  # never past the attempt: other I/O of this thread

    def _dispatch(self, events: list[Event]) -> None:
        for event in events:
            for hook in self._hooks:
                result = self._call_hook(hook, event)
                if inspect.iscoroutine(result):  # a lambda returning a coroutine slipped through
                    result.close()
                    logger.error("herdless on_event hook returned an awaitable; use AsyncClient")

    def close(self) -> None:
        """Close the connections (idempotent)."""
        self._closed[0] = True
        if self._closes_http:
            self._workers.shutdown()
        if self._owns_http and self._closes_http:
            self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


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

    @overload
    async def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        model: str | None = ...,
        max_tokens: int | None = ...,
        temperature: float | None = ...,
        stream: Literal[False] = ...,
        deadline: float | None = ...,
        stream_deadline: float | None = ...,
        allow_fallback: bool = ...,
        extra_body: Mapping[str, Any] | None = ...,
        extra_headers: Mapping[str, str] | None = ...,
        **extra: Any,
    ) -> ChatResult: ...
    @overload
    async def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        model: str | None = ...,
        max_tokens: int | None = ...,
        temperature: float | None = ...,
        stream: Literal[True],
        deadline: float | None = ...,
        stream_deadline: float | None = ...,
        allow_fallback: bool = ...,
        extra_body: Mapping[str, Any] | None = ...,
        extra_headers: Mapping[str, str] | None = ...,
        **extra: Any,
    ) -> AsyncStream: ...
    async def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        model: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        stream: bool = False,
        deadline: float | None = None,
        stream_deadline: float | None = None,
        allow_fallback: bool = True,
        extra_body: Mapping[str, Any] | None = None,
        extra_headers: Mapping[str, str] | None = None,
        **extra: Any,
    ) -> ChatResult | AsyncStream:
        """Ask for a chat completion; see ``Client.chat``."""
        headers = check_extra_headers(extra_headers) if extra_headers else None
        flow, request_id, total = self._start(
            messages,
            model=model,
            max_tokens=max_tokens,
            temperature=temperature,
            stream=stream,
            deadline=deadline,
            stream_deadline=stream_deadline,
            allow_fallback=allow_fallback,
            extra_body=extra_body,
            extra=extra,
        )
        steps = flow.run()
        hooked = bool(self._hooks)
        sends: AsyncSends | None = None  # a hedge's race: its sends as tasks
        try:
            action = next(steps)
            while True:
                if hooked:
                    await self._dispatch(flow.take_events())
                if type(action) is Send:
                    outcome = await self._perform(action, headers)
                    self._answered(flow, action, outcome)
                    action = steps.send(outcome)
                elif isinstance(action, Sleep):
                    await self._sleep(action.seconds)
                    action = steps.send(None)
                elif isinstance(action, SlotWait):
                    await _slot_wait(action)
                    action = steps.send(None)
                else:
                    if sends is None:
                        sends = AsyncSends(functools.partial(self._perform, headers=headers))
                    ended = await sends.race(action)  # type: ignore[arg-type]  # the last kind: Race
                    if ended is not None:
                        self._answered(flow, ended.send, ended.outcome)
                    action = steps.send(ended)
                    if not isinstance(action, Race):
                        await sends.cancel()  # the flow waits for none of them any more
        except StopIteration as stop:
            accepted: Accepted = stop.value
        finally:
            if sends is not None:
                await sends.cancel()
            steps.close()  # cancelled mid-call: free what the flow holds
            if hooked:
                await self._dispatch(flow.take_events())
        if stream:
            state = _StreamState(flow, accepted, request_id, stream_deadline=total)
            return AsyncStream(state, self._dispatch)
        return self._result(accepted, request_id)

    async def _perform(self, send: Send, headers: Mapping[str, str] | None = None) -> Outcome:
        start = self._clock.monotonic()
        limit = send.timeouts.first_byte
        # The whole attempt (pool wait, connect, send, first answer) within the time the
        # flow gave it: httpx's limits are per operation, and under load their sum (a
        # crowded pool, then a slow connect, then the read) outlasted the deadline.
        # asyncio.timeout's rule on a bare loop timer: its context manager doubled the
        # timer's cost, about 1 % of an async call's CPU (herdless.bench.sdk_overhead).
        task = asyncio.current_task()
        if task is None:  # not in a task (a bare coroutine driven by hand): no timer
            return await self._attempt(send, start, headers)
        loop = asyncio.get_running_loop()
        cancelling = task.cancelling()
        fired: list[bool] = []
        timer = loop.call_at(loop.time() + limit, _expire, task, fired)
        try:
            return await self._attempt(send, start, headers)
        except asyncio.CancelledError:
            # Ours, unless someone else cancelled the task too: then theirs wins.
            if fired and task.uncancel() <= cancelling:
                timeout = httpx.ReadTimeout(f"no answer within {limit:g} s")
                return failure(timeout, elapsed=self._clock.monotonic() - start)
            raise
        finally:
            timer.cancel()

    async def _attempt(
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
                                raise _too_slow("the stream's first event")
                except TimeoutError:
                    raise httpx.ReadTimeout(f"no first event within {first:g} s") from None
                return opened.outcome(elapsed=self._clock.monotonic() - start)
            parts: list[bytes] = []
            size = 0
            cap = math.inf if response.is_success else ERROR_BODY_CAP
            async for part in response.aiter_bytes():
                parts.append(part)
                size += len(part)
                if size > cap:
                    break  # an error body is read for its message only
                if self._clock.monotonic() > end:
                    raise _too_slow("the answer")
            await response.aclose()
            return accept(
                response,
                b"".join(parts),
                stream=send.stream,
                elapsed=self._clock.monotonic() - start,
            )
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
