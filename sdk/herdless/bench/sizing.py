"""The ``sizing`` scenarios: a gateway that sizes itself from the engine, beside static limits.

Real processes on 127.0.0.1: an emulated GPU (``herdless emulate --kv-cache-tokens
60000 --max-num-seqs 256 --speed 4``: vLLM's default ``max-num-seqs``, its chunked
prefill, its FCFS queue and its preemptions) and, per arm, a gateway in front of it,
every arm against the same emulator in the same run:

1. ``sizing-flood``: a batch job (40 closed-loop callers, 3,000-token prompts, 600-token
   answers, ``X-Herdless-Priority: batch``) beside 6 employees chatting (200 + 40 tokens,
   0.5 s think time, from 3 s in). Arms: the chats alone, vLLM alone, static limits (the
   old defaults, sized by the docs' table, by hand, the best static arrangement) and the
   self-sized gateway. Figures: chat p50/p95, batch tokens per second, preemptions.
2. ``sizing-crowd``: 120 employees at once, 3,000-token prompts, ``max_tokens`` 600,
   natural answers of 450-600 tokens. Figures: makespan, preemptions, the engine's
   waiting count (sampled every 0.1 s) p50. ``sizing-long``: the same with answers of
   1,000-1,500 tokens (``max_tokens`` 1,500): each arm's gateway, just started, meets
   the crowd with no answer of its own ended for 10 s. ``sizing-open``: ``sizing-long``
   from a chat front-end, whose calls name no ``max_tokens``.
3. ``sizing-mixes``: three closed-loop mixes with no think time (short chat 64 x
   200 + 100, RAG 24 x 6,000 + 300, long answers 24 x 500 + 1,500), each against a sweep
   of static ``--max-concurrency`` and the self-sized gateway. Figure: goodput, the
   answers finished within ``deadline`` seconds of their sending, per second, after a
   warm-up.
4. ``sizing-switch``: the mix switches from short chat to RAG mid-run; the dispatch
   limit the gateway shows on ``/metrics`` (sampled every 0.25 s): how long it takes to
   settle, and its swing afterwards.
5. ``sizing-stale``: the emulator's ``/metrics`` stalls for 10 s mid-run (its fault):
   throughput in those 10 s against the 10 s before, preemptions after.
6. ``sizing-streams``: a chat front-end's streams (64 closed-loop callers, 500-token
   prompts, ``max_tokens`` 4000, natural answers of 450-600 tokens), asking for their
   usage (as herdless's SDK and LangChain.js do) or not (openai-node's and
   openai-python's default), through the self-sized gateway, beside vLLM alone. Figure:
   answers per second.
7. ``sizing-shared``: a job of 120 requests at once that share 3,000 tokens of
   instructions (200 tokens of their own, 200-token answers) on the emulator with its
   prefix cache on (``--enable-prefix-caching``), the instructions already in it. Arms:
   vLLM alone, static limits and the self-sized gateway. Figures: makespan,
   preemptions, the engine's waiting count p50 and its running count at most.
8. ``sizing-restart``: the crowd a gateway's restart refused, back at once, against the
   gateway just started in front of an engine that has served (:mod:`.sizing_restart`).
   Figures: makespan against vLLM alone's and against a gateway that was running.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from herdless._percentiles import percentile
from herdless.bench.report import Column, Medians, ScenarioResult, Target
from herdless.bench.runner import Arm, Progress, run_arms
from herdless.bench.sizing_load import (
    SELF,
    STATIC_ARMS,
    Load,
    SizingParams,
    arm_url,
    closed_loop,
    emulator,
    gpu_knobs,
    idle,
    preemptions,
    sampled,
)
from herdless.bench.sizing_mixes import MIXES, mixes, stale, switch
from herdless.bench.sizing_restart import ARMS as RESTART_ARMS
from herdless.bench.sizing_restart import restart
from herdless.bench.stats import ratio
from herdless.launch.servers import ServerProcess

__all__ = ["SizingParams", "run", "runs"]


# -- 1. the batch flood -----------------------------------------------------------------


def _flood_arm(engine: ServerProcess, p: SizingParams, name: str, opts: Any) -> Arm:
    def run(seed: int) -> dict[str, float]:
        chats_only = name == "chats alone"
        with arm_url(engine, opts) as gw:
            url = (gw or engine).url + "/v1"
            asyncio.run(idle(engine.url))
            before = asyncio.run(preemptions(engine.url))
            chats = Load(kind="chat", callers=6, prompt=200, answer=40, think=0.5, start=3.0,
                         priority="interactive")  # fmt: skip
            loads = [chats]
            batch = Load(kind="batch", callers=40, prompt=3000, answer=600, priority="batch")
            if not chats_only:
                loads.append(batch)
            t0 = time.monotonic()
            asyncio.run(closed_loop(url, loads, p.flood, seed))
            took = time.monotonic() - t0
            after = asyncio.run(preemptions(engine.url))
        latencies = [c.ended - c.sent for c in chats.calls]
        batch_tokens = sum(c.tokens for c in batch.calls)
        return {
            "chat_p50": percentile(latencies, 50) if latencies else math.nan,
            "chat_p95": percentile(latencies, 95) if latencies else math.nan,
            "batch_tps": math.nan if chats_only else batch_tokens / took,
            "preemptions": after - before,
        }

    return Arm(name=name, run=run)


def _flood(engine: ServerProcess, p: SizingParams, progress: Progress) -> ScenarioResult:
    specs: dict[str, Any] = {"chats alone": None, "vLLM alone, no gateway": None}
    specs |= STATIC_ARMS | {SELF: dict(p.gateway)}
    arms = [_flood_arm(engine, p, name, opts) for name, opts in specs.items()]
    runs = run_arms(arms, repeats=p.repeats, seed=p.seed, progress=progress)
    table = Medians(runs)
    table.relative("p50_x", "chat_p50", base="chats alone")
    table.relative("p95_x", "chat_p95", base="chats alone")
    table.relative("tps_x", "batch_tps", base="vLLM alone, no gateway")
    me, best = table[SELF], table["best static (24, reserve 8)"]
    return table.result(
        name="sizing-flood",
        title="A batch flood beside 6 chatting employees (emulated GPU, KV 60,000, 256 seqs)",
        params={**gpu_knobs(p), "seconds": p.flood},
        columns=[
            Column(key="chat_p50", label="chat p50 s"),
            Column(key="p50_x", label="x alone"),
            Column(key="chat_p95", label="chat p95 s"),
            Column(key="p95_x", label="x alone"),
            Column(key="batch_tps", label="batch tokens/s", fmt="{:.0f}"),
            Column(key="tps_x", label="x vLLM alone"),
            Column(key="preemptions", label="preemptions", fmt="{:.0f}"),
        ],
        targets=[
            Target(label="self-sized chat p50 / alone", value=me["p50_x"], limit=1.5),
            Target(label="self-sized chat p95 / alone", value=me["p95_x"], limit=2.2),
            Target(
                label="self-sized chat p95 / best static's",
                value=ratio(me["chat_p95"], best["chat_p95"]),
                limit=1.0,
            ),
            Target(
                label="self-sized batch tokens/s / vLLM alone",
                value=me["tps_x"],
                limit=0.95,
                at_least=True,
            ),
        ],
        notes=[
            "Every answer is exactly max_tokens long (ignore_eos); 429s are retried after "
            "their retry-after-ms. Static arms run `--sizing static` with the flags named."
        ],
    )


# -- 2. the crowd, 7. a job that shares its instructions: all at once ----------------


def _once_arm(
    engine: ServerProcess,
    name: str,
    opts: Any,
    job: Callable[[], Load],
    warm: Callable[[], Load] | None,
) -> Arm:
    def run(seed: int) -> dict[str, float]:
        with arm_url(engine, opts) as gw:
            url = (gw or engine).url + "/v1"
            asyncio.run(idle(engine.url))
            if warm is not None:  # straight to the engine: what it has cached already
                asyncio.run(closed_loop(engine.url + "/v1", [warm()], 60.0, seed, once=True))
            before = asyncio.run(preemptions(engine.url))
            load = job()
            work = closed_loop(url, [load], 600.0, seed, once=True)
            took, seen = asyncio.run(sampled(engine.url, None, work))
            after = asyncio.run(preemptions(engine.url))
        return {
            "makespan": took,
            "preemptions": after - before,
            "waiting_p50": seen.waiting_p50,
            "running_max": float(max(seen.running, default=0)),
            "answered": len(load.calls),
        }

    return Arm(name=name, run=run)


def _at_once(
    p: SizingParams,
    progress: Progress,
    *,
    name: str,
    title: str,
    params: dict[str, object],
    job: Callable[[], Load],
    warm: Callable[[], Load] | None = None,
    makespan: float,
    notes: list[str] | None = None,
    **flags: Any,
) -> ScenarioResult:
    """A ``job`` sent all at once, against an emulator with ``flags``: vLLM alone, the
    static defaults, sized by the docs and the self-sized gateway."""
    with emulator(p, **flags) as engine:
        specs: dict[str, Any] = {"vLLM alone, no gateway": None}
        specs |= {k: v for k, v in STATIC_ARMS.items() if "best" not in k and "hand" not in k}
        specs[SELF] = dict(p.gateway)
        arms = [_once_arm(engine, arm, opts, job, warm) for arm, opts in specs.items()]
        runs = run_arms(arms, repeats=p.repeats, seed=p.seed, progress=progress)
    table = Medians(runs)
    table.relative("makespan_x", "makespan", base="vLLM alone, no gateway")
    me, alone = table[SELF], table["vLLM alone, no gateway"]
    return table.result(
        name=name,
        title=title,
        params=params,
        columns=[
            Column(key="makespan", label="makespan s"),
            Column(key="makespan_x", label="x vLLM alone"),
            Column(key="preemptions", label="preemptions", fmt="{:.0f}"),
            Column(key="waiting_p50", label="engine waiting p50", fmt="{:.0f}"),
            Column(key="running_max", label="engine running at most", fmt="{:.0f}"),
            Column(key="answered", label="answered", fmt="{:.0f}"),
        ],
        targets=[
            Target(
                label="self-sized makespan / vLLM alone", value=me["makespan_x"], limit=makespan
            ),
            Target(
                label="self-sized preemptions - vLLM alone's",
                value=me["preemptions"] - alone["preemptions"],
                limit=0,
            ),
            Target(label="self-sized engine waiting p50", value=me["waiting_p50"], limit=2),
        ],
        notes=notes or [],
    )


def _crowd(
    p: SizingParams, progress: Progress, *, long: bool = False, named: bool = True
) -> ScenarioResult:
    """``sizing-crowd``, or with ``long`` answers ``sizing-long``; ``sizing-open`` when
    they do not name their ``max_tokens``."""
    low, high = (1000, 1500) if long else (450, 600)
    title = f"120 employees at once, 3,000-token prompts, answers of {low:,}-{high:,} tokens"
    notes = [
        "Every gateway arm is started for the run, in front of an engine that has "
        "served the arms before: its first answers end some 10 s in."
    ]
    if not named:
        notes.append(
            "No call names its max_tokens, as chat front-ends send them: the gateway "
            "prices each at --default-max-tokens (512)."
        )
    return _at_once(
        p,
        progress,
        name="sizing-crowd" if not long else "sizing-long" if named else "sizing-open",
        title=title if named else f"{title}, no max_tokens named",
        params=gpu_knobs(p),
        job=lambda: Load(
            kind="crowd", callers=120, prompt=3000, answer=high, ignore_eos=False, named=named
        ),
        makespan=1.03,
        notes=notes if long else None,
        answer_min_tokens=low,
        answer_max_tokens=high,
    )


_INSTRUCTIONS = 3000


def _shared(p: SizingParams, progress: Progress) -> ScenarioResult:
    return _at_once(
        p,
        progress,
        name="sizing-shared",
        title=(
            f"A job of 120 requests at once sharing {_INSTRUCTIONS:,} tokens of instructions, "
            "the engine's prefix cache on"
        ),
        params={**gpu_knobs(p), "instructions": _INSTRUCTIONS, "prompt": 200, "answer": 200},
        job=lambda: Load(kind="job", callers=120, prompt=200, answer=200, system=_INSTRUCTIONS),
        warm=lambda: Load(kind="warm", callers=1, prompt=10, answer=1, system=_INSTRUCTIONS),
        makespan=1.1,
        notes=[
            "Each arm first sends one request with the instructions straight to the engine: "
            "a long job's steady state, its instructions in the cache."
        ],
        enable_prefix_caching=True,
    )


# -- 6. a front-end's streams ----------------------------------------------------------

_ASKED, _NOT_ASKED = "self-sized, streams ask for usage", "self-sized, streams without usage"


def _streams_arm(engine: ServerProcess, p: SizingParams, name: str, opts: Any) -> Arm:
    def run(seed: int) -> dict[str, float]:
        with arm_url(engine, opts) as gw:
            url = (gw or engine).url + "/v1"
            asyncio.run(idle(engine.url))
            before = asyncio.run(preemptions(engine.url))
            chats = Load(kind="stream", callers=64, prompt=500, answer=4000, ignore_eos=False,
                         stream=True, usage=name == _ASKED)  # fmt: skip
            asyncio.run(closed_loop(url, [chats], p.flood, seed))
            after = asyncio.run(preemptions(engine.url))
        return {
            "answers_s": len(chats.calls) / p.flood,
            "tokens_s": sum(c.tokens for c in chats.calls) / p.flood,
            "preemptions": after - before,
        }

    return Arm(name=name, run=run)


def _streams(p: SizingParams, progress: Progress) -> ScenarioResult:
    with emulator(p, answer_min_tokens=450, answer_max_tokens=600) as engine:
        specs: dict[str, Any] = {"vLLM alone, no gateway": None}
        specs |= {_ASKED: dict(p.gateway), _NOT_ASKED: dict(p.gateway)}
        arms = [_streams_arm(engine, p, name, opts) for name, opts in specs.items()]
        runs = run_arms(arms, repeats=p.repeats, seed=p.seed, progress=progress)
    table = Medians(runs)
    table.relative("answers_x", "answers_s", base="vLLM alone, no gateway")
    asked, not_asked = table[_ASKED], table[_NOT_ASKED]
    return table.result(
        name="sizing-streams",
        title="A chat front-end's 64 streams, max_tokens 4000, answers of 450-600 tokens",
        params={**gpu_knobs(p), "seconds": p.flood},
        columns=[
            Column(key="answers_s", label="answers/s", fmt="{:.2f}"),
            Column(key="answers_x", label="x vLLM alone"),
            Column(key="tokens_s", label="tokens/s", fmt="{:.0f}"),
            Column(key="preemptions", label="preemptions", fmt="{:.0f}"),
        ],
        targets=[
            Target(
                label="streams without usage: answers/s / streams asking for it",
                value=ratio(not_asked["answers_s"], asked["answers_s"]),
                limit=0.95,
                at_least=True,
            ),
        ],
        notes=[
            "Streamed closed loops (a new call as soon as one ends); a stream's tokens are "
            "counted from its events. The gateway asks vLLM for the usage of a stream whose "
            "client did not, and settles the price (prompt + max_tokens) on it."
        ],
    )


def runs(repeats: int) -> int:
    """Arm runs of one ``sizing`` run (for the progress bar)."""
    flood = 2 + len(STATIC_ARMS) + 1
    crowd = 3 * (1 + 2 + 1)
    mixes = len(MIXES) * (len(SizingParams().statics) + 1)
    streams = 3
    shared = 1 + 2 + 1
    return repeats * (flood + crowd + mixes + streams + shared + len(RESTART_ARMS)) + 3


def run(p: SizingParams, out: Path, progress: Progress) -> list[ScenarioResult]:
    """Every sizing scenario, in one run."""
    results = []
    with emulator(p) as engine:
        results.append(_flood(engine, p, progress))
    results.append(_crowd(p, progress))
    results.append(_crowd(p, progress, long=True))
    results.append(_crowd(p, progress, long=True, named=False))
    results.append(mixes(p, progress))
    results.append(switch(p, out, progress))
    results.append(stale(p, progress))
    results.append(_streams(p, progress))
    results.append(_shared(p, progress))
    results.append(restart(p, progress))
    return results
