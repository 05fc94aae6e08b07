"""The ``sizing`` scenarios 3-5: mixes against a static sweep, a switch of mix, stale readings.

See :mod:`herdless.bench.sizing` for the setting; every arm runs against the same
emulator in the same run.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import httpx

from herdless.bench.plots import save, subplots
from herdless.bench.report import Column, Medians, ScenarioResult, Target
from herdless.bench.runner import Arm, Progress, run_arms
from herdless.bench.sizing_load import (
    SELF,
    Engine,
    Load,
    SizingParams,
    closed_loop,
    emulator,
    gateway,
    idle,
    preemptions,
    sampled,
)
from herdless.bench.stats import median, ratio
from herdless.launch.servers import ServerProcess

__all__ = ["MIXES", "mixes", "stale", "switch"]

MIXES = {
    "short chat": (64, 200, 100),
    "RAG": (24, 6000, 300),
    "long answers": (24, 500, 1500),
}
"""Closed-loop mixes: (callers, prompt tokens, answer tokens)."""


def _goodput(load: Load, p: SizingParams, start: float, end: float) -> float:
    """Answers that ended in [start, end) within ``deadline`` of their sending, per second."""
    good = [c for c in load.calls if start <= c.ended < end and c.ended - c.sent <= p.deadline]
    return len(good) / (end - start)


def _mix_arm(engine: ServerProcess, p: SizingParams, mix: str, name: str, opts: Any) -> Arm:
    callers, prompt, answer = MIXES[mix]

    def run(seed: int) -> dict[str, float]:
        with gateway(engine.url, opts) as gw:
            assert gw is not None
            asyncio.run(idle(engine.url))
            load = Load(kind=mix, callers=callers, prompt=prompt, answer=answer)
            asyncio.run(closed_loop(gw.url + "/v1", [load], p.warmup + p.mix, seed))
        return {"goodput": _goodput(load, p, p.warmup, p.warmup + p.mix)}

    return Arm(name=f"{mix}: {name}", run=run)


def mixes(p: SizingParams, progress: Progress) -> ScenarioResult:
    """Scenario 3: goodput of each mix, static sweep against one self-sized configuration."""
    specs: dict[str, dict[str, object]] = {
        f"static {n}": {"sizing": "static", "max_concurrency": n} for n in p.statics
    }
    specs[SELF] = dict(p.gateway)
    with emulator(p) as engine:
        arms = [
            _mix_arm(engine, p, mix, name, opts) for mix in MIXES for name, opts in specs.items()
        ]
        runs = run_arms(arms, repeats=p.repeats, seed=p.seed, progress=progress)
    table = Medians(runs)
    targets = []
    for mix in MIXES:
        mine = [r for r in table.rows if r["arm"].startswith(mix + ":")]
        best = max((r for r in mine if SELF not in r["arm"]), key=lambda r: r["goodput"])
        me = next(r for r in mine if SELF in r["arm"])
        for row in mine:
            row["of_best"] = ratio(row["goodput"], best["goodput"])
        targets.append(
            Target(
                label=f"{mix}: self-sized / best static ({best['arm'].split(': ')[1]})",
                value=me["of_best"],
                limit=0.95,
                at_least=True,
            )
        )
    return table.result(
        name="sizing-mixes",
        title="Three mixes, closed loop: goodput against a sweep of static limits",
        params={"seconds": p.mix, "warmup": p.warmup, "deadline": p.deadline, "kv": p.kv},
        columns=[
            Column(key="goodput", label="answers in deadline /s"),
            Column(key="of_best", label="x best static"),
        ],
        targets=targets,
        notes=[
            "Mixes (callers x prompt + answer tokens): "
            + "; ".join(f"{m} {c} x {a} + {b}" for m, (c, a, b) in MIXES.items())
            + ". Answers are exactly max_tokens long; no think time."
        ],
    )


def _settling(seen: Engine, switch_at: float) -> tuple[float, float]:
    """(seconds after ``switch_at`` until the limit stays within 15 % of its final median,
    the largest swing from that median afterwards, as a share)."""
    after = [(t, v) for t, v in zip(seen.times, seen.limit, strict=True) if t >= switch_at]
    after = [(t, v) for t, v in after if not math.isnan(v)]
    if len(after) < 4:
        return math.nan, math.nan
    final = median([v for t, v in after if t >= after[-1][0] - 5.0])
    settled_at = after[-1][0]
    for t, v in reversed(after):
        if abs(v - final) > 0.15 * final:
            break
        settled_at = t
    swing = max(abs(v - final) / final for t, v in after if t >= settled_at)
    return settled_at - switch_at, swing


def switch(p: SizingParams, out: Path, progress: Progress) -> ScenarioResult:
    """Scenario 4: short chat, then RAG; the dispatch limit settles."""
    half = max(20.0, p.mix / 2)
    with (
        emulator(p) as engine,
        gateway(engine.url, dict(p.gateway)) as gw,
    ):
        assert gw is not None
        chat = Load(kind="short chat", callers=64, prompt=200, answer=100)
        rag = Load(kind="RAG", callers=24, prompt=6000, answer=300, start=half)
        chat_work = closed_loop(gw.url + "/v1", [chat], half, p.seed)
        rag_work = closed_loop(gw.url + "/v1", [rag], 2 * half, p.seed + 1)

        async def both() -> None:
            await asyncio.gather(chat_work, rag_work)

        _, seen = asyncio.run(sampled(engine.url, gw.url, both()))
    progress("switch")
    settle, swing = _settling(seen, half)
    plot = _plot(seen, out / "sizing-switch.png", half)
    return ScenarioResult(
        name="sizing-switch",
        title="The mix switches from short chat to RAG: the dispatch limit settles",
        params={"seconds": 2 * half, "switch_at": half},
        columns=[
            Column(key="settle", label="settles in s"),
            Column(key="swing", label="swing after", fmt="{:.0%}"),
            Column(key="before", label="limit before", fmt="{:.0f}"),
            Column(key="after", label="limit after", fmt="{:.0f}"),
        ],
        rows=[
            {
                "arm": SELF,
                "settle": settle,
                "swing": swing,
                "before": median(
                    [v for t, v in zip(seen.times, seen.limit, strict=True) if half - 5 < t < half]
                ),
                "after": median(
                    [v for t, v in zip(seen.times, seen.limit, strict=True) if t > half + 10]
                ),
            }
        ],
        targets=[
            Target(label="settles within 10 s", value=settle, limit=10.0),
            Target(label="swing after settling", value=swing, limit=0.15),
        ],
        plots=[plot],
    )


def stale(p: SizingParams, progress: Progress) -> ScenarioResult:
    """Scenario 5: the engine's /metrics stalls for 10 s mid-run."""
    seconds = 30.0
    with (
        emulator(p) as engine,
        gateway(engine.url, dict(p.gateway)) as gw,
    ):
        assert gw is not None
        load = Load(kind="RAG", callers=24, prompt=6000, answer=300)

        async def run() -> None:
            work = asyncio.ensure_future(closed_loop(gw.url + "/v1", [load], seconds, p.seed))
            await asyncio.sleep(10.0)
            async with httpx.AsyncClient(timeout=5) as client:
                await client.post(f"{engine.url}/_emulator/faults", json={"metrics_stall_for": 10})
            await work

        before = asyncio.run(preemptions(engine.url))
        asyncio.run(run())
        after = asyncio.run(preemptions(engine.url))
    progress("stale")
    tokens = {
        span: sum(c.tokens for c in load.calls if span[0] <= c.ended < span[1])
        for span in ((0.0, 10.0), (10.0, 20.0), (20.0, 30.0))
    }
    rates = {span: tokens[span] / 10.0 for span in tokens}
    held = ratio(rates[(10.0, 20.0)], rates[(0.0, 10.0)])
    return ScenarioResult(
        name="sizing-stale",
        title="The engine's /metrics stalls for 10 s mid-run (RAG mix, self-sized)",
        params={"seconds": seconds, "stall": "10-20 s"},
        columns=[
            Column(key="before", label="tokens/s 0-10 s", fmt="{:.0f}"),
            Column(key="during", label="tokens/s 10-20 s (stale)", fmt="{:.0f}"),
            Column(key="after", label="tokens/s 20-30 s", fmt="{:.0f}"),
            Column(key="held", label="during / before"),
            Column(key="preemptions", label="preemptions", fmt="{:.0f}"),
        ],
        rows=[
            {
                "arm": SELF,
                "before": rates[(0.0, 10.0)],
                "during": rates[(10.0, 20.0)],
                "after": rates[(20.0, 30.0)],
                "held": held,
                "preemptions": after - before,
            }
        ],
        targets=[
            Target(label="throughput while stale / before", value=held, limit=0.8, at_least=True)
        ],
    )


def _plot(seen: Engine, path: Path, mark: float) -> Path:
    fig, axes = subplots(3, 1, sharex=True, figsize=(8, 5))
    axes[0].plot(seen.times, seen.limit, color="#4c72b0")
    axes[0].set_ylabel("dispatch limit")
    axes[1].plot(seen.times, [k * 100 for k in seen.kv], color="#55a868")
    axes[1].set_ylabel("engine KV %")
    axes[2].plot(seen.times, seen.waiting, color="#c44e52")
    axes[2].set_ylabel("engine waiting")
    for ax in axes:
        ax.axvline(mark, color="grey", linewidth=1, linestyle="--")
    axes[-1].set_xlabel("seconds (dashed: the mix switches from short chat to RAG)")
    return save(fig, path)
