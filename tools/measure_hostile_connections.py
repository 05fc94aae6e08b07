"""Hold 1,000 hostile connections (stalled heads) against ``herdless serve``; measure the rest.

    python tools/measure_hostile_connections.py [--hostile 1000] [--seconds 30]

Starts an emulated vLLM and ``herdless serve`` with its default settings (real
processes on 127.0.0.1, what production runs), then, from another address
(127.0.0.2), keeps ``--hostile`` connections open that each sent the start of a
request head and nothing more: a connection the gateway closes (at its head
timeout) is opened again at once, so that the count stays up for ``--seconds``.
Meanwhile a well-behaved client on 127.0.0.1 calls ``/healthz`` (a new connection
for each call, and over one kept-alive connection, alternately) and the gateway's
RSS is sampled. A baseline phase without hostile connections comes first.

Prints a Markdown table. Bounded: every phase has a fixed length, every socket is
closed and both servers are stopped at the end, also on failure. The script raises
its own soft open-file limit to the hard one (it holds ``--hostile`` sockets) and
prints both. ``--gateway-file-limit N`` starts the gateway with an open-file limit
of N (soft and hard, so that it cannot raise it): a host with few file descriptors,
where the per-address cap (half the limit) is what keeps the gateway reachable.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import resource
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx

from herdless.bench.procfs import rss_bytes
from herdless.launch.servers import ServerProcess, emulator_process, gateway_process

STALLED = b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: appl"


def rss_mib(pid: int) -> float:
    return rss_bytes(pid) / 2**20


@dataclass
class Phase:
    """What one phase saw."""

    fresh: list[float] = field(default_factory=list)  # /healthz on a new connection, seconds
    kept: list[float] = field(default_factory=list)  # /healthz on a kept-alive connection
    failures: int = 0
    rss: list[float] = field(default_factory=list)
    held: list[int] = field(default_factory=list)  # hostile connections open, sampled
    reopened: int = 0  # hostile connections the gateway closed (and were opened again)


def fresh_healthz(url: str) -> bytes:
    """GET /healthz on a new connection (a raw socket: no client set-up in the figure)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5.0) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    return reply


def probe(url: str, pid: int, seconds: float, phase: Phase, stop: threading.Event) -> None:
    """The well-behaved client: /healthz every 50 ms, alternately fresh and kept-alive."""
    end = time.monotonic() + seconds
    with httpx.Client(timeout=5.0) as kept:
        n = 0
        while time.monotonic() < end and not stop.is_set():
            fresh = n % 2 == 0
            start = time.perf_counter()
            try:
                if fresh:
                    ok = fresh_healthz(url).startswith(b"HTTP/1.1 200 ")
                else:
                    ok = kept.get(url + "/healthz").status_code == 200
            except (httpx.TransportError, OSError):
                ok = False
            took = time.perf_counter() - start
            if ok:
                (phase.fresh if fresh else phase.kept).append(took)
            else:
                phase.failures += 1
            if n % 10 == 0:
                phase.rss.append(rss_mib(pid))
            n += 1
            time.sleep(0.05)


async def hold(port: int, count: int, seconds: float, phase: Phase) -> None:
    """Keep ``count`` stalled heads open from 127.0.0.2 for ``seconds``."""
    end = time.monotonic() + seconds
    open_now = 0

    async def one() -> None:
        nonlocal open_now
        while time.monotonic() < end:
            try:
                reader, writer = await asyncio.open_connection(
                    "127.0.0.1", port, local_addr=("127.0.0.2", 0)
                )
            except OSError:
                await asyncio.sleep(0.1)
                continue
            open_now += 1
            try:
                writer.write(STALLED)
                left = end - time.monotonic()
                with contextlib.suppress(TimeoutError, ConnectionError):
                    async with asyncio.timeout(max(0.0, left)):
                        while await reader.read(65536):
                            pass
                        phase.reopened += 1  # the gateway closed it: open another
            finally:
                open_now -= 1
                writer.close()
            await asyncio.sleep(0.05)  # not a hot loop when the gateway closes at once

    async def sample() -> None:
        while time.monotonic() < end:
            phase.held.append(open_now)
            await asyncio.sleep(0.5)

    # Opened at about 500 per second: a burst of 1,000 SYNs would overflow the backlog.
    tasks = []
    for _ in range(count):
        tasks.append(asyncio.create_task(one()))
        await asyncio.sleep(0.002)
    await asyncio.gather(sample(), *tasks)


@contextlib.contextmanager
def started_gateway(upstream: str, file_limit: int | None) -> Iterator[ServerProcess]:
    """``herdless serve`` with its defaults; with ``file_limit``, under that open-file limit."""
    if file_limit is None:
        with gateway_process(upstream=upstream) as gateway:
            yield gateway
        return
    server = ServerProcess(["serve", "--upstream", upstream], ready_path="/healthz")
    log = server.log_path.open("ab")
    server.process = subprocess.Popen(
        [sys.executable, "-m", "herdless", *server.command, "--port", str(server.port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (file_limit, file_limit)),
    )
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()
        log.close()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run_phase(url: str, port: int, pid: int, hostile: int, seconds: float) -> Phase:
    phase = Phase()
    stop = threading.Event()
    prober = threading.Thread(target=probe, args=(url, pid, seconds, phase, stop))
    prober.start()
    try:
        if hostile:
            asyncio.run(hold(port, hostile, seconds, phase))
        prober.join(seconds + 10)
    finally:
        stop.set()
        prober.join(10)
    return phase


def row(name: str, phase: Phase) -> str:
    def ms(values: list[float], q: float) -> str:
        return f"{percentile(values, q) * 1000:.1f}" if values else "-"

    held = f"{statistics.median(phase.held):.0f} (min {min(phase.held)})" if phase.held else "0"
    return (
        f"| {name} | {held} | {phase.reopened} | {ms(phase.fresh, 0.5)} / {ms(phase.fresh, 0.99)}"
        f" | {ms(phase.kept, 0.5)} / {ms(phase.kept, 0.99)} | {len(phase.fresh) + len(phase.kept)}"
        f" | {phase.failures} | {min(phase.rss):.1f} / {max(phase.rss):.1f} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(prog="python tools/measure_hostile_connections.py")
    parser.add_argument("--hostile", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--baseline-seconds", type=float, default=10.0)
    parser.add_argument("--gateway-file-limit", type=int, default=None)
    args = parser.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else soft
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    print(f"open-file limit of this script: soft {soft} -> {wanted}, hard {hard}")

    with (
        emulator_process(speed=20) as vllm,
        started_gateway(vllm.url, args.gateway_file_limit) as gateway,
    ):
        assert gateway.pid is not None
        with open(f"/proc/{gateway.pid}/limits") as limits:
            line = next(line for line in limits if line.startswith("Max open files"))
        print(f"gateway: {line.strip()}")
        at_rest = rss_mib(gateway.pid)
        baseline = run_phase(gateway.url, gateway.port, gateway.pid, 0, args.baseline_seconds)
        held = run_phase(gateway.url, gateway.port, gateway.pid, args.hostile, args.seconds)
        after = rss_mib(gateway.pid)
        metrics = httpx.get(gateway.url + "/metrics").text
        closed = [line for line in metrics.splitlines() if "connections_closed_total{" in line]
        tracebacks = gateway.logs().count("Traceback")

    print(f"\ngateway RSS at rest {at_rest:.1f} MiB, after the run {after:.1f} MiB")
    print(f"gateway counters: {'; '.join(closed) or 'none'}; tracebacks in its log: {tracebacks}\n")
    print(
        "| phase | hostile connections held (median) | closed by the gateway | "
        "/healthz new connection p50 / p99 (ms) | /healthz kept-alive p50 / p99 (ms) | "
        "/healthz calls | failed | gateway RSS min / max (MiB) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    print(row("baseline", baseline))
    print(row(f"{args.hostile} stalled heads held", held))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
