"""How many concurrent streams the emulator sustains on this machine, and its latency.

For each concurrency level ``N``, ``N`` closed-loop workers stream completions
(``ignore_eos``, ``max_tokens`` each) from one emulator process for ``duration``
seconds. The emulator is configured so that all ``N`` fit in one batch, so its
timing model says a token comes every ``step_time(N)`` seconds. The
*efficiency* of a level is that model step divided by the median inter-token
time the clients measured (after their first token): near 1, the emulator
(and the client, on the same machine) keeps pace with the GPU it emulates;
well below 1, the CPU is the bottleneck. A level is *sustained* when every
stream completed without error and the efficiency is at least ``threshold``.

Also reported per level: tokens per second received (and the model's
``N / step_time(N)``), time to first token and total time per stream (median
and 95th percentile), and the emulator's own CPU time per generated token
(from ``/proc``; Linux only).

Run: ``python -m herdless.bench.emulator_capacity --speed 2 --levels 1,100,250,500``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import httpx

from herdless._percentiles import percentile
from herdless.bench.procfs import cpu_seconds
from herdless.emulator.engine import EngineConfig
from herdless.launch.servers import emulator_process

__all__ = ["LEVELS", "CapacityParams", "CapacityReport", "LevelResult", "main", "run_capacity"]

_PROMPT = [{"role": "user", "content": "Tell me about herds."}]

LEVELS = (1, 50, 100, 250, 500)
"""The concurrency levels measured unless others are asked for."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CapacityParams:
    """How every level is measured.

    Attributes:
        speed: the emulator's ``--speed``.
        max_tokens: tokens per stream.
        duration: seconds each level runs (streams started before it ends finish).
        threshold: the efficiency a level needs to count as sustained.
        stream_interval: the emulator's ``--stream-interval`` (tokens per write).
    """

    speed: float = 10.0
    max_tokens: int = 64
    duration: float = 5.0
    threshold: float = 0.9
    stream_interval: int = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class LevelResult:
    """One concurrency level. Times in seconds."""

    concurrency: int
    streams: int
    errors: int
    tokens: int
    tokens_per_s: float
    model_tokens_per_s: float
    itl_p50: float
    model_step: float
    efficiency: float
    ttft_p50: float
    ttft_p95: float
    total_p50: float
    total_p95: float
    cpu_per_token: float  # emulator CPU seconds per generated token; nan when unknown

    @property
    def sustained_at(self) -> float:
        return self.efficiency if self.errors == 0 else 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class CapacityReport:
    """All levels, how they were measured, and the largest one sustained."""

    params: CapacityParams
    levels: list[LevelResult]

    @property
    def sustained(self) -> int:
        """The largest concurrency sustained (0 when none was)."""
        ok = [lv.concurrency for lv in self.levels if lv.sustained_at >= self.params.threshold]
        return max(ok, default=0)

    def to_markdown(self) -> str:
        head = (
            "| streams | completed | errors | tokens/s (model) | inter-token ms (model) "
            "| efficiency | TTFT p50 / p95 (ms) | total p50 / p95 (ms) | CPU µs/token |\n"
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
        )
        rows = "".join(
            f"| {lv.concurrency} | {lv.streams} | {lv.errors} "
            f"| {lv.tokens_per_s:,.0f} ({lv.model_tokens_per_s:,.0f}) "
            f"| {lv.itl_p50 * 1e3:.2f} ({lv.model_step * 1e3:.2f}) | {lv.efficiency:.2f} "
            f"| {lv.ttft_p50 * 1e3:.0f} / {lv.ttft_p95 * 1e3:.0f} "
            f"| {lv.total_p50 * 1e3:.0f} / {lv.total_p95 * 1e3:.0f} "
            f"| {lv.cpu_per_token * 1e6:.1f} |\n"
            for lv in self.levels
        )
        p = self.params
        return (
            f"Emulator capacity at --speed {p.speed:g} --stream-interval "
            f"{p.stream_interval}, {p.max_tokens} tokens per stream, "
            f"{p.duration:g} s per level: sustained **{self.sustained}** concurrent streams "
            f"(efficiency >= {p.threshold:g}, no errors).\n\n{head}{rows}"
        )


@dataclass(frozen=True, slots=True)
class _Samples:
    ttfts: list[float]
    totals: list[float]
    itls: list[float]  # per stream: seconds between tokens after the first
    tokens: int
    errors: int
    elapsed: float
    cpu: float


class _Stream(asyncio.Protocol):
    """A bare HTTP/1.1 keep-alive connection that streams one completion at a time.

    The load generator is hand-written on ``asyncio.Protocol`` on purpose: with
    httpx as the client, the client spent about four times the emulator's CPU per
    token here, so the table measured the client. This one only counts ``data:``
    events and spots the end of the chunked body; it never parses JSON.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future[bool] | None = None
        self.first = 0.0
        self.events = 0
        self._head = True
        self._tail = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP connection is one

    def send(self, request: bytes) -> asyncio.Future[bool]:
        self.done = asyncio.get_running_loop().create_future()
        self.first, self.events, self._head, self._tail = 0.0, 0, True, b""
        assert self.transport is not None
        self.transport.write(request)
        return self.done

    def data_received(self, data: bytes) -> None:
        if self._head:
            self._head = False
            if not data.startswith(b"HTTP/1.1 200"):
                self._finish(False)
                return
        if not self.first and b'"content":"' in data.replace(b'"content":""', b""):
            self.first = time.perf_counter()
        self.events += data.count(b"data: ")
        # The zero-length chunk ends a chunked body; it may straddle two reads.
        if b"\r\n0\r\n\r\n" in self._tail + data[:16] or data.endswith(b"\r\n0\r\n\r\n"):
            self._finish(True)
        self._tail = data[-16:]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._finish(False)

    def _finish(self, ok: bool) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_result(ok)


async def _worker(
    host: str,
    port: int,
    request: bytes,
    until: float,
    ttfts: list[float],
    totals: list[float],
    itls: list[float],
    counts: list[int],
) -> None:
    # counts: [tokens, errors]
    loop = asyncio.get_running_loop()
    proto: _Stream | None = None
    while time.perf_counter() < until:
        if proto is None or proto.transport is None:
            _, proto = await loop.create_connection(_Stream, host, port)
        start = time.perf_counter()
        ok = await proto.send(request)
        end = time.perf_counter()
        if not ok:
            counts[1] += 1
            if proto.transport is not None:
                proto.transport.close()
            proto = None
            continue
        tokens = max(0, proto.events - 2)  # minus the role event and [DONE]
        first = proto.first or end
        ttfts.append(first - start)
        totals.append(end - start)
        if tokens > 1:
            itls.append((end - first) / (tokens - 1))
        counts[0] += tokens
    if proto is not None and proto.transport is not None:
        proto.transport.close()


async def _level(url: str, pid: int | None, n: int, max_tokens: int, duration: float) -> _Samples:
    body = json.dumps(
        {"messages": _PROMPT, "stream": True, "max_tokens": max_tokens, "ignore_eos": True}
    ).encode()
    host, port = httpx.URL(url).host, httpx.URL(url).port or 80
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    ttfts: list[float] = []
    totals: list[float] = []
    itls: list[float] = []
    counts = [0, 0]
    cpu0, t0 = cpu_seconds(pid), time.perf_counter()
    until = t0 + duration
    await asyncio.gather(
        *(_worker(host, port, request, until, ttfts, totals, itls, counts) for _ in range(n))
    )
    elapsed, cpu = time.perf_counter() - t0, cpu_seconds(pid) - cpu0
    return _Samples(ttfts, totals, itls, counts[0], counts[1], elapsed, cpu)


def run_capacity(
    params: CapacityParams = CapacityParams(), *, levels: Sequence[int] = LEVELS
) -> CapacityReport:
    """Measure the emulator at each concurrency level (see the module docstring).

    Args:
        params: how every level is measured.
        levels: concurrent streams per level.
    """
    if not levels or min(levels) < 1:
        raise ValueError("levels must be positive integers")
    if params.speed <= 0 or params.max_tokens < 1 or params.duration <= 0:
        raise ValueError("speed, max_tokens and duration must be positive")
    top = max(levels)
    model = EngineConfig(max_num_seqs=top, speed=params.speed)
    results = []
    with emulator_process(
        speed=params.speed,
        max_num_seqs=top,
        kv_cache_tokens=max(400_000, top * 200),
        stream_interval=params.stream_interval,
        log_level="warning",
    ) as server:
        for n in levels:
            got = asyncio.run(_level(server.url, server.pid, n, params.max_tokens, params.duration))
            step = model.step_time(n, 0)
            itl = percentile(got.itls, 50)
            results.append(
                LevelResult(
                    concurrency=n,
                    streams=len(got.totals),
                    errors=got.errors,
                    tokens=got.tokens,
                    tokens_per_s=got.tokens / got.elapsed,
                    model_tokens_per_s=n / step,
                    itl_p50=itl,
                    model_step=step,
                    efficiency=step / itl if itl > 0 else math.nan,
                    ttft_p50=percentile(got.ttfts, 50),
                    ttft_p95=percentile(got.ttfts, 95),
                    total_p50=percentile(got.totals, 50),
                    total_p95=percentile(got.totals, 95),
                    cpu_per_token=got.cpu / got.tokens if got.tokens else math.nan,
                )
            )
    return CapacityReport(params=params, levels=results)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m herdless.bench.emulator_capacity``: print the table (and write JSON)."""
    parser = argparse.ArgumentParser(prog="python -m herdless.bench.emulator_capacity")
    parser.add_argument(
        "--levels", default=",".join(map(str, LEVELS)), help="comma-separated streams"
    )
    parser.add_argument("--speed", type=float, help="the emulator's --speed")
    parser.add_argument("--max-tokens", type=int, help="tokens per stream")
    parser.add_argument("--duration", type=float, help="seconds per level")
    parser.add_argument("--threshold", type=float, help="efficiency to sustain")
    parser.add_argument("--stream-interval", type=int, help="tokens per write")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.set_defaults(**asdict(CapacityParams()))  # the knobs' defaults are its fields'
    args = parser.parse_args(argv)
    try:
        levels = [int(x) for x in args.levels.split(",")]
        params = CapacityParams(
            speed=args.speed,
            max_tokens=args.max_tokens,
            duration=args.duration,
            threshold=args.threshold,
            stream_interval=args.stream_interval,
        )
        report = run_capacity(params, levels=levels)
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
