"""The harness for both clients: every scenario runs against ``Client`` and ``AsyncClient``.

The harness builds the client with a ``FakeClock``, an ``UpperRandom`` (jitter at its ceiling) and a
recorded ``sleep`` (which advances the fake clock), so waits are asserted exactly and
nothing sleeps. Backends are ``herdless.testing.MockBackend`` routes on a respx router.
``timeline`` interleaves the hook's events and the sleeps, to check that every wait is
announced before it starts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import respx

import herdless
from herdless.events import Event
from herdless.testing import FakeClock, MockBackend, Reply

PRIMARY = "http://gpu.test/v1"
HOSTED = "https://hosted.test/v1"
KEY = "sk-primary-SECRET-0123456789"
HOSTED_KEY = "sk-hosted-SECRET-9876543210"
MESSAGES = [{"role": "user", "content": "Hello?"}]


class UpperRandom(random.Random):
    """``uniform`` returns its upper bound: every jittered wait is its ceiling, exactly."""

    def uniform(self, a: float, b: float) -> float:
        return b


class Harness:
    """Builds one client of ``kind`` and calls it the same way for both kinds."""

    def __init__(self, kind: str, router: respx.MockRouter) -> None:
        self.kind = kind
        self.router = router
        self.clock = FakeClock()
        self.sleeps: list[float] = []
        self.events: list[Event] = []
        self.timeline: list[Any] = []  # events and ("sleep", seconds), in order
        self.primary = MockBackend(router, PRIMARY, model="gemma")
        self.hosted = MockBackend(router, HOSTED, model="gpt-mini")
        self.client: Any = None

    def hosted_backend(self, *, external: bool = True) -> herdless.Backend:
        return herdless.Backend(
            name="hosted", base_url=HOSTED, api_key=HOSTED_KEY, model="gpt-mini", external=external
        )

    def _record(self, event: Event) -> None:
        self.events.append(event)
        self.timeline.append(event)

    def _sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.timeline.append(("sleep", seconds))
        self.clock.advance(seconds)

    async def _asleep(self, seconds: float) -> None:
        self._sleep(seconds)

    def build(self, **kwargs: Any) -> Any:
        """The client, with the fakes injected; ``kwargs`` override the defaults."""
        options: dict[str, Any] = {
            "primary": herdless.Backend(name="primary", base_url=PRIMARY, api_key=KEY),
            "model": "gemma",
            "clock": self.clock,
            "rng": UpperRandom(),
            "on_event": self._record,
        }
        options.update(kwargs)
        transport = httpx.MockTransport(self.router.handler)
        if self.kind == "sync":
            self.client = herdless.Client(sleep=self._sleep, transport=transport, **options)
        else:
            self.client = herdless.AsyncClient(sleep=self._asleep, transport=transport, **options)
        return self.client

    async def chat(self, **kwargs: Any) -> Any:
        """``client.chat(MESSAGES, **kwargs)``, awaited for the async client."""
        if self.client is None:
            self.build()
        messages = kwargs.pop("messages", MESSAGES)
        if self.kind == "sync":
            return self.client.chat(messages, **kwargs)
        return await self.client.chat(messages, **kwargs)

    async def stream(self, **kwargs: Any) -> tuple[Any, list[herdless.Chunk]]:
        """A streamed call read to its end inside its context manager: (stream, chunks)."""
        stream = await self.chat(stream=True, **kwargs)
        chunks: list[herdless.Chunk] = []
        if self.kind == "sync":
            with stream:
                chunks.extend(stream)
        else:
            async with stream:
                chunks.extend([chunk async for chunk in stream])
        return stream, chunks

    async def close(self) -> None:
        if self.client is None:
            return
        if self.kind == "sync":
            self.client.close()
        else:
            await self.client.aclose()

    def sleeps_announced(self) -> bool:
        """Whether each sleep follows an event that announced exactly that delay."""
        for index, item in enumerate(self.timeline):
            if isinstance(item, tuple):
                before = self.timeline[index - 1] if index else None
                if getattr(before, "delay", None) != item[1]:
                    return False
        return True


@dataclass(frozen=True)
class Scenario:
    """One row: the scripts, the call, and what the caller must see."""

    id: str
    primary: tuple[Reply, ...]
    hosted: tuple[Reply, ...] | None = None  # None: no fallback configured
    call: dict[str, Any] = field(default_factory=dict)
    # expectations
    backend: str | None = "primary"  # who answered; None when the call raises
    error: type[herdless.HerdlessError] | None = None
    primary_requests: int = 1
    hosted_requests: int = 0
    sleeps: tuple[float, ...] = ()
    fallback_reason: str | None = None
    attempt_kinds: tuple[str, ...] | None = None
    server_message: str | None = None  # the raised error's, when it is a status error


async def run_scenario(harness: Harness, case: Scenario) -> None:
    """Run one row of a scenario table against ``harness``'s client, and check it."""
    harness.primary.script(*case.primary)
    options: dict[str, Any] = {}
    if case.hosted is not None:
        harness.hosted.script(*case.hosted)
        options["fallback"] = harness.hosted_backend()
    harness.build(**options)

    if case.error is not None:
        with pytest.raises(case.error) as caught:
            await harness.chat(**case.call)
        error = caught.value
        assert error.request_id is not None
        assert len(error.attempts) >= 1
        text = str(error)
        assert KEY not in text
        assert HOSTED_KEY not in text
        assert error.request_id in text
        if case.server_message is not None:
            assert getattr(error, "server_message", None) == case.server_message
    else:
        result = await harness.chat(**case.call)
        assert result.backend == case.backend
        assert result.fallback_reason == case.fallback_reason
        if case.attempt_kinds is not None:
            assert tuple(a.kind for a in result.attempts) == case.attempt_kinds
        assert result.attempts[-1].kind == "ok"
        assert [a.waited for a in result.attempts if a.waited] == list(case.sleeps)

    if case.primary_requests >= 0:
        assert len(harness.primary.requests) == case.primary_requests
    if case.hosted_requests >= 0:
        assert len(harness.hosted.requests) == case.hosted_requests
    if case.error is None or case.sleeps:
        assert harness.sleeps == list(case.sleeps)
    assert harness.sleeps_announced()
