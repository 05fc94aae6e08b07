"""The gateway's CPU per request, this tree against another, in the same run.

``python -m herdless.bench.sizing_cpu --baseline PATH`` starts one emulator and, in
turn, a gateway of this tree (self-sized: it reads the engine's ``/metrics`` four
times a second) and a gateway of the tree at ``PATH`` (a checkout whose package is
``PATH/sdk/herdless``, put first on its ``PYTHONPATH``), arms interleaved and repeated.
Each serves the same fixed load (``requests`` streamed chats of 16 tokens,
``concurrency`` at once); the figure is the gateway process's CPU seconds (user +
system, from ``/proc``) per request. The self-sizing read must stay off the request's
path: target <= 1.05x the baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import httpx

from herdless.bench.procfs import cpu_seconds
from herdless.bench.runner import Arm, run_arms
from herdless.bench.stats import median, ratio
from herdless.launch.servers import ServerProcess, emulator_process, gateway_process

__all__ = ["cpu_per_request", "main"]

_CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 16, "stream": True}


async def _load(url: str, requests: int, concurrency: int) -> int:
    """Send ``requests`` streamed chats, ``concurrency`` at once; returns those answered."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    left = requests
    answered = 0
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:

        async def worker() -> None:
            nonlocal left, answered
            while left > 0:
                left -= 1
                async with client.stream("POST", "/v1/chat/completions", json=_CHAT) as r:
                    async for _ in r.aiter_raw():
                        pass
                answered += r.status_code == 200

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return answered


def cpu_per_request(
    vllm: ServerProcess, env: dict[str, str] | None, requests: int, concurrency: int
) -> float:
    """CPU seconds per answered request of one gateway (``env``: its environment)."""
    queue = 4 * concurrency
    with gateway_process(upstream=vllm.url, env=env, access_log=False, max_queue=queue) as gateway:
        asyncio.run(_load(gateway.url, 50, concurrency))  # warm: imports, pools, JIT-free paths
        before = cpu_seconds(gateway.pid)
        answered = asyncio.run(_load(gateway.url, requests, concurrency))
        used = cpu_seconds(gateway.pid) - before
    return used / max(1, answered)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, required=True, help="the other tree's root")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    package = args.baseline / "sdk"
    if not (package / "herdless").is_dir():
        parser.error(f"{package}/herdless is not a herdless package")
    base_env = {**os.environ, "PYTHONPATH": str(package.resolve())}
    with emulator_process(speed=50, max_num_seqs=256) as vllm:

        def arm(name: str, env: dict[str, str] | None) -> Arm:
            def run(seed: int) -> dict[str, float]:
                per = cpu_per_request(vllm, env, args.requests, args.concurrency)
                return {"cpu_ms": per * 1000}

            return Arm(name=name, run=run)

        arms = [arm("this tree (self-sized)", None), arm(f"baseline ({args.baseline})", base_env)]
        runs = run_arms(arms, repeats=args.repeats, seed=1, progress=None)
    figures = {name: median([r["cpu_ms"] for r in rs]) for name, rs in runs.items()}
    mine, base = figures.values()
    print("| gateway | CPU ms per request (median of", args.repeats, ") |")
    print("|---|---|")
    for name, value in figures.items():
        print(f"| {name} | {value:.3f} |")
    print(f"\nthis tree / baseline: {ratio(mine, base):.3f} (target <= 1.05)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
