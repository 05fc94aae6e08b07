"""8. ``sizing-restart``: a gateway restarted in front of a serving engine, and the crowd
its restart refused, back at once.

An emulated GPU of 8 sequences (``--max-num-seqs 8``: a large model on one GPU) that has
served before every arm, and 48 callers at once (20-token prompts, 96-token answers; a
429 retried after its ``retry-after-ms``, the same body again: the gateway knows it as a
retry) against 8 running and 16 waiting (``--max-concurrency 8 --max-queue 16``: the
cap is vLLM's own ``--max-num-seqs``, which a gateway just started would learn only once
the engine queued): 24 of them are refused at once, told when a place frees for them.
Arms:

- vLLM alone: the crowd straight at the engine, which queues what it cannot run;
- herdless serve, running: the gateway served a crowd before this one (its answers
  per second are measured);
- herdless serve, just started: the crowd is the first thing it meets; it has read
  the engine's mean run time (``vllm:request_inference_time_seconds``);
- ``--sizing static``, just started: it reads nothing of the engine, and its times come
  from a guess of 1 s a run (here about three times the engine's).

Figures: the crowd's makespan (against vLLM alone's), its p95 and attempts per call.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

from herdless._percentiles import percentile
from herdless.bench.report import Column, Medians, ScenarioResult, Target
from herdless.bench.runner import Arm, Progress, run_arms
from herdless.bench.sizing_load import (
    Load,
    SizingParams,
    closed_loop,
    emulator,
    gateway,
    gpu_knobs,
    idle,
)
from herdless.bench.stats import ratio
from herdless.launch.servers import ServerProcess

__all__ = ["ARMS", "restart"]

_SEQS, _CROWD, _QUEUE = 8, 48, 16
_ALONE, _RUNNING, _STARTED = (
    "vLLM alone, no gateway",
    "herdless serve, running",
    "herdless serve, just started",
)
_STATIC = "herdless serve --sizing static, just started"
ARMS: dict[str, dict[str, object] | None] = {
    _ALONE: None,
    _RUNNING: {},
    _STARTED: {},
    _STATIC: {"sizing": "static"},
}
"""The arms and their gateway's flags (``None``: no gateway), beside ``--max-concurrency 8
--max-queue 16``."""


def _crowd(url: str, seed: int) -> tuple[float, Load]:
    load = Load(kind="crowd", callers=_CROWD, prompt=20, answer=96)
    t0 = time.monotonic()
    asyncio.run(closed_loop(url + "/v1", [load], 120.0, seed, once=True))
    return time.monotonic() - t0, load


def _arm(engine: ServerProcess, p: SizingParams, name: str, opts: dict[str, object] | None) -> Arm:
    def run(seed: int) -> dict[str, float]:
        asyncio.run(idle(engine.url))
        if opts is None:
            took, load = _crowd(engine.url, seed)
        else:
            caps = {"max_concurrency": _SEQS, "max_queue": _QUEUE}
            with gateway(engine.url, {**p.gateway, **opts, **caps}) as gw:
                if name == _RUNNING:
                    _crowd(gw.url, seed + 1000)  # what it served before this crowd
                    asyncio.run(idle(engine.url))
                took, load = _crowd(gw.url, seed)
        latencies = [c.ended - c.sent for c in load.calls]
        return {
            "makespan": took,
            "p95": percentile(latencies, 95),
            "attempts": sum(c.attempts for c in load.calls) / len(load.calls),
            "answered": len(load.calls),
        }

    return Arm(name=name, run=run)


def restart(p: SizingParams, progress: Progress) -> ScenarioResult:
    """The crowd a restart refused, against a gateway just started and one running."""
    gpu = dataclasses.replace(p, seqs=_SEQS)
    with emulator(gpu) as engine:
        _crowd(engine.url, p.seed - 1)  # the engine has served before the first arm
        progress("the engine served a crowd")
        arms = [_arm(engine, p, name, opts) for name, opts in ARMS.items()]
        runs = run_arms(arms, repeats=p.repeats, seed=p.seed, progress=progress)
    table = Medians(runs)
    table.relative("makespan_x", "makespan", base=_ALONE)
    return table.result(
        name="sizing-restart",
        title=(
            f"{_CROWD} callers at once against a gateway just started in front of a serving "
            f"engine ({_SEQS} running, {_QUEUE} waiting)"
        ),
        params={**gpu_knobs(gpu), "crowd": _CROWD, "max_queue": _QUEUE},
        columns=[
            Column(key="makespan", label="makespan s"),
            Column(key="makespan_x", label="x vLLM alone"),
            Column(key="p95", label="p95 s"),
            Column(key="attempts", label="attempts/call"),
            Column(key="answered", label="answered", fmt="{:.0f}"),
        ],
        targets=[
            Target(
                label="just started: makespan / vLLM alone's",
                value=table[_STARTED]["makespan_x"],
                limit=1.1,
            ),
            Target(
                label="just started: makespan / running's",
                value=ratio(table[_STARTED]["makespan"], table[_RUNNING]["makespan"]),
                limit=1.1,
            ),
        ],
        notes=[
            "Each gateway arm starts its own gateway; the engine runs through the whole "
            "scenario. A refused caller sleeps the time it was told, then sends its call "
            "again: a time too late leaves the GPU idle meanwhile.",
        ],
    )
