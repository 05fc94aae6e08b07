"""``Client`` and ``AsyncClient``: two thin drivers over one call flow.

Every decision (retry, wait, breaker, budget, fallback, deadline) is made by the
sans-I/O ``CallFlow`` (``herdless._flow``). A driver only performs what the flow yields:
``Send`` with httpx, ``Sleep`` with the injected ``sleep``; it hands the flow's events to
``on_event`` after every step, so a hook hears of a wait before it starts. What both
drivers share (arguments, environment, request body, result building, hook dispatch)
lives in ``_BaseClient``; what differs is the ``await``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import threading
import time
import warnings
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Unpack, overload

import httpx

from herdless._actions import Accepted, Outcome, Send, Sleep, SlotWait
from herdless._backend import Backend
from herdless._clock import SYSTEM_CLOCK
from herdless._config import ClientConfig, ClientOptions
from herdless._flow import CallFlow
from herdless._state import ClientState
from herdless._stream import AsyncStream, Stream, _StreamState
from herdless._transport import (
    ERROR_BODY_CAP,
    Endpoints,
    OpenStream,
    accept,
    failure,
    stream_waits,
)
from herdless._types import ChatResult
from herdless._wire import Completion, build_body

if TYPE_CHECKING:
    from pathlib import Path
    from typing import Self

    from herdless._stats import ClientStats
    from herdless.events import Event

__all__ = ["AsyncClient", "Client"]

logger = logging.getLogger("herdless")


def _warn_unclosed(closed: list[bool], name: str) -> None:
    if not closed[0]:
        warnings.warn(
            f"{name} was not closed: use `with` / `async with`, or call close()",
            ResourceWarning,
            stacklevel=1,
        )


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


class _BaseClient:
    """Arguments, environment and everything per call that is not I/O."""

    def __init__(
        self,
        primary: str | Backend | Sequence[str | Backend] | None,
        on_event: Callable[[Event], Any] | None,
        options: ClientOptions,
    ) -> None:
        config = ClientConfig.build(primary, options)
        self._state = ClientState(
            config, clock=options.get("clock", SYSTEM_CLOCK), rng=options.get("rng")
        )
        self._clock = self._state.clock
        self._on_event = on_event
        self._state.keep_events = on_event is not None  # nobody to hand events to
        self._endpoints = Endpoints(config.backends, config.timeouts)
        # A shared flag, not self: the finalizer must not keep the client alive. It warns
        # when an open client is garbage-collected (a leak), not at interpreter exit, where
        # a module-level client that lives as long as the process is fine.
        self._closed = [False]
        finalizer = weakref.finalize(self, _warn_unclosed, self._closed, type(self).__name__)
        finalizer.atexit = False

    @property
    def config(self) -> ClientConfig:
        """What the client was configured with (frozen)."""
        return self._state.config

    @classmethod
    def from_env(cls, *, env_file: str | Path | None = ".env", **kwargs: Any) -> Self:
        """A client configured by ``HERDLESS_*`` variables (and ``env_file``); keyword
        arguments (``on_event=``, ``clock=``, ``fallback=``, ...) add to or override them.

        Raises:
            ConfigurationError: a variable is missing or malformed; ``.variable`` names it.
        """
        if "primary" in kwargs:
            raise TypeError("from_env() reads the primary from HERDLESS_PRIMARY_URL")
        # Client / AsyncClient take env_file among their options; this base does not.
        return cls(env_file=env_file, **kwargs)  # type: ignore[call-arg]

    def stats(self) -> ClientStats:
        """Counts by backend and outcome, fallbacks by reason, retries, waits, breaker
        states and latency percentiles, computed from this client's events."""
        return self._state.stats()

    def _start(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        model: str | None,
        max_tokens: int | None,
        temperature: float | None,
        stream: bool,
        deadline: float | None,
        allow_fallback: bool,
        extra: Mapping[str, Any],
    ) -> tuple[CallFlow, str]:
        """The call's flow and request id."""
        body = build_body(
            messages, max_tokens=max_tokens, temperature=temperature, stream=stream, extra=extra
        )
        # 128 random bits, as uuid4().hex without building a UUID (it shows in per-call CPU).
        request_id = os.urandom(16).hex()
        return CallFlow(
            self._state,
            request_id=request_id,
            body=body,
            model=model,
            stream=stream,
            deadline=deadline,
            allow_fallback=allow_fallback,
        ), request_id

    def _call_hook(self, event: Event) -> Any:
        """Run the hook on one event; a hook that raises is logged and never breaks the call."""
        try:
            return self._on_event(event) if self._on_event is not None else None
        except Exception:
            logger.exception("herdless on_event hook raised on %s", type(event).__name__)
            return None

    @staticmethod
    def _result(accepted: Accepted, request_id: str) -> ChatResult:
        completion: Completion = accepted.response.stream
        return ChatResult(
            content=completion.content,
            backend=accepted.backend.name,
            model=completion.model,
            usage=completion.usage,
            attempts=accepted.attempts,
            fallback_reason=accepted.fallback_reason,
            request_id=request_id,
            finish_reason=completion.finish_reason,
            raw=completion.raw,
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._state!r})"


class Client(_BaseClient):
    """A synchronous herdless client. Thread-safe: share one per process.

    Args:
        primary: the primary's API root (``"http://gateway:8080/v1"``), a ``Backend``, or
            several (each call picks the less busy of two). ``None`` reads the environment
            (``HERDLESS_*``, see ``from_env``) for everything not given.
        fallback: backends to fall back to, in order.
        model: the model asked of the primary.
        retry: retry, backoff and retry-budget policy.
        breaker: circuit-breaker policy (one breaker per backend, per client).
        deadline: seconds for a whole call, waits included (default 60).
        on_event: called with every event (``herdless.events``); must be a plain callable.
        timeouts: per-attempt limits for backends that set none.
        fallback_policy: when to leave a backend, where a call may not go.
        window: flow control: how many of this client's calls may be at one backend at
            once; the others wait in the client (``herdless.WindowPolicy``).
        pacing: a rate the client never exceeds toward each backend (off by default).
        clock: monotonic clock (a ``herdless.testing.FakeClock`` in tests).
        rng: random source for jitter (seeded in tests).
        sleep: how to wait (``time.sleep``; ``FakeClock.sleep`` in tests).
        http_client: an ``httpx.Client`` to send with (not closed by this client).
        transport: an httpx transport for the client's own ``httpx.Client``
            (``httpx.MockTransport`` in tests).
        env_file: the ``.env`` file read when configuring from the environment.

    >>> with Client(primary="http://127.0.0.1:8080/v1", model="gemma") as client:  # doctest: +SKIP
    ...     print(client.chat([{"role": "user", "content": "Hi"}]).content)

    Raises:
        TypeError: ``on_event`` is a coroutine function (use ``AsyncClient``).
        ConfigurationError: configured from the environment, and a variable is wrong.
        ValueError: an argument is out of range.
    """

    def __init__(
        self,
        primary: str | Backend | Sequence[str | Backend] | None = None,
        *,
        on_event: Callable[[Event], None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        http_client: httpx.Client | None = None,
        transport: httpx.BaseTransport | None = None,
        **options: Unpack[ClientOptions],
    ) -> None:
        if on_event is not None and (
            inspect.iscoroutinefunction(on_event)
            or inspect.iscoroutinefunction(getattr(on_event, "__call__", None))  # noqa: B004
        ):
            raise TypeError(
                "Client needs a plain on_event callable; use AsyncClient for async hooks"
            )
        super().__init__(primary, on_event, options)
        self._sleep = sleep
        self._owns_http = http_client is None
        self._http = http_client or httpx.Client(transport=transport)

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
        allow_fallback: bool = ...,
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
        allow_fallback: bool = ...,
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
        allow_fallback: bool = True,
        **extra: Any,
    ) -> ChatResult | Stream:
        """Ask for a chat completion (``POST {base_url}/chat/completions``).

        Args:
            messages: the conversation, e.g. ``[{"role": "user", "content": "Hi"}]``.
            model: this call's model for the primary (a fallback keeps its own).
            max_tokens: the most tokens to generate.
            temperature: sampling temperature.
            stream: return a ``Stream`` of chunks, once the first one arrived.
            deadline: seconds for this call, waits included (the client's by default).
            allow_fallback: ``False`` keeps the call off fallbacks (data guard).
            **extra: other OpenAI fields (``seed``, ``stop``, ``response_format``, ...),
                sent unchanged.

        Returns:
            A ``ChatResult``, or a ``Stream`` with ``stream=True``.

        Raises:
            HerdlessError: a subclass saying what failed (``herdless.errors``).
        """
        flow, request_id = self._start(
            messages,
            model=model,
            max_tokens=max_tokens,
            temperature=temperature,
            stream=stream,
            deadline=deadline,
            allow_fallback=allow_fallback,
            extra=extra,
        )
        steps = flow.run()
        hooked = self._on_event is not None
        try:
            action = next(steps)
            while True:
                if hooked:
                    self._dispatch(flow.take_events())
                if isinstance(action, Sleep):
                    self._sleep(action.seconds)
                    action = steps.send(None)
                elif isinstance(action, SlotWait):
                    woken = threading.Event()
                    action.listen(woken.set)
                    woken.wait(action.timeout)
                    action = steps.send(None)
                else:
                    action = steps.send(self._perform(action))
        except StopIteration as stop:
            accepted: Accepted = stop.value
        finally:
            steps.close()  # the driver stopped early (KeyboardInterrupt): free what the flow holds
            if hooked:
                self._dispatch(flow.take_events())
        if stream:
            return Stream(_StreamState(flow, accepted, request_id), self._dispatch)
        return self._result(accepted, request_id)

    def _perform(self, send: Send) -> Outcome:
        start = self._clock.monotonic()
        response = None
        try:
            request = self._endpoints.request(self._http, send, own=self._owns_http)
            response = self._http.send(request, stream=True)
            if send.stream and response.is_success:
                opened = OpenStream(response, response.iter_bytes())
                while not opened.feed(next(opened.raw)):
                    pass
                return opened.outcome(elapsed=self._clock.monotonic() - start)
            if response.is_success:
                body = response.read()  # the whole answer; read() closes the response
            else:
                body = b""
                for part in response.iter_bytes():
                    body += part
                    if len(body) > ERROR_BODY_CAP:  # an error body is read for its message only
                        break
                response.close()
            return accept(
                response, body, stream=send.stream, elapsed=self._clock.monotonic() - start
            )
        except (httpx.RequestError, ValueError, StopIteration) as exc:
            if response is not None:
                response.close()
            return failure(exc, elapsed=self._clock.monotonic() - start)

    def _dispatch(self, events: list[Event]) -> None:
        for event in events:
            result = self._call_hook(event)
            if inspect.iscoroutine(result):  # a lambda returning a coroutine slipped through
                result.close()
                logger.error("herdless on_event hook returned an awaitable; use AsyncClient")

    def close(self) -> None:
        """Close the connections (idempotent)."""
        self._closed[0] = True
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class AsyncClient(_BaseClient):
    """An asyncio herdless client; the arguments are ``Client``'s, except that ``on_event``
    may also be a coroutine function, ``sleep`` is awaited (``asyncio.sleep``;
    ``FakeClock.asleep`` in tests), and ``http_client`` / ``transport`` are async.

    >>> async with AsyncClient(primary="http://127.0.0.1:8080/v1") as client:  # doctest: +SKIP
    ...     result = await client.chat([{"role": "user", "content": "Hi"}])
    """

    def __init__(
        self,
        primary: str | Backend | Sequence[str | Backend] | None = None,
        *,
        on_event: Callable[[Event], Awaitable[None] | None] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        http_client: httpx.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        **options: Unpack[ClientOptions],
    ) -> None:
        super().__init__(primary, on_event, options)
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
        allow_fallback: bool = ...,
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
        allow_fallback: bool = ...,
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
        allow_fallback: bool = True,
        **extra: Any,
    ) -> ChatResult | AsyncStream:
        """Ask for a chat completion; see ``Client.chat``."""
        flow, request_id = self._start(
            messages,
            model=model,
            max_tokens=max_tokens,
            temperature=temperature,
            stream=stream,
            deadline=deadline,
            allow_fallback=allow_fallback,
            extra=extra,
        )
        steps = flow.run()
        hooked = self._on_event is not None
        try:
            action = next(steps)
            while True:
                if hooked:
                    await self._dispatch(flow.take_events())
                if isinstance(action, Sleep):
                    await self._sleep(action.seconds)
                    action = steps.send(None)
                elif isinstance(action, SlotWait):
                    await _slot_wait(action)
                    action = steps.send(None)
                else:
                    action = steps.send(await self._perform(action))
        except StopIteration as stop:
            accepted: Accepted = stop.value
        finally:
            steps.close()  # cancelled mid-call: free what the flow holds
            if hooked:
                await self._dispatch(flow.take_events())
        if stream:
            return AsyncStream(_StreamState(flow, accepted, request_id), self._dispatch)
        return self._result(accepted, request_id)

    async def _perform(self, send: Send) -> Outcome:
        start = self._clock.monotonic()
        limit = send.timeouts.first_byte
        # The whole attempt (pool wait, connect, send, first answer) within the time the
        # flow gave it: httpx's limits are per operation, and under load their sum (a
        # crowded pool, then a slow connect, then the read) outlasted the deadline.
        # asyncio.timeout's rule on a bare loop timer: its context manager doubled the
        # timer's cost, about 1 % of an async call's CPU (herdless.bench.sdk_overhead).
        task = asyncio.current_task()
        if task is None:  # not in a task (a bare coroutine driven by hand): no timer
            return await self._attempt(send, start)
        loop = asyncio.get_running_loop()
        cancelling = task.cancelling()
        fired: list[bool] = []
        timer = loop.call_at(loop.time() + limit, _expire, task, fired)
        try:
            return await self._attempt(send, start)
        except asyncio.CancelledError:
            # Ours, unless someone else cancelled the task too: then theirs wins.
            if fired and task.uncancel() <= cancelling:
                timeout = httpx.ReadTimeout(f"no answer within {limit:g} s")
                return failure(timeout, elapsed=self._clock.monotonic() - start)
            raise
        finally:
            timer.cancel()

    async def _attempt(self, send: Send, start: float) -> Outcome:
        response = None
        try:
            request = self._endpoints.request(self._http, send, own=self._owns_http)
            response = await self._http.send(request, stream=True)
            if send.stream and response.is_success:
                first, idle = stream_waits(response, send.timeouts)
                opened = OpenStream(response, response.aiter_bytes(), idle=idle)
                try:
                    async with asyncio.timeout(first):
                        while not opened.feed(await anext(opened.raw)):
                            pass
                except TimeoutError:
                    raise httpx.ReadTimeout(f"no first event within {first:g} s") from None
                return opened.outcome(elapsed=self._clock.monotonic() - start)
            if response.is_success:
                body = await response.aread()  # the whole answer; aread() closes the response
            else:
                body = b""
                async for part in response.aiter_bytes():
                    body += part
                    if len(body) > ERROR_BODY_CAP:  # an error body is read for its message only
                        break
                await response.aclose()
            return accept(
                response, body, stream=send.stream, elapsed=self._clock.monotonic() - start
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
            result = self._call_hook(event)
            if inspect.isawaitable(result):
                try:
                    await result
                except Exception:
                    logger.exception("herdless on_event hook raised on %s", type(event).__name__)

    async def aclose(self) -> None:
        """Close the connections (idempotent)."""
        self._closed[0] = True
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
