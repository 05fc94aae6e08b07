"""The loads of the ``sizing`` scenarios, and what they read of the engine (raw HTTP).

Every load is bounded in time and stops by itself. Calls are plain OpenAI chat
requests over httpx (no herdless client: the gateway is what is measured); a 429 or
503 is retried after its ``retry-after-ms``, as the OpenAI clients do. A prompt of
``n`` tokens is ``n`` words: the emulator counts a word as one token, the gateway
estimates four characters per token, so its calibration is exercised too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Coroutine, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from herdless.bench.servers import quiet_gateway
from herdless.bench.stats import median
from herdless.gateway.core.engine import Reading
from herdless.gateway.watcher import parse_metrics
from herdless.launch.servers import ServerProcess, emulator_process

__all__ = [
    "SELF",
    "STATIC_ARMS",
    "Call",
    "Engine",
    "Load",
    "SizingParams",
    "arm_url",
    "closed_loop",
    "emulator",
    "gateway",
    "gpu_knobs",
    "idle",
    "metric",
    "preemptions",
    "prompt",
    "sample",
    "sampled",
]

_UNLIMITED = httpx.Limits(max_connections=None, max_keepalive_connections=None)
_MODEL = "emulated-llama-3-8b"
_TEXT, _NO_TEXT = '"content":"', '"content":""'  # a streamed event's text, or none


def prompt(tokens: int, seed: int = 0, system: int = 0) -> list[dict[str, str]]:
    """A chat of about ``tokens`` tokens (words), unique per ``seed``, after a system
    message of about ``system`` tokens that every call shares (none for 0)."""
    asked = {"role": "user", "content": f"call {seed} " + "word " * max(0, tokens - 2)}
    if not system:
        return [asked]
    return [{"role": "system", "content": "rule " * system}, asked]


@dataclass(slots=True)
class Call:
    """One answered call: its kind, when it was sent and ended (s from the load's start),
    the tokens generated, and the attempts it took."""

    kind: str
    sent: float
    ended: float
    tokens: int
    attempts: int


@dataclass(slots=True, kw_only=True)
class Load:
    """A closed-loop caller population: ``callers`` each send one call after another."""

    kind: str
    callers: int
    prompt: int
    answer: int
    system: int = 0  # tokens of instructions every call begins with
    priority: str | None = None
    think: float = 0.0
    start: float = 0.0
    ignore_eos: bool = True
    stream: bool = False
    usage: bool = True  # a stream asks for its usage (stream_options.include_usage)
    named: bool = True  # its calls name max_tokens (a chat front-end's do not)
    calls: list[Call] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class SizingParams:
    """The knobs of the sizing scenarios (defaults: the issue's figures)."""

    repeats: int = 1
    seed: int = 1
    kv: int = 60_000
    seqs: int = 256
    speed: float = 4.0
    flood: float = 30.0
    mix: float = 60.0
    warmup: float = 10.0
    deadline: float = 15.0
    statics: tuple[int, ...] = (8, 16, 32, 64, 128, 256)
    gateway: Mapping[str, object] = field(default_factory=dict)


SELF = "herdless serve (self-sized)"
STATIC_ARMS: dict[str, dict[str, object]] = {
    "herdless serve, static defaults": {"sizing": "static"},
    "sized by the docs (256, 54,000 tokens)": {
        "sizing": "static",
        "max_concurrency": 256,
        "max_inflight_tokens": 54_000,
    },
    "sized by hand (16)": {"sizing": "static", "max_concurrency": 16},
    "best static (24, reserve 8)": {
        "sizing": "static",
        "max_concurrency": 24,
        "interactive_reserve": 8,
    },
}


@contextlib.contextmanager
def gateway(upstream: str, options: Mapping[str, Any]) -> Iterator[ServerProcess]:
    """A gateway with ``options`` (flags) in front of ``upstream``, quiet, a long queue."""
    with quiet_gateway(upstream=upstream, **{"max_queue": 1024, **options}) as gw:
        yield gw


def emulator(p: SizingParams, **more: Any) -> contextlib.AbstractContextManager[ServerProcess]:
    """The emulated GPU of the scenarios, with ``more`` flags."""
    return emulator_process(kv_cache_tokens=p.kv, max_num_seqs=p.seqs, speed=p.speed, **more)


def gpu_knobs(p: SizingParams) -> dict[str, object]:
    """What a table states of the emulated GPU it ran against (see :func:`emulator`)."""
    return {"kv": p.kv, "seqs": p.seqs, "speed": p.speed}


async def _read(client: httpx.AsyncClient, engine: str) -> Reading:
    return parse_metrics((await client.get(f"{engine}/metrics")).text, 0.0)


async def preemptions(engine: str) -> float:
    """The engine's preemptions so far."""
    async with httpx.AsyncClient(timeout=5) as client:
        return float((await _read(client, engine)).preemptions or 0)


async def idle(engine: str) -> None:
    """Wait (bounded) until the engine runs nothing: arms do not overlap."""
    async with httpx.AsyncClient(timeout=5) as client:
        for _ in range(600):
            reading = await _read(client, engine)
            if not reading.running and not reading.waiting:
                return
            await asyncio.sleep(0.1)


def arm_url(engine: ServerProcess, options: Mapping[str, object] | None) -> Any:
    if options is None:
        return contextlib.nullcontext(None)
    return gateway(engine.url, options)


async def closed_loop(
    url: str, loads: list[Load], seconds: float, seed: int = 0, *, once: bool = False
) -> None:
    """Play every load against ``url`` (``.../v1``) for ``seconds``; calls still running
    then are cancelled (not recorded). ``once``: each caller sends one call only."""
    t0 = time.monotonic()
    rng = random.Random(seed)
    async with httpx.AsyncClient(timeout=600, limits=_UNLIMITED) as client:

        async def caller(load: Load, index: int) -> None:
            await asyncio.sleep(load.start + rng.random() * 0.05)
            n = 0
            while time.monotonic() - t0 < seconds:
                n += 1
                body: dict[str, Any] = {
                    "model": _MODEL,
                    "messages": prompt(
                        load.prompt, seed * 1_000_000 + index * 10_000 + n, load.system
                    ),
                }
                if load.named:
                    body["max_tokens"] = load.answer
                if load.ignore_eos:
                    body["ignore_eos"] = True
                if load.stream:
                    body["stream"] = True
                    if load.usage:
                        body["stream_options"] = {"include_usage": True}
                headers = {} if load.priority is None else {"x-herdless-priority": load.priority}
                sent = time.monotonic() - t0
                attempts = 0
                while True:
                    attempts += 1
                    status, wait, tokens = await _call(client, url, body, headers)
                    if wait is not None:
                        await asyncio.sleep(wait)
                        continue
                    break
                if status == 200:
                    ended = time.monotonic() - t0
                    load.calls.append(Call(load.kind, sent, ended, tokens, attempts))
                if once:
                    return
                if load.think:
                    await asyncio.sleep(rng.expovariate(1 / load.think))

        tasks = [
            asyncio.create_task(caller(load, i)) for load in loads for i in range(load.callers)
        ]
        await _bounded(tasks, seconds + 1.0)


async def _call(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str]
) -> tuple[int, float | None, int]:
    """One chat request: (status, seconds until it is sent again or ``None``, tokens
    answered). A stream's tokens are its events with text (the emulator's one a token)."""
    async with client.stream("POST", f"{url}/chat/completions", json=body, headers=headers) as r:
        if r.status_code in (429, 503):
            return r.status_code, float(r.headers.get("retry-after-ms", 1000)) / 1000, 0
        if r.status_code != 200:
            return r.status_code, None, 0
        if not body.get("stream"):
            return 200, None, json.loads(await r.aread())["usage"]["completion_tokens"]
        tokens = 0
        async for line in r.aiter_lines():
            tokens += line.startswith("data: {") and _TEXT in line and _NO_TEXT not in line
        return 200, None, tokens


async def _bounded(tasks: list[asyncio.Task[None]], seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=seconds)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def metric(client: httpx.AsyncClient, url: str, name: str) -> float | None:
    """One series' value in ``url``'s Prometheus text (the first line of that name)."""
    text = (await client.get(url)).text
    for line in text.splitlines():
        if line.startswith(name) and line[len(name)] in "{ ":
            return float(line.rsplit(" ", 1)[1])
    return None


@dataclass(slots=True)
class Engine:
    """What the engine and the gateway showed over a run, sampled every ``every`` s."""

    times: list[float] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    running: list[int] = field(default_factory=list)
    kv: list[float] = field(default_factory=list)
    limit: list[float] = field(default_factory=list)

    @property
    def waiting_p50(self) -> float:
        return median([float(w) for w in self.waiting]) if self.waiting else float("nan")


async def sample(
    engine_url: str, gateway_url: str | None, out: Engine, stop: asyncio.Event, every: float = 0.1
) -> None:
    """Sample the engine's /metrics (and the gateway's dispatch limit) into ``out`` every
    ``every`` seconds until ``stop`` is set."""
    t0 = time.monotonic()
    async with httpx.AsyncClient(timeout=5) as client:
        while not stop.is_set():
            now = time.monotonic() - t0
            with contextlib.suppress(httpx.HTTPError):
                reading = parse_metrics((await client.get(f"{engine_url}/metrics")).text, now)
                limit = None
                if gateway_url is not None:
                    limit = await metric(
                        client, f"{gateway_url}/metrics", "herdless_gateway_dispatch_limit"
                    )
                out.times.append(now)
                out.waiting.append(reading.waiting or 0)
                out.running.append(reading.running or 0)
                out.kv.append(reading.kv_usage or 0.0)
                out.limit.append(float("nan") if limit is None else limit)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every)


async def sampled(
    engine_url: str, gateway_url: str | None, work: Coroutine[Any, Any, None]
) -> tuple[float, Engine]:
    """Run ``work`` while sampling the engine; returns (its seconds, the samples)."""
    seen = Engine()
    stop = asyncio.Event()
    sampler = asyncio.ensure_future(sample(engine_url, gateway_url, seen, stop))
    t0 = time.monotonic()
    try:
        await work
    finally:
        took = time.monotonic() - t0
        stop.set()
        await sampler
    return took, seen
