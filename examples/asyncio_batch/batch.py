"""A batch job: hundreds of prompts through one herdless.AsyncClient, bounded concurrency.

    python examples/asyncio_batch/batch.py prompts.txt --concurrency 16 > answers.jsonl

The semaphore bounds what *this job* sends at once; the gateway's 429s and the
client's backoff handle what the GPU can take; a prompt that fails (after the
client's retries and fallback) is reported, never silently dropped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import herdless


@dataclass(frozen=True, slots=True)
class Outcome:
    """One prompt's answer, or the error that stopped it."""

    index: int
    answer: str | None
    backend: str | None
    error: str | None = None


@dataclass(slots=True)
class Batch:
    outcomes: list[Outcome]
    max_in_flight: int
    stats: dict[str, Any]


async def run_batch(
    client: herdless.AsyncClient, prompts: Sequence[str], *, concurrency: int = 16
) -> Batch:
    """Answer every prompt, at most ``concurrency`` calls at a time, in input order."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency!r}")
    limit = asyncio.Semaphore(concurrency)
    in_flight = peak = 0

    async def one(index: int, prompt: str) -> Outcome:
        nonlocal in_flight, peak
        async with limit:
            in_flight += 1
            peak = max(peak, in_flight)
            try:
                result = await client.chat([{"role": "user", "content": prompt}])
                return Outcome(index, result.content, result.backend)
            except herdless.HerdlessError as exc:
                return Outcome(index, None, exc.backend, f"{type(exc).__name__}: {exc.message}")
            finally:
                in_flight -= 1

    outcomes = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    return Batch(list(outcomes), peak, client.stats().as_dict())


async def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prompts", type=Path, help="a text file, one prompt per line")
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args(argv)
    lines = args.prompts.read_text(encoding="utf-8").splitlines()
    prompts = [line.strip() for line in lines if line.strip()]
    async with herdless.AsyncClient() as client:  # HERDLESS_* from the environment
        batch = await run_batch(client, prompts, concurrency=args.concurrency)
    for outcome in batch.outcomes:
        print(json.dumps(_row(outcome)))
    print(json.dumps(batch.stats), file=sys.stderr)
    return 1 if any(o.error for o in batch.outcomes) else 0


def _row(outcome: Outcome) -> dict[str, Any]:
    return {name: getattr(outcome, name) for name in Outcome.__slots__}


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
