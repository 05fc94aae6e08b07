"""Measure the gateway in front of a real vLLM on CPU: latency added, throughput, refusals.

    python tools/measure_gateway_vllm.py [--cache .cache/vllm]

Starts vLLM (``herdless.launch.vllm``, four sequences) and ``herdless serve``
in front of it (two admitted, two queued), runs three short phases and prints a
Markdown table; both servers are stopped at the end, also on failure. Every
phase compares the gateway with vLLM directly, in the same run, interleaved.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

import httpx

from herdless.launch.servers import gateway_process
from herdless.launch.vllm import MODEL_NAME, VllmServer, prepare

CONCURRENCY, QUEUE = 2, 2


def body(max_tokens: int, stream: bool = False) -> dict[str, object]:
    messages = [{"role": "user", "content": "Tell me a story."}]
    return {"model": MODEL_NAME, "messages": messages, "max_tokens": max_tokens,
            "ignore_eos": True, "stream": stream}  # fmt: skip


async def ttft(client: httpx.AsyncClient, url: str) -> tuple[float, float]:
    """Seconds to the first content chunk and to the end of a 16-token stream."""
    started = time.perf_counter()
    first = 0.0
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body(16, True)) as r:
        async for line in r.aiter_lines():
            if not first and '"content":"' in line and '"content":""' not in line:
                first = time.perf_counter() - started
    return first, time.perf_counter() - started


async def throughput(client: httpx.AsyncClient, url: str, callers: int, each: int) -> float:
    """Completion tokens per second for ``callers`` concurrent callers, ``each`` requests."""

    async def caller() -> int:
        tokens = 0
        for _ in range(each):
            r = await client.post(f"{url}/v1/chat/completions", json=body(32))
            if r.status_code == 200:
                tokens += r.json()["usage"]["completion_tokens"]
        return tokens

    started = time.perf_counter()
    total = sum(await asyncio.gather(*(caller() for _ in range(callers))))
    return total / (time.perf_counter() - started)


async def burst(
    client: httpx.AsyncClient, url: str, vllm: str, n: int
) -> tuple[dict[int, int], int]:
    """Status counts of ``n`` simultaneous requests, and vLLM's peak running count."""
    peak, done = 0.0, asyncio.Event()

    async def watch() -> None:
        nonlocal peak
        while not done.is_set():
            for line in (await client.get(f"{vllm}/metrics")).text.splitlines():
                if line.startswith("vllm:num_requests_running{"):
                    peak = max(peak, float(line.rsplit(" ", 1)[1]))
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch())
    posts = [client.post(f"{url}/v1/chat/completions", json=body(24)) for _ in range(n)]
    responses = await asyncio.gather(*posts)
    done.set()
    await watcher
    counts: dict[int, int] = {}
    for r in responses:
        counts[r.status_code] = counts.get(r.status_code, 0) + 1
    return counts, int(peak)


async def measure(vllm: str, gateway: str) -> None:
    async with httpx.AsyncClient(timeout=300.0) as client:
        await ttft(client, vllm)  # warm-up
        samples: dict[str, list[tuple[float, float]]] = {"vllm": [], "gateway": []}
        for _ in range(8):
            samples["vllm"].append(await ttft(client, vllm))
            samples["gateway"].append(await ttft(client, gateway))
        rows = [
            "| path | TTFT median | 16-token stream median | tokens/s, 4 callers "
            "| burst of 12: answers | vLLM peak running |",
            "|---|---|---|---|---|---|",
        ]
        for name, url in (("vLLM directly", vllm), ("through the gateway", gateway)):
            key = "vllm" if url == vllm else "gateway"
            first = statistics.median(s[0] for s in samples[key]) * 1000
            whole = statistics.median(s[1] for s in samples[key]) * 1000
            rate = await throughput(client, url, callers=4, each=2)
            counts, peak = await burst(client, url, vllm, 12)
            answers = ", ".join(f"{n}x{code}" for code, n in sorted(counts.items()))
            rows.append(f"| {name} | {first:.0f} ms | {whole:.0f} ms | {rate:.1f} | "
                        f"{answers} | {peak} |")  # fmt: skip
        print("\n".join(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=None)
    args = parser.parse_args()
    home = prepare(args.cache)
    with VllmServer(home, extra_args=["--max-num-seqs", "4"]) as vllm:
        options = {"max_concurrency": CONCURRENCY, "max_queue": QUEUE, "access_log": False}
        with gateway_process(upstream=vllm.url, **options) as gateway:
            asyncio.run(measure(vllm.url, gateway.url))


if __name__ == "__main__":
    main()
