"""The ``hedge`` scenario: a primary whose first byte is sometimes very late.

A share of a GPU's requests can stall before their first token (a long prefill ahead of
them, a preemption, a stuck worker) while the rest are fast. Waiting for the attempt's
whole ``first_byte`` limit before doing anything makes those calls the tail; a hedge
(``herdless.HedgePolicy``) sends the same request to the fallback once the first byte
is late and keeps whichever answers first.

The primary is an emulated vLLM with the ``slow`` fault (``slow_rate`` of its requests
held ``slow_latency`` seconds before their first byte) behind the gateway; the fallback
a second emulator (the hosted model, as fast as the GPU when the GPU is well). One client
sends ``calls`` chats at a steady ``rate`` (open loop: a call starts every ``1 / rate``
seconds whatever the others do), each a whole answer of ``max_tokens`` tokens. Arms, in
the same run, each against a fresh primary and gateway with the same seed (so the same
calls are slow in every arm):

- ``no hedging``: ``herdless.AsyncClient`` with the fallback, default policies;
- ``herdless, HedgePolicy(after="auto", max_share=...)``;
- ``openai client, defaults``: ``openai.AsyncOpenAI`` straight at the gateway;
- ``the fallback alone (reference)``: the same calls straight at the fallback, for its
  own latency (the hedge's tail cannot beat the hedge delay plus that).

Figures per arm (median over repetitions): latency p50 / p90 / p99 / max (seconds, from
the call's start to its answer), the share of calls answered by the fallback, the share
that sent a hedge, and errors. The plot is each arm's latency CDF (the first repetition).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from herdless._percentiles import percentile
from herdless.bench.plots import save, subplots
from herdless.bench.report import Column, Medians, ScenarioResult, Target, knobs
from herdless.bench.runner import Arm, Progress, Runs, run_arms
from herdless.bench.servers import quiet_emulator, quiet_gateway
from herdless.bench.stats import ratio

__all__ = ["HedgeParams", "run"]

_MESSAGES = [{"role": "user", "content": "Write a one-line status update for the team."}]
_GPU_MODEL = "emulated-llama-3-8b"
_HOSTED_MODEL = "hosted-model"

NO_HEDGE = "no hedging"
OPENAI = "openai client, defaults"
REFERENCE = "the fallback alone (reference)"

Chat = Callable[[], Awaitable[str]]
"""One call; returns the name of the backend that answered ("gpu" or "hosted")."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HedgeParams:
    """Sizes of the hedge scenario.

    Attributes:
        calls: calls per arm, from one client.
        rate: calls started per second (open loop).
        slow_rate: the share of the primary's requests held before their first byte.
        slow_latency: seconds they are held.
        max_tokens: tokens per answer (``ignore_eos``: every answer is this long).
        max_share: the hedging arm's ``HedgePolicy.max_share``.
        reference_calls: calls of the reference arm (the fallback alone).
        repeats: repetitions per arm.
        seed: first seed (the emulators' fault draws; repetition ``r`` uses ``seed + r``).
    """

    calls: int = 500
    rate: float = 20.0
    slow_rate: float = 0.1
    slow_latency: float = 5.0
    max_tokens: int = 24
    max_share: float = 0.15
    reference_calls: int = 200
    repeats: int = 1
    seed: int = 1

    @property
    def hedged(self) -> str:
        """The hedging arm's name."""
        return f'herdless, HedgePolicy(after="auto", max_share={self.max_share:g})'


async def _open_loop(chat: Chat, calls: int, rate: float) -> list[tuple[float, str]]:
    """Start ``calls`` calls ``1 / rate`` seconds apart; (latency, backend) of each (a
    call that raised: its exception's class name)."""
    results: list[tuple[float, str]] = []

    async def one() -> None:
        began = time.monotonic()
        try:
            backend = await chat()
        except Exception as exc:  # an arm's failure is a figure here
            backend = f"error: {type(exc).__name__}"
        results.append((time.monotonic() - began, backend))

    tasks = []
    start = time.monotonic()
    for index in range(calls):
        delay = start + index / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one()))
    await asyncio.gather(*tasks)
    return results


async def _herdless(
    gateway: str, hosted: str, p: HedgeParams, *, hedge: bool, hedges: list[float]
) -> list[tuple[float, str]]:
    import herdless  # lazy: keeps the scenario list importable without the SDK's extras
    from herdless.events import Event, HedgeStarted

    def record(event: Event) -> None:
        if isinstance(event, HedgeStarted):
            hedges.append(event.after)

    async with herdless.AsyncClient(
        primary=herdless.Backend(name="gpu", base_url=gateway, model=_GPU_MODEL),
        fallback=herdless.Backend(
            name="hosted", base_url=hosted, model=_HOSTED_MODEL, external=True
        ),
        hedge=herdless.HedgePolicy(after="auto", max_share=p.max_share) if hedge else None,
        on_event=record,
    ) as client:

        async def chat() -> str:
            result = await client.chat(_MESSAGES, max_tokens=p.max_tokens, ignore_eos=True)
            return result.backend

        return await _open_loop(chat, p.calls, p.rate)


async def _openai(gateway: str, p: HedgeParams) -> list[tuple[float, str]]:
    import openai  # lazy: the bench extra

    async with openai.AsyncOpenAI(api_key="bench", base_url=gateway) as client:

        async def chat() -> str:
            await client.chat.completions.create(
                model=_GPU_MODEL,
                messages=_MESSAGES,  # type: ignore[arg-type]  # a plain dict
                max_tokens=p.max_tokens,
                extra_body={"ignore_eos": True},
            )
            return "gpu"

        return await _open_loop(chat, p.calls, p.rate)


async def _reference(hosted: str, p: HedgeParams) -> list[tuple[float, str]]:
    import herdless

    async with herdless.AsyncClient(
        primary=herdless.Backend(name="hosted", base_url=hosted, model=_HOSTED_MODEL)
    ) as client:

        async def chat() -> str:
            result = await client.chat(_MESSAGES, max_tokens=p.max_tokens, ignore_eos=True)
            return result.backend

        return await _open_loop(chat, p.reference_calls, p.rate)


@contextlib.contextmanager
def _primary(p: HedgeParams, seed: int) -> Iterator[str]:
    """A fresh slow GPU and its gateway (the same seed: the same calls are slow)."""
    with (
        quiet_emulator(
            model=_GPU_MODEL, slow_rate=p.slow_rate, slow_latency=p.slow_latency, seed=seed
        ) as gpu,
        quiet_gateway(upstream=gpu.url) as gateway,
    ):
        yield f"{gateway.url}/v1"


def _figures(results: list[tuple[float, str]], hedges: list[float] | None) -> dict[str, float]:
    latencies = [latency for latency, backend in results if not backend.startswith("error")]
    n = len(results)
    figures = {
        "p50": percentile(latencies, 50),
        "p90": percentile(latencies, 90),
        "p99": percentile(latencies, 99),
        "max": max(latencies, default=math.nan),
        "fallback_share": sum(backend == "hosted" for _, backend in results) / n,
        "errors": sum(backend.startswith("error") for _, backend in results) / n,
    }
    if hedges is not None:
        figures["hedge_share"] = len(hedges) / n
        figures["hedge_delay"] = percentile(hedges, 50)
    return figures


def run(p: HedgeParams, out: Path, progress: Progress | None = None) -> list[ScenarioResult]:
    """Every arm against a fresh primary (one shared fallback); the table and the CDF."""
    samples: dict[str, list[float]] = {}  # the first repetition's latencies, per arm

    def keep(arm: str, results: list[tuple[float, str]]) -> None:
        samples.setdefault(arm, [latency for latency, _ in results])

    with quiet_emulator(model=_HOSTED_MODEL) as hosted_server:
        hosted = f"{hosted_server.url}/v1"

        def herdless_arm(name: str, *, hedge: bool) -> Callable[[int], dict[str, float]]:
            def measure(seed: int) -> dict[str, float]:
                hedges: list[float] = []
                with _primary(p, seed) as gateway:
                    results = asyncio.run(_herdless(gateway, hosted, p, hedge=hedge, hedges=hedges))
                keep(name, results)
                return _figures(results, hedges)

            return measure

        def openai_arm(seed: int) -> dict[str, float]:
            with _primary(p, seed) as gateway:
                results = asyncio.run(_openai(gateway, p))
            keep(OPENAI, results)
            return _figures(results, None)

        def reference_arm(seed: int) -> dict[str, float]:
            results = asyncio.run(_reference(hosted, p))
            keep(REFERENCE, results)
            return _figures(results, None)

        arms = [
            Arm(name=NO_HEDGE, run=herdless_arm(NO_HEDGE, hedge=False)),
            Arm(name=p.hedged, run=herdless_arm(p.hedged, hedge=True)),
            Arm(name=OPENAI, run=openai_arm),
            Arm(name=REFERENCE, run=reference_arm),
        ]
        runs = run_arms(arms, repeats=p.repeats, seed=p.seed, progress=progress)
    result = _result(p, runs)
    result.plots.append(_cdf(samples, out / "hedge-cdf.png", p))
    return [result]


def _result(p: HedgeParams, runs: Runs) -> ScenarioResult:
    table = Medians(runs)
    plain, hedged, reference = table[NO_HEDGE], table[p.hedged], table[REFERENCE]
    tail_limit = float(hedged["hedge_delay"]) + float(reference["p99"]) + 0.1
    return table.result(
        name="hedge",
        title=(
            f"{p.calls} calls at {p.rate:g}/s from one client; the GPU holds "
            f"{p.slow_rate:.0%} of its requests {p.slow_latency:g} s before the first byte"
        ),
        params=knobs(p, leave_out={"reference_calls"}),
        columns=[
            *(Column(key=q, label=f"{q} s", fmt="{:.3f}") for q in ("p50", "p90", "p99", "max")),
            Column(key="fallback_share", label="answered by the fallback", fmt="{:.1%}"),
            Column(key="hedge_share", label="calls that hedged", fmt="{:.1%}"),
            Column(key="hedge_delay", label="hedge delay s (median)", fmt="{:.3f}"),
            Column(key="errors", label="errors", fmt="{:.1%}"),
        ],
        targets=[
            Target(
                label="hedging: p50 / no hedging's p50",
                value=ratio(float(hedged["p50"]), float(plain["p50"])),
                limit=1.05,
            ),
            Target(
                label="hedging: p99 s (limit: hedge delay + the fallback's p99 + 0.1 s)",
                value=float(hedged["p99"]),
                limit=tail_limit,
            ),
            Target(
                label="hedging: share answered by the fallback",
                value=float(hedged["fallback_share"]),
                limit=0.12,
            ),
        ],
        notes=[
            "Real processes on 127.0.0.1: an emulated GPU with the slow fault behind the "
            "gateway, an emulated hosted model as the fallback; one AsyncClient per arm.",
            "Latency: from the call's start to its whole answer (non-streaming, "
            f"{p.max_tokens} tokens each); errors are left out of the percentiles.",
            "Each arm gets a fresh GPU and gateway seeded alike: the same calls are slow.",
            "Hedge delay: the median of HedgeStarted.after (after='auto': the 95th "
            "percentile of the GPU's recent first-byte times, at least 0.1 s).",
        ],
    )


def _cdf(samples: dict[str, list[float]], path: Path, p: HedgeParams) -> Path:
    """Each arm's latency CDF: the whole range (log x) and the tail (fraction >= 0.8)."""
    fig, (whole, tail) = subplots(1, 2, figsize=(11, 4.2))
    for arm, latencies in samples.items():
        ordered = sorted(latencies)
        if not ordered:
            continue
        fraction = [(index + 1) / len(ordered) for index in range(len(ordered))]
        style: dict[str, Any] = {"linestyle": "--"} if arm == REFERENCE else {}
        for ax in (whole, tail):
            ax.step(ordered, fraction, where="post", label=arm, linewidth=1.4, **style)
    from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

    for ax in (whole, tail):
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(FixedLocator([0.1, 0.2, 0.3, 0.5, 1, 2, 3, 5, 10]))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.set_xlabel("latency, seconds (log scale)")
        ax.grid(True, which="major", linewidth=0.3)
    whole.set_ylabel("fraction of calls answered")
    whole.set_ylim(0, 1.01)
    tail.set_ylim(0.8, 1.001)
    tail.set_title("the tail", fontsize=9, loc="left")
    whole.legend(fontsize=7, loc="lower right")
    return save(
        fig,
        path,
        f"hedge: {p.calls} calls at {p.rate:g}/s, {p.slow_rate:.0%} of the GPU's requests "
        f"held {p.slow_latency:g} s",
        fontsize=10,
    )
