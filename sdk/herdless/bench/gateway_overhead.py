"""What the gateway costs: added latency, refusal throughput, memory under overload.

``python -m herdless.bench.gateway_overhead [--quick]`` starts an emulator and
gateways as real processes on 127.0.0.1 and measures, each figure against a
baseline taken in the same run:

* **added latency**: 100 concurrent streams (httpx) against the emulator
  directly, through the gateway, and through a bare relay on the gateway's own
  stack (:mod:`herdless.bench.relay`: Starlette, uvicorn, httpx, no rules),
  arms interleaved and repeated; the figure is ``p50(gateway) - p50(direct)``
  (and p99) of each request's time to the end of its stream. Targets: p50 <=
  1 ms, p99 <= 3 ms.
* **CPU per request**: each server's own CPU time (``/proc``) over the requests
  of its arm. Where three processes share two cores, latency is mostly queueing
  for a core; CPU time is not. The gateway's against the bare relay's is what
  herdless's rules cost over the stack they run on: the median of the rounds'
  ratios. Target: <= 1.2x.
* **refusal throughput**: a gateway that refuses everything (a request rate of
  ~0) is hammered over raw keep-alive sockets; refusals/s against the same
  server's ``/healthz`` rate. The server is one uvicorn process: one core.
  Also per CPU-second of the server (its ``/proc`` user + system time), which
  a busy machine or a saturated load generator does not skew.
  Targets: >= 5,000/s and >= 0.8x ``/healthz``.
* **memory under overload**: ten times as many callers as the gateway holds
  (running + queued), each sending again as soon as it is answered (Retry-After
  ignored: the worst case) for a bounded time; peak RSS of the gateway against
  its RSS at rest (bounded queue, bounded memory).

The load generator runs in this process (one core), the servers in their own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
from aiolimiter import AsyncLimiter

from herdless._percentiles import percentile
from herdless.bench.procfs import cpu_seconds, rss_bytes
from herdless.bench.raw_http import raw_request, read_response
from herdless.bench.stats import median, ratio
from herdless.launch.servers import ServerProcess, emulator_process, gateway_process

__all__ = ["OverheadParams", "OverheadResult", "main", "run"]

_CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 16, "stream": True}


@dataclass(frozen=True, slots=True, kw_only=True)
class OverheadParams:
    """Sizes of the benchmark (all bounded).

    Attributes:
        streams: concurrent streams of the latency arms.
        requests_per_stream: sequential requests per stream and run.
        repeats: interleaved repetitions of the latency arms.
        refusal_seconds: duration of each throughput measurement.
        refusal_rounds: interleaved rounds of refusals and ``/healthz``.
        connections: keep-alive sockets of the throughput generator.
        overload_seconds: duration of the overload (the issue asks for 60).
        overload_factor: callers over what the gateway holds (running + queued).
    """

    streams: int = 100
    requests_per_stream: int = 5
    repeats: int = 3
    refusal_seconds: float = 2.0
    refusal_rounds: int = 6
    connections: int = 32
    overload_seconds: float = 60.0
    overload_factor: float = 10.0


@dataclass(frozen=True, slots=True, kw_only=True)
class OverheadResult:
    """The figures (seconds, requests per second, bytes)."""

    direct_p50: float
    direct_p99: float
    direct_failures: float
    gateway_failures: float
    gateway_p50: float
    gateway_p99: float
    added_p50: float
    added_p99: float
    relay_p50: float
    relay_p99: float
    relay_failures: float
    direct_cpu: float
    """The emulator's CPU seconds per request, served directly."""
    relay_cpu: float
    """The bare relay's CPU seconds per request (its own process)."""
    gateway_cpu: float
    """The gateway's CPU seconds per request (its own process)."""
    cpu_ratio: float
    """The median of the rounds' gateway / relay CPU ratios (not of the medians above):
    what herdless's rules cost over their stack."""
    refusals_per_s: float
    healthz_per_s: float
    refusal_ratio: float
    refusals_per_cpu_s: float
    healthz_per_cpu_s: float
    refusal_cpu_ratio: float
    overload_callers: int
    overload_served_per_s: float
    overload_refused_per_s: float
    overload_codes: dict[str, int]
    rss_at_rest: int
    rss_peak: int


# -- latency ----------------------------------------------------------------------------


async def _stream_latencies(
    url: str, streams: int, per_stream: int, failures: Counter[int] | None = None
) -> list[float]:
    """Latencies of the requests answered 200; other statuses go to ``failures``."""
    limits = httpx.Limits(max_connections=streams, max_keepalive_connections=streams)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:

        async def one_stream() -> list[float]:
            times = []
            for _ in range(per_stream):
                start = time.perf_counter()
                async with client.stream("POST", "/v1/chat/completions", json=_CHAT) as response:
                    async for _ in response.aiter_raw():
                        pass
                if response.status_code == 200:
                    times.append(time.perf_counter() - start)
                elif failures is not None:
                    failures[response.status_code] += 1
            return times

        await _stream_latencies_warmup(client)
        results = await asyncio.gather(*(one_stream() for _ in range(streams)))
    return [t for times in results for t in times]


async def _stream_latencies_warmup(client: httpx.AsyncClient) -> None:
    async with client.stream("POST", "/v1/chat/completions", json=_CHAT) as response:
        await response.aread()


def _latency(
    arms: dict[str, ServerProcess], params: OverheadParams
) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Each arm's latencies, and its server's CPU seconds per request in each round (the
    arms taken in turn, each first once): (figures, CPU per request by round)."""
    names = list(arms)
    samples: dict[str, list[float]] = {arm: [] for arm in names}
    failures: dict[str, Counter[int]] = {arm: Counter() for arm in names}
    cpu: dict[str, list[float]] = {arm: [] for arm in names}
    requests = params.streams * params.requests_per_stream + 1  # and the warm-up
    for rep in range(params.repeats):
        turn = rep % len(names)
        for arm in names[turn:] + names[:turn]:
            server = arms[arm]
            before = cpu_seconds(server.pid)
            samples[arm] += asyncio.run(
                _stream_latencies(
                    server.url, params.streams, params.requests_per_stream, failures[arm]
                )
            )
            cpu[arm].append((cpu_seconds(server.pid) - before) / requests)
    figures: dict[str, float] = {}
    for arm in names:
        figures[f"{arm}_failures"] = float(sum(failures[arm].values()))
        figures[f"{arm}_p50"] = percentile(samples[arm], 50)
        figures[f"{arm}_p99"] = percentile(samples[arm], 99)
        figures[f"{arm}_cpu"] = median(cpu[arm])
    return figures, cpu


# -- refusal throughput -----------------------------------------------------------------


async def _hammer(
    port: int, request: bytes, seconds: float, connections: int
) -> tuple[float, Counter[int]]:
    """Keep-alive sockets sending ``request`` back to back; returns (answers/s, statuses)."""
    codes: Counter[int] = Counter()
    end = time.perf_counter() + seconds

    async def connection() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.perf_counter() < end:
                writer.write(request)
                codes[await read_response(reader)] += 1
        finally:
            writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(connection() for _ in range(connections)))
    return sum(codes.values()) / (time.perf_counter() - start), codes


def _refusals(vllm: ServerProcess, params: OverheadParams) -> dict[str, float]:
    # A rate of one request per ~3 years: after the first, every chat request is a 429.
    with gateway_process(upstream=vllm.url, rate=1e-8, burst=1, access_log=False) as gateway:
        refused_body = {**_CHAT, "stream": False}
        # The one request the bucket lets through, spent before measuring.
        httpx.post(gateway.url + "/v1/chat/completions", json=refused_body, timeout=30)
        chat = raw_request("POST", "/v1/chat/completions", json.dumps(refused_body).encode())
        healthz = raw_request("GET", "/healthz")
        seconds, conns = params.refusal_seconds, params.connections
        asyncio.run(_hammer(gateway.port, healthz, 1.0, conns))  # warm-up
        pid = gateway.pid
        assert pid is not None
        rates: dict[str, list[float]] = {name: [] for name in _REFUSAL_FIGURES}
        for _ in range(params.refusal_rounds):  # interleaved short rounds: a busy machine
            # drifts, and the median of pairs taken side by side is what compares.
            for name, request in (("refusals", chat), ("healthz", healthz)):
                cpu = cpu_seconds(pid)
                rate, codes = asyncio.run(_hammer(gateway.port, request, seconds, conns))
                cpu = cpu_seconds(pid) - cpu
                if name == "refusals" and codes[429] != sum(codes.values()):
                    raise RuntimeError(f"expected refusals, got {dict(codes)}")
                rates[f"{name}_per_s"].append(rate)
                rates[f"{name}_per_cpu_s"].append(sum(codes.values()) / max(cpu, 1e-9))
    return {name: median(values) for name, values in rates.items()}


_REFUSAL_FIGURES = ("refusals_per_s", "healthz_per_s", "refusals_per_cpu_s", "healthz_per_cpu_s")


# -- memory under overload --------------------------------------------------------------


async def _crowd(
    port: int, request: bytes, callers: int, seconds: float, pid: int
) -> tuple[Counter[str], int]:
    """``callers`` keep-alive sockets, each sending ``request`` again as soon as it is
    answered (Retry-After ignored: the worst case), for ``seconds``; returns the
    answers by status and the server's peak RSS."""
    codes: Counter[str] = Counter()
    # aiolimiter paces the ramp-up (waiting is right here): 1,000 connections/s at most.
    opening = AsyncLimiter(100, 0.1)
    end = time.perf_counter() + seconds
    peak = rss_bytes(pid)

    async def caller() -> None:
        await opening.acquire()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.perf_counter() < end:
                writer.write(request)
                codes[str(await read_response(reader))] += 1
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            codes[type(exc).__name__] += 1
        finally:
            writer.close()

    tasks = [asyncio.create_task(caller()) for _ in range(callers)]
    while not all(task.done() for task in tasks):
        peak = max(peak, rss_bytes(pid))
        await asyncio.wait(tasks, timeout=0.25)
    for task in tasks:
        task.result()  # an unexpected error is a broken benchmark: raise it
    return codes, peak


@dataclass(frozen=True, slots=True, kw_only=True)
class _Crowded:
    """What the overload measured: its figures are derived in :func:`run`."""

    callers: int
    codes: Counter[str]
    seconds: float
    rss_at_rest: int
    rss_peak: int


def _overload(vllm: ServerProcess, params: OverheadParams) -> _Crowded:
    concurrency, queue = 32, 64
    with gateway_process(
        upstream=vllm.url,
        max_concurrency=concurrency,
        max_queue=queue,
        queue_timeout=5,
        access_log=False,
    ) as gateway:
        assert gateway.pid is not None  # started by the context manager
        at_rest = rss_bytes(gateway.pid)
        callers = int(params.overload_factor * (concurrency + queue))
        body = json.dumps({**_CHAT, "stream": False}).encode()
        request = raw_request("POST", "/v1/chat/completions", body)
        start = time.perf_counter()
        codes, peak = asyncio.run(
            _crowd(gateway.port, request, callers, params.overload_seconds, gateway.pid)
        )
        elapsed = time.perf_counter() - start
    return _Crowded(
        callers=callers, codes=codes, seconds=elapsed, rss_at_rest=at_rest, rss_peak=peak
    )


def run(params: OverheadParams) -> OverheadResult:
    """Run the three measurements; returns the figures."""
    with emulator_process(speed=50, max_num_seqs=256) as vllm:
        relay = ServerProcess(
            ["--upstream", vllm.url], module="herdless.bench.relay", ready_path="/healthz"
        )
        with (
            gateway_process(upstream=vllm.url, max_concurrency=256, access_log=False) as gw,
            relay,
        ):
            latency, cpu = _latency({"direct": vllm, "relay": relay, "gateway": gw}, params)
        refusals = _refusals(vllm, params)
        overload = _overload(vllm, params)
    return OverheadResult(
        **latency,  # each arm's p50, p99, failures and CPU per request
        added_p50=latency["gateway_p50"] - latency["direct_p50"],
        added_p99=latency["gateway_p99"] - latency["direct_p99"],
        # The median of the rounds' own ratios: a busy machine drifts between rounds.
        cpu_ratio=median([ratio(g, r) for g, r in zip(cpu["gateway"], cpu["relay"], strict=True)]),
        refusals_per_s=refusals["refusals_per_s"],
        healthz_per_s=refusals["healthz_per_s"],
        refusal_ratio=ratio(refusals["refusals_per_s"], refusals["healthz_per_s"]),
        refusals_per_cpu_s=refusals["refusals_per_cpu_s"],
        healthz_per_cpu_s=refusals["healthz_per_cpu_s"],
        refusal_cpu_ratio=ratio(refusals["refusals_per_cpu_s"], refusals["healthz_per_cpu_s"]),
        overload_callers=overload.callers,
        overload_served_per_s=overload.codes["200"] / overload.seconds,
        overload_refused_per_s=overload.codes["429"] / overload.seconds,
        overload_codes=dict(overload.codes),
        rss_at_rest=overload.rss_at_rest,
        rss_peak=overload.rss_peak,
    )


def _table(result: OverheadResult) -> str:
    """Every figure by its name (``herdless bench overhead`` gives them labels and targets)."""
    rows = [
        f"| {name} | {value:.4g} |" if isinstance(value, float) else f"| {name} | {value} |"
        for name, value in asdict(result).items()
    ]
    return "\n".join(["| figure | value |", "|---|---|", *rows])


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m herdless.bench.gateway_overhead [--quick] [--json PATH]``."""
    parser = argparse.ArgumentParser(prog="python -m herdless.bench.gateway_overhead")
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--overload-seconds", type=float, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    params = OverheadParams()
    if args.quick:
        params = OverheadParams(
            streams=20,
            requests_per_stream=2,
            repeats=1,
            refusal_seconds=1,
            refusal_rounds=2,
            overload_seconds=3,
        )
    if args.overload_seconds is not None:
        params = OverheadParams(**{**asdict(params), "overload_seconds": args.overload_seconds})
    result = run(params)
    print(_table(result))
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(result), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
