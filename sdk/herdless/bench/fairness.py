"""The ``fairness`` scenarios: one GPU shared fairly between users, and batch work kept
off the interactive users' way.

Real processes on 127.0.0.1: an emulated vLLM (``slots`` sequences) and, per arm, a
gateway in front of it (``slots`` running + ``queue`` waiting, no API keys: users are
told apart by the OpenAI ``user`` field). Arms, each in the same run against the same
emulator: the gateway's ``--scheduler vtc`` (token-fair, with priority classes), and
the reference orders ``round-robin`` (by requests, the gateway's order before) and
``fcfs``; and ``vLLM alone``, the same load straight at the emulator (its own FCFS
queue, no gateway). Four scenarios:

1. ``fairness-tokens``: two users of one key, both backlogged (``backlog`` calls each
   outstanding at all times), one asking 512-token answers, one 64-token answers.
   Target (vtc): the tokens served to each within 10 % of the other, Jain >= 0.99.
2. ``fairness-priority``: ``users`` interactive users (sequential chats, exponential
   think time, 32-128-token answers) and one batch user with ``batch_calls`` calls
   outstanding (it would take the whole GPU: more than ten times the load of all
   the others), sent with ``priority="batch"`` from a herdless client whose fallback
   is an external hosted model. Targets (vtc): interactive p95 latency <= 1.2x its
   p95 without the batch user (measured in the same run); the batch user's code
   sees no error and no call spills to the hosted model; GPU throughput >= 0.95x
   ``fcfs``'s.
3. ``fairness-no-priority``: the same, the batch user's calls sent without a class
   (all interactive). Target (vtc): Jain >= 0.95 over the backlogged users' tokens
   in every ``window``-second window.
4. ``fairness-stops``: scenario 1's two users both asking ``long_tokens``, the short
   user streaming each answer and closing it after ``short_tokens`` (an employee who
   presses stop). Target (vtc): the tokens each used within 10 % of the other's.

How service, throughput and the per-window index are computed from the clients'
records: :mod:`herdless.bench.fairness_stats`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import httpx

from herdless.bench.fairness_report import (
    priority_figures,
    priority_table,
    tokens_figures,
    tokens_table,
    window_figures,
    window_table,
)
from herdless.bench.fairness_stats import CallRecord, FairnessParams, cumulative_service
from herdless.bench.plots import service_panels
from herdless.bench.report import ScenarioResult
from herdless.bench.runner import Arm, Progress, Runs, run_arms
from herdless.bench.servers import quiet_emulator, quiet_gateway

__all__ = ["ALONE", "ARMS", "RESERVES", "run"]

ARMS = ("vtc", "round-robin", "fcfs")
"""The gateway's schedulers compared; ``vtc`` is the one under test."""
ALONE = "vLLM alone"
"""The arm with no gateway: the load straight at the emulated vLLM."""
BASELINE = "no batch user"
RESERVES = (1, 2, 3)
"""Interactive reserves of scenario 2's static arms: ``vtc`` with ``--sizing static`` (the
reserve an operator sets; the default is 1 at 8 slots). Self-sized, it is measured."""
_MODEL = "emulated-llama-3-8b"
_MESSAGES = [{"role": "user", "content": "Summarise the meeting notes, please."}]
_UNLIMITED = httpx.Limits(max_connections=None, max_keepalive_connections=None)


Load = Callable[[str, FairnessParams, int, list[CallRecord]], Coroutine[Any, Any, None]]
"""``(gateway /v1 URL, params, seed, records)``: play a scenario's users until ``stop``."""


async def _until_end(p: FairnessParams, t0: float, work: list[Coroutine[Any, Any, None]]) -> None:
    """Run the users' loops until ``p.stop`` (each records its own calls, an outstanding
    one as unfinished when it is cancelled)."""
    tasks = [asyncio.ensure_future(w) for w in work]
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=p.stop - (time.monotonic() - t0))
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _two_users(
    url: str, p: FairnessParams, seed: int, records: list[CallRecord], *, stops: bool = False
) -> None:
    """Scenario 1: two users, each keeping ``backlog`` calls outstanding (raw HTTP).
    ``stops`` (scenario 4): both ask ``long_tokens``, and the short user streams each
    answer and stops it after ``short_tokens``."""
    t0 = time.monotonic()
    async with httpx.AsyncClient(timeout=600, limits=_UNLIMITED) as client:
        prompt = await _prompt_tokens(client, url) if stops else 0

        async def loop(user: str, tokens: int, stop_after: int | None = None) -> None:
            body = {"model": _MODEL, "messages": _MESSAGES, "max_tokens": tokens}
            body |= {"ignore_eos": True, "user": user}
            while (sent := time.monotonic() - t0) < p.stop:
                try:
                    if stop_after is None:
                        response = await client.post(f"{url}/chat/completions", json=body)
                    else:
                        response, got = await _stopped(client, url, body, stop_after)
                except asyncio.CancelledError:
                    records.append(CallRecord(user=user, sent=sent, ended=None, ok=False))
                    raise
                ended = time.monotonic() - t0
                if response.status_code != 200:
                    records.append(CallRecord(user=user, sent=sent, ended=ended, ok=False))
                    await asyncio.sleep(float(response.headers.get("retry-after", 1)))
                    continue
                if stop_after is None:
                    usage = response.json()["usage"]
                else:
                    usage = {"prompt_tokens": prompt, "completion_tokens": got}
                records.append(
                    CallRecord(
                        user=user,
                        sent=sent,
                        ended=ended,
                        prompt=usage["prompt_tokens"],
                        completion=usage["completion_tokens"],
                        backend="primary",
                    )
                )

        work = [loop("long", p.long_tokens) for _ in range(p.backlog)]
        short = (p.long_tokens, p.short_tokens) if stops else (p.short_tokens, None)
        work += [loop("short", *short) for _ in range(p.backlog)]
        await _until_end(p, t0, work)


async def _prompt_tokens(client: httpx.AsyncClient, url: str) -> int:
    """The prompt tokens of the scenarios' messages, as vLLM counts them (one token asked)."""
    body = {"model": _MODEL, "messages": _MESSAGES, "max_tokens": 1}
    response = await client.post(f"{url}/chat/completions", json=body)
    response.raise_for_status()
    return int(response.json()["usage"]["prompt_tokens"])


async def _stopped(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], stop_after: int
) -> tuple[httpx.Response, int]:
    """One answer streamed and closed after ``stop_after`` tokens (an employee pressing
    stop): the response, and the tokens it got (an event a token; the first names the
    role)."""
    got = -1
    async with client.stream("POST", f"{url}/chat/completions", json=body | {"stream": True}) as r:
        if r.status_code == 200:
            async for line in r.aiter_lines():
                got += line.startswith("data: {")
                if got >= stop_after:
                    break
    return r, max(got, 0)


def _crowd(*, batch: bool, priorities: bool, hosted: str) -> Load:
    """Scenarios 2 and 3: interactive users, and (``batch``) the batch user."""

    async def play(url: str, p: FairnessParams, seed: int, records: list[CallRecord]) -> None:
        import herdless  # lazy: the SDK under its own load

        t0 = time.monotonic()
        rng = random.Random(seed)
        chats = herdless.AsyncClient(
            primary=herdless.Backend(name="primary", base_url=url, model=_MODEL),
            rng=random.Random(rng.random()),
            http_client=httpx.AsyncClient(limits=_UNLIMITED),
        )
        jobs = herdless.AsyncClient(
            primary=herdless.Backend(name="primary", base_url=url, model=_MODEL),
            fallback=herdless.Backend(name="hosted", base_url=hosted, external=True),
            priority="batch" if priorities else "interactive",
            deadline=300.0,
            rng=random.Random(rng.random()),
            http_client=httpx.AsyncClient(limits=_UNLIMITED),
        )

        async def call(client: herdless.AsyncClient, user: str, tokens: int) -> None:
            sent = time.monotonic() - t0
            try:
                result = await client.chat(_MESSAGES, max_tokens=tokens, user=user, ignore_eos=True)
            except asyncio.CancelledError:
                records.append(CallRecord(user=user, sent=sent, ended=None, ok=False))
                raise
            except herdless.HerdlessError:
                ended = time.monotonic() - t0
                records.append(CallRecord(user=user, sent=sent, ended=ended, ok=False))
                return
            usage = result.usage
            records.append(
                CallRecord(
                    user=user,
                    sent=sent,
                    ended=time.monotonic() - t0,
                    prompt=0 if usage is None else usage.prompt_tokens,
                    completion=0 if usage is None else usage.completion_tokens,
                    backend=result.backend,
                )
            )

        async def chatter(index: int) -> None:
            own = random.Random(seed * 1000 + index)  # the same chats in every arm
            while time.monotonic() - t0 < p.stop:
                await asyncio.sleep(own.expovariate(1 / p.think))
                await call(chats, f"chat-{index:02d}", own.choice(p.chat_tokens))

        async def worker() -> None:
            while time.monotonic() - t0 < p.stop:
                await call(jobs, "batch", p.batch_tokens)

        work = [chatter(index) for index in range(p.users)]
        if batch:
            work += [worker() for _ in range(p.batch_calls)]
        try:
            await _until_end(p, t0, work)
        finally:
            await chats.aclose()
            await jobs.aclose()

    return play


@contextlib.contextmanager
def _emulators(p: FairnessParams) -> Iterator[tuple[str, str]]:
    """The GPU, and a small hosted model (the batch user's external fallback)."""
    with (
        quiet_emulator(speed=p.speed, max_num_seqs=p.slots) as gpu,
        quiet_emulator(speed=p.speed, max_num_seqs=p.slots) as hosted,
    ):
        yield gpu.url, f"{hosted.url}/v1"


Spec = tuple[dict[str, Any] | None, Load]
"""An arm: the gateway's flags (``scheduler``, ...; ``None``: no gateway, the load at the
emulator itself) and the load played against it."""


def _measure(
    gpu: str,
    p: FairnessParams,
    specs: dict[str, Spec],
    progress: Progress | None,
    kept: dict[str, list[CallRecord]],
    figures: Callable[[list[CallRecord]], dict[str, float]],
) -> dict[str, list[dict[str, float]]]:
    """Every arm (``name -> spec``) interleaved; ``kept`` gets each arm's records of its
    first run (for the plots)."""

    def arm(name: str, flags: dict[str, Any] | None, load: Load) -> Arm:
        def once(seed: int) -> dict[str, float]:
            records: list[CallRecord] = []
            with contextlib.ExitStack() as stack:
                url = gpu
                if flags is not None:
                    gateway = quiet_gateway(
                        upstream=gpu,
                        max_concurrency=p.slots,
                        max_queue=p.queue,
                        queue_timeout=120,
                        **flags,
                    )
                    url = stack.enter_context(gateway).url
                asyncio.run(load(f"{url}/v1", p, seed, records))
            kept.setdefault(name, records)
            return figures(records)

        return Arm(name=name, run=once)

    arms = [arm(name, flags, load) for name, (flags, load) in specs.items()]
    return run_arms(arms, repeats=p.repeats, seed=p.seed, progress=progress)


def run(p: FairnessParams, out: Path, progress: Progress | None = None) -> list[ScenarioResult]:
    """The four scenarios, every arm; returns their tables and writes their plots."""
    results = []
    with _emulators(p) as (gpu, hosted):

        def scenario(
            specs: dict[str, Spec],
            figures: Callable[[list[CallRecord], FairnessParams], dict[str, float]],
            table: Callable[[Runs, FairnessParams], ScenarioResult],
        ) -> None:
            """Measure the arms; the table, with each arm's first run plotted beside it."""
            kept: dict[str, list[CallRecord]] = {}
            runs = _measure(gpu, p, specs, progress, kept, lambda r: figures(r, p))
            result = table(runs, p)
            result.plots.append(_plot(out / f"{result.name}.png", kept, p, result.title))
            results.append(result)

        scenario(_arms(_two_users), tokens_figures, tokens_table)
        stops = functools.partial(_two_users, stops=True)
        scenario(_arms(stops), tokens_figures, functools.partial(tokens_table, stops=True))
        crowd = _crowd(batch=True, priorities=True, hosted=hosted)
        reserves = {  # the latency / throughput trade-off of a static reserve
            f"vtc, static, reserve {n}": {"sizing": "static", "interactive_reserve": n}
            for n in RESERVES
        }
        chats = _crowd(batch=False, priorities=True, hosted=hosted)
        specs = _arms(crowd, reserves) | {BASELINE: ({}, chats)}
        scenario(specs, priority_figures, functools.partial(priority_table, baseline=BASELINE))
        crowd = _crowd(batch=True, priorities=False, hosted=hosted)
        scenario(_arms(crowd), window_figures, window_table)
    return results


def _arms(load: Load, statics: dict[str, dict[str, Any]] | None = None) -> dict[str, Spec]:
    """``load`` against a gateway per scheduler (then one per ``statics`` flags), and
    straight at the emulator (last: the arms' order is the tables')."""
    specs: dict[str, Spec] = {arm: ({"scheduler": arm}, load) for arm in ARMS}
    specs |= {name: (flags, load) for name, flags in (statics or {}).items()}
    specs[ALONE] = (None, load)
    return specs


def _plot(path: Path, kept: dict[str, list[CallRecord]], p: FairnessParams, title: str) -> Path:
    """Weighted tokens served per user over time, one panel per arm."""
    panels = {
        arm: cumulative_service(records, step=p.step, until=p.end) for arm, records in kept.items()
    }
    return service_panels(
        path, panels, title=f"tokens served per user: {title}", heavy={"long", "batch"}
    )
