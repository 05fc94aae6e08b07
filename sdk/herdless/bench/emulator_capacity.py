"""How many concurrent streams the emulator sustains on this machine, and its latency.

For each concurrency level ``N``, ``N`` closed-loop workers stream completions
(``ignore_eos``, ``max_tokens`` each) from one emulator process for ``duration``
seconds. The emulator is configured so that all ``N`` fit in one batch; its
timing model then predicts ``N / step_time(N)`` tokens per second. The
*efficiency* is the tokens per second the clients actually received divided
by that prediction: near 1, the emulator (and the client, on the same
machine) keeps up with the GPU it emulates; well below 1, the CPU is the
bottleneck. A level is *sustained* when every stream completed without error
and the efficiency is at least ``threshold``.

Also reported per level: time to first token and total time per stream
(median and 95th percentile) against the model's step time, and the
emulator's own CPU time per generated token (from ``/proc``; Linux only).

Run: ``python -m herdless.bench.emulator_capacity --speed 10 --levels 1,100,250,500``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import httpx

from herdless.bench.stats import percentile
from herdless.emulator.engine import EngineConfig
from herdless.testing.servers import emulator_process

__all__ = ["CapacityReport", "LevelResult", "main", "run_capacity"]

_PROMPT = [{"role": "user", "content": "Tell me about herds."}]


@dataclass(frozen=True, slots=True, kw_only=True)
class LevelResult:
    """One concurrency level. Times in seconds."""

    concurrency: int
    streams: int
    errors: int
    tokens: int
    tokens_per_s: float
    model_tokens_per_s: float
    efficiency: float
    ttft_p50: float
    ttft_p95: float
    total_p50: float
    total_p95: float
    model_step: float
    cpu_per_token: float  # emulator CPU seconds per generated token; nan when unknown

    @property
    def sustained_at(self) -> float:
        return self.efficiency if self.errors == 0 else 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class CapacityReport:
    """All levels, and the largest one sustained."""

    speed: float
    max_tokens: int
    duration: float
    threshold: float
    levels: list[LevelResult]

    @property
    def sustained(self) -> int:
        """The largest concurrency sustained (0 when none was)."""
        ok = [lv.concurrency for lv in self.levels if lv.sustained_at >= self.threshold]
        return max(ok, default=0)

    def to_markdown(self) -> str:
        head = (
            "| streams | completed | errors | tokens/s | model tokens/s | efficiency "
            "| TTFT p50 / p95 (ms) | total p50 / p95 (ms) | model step (ms) | CPU µs/token |\n"
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
        )
        rows = "".join(
            f"| {lv.concurrency} | {lv.streams} | {lv.errors} | {lv.tokens_per_s:,.0f} "
            f"| {lv.model_tokens_per_s:,.0f} | {lv.efficiency:.2f} "
            f"| {lv.ttft_p50 * 1e3:.1f} / {lv.ttft_p95 * 1e3:.1f} "
            f"| {lv.total_p50 * 1e3:.0f} / {lv.total_p95 * 1e3:.0f} "
            f"| {lv.model_step * 1e3:.2f} | {lv.cpu_per_token * 1e6:.1f} |\n"
            for lv in self.levels
        )
        return (
            f"Emulator capacity at --speed {self.speed:g}, {self.max_tokens} tokens per stream, "
            f"{self.duration:g} s per level: sustained **{self.sustained}** concurrent streams "
            f"(efficiency >= {self.threshold:g}, no errors).\n\n{head}{rows}"
        )


def _cpu_seconds(pid: int | None) -> float:
    """User plus system CPU time of ``pid`` so far; nan where ``/proc`` is not available."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return math.nan


async def _worker(
    client: httpx.AsyncClient,
    body: bytes,
    until: float,
    ttfts: list[float],
    totals: list[float],
    counts: list[int],
) -> None:
    # counts: [tokens, errors]. Events are counted, not parsed: the client must stay cheap
    # enough not to be the bottleneck itself.
    while time.perf_counter() < until:
        start = time.perf_counter()
        first = 0.0
        events = 0
        try:
            async with client.stream("POST", "/v1/chat/completions", content=body) as r:
                if r.status_code != 200:
                    counts[1] += 1
                    continue
                async for chunk in r.aiter_bytes():
                    if not first and b'"content":"' in chunk.replace(b'"content":""', b""):
                        first = time.perf_counter()
                    events += chunk.count(b"data: ")
        except httpx.HTTPError:
            counts[1] += 1
            continue
        end = time.perf_counter()
        ttfts.append((first or end) - start)
        totals.append(end - start)
        counts[0] += max(0, events - 2)  # minus the role event and [DONE]


async def _level(url: str, pid: int | None, n: int, max_tokens: int, duration: float) -> tuple:
    body = json.dumps(
        {"messages": _PROMPT, "stream": True, "max_tokens": max_tokens, "ignore_eos": True}
    ).encode()
    ttfts: list[float] = []
    totals: list[float] = []
    counts = [0, 0]
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    timeout = httpx.Timeout(60.0, connect=30.0)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as client:
        cpu0, t0 = _cpu_seconds(pid), time.perf_counter()
        until = t0 + duration
        await asyncio.gather(
            *(_worker(client, body, until, ttfts, totals, counts) for _ in range(n))
        )
        elapsed, cpu = time.perf_counter() - t0, _cpu_seconds(pid) - cpu0
    return ttfts, totals, counts, elapsed, cpu


def run_capacity(
    *,
    levels: Sequence[int] = (1, 50, 100, 250, 500),
    speed: float = 10.0,
    max_tokens: int = 64,
    duration: float = 5.0,
    threshold: float = 0.9,
) -> CapacityReport:
    """Measure the emulator at each concurrency level (see the module docstring).

    Args:
        levels: concurrent streams per level.
        speed: the emulator's ``--speed``.
        max_tokens: tokens per stream.
        duration: seconds each level runs (streams started before it ends finish).
        threshold: the efficiency a level needs to count as sustained.
    """
    if not levels or min(levels) < 1:
        raise ValueError("levels must be positive integers")
    if speed <= 0 or max_tokens < 1 or duration <= 0:
        raise ValueError("speed, max_tokens and duration must be positive")
    top = max(levels)
    model = EngineConfig(max_num_seqs=top, speed=speed)
    results = []
    with emulator_process(
        speed=speed, max_num_seqs=top, kv_cache_tokens=max(400_000, top * 200), log_level="warning"
    ) as server:
        for n in levels:
            ttfts, totals, (tokens, errors), elapsed, cpu = asyncio.run(
                _level(server.url, server.pid, n, max_tokens, duration)
            )
            step = model.step_time(n, 0)
            expected = n / step
            results.append(
                LevelResult(
                    concurrency=n,
                    streams=len(totals),
                    errors=errors,
                    tokens=tokens,
                    tokens_per_s=tokens / elapsed,
                    model_tokens_per_s=expected,
                    efficiency=tokens / elapsed / expected,
                    ttft_p50=percentile(ttfts, 50),
                    ttft_p95=percentile(ttfts, 95),
                    total_p50=percentile(totals, 50),
                    total_p95=percentile(totals, 95),
                    model_step=step,
                    cpu_per_token=cpu / tokens if tokens else math.nan,
                )
            )
    return CapacityReport(
        speed=speed, max_tokens=max_tokens, duration=duration, threshold=threshold, levels=results
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m herdless.bench.emulator_capacity``: print the table (and write JSON)."""
    parser = argparse.ArgumentParser(prog="python -m herdless.bench.emulator_capacity")
    parser.add_argument("--levels", default="1,50,100,250,500", help="comma-separated streams")
    parser.add_argument("--speed", type=float, default=10.0, help="the emulator's --speed")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per stream")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per level")
    parser.add_argument("--threshold", type=float, default=0.9, help="efficiency to sustain")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    try:
        levels = [int(x) for x in args.levels.split(",")]
        report = run_capacity(
            levels=levels,
            speed=args.speed,
            max_tokens=args.max_tokens,
            duration=args.duration,
            threshold=args.threshold,
        )
    except ValueError as exc:
        print(f"emulator_capacity: {exc}", file=sys.stderr)
        return 2
    print(report.to_markdown())
    if args.json:
        data = {**asdict(report), "sustained": report.sustained}
        with open(args.json, "w") as f:
            json.dump(data, f, indent=2, allow_nan=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
