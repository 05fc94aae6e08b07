"""Hedged requests through both clients (``client_kind``): two sends at once, the first
answer wins, the loser is closed.

The rules themselves are tested in fake time in ``tests/unit/test_hedge.py``; here the
drivers' part: running the hedge beside the late attempt, taking the first answer and
closing the other. A "late" backend here is one whose answer is *held* until the test
releases it (or the client cancels it), so who wins never depends on timing: the hedge
delay is a real ``AFTER`` seconds (a race's timer is real time in both drivers, as a
``SlotWait``'s), and only lower bounds are asserted on it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest
from tests.client.client_harness import HOSTED, MESSAGES, PRIMARY, UpperRandom

import herdless
from herdless.events import AttemptFailed, Event, HedgeFinished, HedgeStarted
from herdless.testing import FakeClock, ok, server_error, stream

AFTER = 0.05  # seconds: the hedge delay in these tests (real time)
HELD_FOR = 10.0  # seconds a held answer waits at most (a safety net: tests release it)


class Held:
    """One backend's answer, held until ``release()`` (or the client cancels it).

    ``kind`` decides how it waits (a thread's event, or the loop's); ``head_first``
    sends the response head at once and holds the body's first chunk (as vLLM does for a
    stream, whose first event waits for the first token); ``tail`` sends the first chunk
    at once and holds the rest.
    """

    def __init__(
        self,
        kind: str,
        reply: Callable[[httpx.Request], httpx.Response],
        *,
        hold: str = "answer",
        on_enter: Callable[[], None] | None = None,
    ) -> None:
        self.kind = kind
        self.reply = reply
        self.hold = hold  # "answer", "first_chunk", "tail" or "nothing"
        self.on_enter = on_enter
        self.requests: list[httpx.Request] = []
        self.times: list[float] = []
        self.cancelled = False  # the client gave up while it was held (async)
        self.closed = threading.Event()  # its response body was closed
        self._thread_event = threading.Event()
        self._loop_event = asyncio.Event()

    def release(self) -> None:
        self._thread_event.set()
        self._loop_event.set()

    def release_soon(self, seconds: float) -> None:
        """Release from elsewhere after ``seconds`` (while the test's thread is blocked)."""
        if self.kind == "sync":
            threading.Timer(seconds, self.release).start()
        else:
            asyncio.get_running_loop().call_later(seconds, self.release)

    def _enter(self, request: httpx.Request) -> None:
        self.requests.append(request)
        self.times.append(time.monotonic())
        if self.on_enter is not None:
            self.on_enter()

    def answer(self, request: httpx.Request) -> httpx.Response:  # sync
        self._enter(request)
        if self.hold == "answer":
            self._thread_event.wait(HELD_FOR)
        return self._wrap(self.reply(request))

    async def aanswer(self, request: httpx.Request) -> httpx.Response:
        self._enter(request)
        if self.hold == "answer":
            try:
                await asyncio.wait_for(self._loop_event.wait(), HELD_FOR)
            except asyncio.CancelledError:
                self.cancelled = True
                raise
        return self._wrap(self.reply(request))

    def _wrap(self, response: httpx.Response) -> httpx.Response:
        if self.hold not in ("first_chunk", "tail"):
            return response
        body = response.read()
        events = [event + b"\n\n" for event in body.split(b"\n\n") if event]
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_HeldBody(self, events),
        )


class _HeldBody(httpx.SyncByteStream, httpx.AsyncByteStream):
    """SSE events with a hold before the first (``first_chunk``) or the second (``tail``)."""

    def __init__(self, held: Held, events: list[bytes]) -> None:
        self.held = held
        self.events = events
        self.at = 0 if held.hold == "first_chunk" else 1

    def __iter__(self) -> Iterator[bytes]:
        for index, event in enumerate(self.events):
            if index == self.at:
                self.held._thread_event.wait(HELD_FOR)
            yield event

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for index, event in enumerate(self.events):
            if index == self.at:
                try:
                    await asyncio.wait_for(self.held._loop_event.wait(), HELD_FOR)
                except asyncio.CancelledError:
                    self.held.cancelled = True
                    raise
            yield event

    def close(self) -> None:
        self.held.closed.set()

    async def aclose(self) -> None:
        self.held.closed.set()


class Rig:
    """A client of ``kind`` with a primary and a hosted fallback, each a ``Held``."""

    def __init__(self, kind: str, primary: Held, hosted: Held, **options: Any) -> None:
        self.kind = kind
        self.primary = primary
        self.hosted = hosted
        self.events: list[Event] = []
        self.hooks: list[Callable[[Event], None]] = []

        def record(event: Event) -> None:
            self.events.append(event)
            for hook in self.hooks:
                hook(event)

        settings: dict[str, Any] = {
            "primary": herdless.Backend(name="primary", base_url=PRIMARY),
            "fallback": herdless.Backend(
                name="hosted", base_url=HOSTED, model="gpt-mini", external=True
            ),
            "model": "gemma",
            "clock": FakeClock(),
            "rng": UpperRandom(),
            "on_event": record,
            "hedge": herdless.HedgePolicy(after=AFTER),
            **options,
        }
        if kind == "sync":
            transport = httpx.MockTransport(self._answer)
            self.client: Any = herdless.Client(transport=transport, **settings)
        else:
            transport = httpx.MockTransport(self._aanswer)
            self.client = herdless.AsyncClient(transport=transport, **settings)

    def _backend(self, request: httpx.Request) -> Held:
        return self.primary if request.url.host == "gpu.test" else self.hosted

    def _answer(self, request: httpx.Request) -> httpx.Response:
        return self._backend(request).answer(request)

    async def _aanswer(self, request: httpx.Request) -> httpx.Response:
        return await self._backend(request).aanswer(request)

    async def chat(self, **kwargs: Any) -> Any:
        if self.kind == "sync":
            return self.client.chat(MESSAGES, **kwargs)
        return await self.client.chat(MESSAGES, **kwargs)

    async def read(self, result: Any) -> str:
        """A stream's text, read to its end inside its context manager."""
        if self.kind == "sync":
            with result:
                return "".join(chunk.content for chunk in result)
        async with result:
            return "".join([chunk.content async for chunk in result])

    async def close(self) -> None:
        self.primary.release()
        self.hosted.release()
        if self.kind == "sync":
            self.client.close()
        else:
            await self.client.aclose()

    def of(self, kind: type[Event]) -> list[Any]:
        return [event for event in self.events if isinstance(event, kind)]


@pytest.fixture
async def rigs() -> AsyncIterator[list[Rig]]:
    made: list[Rig] = []
    yield made
    for rig in made:
        await rig.close()


def _rig(made: list[Rig], kind: str, primary: Held, hosted: Held, **options: Any) -> Rig:
    rig = Rig(kind, primary, hosted, **options)
    made.append(rig)
    return rig


def _closed_soon(held: Held) -> bool:
    """Whether ``held``'s body gets closed (a sync loser is closed when its thread gets
    the answer it was blocked on: released here)."""
    held.release()
    return held.closed.wait(5.0)


async def test_a_late_primary_is_hedged_and_the_hedge_answers(
    client_kind: str, rigs: list[Rig]
) -> None:
    primary = Held(client_kind, ok("from the gpu"))
    hosted = Held(client_kind, ok("from hosted"), hold="nothing")
    rig = _rig(rigs, client_kind, primary, hosted)
    result = await rig.chat()
    assert (result.content, result.backend, result.fallback_reason) == (
        "from hosted",
        "hosted",
        "hedge",
    )
    assert [(a.backend, a.kind) for a in result.attempts] == [
        ("primary", "cancelled"),
        ("hosted", "ok"),
    ]
    # The hedge went out only after the delay, with the call's id and its own attempt.
    assert hosted.times[0] - primary.times[0] >= AFTER - 1e-3
    first, second = primary.requests[0], hosted.requests[0]
    assert first.headers["x-request-id"] == second.headers["x-request-id"]
    assert (first.headers["x-herdless-attempt"], second.headers["x-herdless-attempt"]) == ("1", "2")
    (started,) = rig.of(HedgeStarted)
    assert (started.backend, started.from_backend) == ("hosted", "primary")
    (finished,) = rig.of(HedgeFinished)
    assert (finished.winner, finished.loser_cancelled) == ("hosted", True)
    stats = rig.client.stats()
    assert (stats.hedges, stats.hedge_wins) == ({"hosted": 1}, {"hosted": 1})
    if client_kind == "async":
        assert primary.cancelled  # its request was cancelled when the hedge answered


async def test_a_primary_that_answers_in_time_is_not_hedged(
    client_kind: str, rigs: list[Rig]
) -> None:
    primary = Held(client_kind, ok("fast"), hold="nothing")
    hosted = Held(client_kind, ok())
    rig = _rig(rigs, client_kind, primary, hosted, hedge=herdless.HedgePolicy(after=30.0))
    result = await rig.chat()
    assert (result.content, result.backend) == ("fast", "primary")
    assert hosted.requests == []
    assert rig.of(HedgeStarted) == []


async def test_the_primary_wins_when_it_answers_first_and_the_hedge_is_closed(
    client_kind: str, rigs: list[Rig]
) -> None:
    primary = Held(client_kind, ok("from the gpu"))
    # The hedge's arrival lets the primary answer; the hedge itself stays held.
    hosted = Held(client_kind, stream(["late"]), hold="first_chunk", on_enter=primary.release)
    rig = _rig(rigs, client_kind, primary, hosted)
    result = await rig.chat()
    assert (result.content, result.backend, result.fallback_reason) == (
        "from the gpu",
        "primary",
        None,
    )
    (finished,) = rig.of(HedgeFinished)
    assert (finished.winner, finished.loser_cancelled) == ("primary", True)
    assert [(a.backend, a.kind) for a in result.attempts] == [
        ("hosted", "cancelled"),
        ("primary", "ok"),
    ]
    assert rig.client.stats().hedge_wins == {"primary": 1}
    if client_kind == "async":
        assert hosted.cancelled
    else:
        assert _closed_soon(hosted)


async def test_a_failed_hedge_leaves_the_call_waiting_for_the_primary(
    client_kind: str, rigs: list[Rig]
) -> None:
    primary = Held(client_kind, ok("from the gpu"))
    hosted = Held(client_kind, server_error(500), hold="nothing")
    rig = _rig(rigs, client_kind, primary, hosted)

    def release_on_the_hedges_failure(event: Event) -> None:
        if isinstance(event, AttemptFailed) and event.backend == "hosted":
            primary.release()

    rig.hooks.append(release_on_the_hedges_failure)
    result = await rig.chat()
    assert (result.content, result.backend) == ("from the gpu", "primary")
    assert [(a.backend, a.kind, a.status) for a in result.attempts] == [
        ("hosted", "status", 500),
        ("primary", "ok", 200),
    ]
    (finished,) = rig.of(HedgeFinished)
    assert (finished.winner, finished.loser_cancelled) == ("primary", False)


async def test_a_stream_whose_first_chunk_is_late_is_won_by_its_hedge(
    client_kind: str, rigs: list[Rig]
) -> None:
    primary = Held(client_kind, stream(["gpu"]), hold="first_chunk")
    hosted = Held(client_kind, stream(["hosted", " text"]), hold="nothing")
    rig = _rig(rigs, client_kind, primary, hosted)
    result = await rig.chat(stream=True)
    assert (result.backend, result.fallback_reason) == ("hosted", "hedge")
    assert await rig.read(result) == "hosted text"
    # The late stream was closed: at once (async), or when its thread got its first
    # chunk (sync, with a transport that cannot be interrupted).
    if client_kind == "async":
        assert primary.closed.is_set()
    else:
        assert _closed_soon(primary)
    assert rig.client.stats().succeeded == 1


async def test_a_stream_whose_first_chunk_came_in_time_is_never_hedged(
    client_kind: str, rigs: list[Rig]
) -> None:
    primary = Held(client_kind, stream(["first", " rest"]), hold="tail")
    hosted = Held(client_kind, stream(["hosted"]))
    rig = _rig(rigs, client_kind, primary, hosted)
    result = await rig.chat(stream=True)
    assert result.backend == "primary"  # accepted at its first chunk
    primary.release_soon(4 * AFTER)  # the rest comes slowly: no race any more
    assert await rig.read(result) == "first rest"
    assert hosted.requests == []
    assert rig.of(HedgeStarted) == []


async def test_a_call_that_keeps_its_data_in_is_never_hedged_to_an_external_backend(
    client_kind: str, rigs: list[Rig]
) -> None:
    primary = Held(client_kind, ok("from the gpu"))
    hosted = Held(client_kind, ok(), hold="nothing")
    rig = _rig(rigs, client_kind, primary, hosted)
    primary.release_soon(4 * AFTER)
    result = await rig.chat(allow_fallback=False)
    assert result.backend == "primary"
    assert hosted.requests == []


class _Interrupted(BaseException):
    """The caller stopped (a signal in the caller's thread, a cancelled task)."""


async def test_a_caller_that_leaves_mid_race_closes_both_and_frees_their_slots(
    client_kind: str, rigs: list[Rig]
) -> None:
    racing, racing_now = asyncio.Event(), threading.Event()  # the hedge's request is in

    def both_run() -> None:
        racing.set()
        racing_now.set()

    primary = Held(client_kind, stream(["gpu"]), hold="first_chunk")
    hosted = Held(client_kind, stream(["hosted"]), hold="first_chunk", on_enter=both_run)
    rig = _rig(rigs, client_kind, primary, hosted)
    state = rig.client._state
    if client_kind == "async":
        task = asyncio.ensure_future(rig.chat(stream=True))
        await racing.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert primary.closed.is_set()
        assert hosted.closed.is_set()
    else:
        # The caller's thread leaves the race by an exception while both sends run: here
        # the hedge's send raises one (a BaseException, as KeyboardInterrupt is) the
        # moment it reaches the backend, and the driver raises it in the caller's thread.
        # Deterministic, unlike a signal, whose moment of delivery a busy machine decides.
        def leave() -> None:
            raise _Interrupted

        hosted.on_enter = leave
        with pytest.raises(_Interrupted):
            await rig.chat(stream=True)
        assert _closed_soon(primary)  # the primary's send was cancelled and closed
    backends = rig.client.config.backends
    assert [state.window(backend).in_use for backend in backends] == [0, 0]
    assert rig.client.stats().hedges == {"hosted": 1}
