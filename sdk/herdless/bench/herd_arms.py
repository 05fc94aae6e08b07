"""The herd scenario's client arms: the same logical request, five ways of retrying it.

Each arm builds, per run, a ``call()`` coroutine function that makes one logical
chat request and returns when it succeeded, or raises when the arm gives up.
Every arm retries 429 and 503 and nothing else, and is given the same
``give_up`` time budget where it has no stopping rule of its own:

- ``naive``: a fixed 1 s pause between attempts (the loop people write first).
- ``exp-no-jitter``: 1, 2, 4, ... 32 s, no randomness (backoff without jitter).
- ``openai``: the official ``openai`` client with its defaults (2 retries, 0.5 s
  doubling to 8 s minus up to 25 %, Retry-After obeyed exactly up to 2 min).
- ``tenacity``: the OpenAI cookbook's recipe, ``wait_random_exponential(min=1,
  max=60)`` and ``stop_after_attempt(6)``, around the openai client with its
  own retries off (as the cookbook does).
- ``herdless``: ``herdless.AsyncClient`` with its defaults, one client per caller
  (independent callers: nobody shares a gate or a budget but the server).

The openai client and tenacity draw from the module-level ``random``; the
scenario seeds it per run so that a run is reproducible.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

import httpx

from herdless.bench.herd_server import HerdServer
from herdless.bench.runner import GaveUp, cookbook_call
from herdless.bench.vtime import VirtualClock

__all__ = ["ARMS", "CallFactory"]

Call = Callable[[], Awaitable[None]]
CallFactory = Callable[[HerdServer, int, float], Call]
"""``(server, seed, give_up seconds) -> call``; built inside the running loop."""

_URL = "http://herd.bench/v1"
_MESSAGES = [{"role": "user", "content": "Summarise the meeting notes, please."}]
_BODY = {"model": "herd", "messages": _MESSAGES, "max_tokens": 16}
_RETRY = frozenset({429, 503})


def _fixed_schedule(delays: Callable[[int], float]) -> CallFactory:
    """An arm written by hand: retry 429/503 after ``delays(n)`` until ``give_up``."""

    def factory(server: HerdServer, seed: int, give_up: float) -> Call:
        client = httpx.AsyncClient(transport=server.transport(httpx))
        loop = asyncio.get_running_loop()

        async def call() -> None:
            start = loop.time()
            n = 0
            while True:
                response = await client.post(f"{_URL}/chat/completions", json=_BODY)
                if response.status_code == 200:
                    return
                if response.status_code not in _RETRY:
                    raise GaveUp(f"status {response.status_code}")
                delay = delays(n)
                if loop.time() + delay - start > give_up:
                    raise GaveUp("out of time")
                n += 1
                await asyncio.sleep(delay)

        return call

    return factory


def _openai(server: HerdServer, seed: int, give_up: float) -> Call:
    import httpx2  # lazy: the openai client's own httpx; only this arm needs it
    import openai  # lazy: optional: only the bench imports it

    client = openai.AsyncOpenAI(
        api_key="bench",
        base_url=_URL,
        http_client=httpx2.AsyncClient(transport=server.transport(httpx2)),
    )

    async def call() -> None:
        try:
            await client.chat.completions.create(model="herd", messages=_MESSAGES, max_tokens=16)  # type: ignore[arg-type]  # a plain dict, not the SDK TypedDict
        except openai.APIStatusError as exc:
            raise GaveUp(f"status {exc.status_code}") from exc

    return call


def _tenacity(server: HerdServer, seed: int, give_up: float) -> Call:
    import httpx2  # lazy: see _openai
    import openai

    client = openai.AsyncOpenAI(
        api_key="bench",
        base_url=_URL,
        max_retries=0,
        http_client=httpx2.AsyncClient(transport=server.transport(httpx2)),
    )

    async def send() -> None:
        await client.chat.completions.create(model="herd", messages=_MESSAGES, max_tokens=16)  # type: ignore[arg-type]  # a plain dict, not the SDK TypedDict

    return cookbook_call(send)


def _herdless(server: HerdServer, seed: int, give_up: float) -> Call:
    import herdless  # lazy: keeps this module importable while the SDK grows

    loop = asyncio.get_running_loop()
    clock = VirtualClock(loop)
    callers = 0

    async def call() -> None:
        nonlocal callers
        callers += 1
        async with herdless.AsyncClient(
            primary=herdless.Backend(name="gateway", base_url=_URL, model="herd"),
            transport=server.transport(httpx),
            clock=clock,
            rng=random.Random(seed * 1_000_003 + callers),
            sleep=asyncio.sleep,
            deadline=give_up,
        ) as client:
            try:
                await client.chat(_MESSAGES, max_tokens=16)
            except herdless.HerdlessError as exc:
                raise GaveUp(type(exc).__name__) from exc

    return call


ARMS: dict[str, CallFactory] = {
    "naive": _fixed_schedule(lambda n: 1.0),
    "exp-no-jitter": _fixed_schedule(lambda n: min(32.0, 2.0**n)),
    "openai": _openai,
    "tenacity": _tenacity,
    "herdless": _herdless,
}
"""Arms in table order; the no-jitter arm is the baseline of the attempts ratio."""
