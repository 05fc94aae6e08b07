"""``Client``: the synchronous driver over the call flow (``AsyncClient`` is its twin,
``herdless._async_client``).

Every decision (retry, wait, breaker, budget, fallback, deadline) is made by the
sans-I/O ``CallFlow`` (``herdless._call.flow``), run by the loop of ``herdless._drive``.
A driver only says how it performs each action (its ``_Performer``): ``Send`` with
httpx, ``Sleep`` with the injected ``sleep``, ``SlotWait`` on a thread event, ``Race``
on worker threads; the flow's events go to ``on_event`` before every action, so a hook
hears of a wait before it starts. What both drivers share
(arguments, environment, request body, result building, hooks, ``with_options``, what
an answer or an httpx error becomes) lives below them (``herdless._base``,
``herdless._request``, ``herdless._outcomes``); what differs is the ``await``, and that
this one bounds its own sockets (``herdless._sockets``).
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Unpack, overload

import httpx

from herdless._actions import Ended, Outcome, Race, Send, SlotWait
from herdless._backend import Backend
from herdless._base import SyncHooks, _BaseClient, hooks_of, is_async_hook
from herdless._config import ChatOptions, ClientOptions
from herdless._drive import drive
from herdless._outcomes import Body, OpenStream, failure, stream_waits, too_slow
from herdless._parallel import SyncSends, Workers
from herdless._request import lean_headers, read_cookies_when_set
from herdless._sockets import AttemptLimit, bounded_http_client
from herdless._stream import Stream
from herdless._stream_state import StreamState
from herdless._types import ChatResult

if TYPE_CHECKING:
    from typing import Self

    from herdless._call.flow import CallFlow
    from herdless.events import Event

__all__ = ["Client"]

logger = logging.getLogger("herdless")


class _Performer:
    """How ``Client`` performs the actions of one call (``herdless._drive``)."""

    __slots__ = ("_client", "_flow", "_headers", "_hooked", "_sends")

    def __init__(self, client: Client, flow: CallFlow, headers: Mapping[str, str] | None) -> None:
        self._client = client
        self._flow = flow
        self._headers = headers
        self._hooked = bool(client._hooks)
        self._sends: SyncSends | None = None  # a hedge's race: its sends on worker threads

    def deliver(self) -> None:
        if self._hooked:
            self._client._dispatch(self._flow.take_events())

    def send(self, send: Send, /) -> Outcome:
        outcome = self._client._perform(send, self._headers)
        self._client._answered(self._flow, send, outcome)
        return outcome

    def sleep(self, seconds: float, /) -> None:
        self._client._sleep(seconds)

    def slot_wait(self, wait: SlotWait, /) -> None:
        woken = threading.Event()
        wait.listen(woken.set)
        woken.wait(wait.timeout)

    def race(self, race: Race, /) -> Ended | None:
        client = self._client
        if self._sends is None:
            perform = functools.partial(client._perform, headers=self._headers)
            self._sends = SyncSends(perform, client._workers, client._limit)
        ended = self._sends.race(race)
        if ended is not None:
            client._answered(self._flow, ended.send, ended.outcome)
        return ended

    def cancel(self) -> None:
        if self._sends is not None:
            self._sends.cancel()


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
        priority (str | None): the class of the client's calls, ``"interactive"``
            (default) or ``"batch"``; a call's ``priority=`` overrides it.
        llm_d_headers (bool): send llm-d's request headers beside herdless's own
            (default ``True``): ``x-llm-d-inference-fairness-id`` (the call's user:
            ``X-Herdless-User``, else the body's ``user``) and ``x-llm-d-inference-ttl``
            (a Go duration: the longest the attempt may wait in a queue and still be
            answered in time). An llm-d endpoint picker and a herdless gateway read both.
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
        if self._owns_http:
            read_cookies_when_set(self._http)
            lean_headers(self._http)

    @overload
    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        stream: Literal[False] = ...,
        **options: Unpack[ChatOptions],
    ) -> ChatResult: ...
    @overload
    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        stream: Literal[True],
        **options: Unpack[ChatOptions],
    ) -> Stream: ...
    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        stream: bool = False,
        **options: Unpack[ChatOptions],
    ) -> ChatResult | Stream:
        """Ask for a chat completion (``POST {base_url}/chat/completions``).

        Args:
            messages: the conversation, e.g. ``[{"role": "user", "content": "Hi"}]``.
            stream: return a ``Stream`` of chunks, once the first one arrived.
            **options: ``ChatOptions``: herdless's own, below, and the OpenAI and vLLM
                request fields herdless knows (``seed``, ``stop``, ``response_format``,
                ``tools``, ``tool_choice``, ``top_p``, ``n``, ``user``, ``logit_bias``,
                ``min_tokens``, ``ignore_eos``, ...), sent unchanged.

        Other Parameters:
            model (str | None): this call's model for the primary (a fallback keeps
                its own).
            max_tokens (int | None): the most tokens to generate.
            temperature (float | None): sampling temperature.
            deadline (float | None): seconds for this call, waits included (the
                client's by default); for a stream, until its first chunk.
            stream_deadline (float | None): seconds from this streamed call's start to
                the stream's end (the client's by default: none); past it the stream
                is closed and ``StreamDeadlineExceeded`` raised.
            allow_fallback (bool): ``False`` keeps the call off fallbacks (data guard).
            priority (Priority | None): ``"interactive"`` or ``"batch"`` (the client's
                by default), sent as ``X-Herdless-Priority``: a herdless gateway serves
                interactive work first, and answers a batch call it displaced with a 429
                and a time to come back (the call waits for it, spending no retry
                budget). A batch call never spills to an ``external`` fallback: it waits
                for the GPU, up to its deadline.
            extra_body (Mapping[str, Any] | None): request fields herdless does not
                know, sent unchanged (as openai-python's ``extra_body``).
            extra_headers (Mapping[str, str] | None): headers sent with every attempt of
                this call, to every backend it tries; not ``Authorization`` (each
                backend has its key) nor the headers herdless sets itself.

        Returns:
            A ``ChatResult``, or a ``Stream`` with ``stream=True``.

        Raises:
            TypeError: an unknown keyword argument (the message names the closest one).
            HerdlessError: a subclass saying what failed (``herdless.errors``).
        """
        flow, request_id, total, headers = self._start(messages, stream, options)
        accepted = drive(flow.run(), _Performer(self, flow, headers))
        if stream:
            state = StreamState(
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
                        raise too_slow("the stream's first event")
                return opened.outcome(elapsed=self._clock.monotonic() - start)
            body = Body(response, self._clock, end)
            for part in response.iter_bytes():
                if body.add(part):
                    break
            response.close()
            elapsed = self._clock.monotonic() - start
            return body.outcome(response, stream=send.stream, elapsed=elapsed)
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
