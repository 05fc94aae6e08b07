"""The ``outage`` scenario: the primary hangs, then recovers; how fast does the SDK react?

Real processes: an emulated vLLM as the primary and a second emulator as the
hosted fallback. ``workers`` closed-loop callers share one
:class:`herdless.AsyncClient` (one app). After ``warmup`` seconds the primary
starts hanging (it accepts requests and never answers: the emulator's ``hang``
fault); ``hang`` seconds later it is healthy again; the run goes on for
``after`` seconds. A second arm, the same callers talking to the hosted model
directly, is the baseline of the added latency. Arms interleaved, repeated.

Figures (medians over repetitions):

- time to fallback: from the hang to the first call answered by the fallback;
- added latency once the breaker is open: p50 of calls served by the fallback
  while the primary's breaker is open, minus p50 of the direct arm (target <= 5 ms);
- time back to the primary: from recovery to the first call the primary answers,
  in probe intervals (the breaker's ``open_for``; target <= 2).

The primary is the emulator itself, not a gateway: what is measured is the
SDK's breaker and fallback, and a gateway would turn a hang into fast 503s.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx

import herdless
from herdless._percentiles import percentile
from herdless.bench.report import Column, Medians, ScenarioResult, Target, knobs
from herdless.bench.runner import Arm, Progress, run_arms
from herdless.bench.servers import quiet_emulator
from herdless.events import BreakerStateChanged, Event, FallbackUsed

__all__ = ["OutageParams", "run"]

_MESSAGES = [{"role": "user", "content": "Is the build green?"}]


@dataclass(frozen=True, slots=True, kw_only=True)
class OutageParams:
    """Sizes of the outage scenario (seconds unless said otherwise).

    Attributes:
        workers: closed-loop callers sharing one client.
        warmup: normal service before the hang.
        hang: how long the primary hangs.
        after: observation after recovery.
        first_byte: the client's first-byte timeout (what a hang costs one attempt).
        open_for: the breaker's open period (the probe interval).
        speed: the emulators' time scale.
        repeats: repetitions of each arm.
    """

    workers: int = 8
    warmup: float = 3.0
    hang: float = 10.0
    after: float = 30.0
    first_byte: float = 2.0
    open_for: float = 5.0
    speed: float = 20.0
    repeats: int = 2


@dataclass(slots=True)
class _Log:
    calls: list[tuple[float, float, str | None]] = field(default_factory=list)
    opened: list[tuple[float, float]] = field(default_factory=list)
    """(time, open_for) of every opening of the primary's breaker."""
    fallbacks: list[float] = field(default_factory=list)

    def on_event(self, event: Event) -> None:
        if isinstance(event, FallbackUsed):
            self.fallbacks.append(event.at)
        elif isinstance(event, BreakerStateChanged) and (event.backend, event.new) == (
            "primary",
            "open",
        ):
            self.opened.append((event.at, event.open_for or math.nan))


@contextlib.contextmanager
def _servers(p: OutageParams) -> Iterator[tuple[str, str]]:
    with quiet_emulator(speed=p.speed) as primary, quiet_emulator(speed=p.speed) as hosted:
        yield primary.url, hosted.url


async def _callers(client: herdless.AsyncClient, log: _Log, until: float, workers: int) -> None:
    async def one() -> None:
        while time.monotonic() < until:
            start = time.monotonic()
            backend: str | None = None
            with contextlib.suppress(herdless.HerdlessError):
                backend = (await client.chat(_MESSAGES, max_tokens=8)).backend
            log.calls.append((start, time.monotonic(), backend))

    await asyncio.gather(*(one() for _ in range(workers)))


async def _outage(primary: str, hosted: str, p: OutageParams) -> dict[str, float]:
    log = _Log()
    client = herdless.AsyncClient(
        primary=herdless.Backend(name="primary", base_url=f"{primary}/v1"),
        fallback=herdless.Backend(name="hosted", base_url=f"{hosted}/v1"),
        timeouts=herdless.Timeouts(first_byte=p.first_byte),
        breaker=herdless.BreakerPolicy(open_for=p.open_for),
        on_event=log.on_event,
        env_file=None,
    )
    start = time.monotonic()
    hang_at, recover_at = start + p.warmup, start + p.warmup + p.hang
    async with client, httpx.AsyncClient(base_url=primary) as admin:
        callers = asyncio.create_task(_callers(client, log, recover_at + p.after, p.workers))
        await asyncio.sleep(hang_at - time.monotonic())
        (await admin.post("/_emulator/faults", json={"hang": True})).raise_for_status()
        await asyncio.sleep(recover_at - time.monotonic())
        (await admin.delete("/_emulator/faults")).raise_for_status()
        await callers
    back = min(
        (end for s, end, b in log.calls if b == "primary" and s >= recover_at), default=math.nan
    )
    first_open = min((t for t, _ in log.opened if t >= hang_at), default=math.nan)
    # The probe interval in force at recovery: the open period of the last opening before it.
    interval = max(((t, f) for t, f in log.opened if t < recover_at), default=(0.0, math.nan))[1]
    open_latency = [
        end - s for s, end, b in log.calls if b == "hosted" and first_open <= s and end < recover_at
    ]
    return {
        "to_fallback": min((t for t in log.fallbacks if t >= hang_at), default=math.nan) - hang_at,
        "fallback_p50": percentile(open_latency, 50),
        "back_s": back - recover_at,
        "probe_interval": interval,
        "back_intervals": (back - recover_at) / interval,
        "failed": float(sum(1 for *_, b in log.calls if b is None)),
        "calls": float(len(log.calls)),
    }


async def _direct(hosted: str, p: OutageParams) -> dict[str, float]:
    log = _Log()
    async with herdless.AsyncClient(
        primary=herdless.Backend(name="hosted", base_url=f"{hosted}/v1"), env_file=None
    ) as client:
        # As long as the breaker stays open in the other arm: comparable samples.
        await _callers(client, log, time.monotonic() + p.hang, p.workers)
    return {
        "direct_p50": percentile([end - s for s, end, b in log.calls if b is not None], 50),
        "calls": float(len(log.calls)),
    }


def run(p: OutageParams, progress: Progress | None = None) -> list[ScenarioResult]:
    """Both arms, interleaved and repeated, against fresh processes."""
    with _servers(p) as (primary, hosted):
        arms = [
            Arm(name="hosted directly", run=lambda seed: asyncio.run(_direct(hosted, p))),
            Arm(
                name="primary hangs, then recovers",
                run=lambda seed: asyncio.run(_outage(primary, hosted, p)),
            ),
        ]
        runs = run_arms(arms, repeats=p.repeats, seed=0, progress=progress)
    table = Medians(runs)
    direct, outage = table.rows
    added_ms = (float(outage["fallback_p50"]) - float(direct["direct_p50"])) * 1000
    outage["added_ms"] = added_ms
    ms = 1000.0
    for row in table.rows:
        for key in ("direct_p50", "fallback_p50"):
            if key in row:
                row[key] = float(row[key]) * ms
    return [
        table.result(
            name="outage",
            title="the primary hangs, then recovers; one app, a shared client",
            params=knobs(p, leave_out={"warmup", "after", "speed"}),
            columns=[
                Column(key="direct_p50", label="p50 direct to hosted (ms)", fmt="{:.1f}"),
                Column(
                    key="fallback_p50", label="p50 on fallback, breaker open (ms)", fmt="{:.1f}"
                ),
                Column(key="added_ms", label="added (ms)", fmt="{:.1f}"),
                Column(key="to_fallback", label="time to fallback (s)"),
                Column(key="back_s", label="back to primary (s)"),
                Column(key="probe_interval", label="probe interval at recovery (s)"),
                Column(key="back_intervals", label="back (probe intervals)"),
                Column(key="failed", label="calls failed", fmt="{:.0f}"),
                Column(key="calls", label="calls", fmt="{:.0f}"),
            ],
            targets=[
                Target(label="added latency, breaker open (ms)", value=added_ms, limit=5.0),
                Target(
                    label="back to primary (probe intervals)",
                    value=float(outage["back_intervals"]),
                    limit=2.0,
                ),
            ],
            notes=[
                "Time to fallback is bounded below by the first-byte timeout: a hung "
                "primary answers nothing, so the first calls learn it the slow way.",
            ],
        )
    ]
