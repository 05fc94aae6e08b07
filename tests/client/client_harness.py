"""The harness for both clients: every scenario runs against ``Client`` and ``AsyncClient``.

The harness builds the client with a ``FakeClock``, an ``UpperRandom`` (jitter at its ceiling) and a
recorded ``sleep`` (which advances the fake clock), so waits are asserted exactly and
nothing sleeps. Backends are ``herdless.testing.MockBackend`` routes on a respx router.
``timeline`` interleaves the hook's events and the sleeps, to check that every wait is
announced before it starts.
"""

from __future__ import annotations

import random
from typing import Any

import httpx
import respx

import herdless
from herdless.events import Event
from herdless.testing import FakeClock, MockBackend

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
