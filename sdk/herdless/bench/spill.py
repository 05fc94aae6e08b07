"""The ``spill`` scenario: when does a shared client send work to the paid hosted model?

The hosted fallback is for outages and missed deadlines, not for a GPU that is merely
busy: every spilled call costs money and sends data out. One ``herdless.AsyncClient``
with an emulated hosted model (``external=True``) as its fallback, in front of the
gateway (``slots`` running + ``queue`` waiting) on an emulated vLLM, and three cases:

- ``busy``: ``n`` calls at once with a deadline the GPU's queue easily meets: how many
  go to the hosted model (target: none);
- ``short``: the same with a deadline the queue cannot meet for all of them: the calls
  that cannot make it must leave as soon as the client can know it (how long after it
  last learned anything: an answer, a refusal, another call leaving the GPU; a batch's
  answers may come split, a slow engine step apart, so its end is known only half a
  batch after its last answer) and none may end past its deadline; the same with
  ``allow_fallback=False``: a typed error;
- ``drain``: the gateway drained for an announced window under a steady load from the
  same client, then resumed: which calls started after the window the hosted model
  answered (target: none; the client is told the window's end, and a GPU serving again
  is merely busy);
- ``outage``: the vLLM behind the gateway is stopped: how long after the gateway's
  503 the first call is answered by the hosted model.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from herdless._percentiles import percentile
from herdless.bench.report import Column, Medians, ScenarioResult, Target, knobs
from herdless.bench.runner import Arm, Progress, Runs, run_arms
from herdless.bench.servers import quiet_emulator, quiet_gateway
from herdless.launch.servers import ServerProcess

__all__ = ["SpillParams", "run"]

_MESSAGES = [{"role": "user", "content": "Draft a reply to this customer email."}]
_ADMIN = "bench-admin"


@dataclass(frozen=True, slots=True, kw_only=True)
class SpillParams:
    """Sizes of the spill scenario.

    Attributes:
        n: calls started at once.
        slots: the GPU's ``max_num_seqs`` and the gateway's ``max_concurrency``.
        queue: the gateway's ``max_queue``.
        max_tokens: tokens per answer (``ignore_eos``).
        deadline: seconds per call in the ``busy`` case (ample).
        short_deadline: seconds per call in the ``short`` case (too short for the last).
        window: the ``drain`` case's announced window, in seconds.
        repeats: repetitions per case.
    """

    n: int = 30
    slots: int = 4
    queue: int = 4
    max_tokens: int = 48
    deadline: float = 90.0
    short_deadline: float = 4.0
    window: float = 3.0
    repeats: int = 1


def _client(gateway: str, hosted: str, events: list[Any], deadline: float) -> Any:
    import herdless

    return herdless.AsyncClient(
        primary=herdless.Backend(name="gpu", base_url=gateway),
        fallback=herdless.Backend(
            name="hosted", base_url=hosted, model="hosted-model", external=True
        ),
        deadline=deadline,
        on_event=events.append,
    )


async def _crowd(
    gateway: str, hosted: str, n: int, deadline: float, *, allow_fallback: bool, tokens: int
) -> dict[str, float]:
    import herdless
    from herdless.events import CallFinished

    events: list[Any] = []
    ends: list[float] = []
    outcomes: list[str] = []
    async with _client(gateway, hosted, events, deadline) as client:
        start = time.monotonic()

        async def one() -> None:
            began = time.monotonic()
            try:
                result = await client.chat(
                    _MESSAGES, max_tokens=tokens, ignore_eos=True, allow_fallback=allow_fallback
                )
                outcomes.append(result.backend)
            except herdless.HerdlessError as exc:
                outcomes.append(type(exc).__name__)
            ends.append(time.monotonic() - began)

        await asyncio.gather(*(one() for _ in range(n)))
        makespan = time.monotonic() - start
    lags = _lags(events)
    gpu = [e.at for e in events if isinstance(e, CallFinished) and e.backend == "gpu"]
    first = min(gpu, default=start)  # none served by the GPU: no batch measured
    return {
        "batch_ms": (first - start) * 1000,  # the first batch went straight in
        "gpu": outcomes.count("gpu") / n,
        "hosted": outcomes.count("hosted") / n,
        "errors": sum(o not in ("gpu", "hosted") for o in outcomes) / n,
        "late": sum(e > deadline + 0.5 for e in ends) / n,
        "lag_p50_ms": percentile(lags, 50) * 1000,
        "lag_max_ms": max(lags, default=float("nan")) * 1000,
        "makespan": makespan,
    }


def _lags(events: list[Any]) -> list[float]:
    """For every call that left the GPU (to the fallback, or with an error): seconds from
    the last thing the client learned (this call's own last event, or another call leaving
    the GPU) to its leaving."""
    from herdless.events import CallFailed, CallFinished, FallbackUsed

    last_seen: dict[str, float] = {}
    freed: list[float] = []  # when calls finished at the GPU: a place there freed
    lags = []
    for event in sorted(events, key=lambda e: e.at):
        left = (isinstance(event, FallbackUsed) and event.from_backend == "gpu") or (
            isinstance(event, CallFailed) and event.backend == "gpu"
        )
        if left:
            learned = max(last_seen.get(event.call_id, 0.0), freed[-1] if freed else 0.0)
            lags.append(event.at - learned)
        if isinstance(event, CallFinished) and event.backend == "gpu":
            freed.append(event.at)
        last_seen[event.call_id] = event.at
    return lags


async def _drain(gateway: str, hosted: str, p: SpillParams) -> dict[str, float]:
    """As many closed loops as the gateway holds (``slots + queue``), 2 s of steady
    load, a drain announced for ``p.window`` s and resumed half a second early (the
    upstream came back: a window that runs over is another case), then 6 s more. The
    figures count the calls started after the announced end, a 50 ms margin for the
    lag between the two clocks."""
    from herdless.events import FallbackUsed

    events: list[Any] = []
    calls: list[tuple[float, str]] = []  # (started, who answered)
    stop = asyncio.Event()
    admin = httpx.AsyncClient(
        base_url=gateway.removesuffix("/v1"), headers={"authorization": f"Bearer {_ADMIN}"}
    )
    async with _client(gateway, hosted, events, 30.0) as client, admin:

        async def loop() -> None:
            while not stop.is_set():
                started = time.monotonic()
                result = await client.chat(_MESSAGES, max_tokens=p.max_tokens, ignore_eos=True)
                calls.append((started, result.backend))

        loops = [asyncio.create_task(loop()) for _ in range(p.slots + p.queue)]
        await asyncio.sleep(2.0)
        (await admin.post("/admin/drain", params={"expect": p.window})).raise_for_status()
        end = time.monotonic() + p.window
        await asyncio.sleep(p.window - 0.5)
        (await admin.post("/admin/resume")).raise_for_status()
        await asyncio.sleep(6.5)
        stop.set()
        await asyncio.gather(*loops)
    after = [backend for started, backend in calls if started >= end + 0.05]
    spills = [e for e in events if isinstance(e, FallbackUsed) and e.at >= end + 0.05]
    return {
        "calls": len(after),
        "hosted": after.count("hosted") / max(1, len(after)),
        "breaker_open": sum(e.reason == "breaker_open" for e in spills),
        "draining": sum(e.reason == "draining" for e in spills),
        "last_spill_s": max((e.at - end for e in spills), default=0.0),
    }


async def _outage(gateway: str, hosted: str, tokens: int) -> dict[str, float]:
    from herdless.events import AttemptFailed, CallFinished

    events: list[Any] = []
    async with _client(gateway, hosted, events, 30.0) as client:
        result = await client.chat(_MESSAGES, max_tokens=tokens)
    refused = next(e for e in events if isinstance(e, AttemptFailed) and e.backend == "gpu")
    served = next(e for e in events if isinstance(e, CallFinished))
    return {
        "hosted": float(result.backend == "hosted"),
        "after_503_ms": (served.at - refused.at) * 1000,
        "status": float(refused.status or 0),
    }


@contextlib.contextmanager
def _stack(p: SpillParams) -> Iterator[tuple[ServerProcess, str, str]]:
    """The emulated GPU, the gateway in front of it, and a fast emulated hosted model."""
    with (
        quiet_emulator(max_num_seqs=p.slots) as gpu,
        quiet_emulator(model="hosted-model", speed=50.0) as hosted,
        quiet_gateway(
            upstream=gpu.url,
            max_concurrency=p.slots,
            max_queue=p.queue,
            queue_timeout=120,
            health_interval=0.25,
            upstream_retry_after=5.0,
            env={"HERDLESS_GATEWAY_ADMIN_TOKEN": _ADMIN},
        ) as gateway,
    ):
        yield gpu, f"{gateway.url}/v1", f"{hosted.url}/v1"


def run(p: SpillParams, progress: Progress | None = None) -> list[ScenarioResult]:
    """The three cases, in one deployment; the outage last (it stops the GPU)."""
    with _stack(p) as (gpu, gateway, hosted):
        tokens = p.max_tokens

        def crowd(deadline: float, allow: bool) -> Arm:
            name = f"deadline {deadline:g} s" + ("" if allow else ", allow_fallback=False")
            return Arm(
                name=name,
                run=lambda seed: asyncio.run(
                    _crowd(gateway, hosted, p.n, deadline, allow_fallback=allow, tokens=tokens)
                ),
            )

        arms = [
            crowd(p.deadline, True),
            crowd(p.short_deadline, True),
            crowd(p.short_deadline, False),
        ]
        runs = run_arms(arms, repeats=p.repeats, seed=0, progress=progress)
        drain = Arm(
            name=f"drained {p.window:g} s", run=lambda seed: asyncio.run(_drain(gateway, hosted, p))
        )
        drained = run_arms([drain], repeats=p.repeats, seed=0, progress=progress)
        gpu.stop()
        _until_unready(gateway)
        outage = run_arms(
            [
                Arm(
                    name="upstream stopped",
                    run=lambda seed: asyncio.run(_outage(gateway, hosted, tokens)),
                )
            ],
            repeats=1,
            seed=0,
            progress=progress,
        )
    return [_crowd_result(p, runs), _drain_result(p, drained), _outage_result(outage)]


def _until_unready(gateway: str, timeout: float = 10.0) -> None:
    """Wait for the gateway to see its upstream gone (its health poll), bounded."""
    root = gateway.removesuffix("/v1")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if httpx.get(f"{root}/readyz", timeout=2).status_code != 200:
            return
        time.sleep(0.1)


def _crowd_result(p: SpillParams, runs: Runs) -> ScenarioResult:
    table = Medians(runs)
    busy, short, guarded = table.rows
    return table.result(
        name="spill",
        title=(
            f"{p.n} chats at once from one client, gateway {p.slots}+{p.queue}, "
            "an external hosted model as fallback"
        ),
        params=knobs(p, leave_out={"deadline", "short_deadline", "window"}),
        columns=[
            Column(key="gpu", label="served by the GPU", fmt="{:.0%}"),
            Column(key="hosted", label="sent to the hosted model", fmt="{:.0%}"),
            Column(key="errors", label="typed errors", fmt="{:.0%}"),
            Column(key="late", label="ended past the deadline", fmt="{:.0%}"),
            Column(key="lag_p50_ms", label="left the GPU, p50 ms after learning", fmt="{:.1f}"),
            Column(key="lag_max_ms", label="max ms", fmt="{:.1f}"),
            Column(key="batch_ms", label="a batch, ms", fmt="{:.0f}"),
        ],
        targets=[
            Target(
                label="busy GPU, ample deadline: sent to the hosted model",
                value=float(busy["hosted"]),
                limit=0.0,
            ),
            _left_in_time("short deadline: left the GPU", short),
            _left_in_time("allow_fallback=False: raised", guarded),
            Target(
                label="short deadline: ended past the deadline",
                value=float(short["late"]) + float(guarded["late"]),
                limit=0.0,
            ),
        ],
        notes=[
            "Real processes on 127.0.0.1: an emulated GPU, the gateway, an emulated hosted model.",
            "'After learning': from the last thing the client learned (the call's own last "
            "event, or another call leaving the GPU) to the call leaving it. A batch's end "
            "is known half a batch after its last answer (its rest may be a slow step "
            "behind): a batch is the first GPU answer's time.",
            "'Past the deadline': more than 0.5 s after it (the machine's own noise).",
        ],
    )


def _left_in_time(case: str, row: dict[str, Any]) -> Target:
    """The calls that left the GPU did so at most 50 ms after the client could know, and
    a batch's end is known only half a batch after its last answer."""
    return Target(
        label=f"{case}, max ms after learning (50 + half a batch)",
        value=float(row["lag_max_ms"]),
        limit=50.0 + 0.5 * float(row["batch_ms"]),
    )


def _drain_result(p: SpillParams, runs: Runs) -> ScenarioResult:
    table = Medians(runs)
    row = table.rows[0]
    return table.result(
        name="spill-drain",
        title=(
            f"one client, {p.slots + p.queue} calls at a time, across an announced "
            f"{p.window:g} s drain: the calls started in the 6 s after its end"
        ),
        params=knobs(p, leave_out={"n", "deadline", "short_deadline"}),
        columns=[
            Column(key="calls", label="calls", fmt="{:.0f}"),
            Column(key="hosted", label="sent to the hosted model", fmt="{:.0%}"),
            Column(key="breaker_open", label="of them: breaker open", fmt="{:.0f}"),
            Column(key="draining", label="of them: draining", fmt="{:.0f}"),
            Column(key="last_spill_s", label="last one, s after the end", fmt="{:.2f}"),
        ],
        targets=[
            Target(
                label="after the window: sent to the hosted model",
                value=float(row["hosted"]),
                limit=0.0,
            )
        ],
        notes=[
            "Every 503 of the drain tells the window's end; the resume comes 0.5 s before it "
            "(the GPU is back early), so no call meets a window that ran over.",
        ],
    )


def _outage_result(runs: Runs) -> ScenarioResult:
    table = Medians(runs)
    return table.result(
        name="spill-outage",
        title="the vLLM behind the gateway is stopped: the first call",
        params={"repeats": 1},
        columns=[
            Column(key="status", label="gateway's status", fmt="{:.0f}"),
            Column(key="hosted", label="answered by the hosted model", fmt="{:.0%}"),
            Column(key="after_503_ms", label="ms from the 503 to the hosted answer", fmt="{:.1f}"),
        ],
        targets=[
            Target(
                label="first call answered after the 503 (ms)",
                value=float(table.rows[0]["after_503_ms"]),
                limit=200.0,
            )
        ],
        notes=["The hosted model answers in about 10 ms: the rest is the client's doing."],
    )
