"""The ``overload`` scenario: steady offered load at 0.8x, 2x and 4x the GPU's capacity.

Real processes: an emulated vLLM and the gateway in front of it (or ``--target``,
any deployment). First the capacity is measured in the same run: ``slots``
closed-loop workers (each sends its next request as soon as the previous one is
answered) for ``seconds``; the served rate is the capacity. Then open-loop
arrivals (evenly spaced, each request sent once, never retried: the gateway's
behaviour is what is measured) at each multiple of it, levels interleaved and
repeated. Per level (medians):

- goodput: requests served per second / capacity (targets: >= 0.90 at 2x,
  >= 0.85 at 4x);
- p99 of the served requests' latency, as a multiple of its value at 0.8x
  (target <= 1.5);
- refused: the share answered 429/503 (at 0.8x, capacity is free: target 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import httpx

from herdless._percentiles import percentile
from herdless.bench.report import Column, Medians, ScenarioResult, Target
from herdless.bench.runner import Arm, Progress, run_arms
from herdless.bench.servers import quiet_emulator, quiet_flags
from herdless.launch.servers import ServerProcess

__all__ = ["LEVELS", "OverloadParams", "run"]

_WARMUP = 2.0  # seconds of the capacity measurement not counted

LEVELS = (0.8, 2.0, 4.0)
"""Offered load as multiples of the measured capacity."""


@dataclass(frozen=True, slots=True, kw_only=True)
class OverloadParams:
    """Sizes of the overload scenario (bounded: every level runs ``seconds``).

    Attributes:
        slots: the GPU's ``max_num_seqs`` and the gateway's ``max_concurrency``.
        queue: the gateway's ``max_queue``.
        max_tokens: tokens per answer (``ignore_eos``: every answer is this long).
        speed: the emulator's time scale.
        seconds: duration of each level and of the capacity measurement.
        repeats: interleaved repetitions of the levels.
        target: base URL (``.../v1``) of a deployment to use instead of local processes.
    """

    slots: int = 16
    queue: int = 8
    max_tokens: int = 64
    speed: float = 2.0
    seconds: float = 8.0
    repeats: int = 2
    target: str | None = None


@contextlib.contextmanager
def _deployment(p: OverloadParams) -> Iterator[str]:
    if p.target is not None:
        yield p.target.rstrip("/")
        return
    gateway_options = {"max_concurrency": p.slots, "max_queue": p.queue, "queue_timeout": 30}
    with (
        quiet_emulator(speed=p.speed, max_num_seqs=p.slots) as vllm,
        ServerProcess(
            ["serve", "--upstream", vllm.url, *quiet_flags(gateway_options)],
            ready_path="/readyz",  # measured only once the gateway sees vLLM ready
        ) as gateway,
    ):
        yield f"{gateway.url}/v1"


def _model(url: str) -> str:
    """The first model the deployment serves (``GET /models``)."""
    models = httpx.get(f"{url}/models", timeout=10).raise_for_status().json()["data"]
    return str(models[0]["id"])


def _body(p: OverloadParams, model: str) -> dict[str, object]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "Write a status update."}],
        "max_tokens": p.max_tokens,
        "ignore_eos": True,
    }


async def _capacity(url: str, p: OverloadParams, body: dict[str, object]) -> float:
    """Requests per second served by ``slots`` closed-loop workers.

    The first ``_WARMUP`` seconds (connections opening, the batch filling) are
    not counted; answers are counted when they arrive within the window.
    """
    served = 0
    statuses: Counter[int] = Counter()
    begin = time.monotonic() + _WARMUP
    end = begin + p.seconds
    limits = httpx.Limits(max_connections=p.slots * 2)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:

        async def worker() -> None:
            nonlocal served
            while time.monotonic() < end:
                response = await client.post("/chat/completions", json=body)
                statuses[response.status_code] += 1
                if response.status_code == 200:
                    served += begin <= time.monotonic() <= end
                else:  # a refusal: no hot loop against the server being measured
                    await asyncio.sleep(0.05)

        await asyncio.gather(*(worker() for _ in range(p.slots)))
    if not served:
        raise RuntimeError(f"{url} served nothing in {p.seconds:g} s: {dict(statuses)}")
    return served / p.seconds


async def _level(
    url: str, p: OverloadParams, body: dict[str, object], rate: float, capacity: float
) -> dict[str, float]:
    """Open loop at ``rate`` req/s for ``seconds``; each request sent once."""
    latencies: list[float] = []
    refused = errors = 0
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=512)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:

        async def one() -> None:
            nonlocal refused, errors
            start = time.monotonic()
            try:
                response = await client.post("/chat/completions", json=body)
            except httpx.HTTPError:
                errors += 1
                return
            if response.status_code == 200:
                latencies.append(time.monotonic() - start)
            elif response.status_code in (429, 503):
                refused += 1
            else:
                errors += 1

        tasks = []
        start = time.monotonic()
        count = int(rate * p.seconds)
        for i in range(count):
            # Evenly spaced arrivals on the real clock (a late loop catches up, never drifts).
            await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
            tasks.append(asyncio.create_task(one()))
        await asyncio.gather(*tasks)
        # Served during the offered window plus its drain: at most the window's worth.
        elapsed = max(time.monotonic() - start, p.seconds)
    return {
        "goodput_x": len(latencies) / elapsed / capacity,
        "p99": percentile(latencies, 99),
        "p50": percentile(latencies, 50),
        "refused": refused / count if count else 0.0,
        "errors": float(errors),
    }


def _params(p: OverloadParams, capacity: float) -> dict[str, object]:
    """What the table states it ran with; a ``--target`` has its own slots, queue and speed."""
    local = {"slots": p.slots, "queue": p.queue, "speed": p.speed} if p.target is None else {}
    return {
        **local,
        "max_tokens": p.max_tokens,
        "seconds": p.seconds,
        "repeats": p.repeats,
        "capacity_rps": round(capacity, 1),
        "target": p.target or "local emulator + gateway",
    }


def _name(level: float) -> str:
    return f"{level:g}x capacity"


def run(p: OverloadParams, progress: Progress | None = None) -> list[ScenarioResult]:
    """Measure the capacity, then every level interleaved; returns the result table."""
    with _deployment(p) as url:
        body = _body(p, _model(url))
        capacity = asyncio.run(_capacity(url, p, body))

        def arm(level: float) -> Arm:
            return Arm(
                name=_name(level),
                run=lambda seed: asyncio.run(_level(url, p, body, level * capacity, capacity)),
            )

        runs = run_arms([arm(x) for x in LEVELS], repeats=p.repeats, seed=0, progress=progress)
    table = Medians(runs)
    table.relative("p99_x", "p99", base=_name(LEVELS[0]))
    return [
        table.result(
            name="overload",
            title="steady offered load against the gateway in front of one GPU",
            params=_params(p, capacity),
            columns=[
                Column(key="goodput_x", label="goodput / capacity"),
                Column(key="p50", label="p50 served (s)"),
                Column(key="p99", label="p99 served (s)"),
                Column(key="p99_x", label="p99 / p99 at 0.8x"),
                Column(key="refused", label="refused", fmt="{:.1%}"),
                Column(key="errors", label="errors", fmt="{:.0f}"),
            ],
            targets=[
                Target(
                    label="goodput at 2x",
                    value=float(table["2x capacity"]["goodput_x"]),
                    limit=0.90,
                    at_least=True,
                ),
                Target(
                    label="goodput at 4x",
                    value=float(table["4x capacity"]["goodput_x"]),
                    limit=0.85,
                    at_least=True,
                ),
                Target(
                    label="p99 at 2x / at 0.8x",
                    value=float(table["2x capacity"]["p99_x"]),
                    limit=1.5,
                ),
                Target(
                    label="p99 at 4x / at 0.8x",
                    value=float(table["4x capacity"]["p99_x"]),
                    limit=1.5,
                ),
                Target(
                    label="refused at 0.8x",
                    value=float(table["0.8x capacity"]["refused"]),
                    limit=0.0,
                ),
            ],
            notes=[
                "Capacity measured in the same run by closed-loop workers, one per slot.",
                "Open loop: evenly spaced arrivals, each request sent once (no client retries).",
                "Goodput counts served requests over the offered window (or its drain, if longer).",
            ],
        )
    ]
