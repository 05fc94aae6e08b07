"""The soak: thousands of calls from many concurrent clients through overload and two outages.

``python -m herdless.bench.soak --duration 150 --out soak-results`` (or ``nox -s soak``)
starts an emulated vLLM behind the gateway and an emulated hosted model (real
processes on 127.0.0.1), then runs a timeline of phases against them from several
``AsyncClient`` instances at once::

    warm-up -> overload (4x the gateway's capacity) -> outage 1 (vLLM hangs)
    -> recovery -> outage 2 (vLLM crashes, restarted 10 s later) -> recovery

and accounts for every call: ``calls == results + typed errors`` exactly, ``hung == 0``
(a call still running 5 s past its deadline), attempts per call, latency and memory
(the gateway's and this process's RSS) every second. Writes ``soak.json`` and
``soak.png`` in ``--out``; exits 1 when the accounting does not balance.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from herdless import AsyncClient, Backend, BreakerPolicy, HerdlessError, RetryPolicy, Timeouts
from herdless.bench.procfs import rss_bytes
from herdless.launch.servers import ServerProcess

__all__ = ["Phase", "SoakReport", "main", "run_soak"]

_DEADLINE = 6.0  # seconds per call
_HUNG_GRACE = 5.0  # a call still running this long after its deadline is hung
_CLIENTS = 8  # AsyncClient instances (apps); the workers share them round-robin
_GATEWAY_FLAGS = (
    *("--max-concurrency", "16", "--max-queue", "16", "--queue-timeout", "2"),
    *("--health-interval", "0.25", "--read-timeout", "10", "--connect-timeout", "0.5"),
    "--no-access-log",  # thousands of lines would only cost CPU on a 2-core machine
)
_MESSAGES = [{"role": "user", "content": "Summarise the meeting notes in two lines."}]


@dataclass(frozen=True, slots=True)
class Phase:
    """A stretch of the soak: how many workers call, and what goes wrong at its start."""

    name: str
    share: float  # fraction of the duration
    workers: int  # concurrent callers
    fault: str | None = None  # "hang" or "crash" of the emulated vLLM at the start


PHASES = (
    Phase("warm-up", 0.15, 16),
    Phase("overload", 0.20, 64),
    Phase("outage 1: vLLM hangs", 0.15, 32, fault="hang"),
    Phase("recovery", 0.15, 32),
    Phase("outage 2: vLLM crashes", 0.15, 32, fault="crash"),
    Phase("recovery 2", 0.20, 32),
)


@dataclass(slots=True)
class SoakReport:
    """Everything the soak counted. ``balanced`` is the acceptance check."""

    duration_s: float
    calls: int = 0
    results: int = 0
    typed_errors: int = 0
    untyped_errors: int = 0
    hung: int = 0
    late: int = 0  # ended, but more than 0.5 s past the deadline
    max_loop_lag_s: float = 0.0
    by_outcome: dict[str, int] = field(default_factory=dict)
    by_phase: dict[str, dict[str, int]] = field(default_factory=dict)
    attempts_per_call: float = 0.0
    latency_p50_s: float = 0.0
    latency_p99_s: float = 0.0
    timeline: list[dict[str, float]] = field(default_factory=list)

    @property
    def balanced(self) -> bool:
        """Every call is accounted for, and none is hung or untyped."""
        return (
            self.calls == self.results + self.typed_errors
            and self.hung == 0
            and self.untyped_errors == 0
        )


class _Soak:
    """The running soak: processes, clients, counters."""

    def __init__(self, duration: float, log_dir: Path) -> None:
        self.duration = duration
        emulate = ["emulate", "--speed", "10", "--max-num-seqs", "16", "--answer-max-tokens", "48"]
        self.vllm = ServerProcess([*emulate, "--model", "local"], log_path=log_dir / "vllm.log")
        self.hosted = ServerProcess(
            [*emulate, "--model", "hosted"], log_path=log_dir / "hosted.log"
        )
        self.gateway = ServerProcess(
            ["serve", "--upstream", self.vllm.url, *_GATEWAY_FLAGS],
            ready_path="/readyz",
            log_path=log_dir / "gateway.log",
        )
        self.report = SoakReport(duration_s=duration)
        self.outcomes: Counter[str] = Counter()
        self.latencies: list[tuple[float, float]] = []  # (end time, latency)
        self.attempts: list[int] = []
        self.phase = PHASES[0]
        self.started = 0.0
        self.restarts: list[asyncio.Future[None]] = []

    async def run(self) -> SoakReport:
        for server in (self.vllm, self.hosted, self.gateway):
            server.start()
        try:
            clients = [self._client(i) for i in range(_CLIENTS)]
            self.started = time.monotonic()
            workers = max(phase.workers for phase in PHASES)
            tasks = [asyncio.create_task(self._worker(i, clients)) for i in range(workers)]
            sampler = asyncio.create_task(self._sample())
            await self._timeline()
            await asyncio.gather(*tasks)
            sampler.cancel()
            for client in clients:
                await client.aclose()
        finally:
            for server in (self.gateway, self.vllm, self.hosted):
                server.stop(grace=3.0)
        return self._finish()

    def _client(self, seed: int) -> AsyncClient:
        return AsyncClient(
            primary=Backend(name="gateway", base_url=self.gateway.url + "/v1"),
            fallback=Backend(
                name="hosted", base_url=self.hosted.url + "/v1", model="hosted", external=True
            ),
            model="local",
            deadline=_DEADLINE,
            timeouts=Timeouts(connect=0.5, first_byte=2.0, read=2.0),
            retry=RetryPolicy(max_retry_after=3.0),
            breaker=BreakerPolicy(open_for=2.0, max_open_for=8.0),
            rng=random.Random(seed),
            env_file=None,
        )

    async def _timeline(self) -> None:
        for phase in PHASES:
            self.phase = phase
            if phase.fault == "hang":
                self._faults(hang=True)
            elif phase.fault == "crash":
                self._faults(crash=True)
                loop = asyncio.get_running_loop()
                self.restarts.append(loop.run_in_executor(None, self._restart_vllm, 10.0))
            else:
                self._faults()  # healthy again: clear the steady faults
            await asyncio.sleep(phase.share * self.duration)
        self.phase = Phase("stopped", 0.0, 0)
        await asyncio.gather(*self.restarts)

    def _faults(self, **faults: object) -> None:
        # Crashed and not yet back (or crashing now, without an answer): nothing to do.
        with contextlib.suppress(httpx.TransportError):
            httpx.post(self.vllm.url + "/_emulator/faults", json=faults, timeout=2.0)

    def _restart_vllm(self, after: float) -> None:
        time.sleep(after)
        self.vllm.stop()
        self.vllm.process = None
        self.vllm.start()

    async def _worker(self, index: int, clients: list[AsyncClient]) -> None:
        rng = random.Random(index)
        while self.phase.name != "stopped":
            if index >= self.phase.workers:
                await asyncio.sleep(0.1)
                continue
            await self._one_call(clients[index % len(clients)], strict=rng.random() < 0.25)

    async def _one_call(self, client: AsyncClient, *, strict: bool) -> None:
        phase = self.phase.name
        began = time.monotonic()
        self.report.calls += 1
        try:
            result = await asyncio.wait_for(
                client.chat(_MESSAGES, max_tokens=32, allow_fallback=not strict),
                timeout=_DEADLINE + _HUNG_GRACE,
            )
        except TimeoutError:
            outcome, attempts = "hung", 0
            self.report.hung += 1
        except HerdlessError as exc:
            outcome, attempts = type(exc).__name__, len(exc.attempts)
            self.report.typed_errors += 1
            await asyncio.sleep(0.05)  # an app would not hammer on at once either
        except Exception as exc:
            outcome, attempts = f"untyped {type(exc).__name__}", 0
            self.report.untyped_errors += 1
        else:
            outcome, attempts = result.backend, len(result.attempts)
            self.report.results += 1
        now = time.monotonic()
        self.outcomes[outcome] += 1
        counts = self.report.by_phase.setdefault(phase, {})
        counts[outcome] = counts.get(outcome, 0) + 1
        self.latencies.append((now - self.started, now - began))
        self.attempts.append(attempts)

    async def _sample(self) -> None:
        """Once a second: latency of the calls that ended, calls so far, memory."""
        seen = 0
        while True:
            asked = time.monotonic()
            await asyncio.sleep(1.0)
            # How late the loop woke us: on a starved CPU, calls overrun their deadline
            # by about this much, through no decision of the SDK's.
            lag = time.monotonic() - asked - 1.0
            window = [lat for _, lat in self.latencies[seen:]]
            seen = len(self.latencies)
            self.report.timeline.append(
                {
                    "t": round(time.monotonic() - self.started, 2),
                    "calls_per_s": len(window),
                    "p50_s": statistics.median(window) if window else 0.0,
                    "max_s": max(window, default=0.0),
                    "loop_lag_s": round(lag, 3),
                    "gateway_rss_mib": rss_bytes(self.gateway.pid) / 2**20,
                    "soak_rss_mib": rss_bytes() / 2**20,
                }
            )

    def _finish(self) -> SoakReport:
        report = self.report
        report.by_outcome = dict(self.outcomes)
        latencies = sorted(lat for _, lat in self.latencies)
        if latencies:
            report.latency_p50_s = latencies[len(latencies) // 2]
            report.latency_p99_s = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
        report.late = sum(lat > _DEADLINE + 0.5 for _, lat in self.latencies)
        report.max_loop_lag_s = max((row["loop_lag_s"] for row in report.timeline), default=0.0)
        if self.attempts:
            report.attempts_per_call = sum(self.attempts) / len(self.attempts)
        return report


def plot(report: SoakReport, path: Path) -> Path:
    """Latency and memory over time, with the phases shaded (PNG)."""
    import matplotlib  # lazy: the demo extra

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [row["t"] for row in report.timeline]
    fig, (lat, rate, mem) = plt.subplots(3, 1, sharex=True, figsize=(9, 7))
    lat.plot(t, [row["p50_s"] for row in report.timeline], label="p50")
    lat.plot(t, [row["max_s"] for row in report.timeline], label="max", alpha=0.6)
    lat.axhline(_DEADLINE, linestyle="--", color="grey", label="deadline")
    lat.set_ylabel("latency (s)")
    lat.legend(loc="upper right")
    rate.plot(t, [row["calls_per_s"] for row in report.timeline])
    rate.set_ylabel("calls ended / s")
    mem.plot(t, [row["gateway_rss_mib"] for row in report.timeline], label="gateway")
    mem.plot(t, [row["soak_rss_mib"] for row in report.timeline], label="clients (this process)")
    mem.set_ylabel("RSS (MiB)")
    mem.set_xlabel("seconds")
    mem.legend(loc="upper right")
    start = 0.0
    for i, phase in enumerate(PHASES):
        end = start + phase.share * report.duration_s
        for axis in (lat, rate, mem):
            axis.axvspan(start, end, color=f"C{i % 10}", alpha=0.07)
        lat.text(start, lat.get_ylim()[1] * 0.92, phase.name, fontsize=7)
        start = end
    fig.suptitle(f"soak: {report.calls} calls, {report.hung} hung")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run_soak(duration: float, out: Path) -> SoakReport:
    """Run the soak for ``duration`` seconds; write ``soak.json`` and ``soak.png`` to ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    report = asyncio.run(_Soak(duration, out).run())
    (out / "soak.json").write_text(json.dumps(asdict(report), indent=2))
    plot(report, out / "soak.png")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m herdless.bench.soak``; returns 0 when the accounting balances."""
    parser = argparse.ArgumentParser(prog="python -m herdless.bench.soak", description=__doc__)
    parser.add_argument("--duration", type=float, default=150.0, help="seconds (default 150)")
    parser.add_argument("--out", type=Path, default=Path("soak-results"), help="output folder")
    opts = parser.parse_args(argv)
    report = run_soak(opts.duration, opts.out)
    print(
        f"calls {report.calls} = results {report.results} + typed errors {report.typed_errors}"
        f" (untyped {report.untyped_errors}, hung {report.hung});"
        f" attempts/call {report.attempts_per_call:.2f};"
        f" latency p50 {report.latency_p50_s:.2f}s p99 {report.latency_p99_s:.2f}s;"
        f" {report.late} ended > 0.5 s past the {_DEADLINE:g} s deadline"
        f" (event-loop lag up to {report.max_loop_lag_s:.2f} s)"
    )
    print(json.dumps(report.by_outcome, sort_keys=True))
    return 0 if report.balanced else 1


if __name__ == "__main__":
    sys.exit(main())
