"""The ``shared`` scenario: a crowd of calls at once from ONE client, as a process has.

A web app, a worker, a notebook: a process normally shares one client among all its
requests. Here ``n`` chats start at once against a GPU that runs ``slots`` of them at a
time, two ways:

- ``gateway``: the herdless gateway (``slots`` running + ``queue`` waiting, staggered
  Retry-After) in front of the emulated vLLM;
- ``vllm``: straight at the emulated vLLM with a bounded waiting queue
  (``--max-num-queued-reqs``), which refuses with a bare 503, as vLLM does; its
  baseline is the same server with an unbounded queue (nobody is refused).

Arms (``herdless.bench.shared_arms``), each in the same run, one shared client for the
whole crowd unless it says "per caller": the official openai client with its defaults,
the OpenAI cookbook's tenacity recipe, a naive loop (a fixed 1 s pause), herdless
(``AsyncClient``), and herdless and openai with one client per caller. Figures per arm (median over
repetitions):

- served: the share of calls answered (the others gave up or failed);
- attempts / request: every HTTP request the clients sent / ``n``;
- makespan / ideal: from the start to the last answer, over ``n / slots x service``,
  where ``service`` is one call's time in a full batch, measured in the same run (and,
  for ``vllm``, over the unbounded queue's own makespan).
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from herdless.bench.plots import rate_panels
from herdless.bench.report import Column, Medians, ScenarioResult, Target
from herdless.bench.runner import Arm, GaveUp, Progress, Runs, run_arms
from herdless.bench.servers import quiet_emulator, quiet_gateway
from herdless.bench.shared_arms import GIVE_UP, Call, Crowd, arms, chat_body
from herdless.bench.stats import ratio
from herdless.launch.servers import ServerProcess

__all__ = ["SharedParams", "run"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SharedParams:
    """Sizes of the shared-client scenario (bounded: each arm serves ``n`` calls once).

    Attributes:
        n: calls started at once.
        slots: the GPU's ``max_num_seqs`` and the gateway's ``max_concurrency``.
        queue: the gateway's ``max_queue``.
        vllm_queue: the emulator's ``--max-num-queued-reqs`` in the ``vllm`` case.
        max_tokens: tokens per answer (``ignore_eos``: every answer is this long).
        speed: the emulator's time scale.
        repeats: repetitions per arm.
        seed: first seed.
    """

    n: int = 200
    slots: int = 8
    queue: int = 16
    vllm_queue: int = 8
    max_tokens: int = 48
    speed: float = 1.0
    repeats: int = 1
    seed: int = 1


async def _crowd(
    url: str, n: int, crowd: Crowd, arrivals: list[float] | None = None
) -> dict[str, float]:
    """Start ``n`` calls at once; their served share, attempts and makespan. ``arrivals``
    receives when each request was sent (seconds since the start)."""
    sent: list[float] = []
    calls = await crowd(url, n, sent)
    start = time.monotonic()
    finished: list[float] = []

    async def one(call: Call) -> bool:
        try:
            await asyncio.wait_for(call(), timeout=GIVE_UP + 60)
        except (GaveUp, TimeoutError):
            return False
        finished.append(time.monotonic() - start)
        return True

    outcomes = await asyncio.gather(*(one(call) for call in calls))
    if arrivals is not None:
        arrivals.extend(t - start for t in sent)
    return {
        "served": sum(outcomes) / n,
        "attempts": len(sent) / n,
        "makespan": max(finished, default=float("nan")),
    }


async def _service(url: str, p: SharedParams, model: str) -> float:
    """Seconds one call takes in a full batch: ``slots`` at once, median of their times."""
    body = chat_body(model, p.max_tokens)
    async with httpx.AsyncClient(timeout=120) as client:

        async def timed() -> float:
            begin = time.monotonic()
            (await client.post(f"{url}/chat/completions", json=body)).raise_for_status()
            return time.monotonic() - begin

        await asyncio.gather(*(timed() for _ in range(p.slots)))  # warm: connections, JIT
        return statistics.median(await asyncio.gather(*(timed() for _ in range(p.slots))))


@contextlib.contextmanager
def _gateway_case(p: SharedParams) -> Iterator[str]:
    with (
        quiet_emulator(speed=p.speed, max_num_seqs=p.slots) as vllm,
        quiet_gateway(
            upstream=vllm.url, max_concurrency=p.slots, max_queue=p.queue, queue_timeout=GIVE_UP
        ) as gateway,
    ):
        yield f"{gateway.url}/v1"


@contextlib.contextmanager
def _vllm_case(p: SharedParams, queued: int | None) -> Iterator[ServerProcess]:
    with quiet_emulator(speed=p.speed, max_num_seqs=p.slots, max_num_queued_reqs=queued) as vllm:
        yield vllm


def _measure(
    url: str,
    p: SharedParams,
    crowds: dict[str, Crowd],
    progress: Progress | None,
    arrivals: dict[str, list[float]] | None = None,
) -> Runs:
    """Every arm, interleaved; ``arrivals`` gets each arm's send times of its first run."""

    def arm(name: str, crowd: Crowd) -> Arm:
        def measure(seed: int) -> dict[str, float]:
            seen = None if arrivals is None or name in arrivals else arrivals.setdefault(name, [])
            return asyncio.run(_crowd(url, p.n, crowd, seen))

        return Arm(name=name, run=measure)

    measured = [arm(name, crowd) for name, crowd in crowds.items()]
    return run_arms(measured, repeats=p.repeats, seed=p.seed, progress=progress)


def run(p: SharedParams, out: Path, progress: Progress | None = None) -> list[ScenarioResult]:
    """Both cases, every arm; returns one table per case and writes their plots in ``out``."""
    model = "emulated-llama-3-8b"
    results = []
    arrivals: dict[str, list[float]] = {}
    with _gateway_case(p) as url:
        service = asyncio.run(_service(url, p, model))
        runs = _measure(url, p, arms(p.max_tokens, model, p.seed), progress, arrivals)
    ideal = p.n / p.slots * service
    result = _result("shared-gateway", p, runs, ideal, service, gateway=True)
    result.plots.append(_plot(out / "shared-gateway.png", arrivals, p, service, result.title))
    results.append(result)

    with _vllm_case(p, None) as vllm:
        url = f"{vllm.url}/v1"
        service = asyncio.run(_service(url, p, model))
        reference = {"unbounded queue": arms(p.max_tokens, model, p.seed)["openai (shared)"]}
        unbounded = _measure(url, p, reference, progress)
    baseline = statistics.median(r["makespan"] for r in unbounded["unbounded queue"])
    arrivals = {}
    with _vllm_case(p, p.vllm_queue) as vllm:
        runs = _measure(f"{vllm.url}/v1", p, arms(p.max_tokens, model, p.seed), progress, arrivals)
    result = _result("shared-vllm", p, runs, baseline, service, gateway=False)
    result.plots.append(_plot(out / "shared-vllm.png", arrivals, p, service, result.title))
    results.append(result)
    return results


def _plot(
    path: Path, arrivals: dict[str, list[float]], p: SharedParams, service: float, title: str
) -> Path:
    """Requests sent over time, one panel per shared-client arm."""
    shown = {k: v for k, v in arrivals.items() if "shared" in k}
    return rate_panels(
        path,
        shown,
        title=f"requests sent over time: {title}",
        capacity=p.slots / service,
        until=max((max(t) for t in shown.values() if t), default=1.0) + 1,
    )


def _result(
    name: str,
    p: SharedParams,
    runs: Runs,
    ideal: float,
    service: float,
    *,
    gateway: bool,
) -> ScenarioResult:
    for figures in runs.values():
        for run in figures:
            run["makespan_x"] = ratio(run["makespan"], ideal)
    table = Medians(runs)
    arm = "herdless (shared)"
    h = table[arm]
    if gateway:
        title = f"{p.n} chats at once from one client, gateway {p.slots}+{p.queue} on the emulator"
        base = f"ideal = n / slots x service = {ideal:.2f} s (service {service:.3f} s, measured)"
        limits = (1.10, 1.10, "makespan / ideal")
    else:
        title = (
            f"{p.n} chats at once from one client, straight at the emulator "
            f"(--max-num-seqs {p.slots} --max-num-queued-reqs {p.vllm_queue}: a bare 503 when full)"
        )
        base = f"baseline = the same server with an unbounded queue: makespan {ideal:.2f} s"
        limits = (1.20, 1.15, "makespan / unbounded")
    attempts, makespan, label = limits
    targets = [
        Target(label=f"{arm} served", value=float(h["served"]), limit=1.0, at_least=True),
        Target(label=f"{arm} attempts / request", value=float(h["attempts"]), limit=attempts),
        Target(label=f"{arm} {label}", value=float(h["makespan_x"]), limit=makespan),
    ]
    return table.result(
        name=name,
        title=title,
        params={
            "n": p.n,
            "slots": p.slots,
            "queue": p.queue if gateway else p.vllm_queue,
            "max_tokens": p.max_tokens,
            "speed": p.speed,
            "service_s": round(service, 3),
            "repeats": p.repeats,
        },
        columns=[
            Column(key="served", label="served", fmt="{:.1%}"),
            Column(key="attempts", label="attempts / request"),
            Column(key="makespan", label="makespan (s)"),
            Column(key="makespan_x", label=label),
        ],
        targets=targets,
        notes=[
            "Real processes on 127.0.0.1; every arm in the same run, against the same servers.",
            base + ".",
            "Attempts counted by each client's HTTP layer (every request sent).",
        ],
    )
