"""The ``shared`` scenario's arms: how each client sends a crowd of chats.

The official openai client with its defaults (one client shared, or one per caller), the
OpenAI cookbook's tenacity recipe, a naive loop (a fixed 1 s pause), and herdless's
``AsyncClient`` (shared, or per caller). Every HTTP request an arm sends is noted
(``sent``), so that the scenario counts attempts per call the same way for all.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from herdless.bench.runner import GaveUp, cookbook_call

__all__ = ["GIVE_UP", "MESSAGES", "Call", "Crowd", "arms", "chat_body"]

MESSAGES = [{"role": "user", "content": "Summarise the meeting notes, please."}]
GIVE_UP = 120.0  # seconds an arm without a stopping rule of its own keeps trying

Call = Callable[[], Awaitable[None]]
"""One logical chat; returns when answered, raises ``GaveUp`` when its arm gave up."""
Crowd = Callable[[str, int, list[float]], Awaitable[list[Call]]]
"""``(base_url, n, sent) -> n calls``; every HTTP request they send appends its time to
``sent`` (``time.monotonic()``)."""


def _counting(sent: list[float]) -> dict[str, list[Callable[[Any], Awaitable[None]]]]:
    """httpx (or httpx2) event hooks that note when every request is sent."""

    async def count(request: Any) -> None:
        sent.append(time.monotonic())

    return {"request": [count]}


def chat_body(model: str, tokens: int) -> dict[str, Any]:
    """A chat request of ``tokens`` tokens (``ignore_eos``: every answer is that long)."""
    return {"model": model, "messages": MESSAGES, "max_tokens": tokens, "ignore_eos": True}


async def _openai_crowd(
    url: str, n: int, sent: list[float], *, shared: bool, model: str, tokens: int
) -> list[Call]:
    import httpx2  # lazy: the openai client's own httpx
    import openai

    def make() -> Any:
        http = httpx2.AsyncClient(event_hooks=_counting(sent), timeout=600)
        return openai.AsyncOpenAI(api_key="bench", base_url=url, http_client=http)

    one = make() if shared else None

    async def call() -> None:
        client = one or make()
        try:
            await client.chat.completions.create(
                model=model,
                messages=MESSAGES,
                max_tokens=tokens,
                extra_body={"ignore_eos": True},
            )
        except openai.APIStatusError as exc:
            raise GaveUp(f"status {exc.status_code}") from exc
        except openai.APIConnectionError as exc:
            raise GaveUp("connection") from exc
        finally:
            if one is None:
                await client.close()

    return [call for _ in range(n)]


async def _tenacity_crowd(
    url: str, n: int, sent: list[float], *, model: str, tokens: int
) -> list[Call]:
    import httpx2
    import openai

    http = httpx2.AsyncClient(event_hooks=_counting(sent), timeout=600)
    client = openai.AsyncOpenAI(api_key="bench", base_url=url, max_retries=0, http_client=http)

    async def send() -> None:
        await client.chat.completions.create(
            model=model,
            messages=MESSAGES,  # type: ignore[arg-type]  # a plain dict
            max_tokens=tokens,
            extra_body={"ignore_eos": True},
        )

    call = cookbook_call(send)
    return [call for _ in range(n)]


async def _naive_crowd(
    url: str, n: int, sent: list[float], *, model: str, tokens: int
) -> list[Call]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    client = httpx.AsyncClient(event_hooks=_counting(sent), timeout=600, limits=limits)
    body = chat_body(model, tokens)

    async def call() -> None:
        start = time.monotonic()
        while True:
            response = await client.post(f"{url}/chat/completions", json=body)
            if response.status_code == 200:
                return
            if response.status_code not in (429, 503) or time.monotonic() - start > GIVE_UP:
                raise GaveUp(f"status {response.status_code}")
            await asyncio.sleep(1.0)

    return [call for _ in range(n)]


async def _herdless_crowd(
    url: str, n: int, sent: list[float], *, shared: bool, model: str, tokens: int, seed: int
) -> list[Call]:
    import herdless  # lazy: keeps this module importable while the SDK grows

    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)

    def make() -> herdless.AsyncClient:
        http = httpx.AsyncClient(event_hooks=_counting(sent), limits=limits)
        return herdless.AsyncClient(
            primary=herdless.Backend(name="gpu", base_url=url, model=model),
            deadline=GIVE_UP,
            rng=random.Random(rng.random()),
            http_client=http,
        )

    one = make() if shared else None

    async def call() -> None:
        client = one or make()
        try:
            await client.chat(MESSAGES, max_tokens=tokens, ignore_eos=True)
        except herdless.HerdlessError as exc:
            raise GaveUp(type(exc).__name__) from exc
        finally:
            if one is None:
                await client.aclose()

    return [call for _ in range(n)]


def arms(tokens: int, model: str, seed_base: int) -> dict[str, Crowd]:
    """The arms of the scenario, by name: each builds a crowd of ``tokens``-token chats of
    ``model`` (herdless's random sources seeded from ``seed_base``)."""

    async def openai_shared(url: str, n: int, sent: list[float]) -> list[Call]:
        return await _openai_crowd(url, n, sent, shared=True, model=model, tokens=tokens)

    async def openai_each(url: str, n: int, sent: list[float]) -> list[Call]:
        return await _openai_crowd(url, n, sent, shared=False, model=model, tokens=tokens)

    async def tenacity_shared(url: str, n: int, sent: list[float]) -> list[Call]:
        return await _tenacity_crowd(url, n, sent, model=model, tokens=tokens)

    async def naive_shared(url: str, n: int, sent: list[float]) -> list[Call]:
        return await _naive_crowd(url, n, sent, model=model, tokens=tokens)

    async def herdless_shared(url: str, n: int, sent: list[float]) -> list[Call]:
        return await _herdless_crowd(
            url, n, sent, shared=True, model=model, tokens=tokens, seed=seed_base
        )

    async def herdless_each(url: str, n: int, sent: list[float]) -> list[Call]:
        return await _herdless_crowd(
            url, n, sent, shared=False, model=model, tokens=tokens, seed=seed_base
        )

    return {
        "openai (shared)": openai_shared,
        "tenacity (shared)": tenacity_shared,
        "naive 1 s (shared)": naive_shared,
        "herdless (shared)": herdless_shared,
        "openai (per caller)": openai_each,
        "herdless (per caller)": herdless_each,
    }
