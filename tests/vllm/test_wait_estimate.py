"""The client's wait estimate in front of a real vLLM: a busy GPU is waited for, not left.

Real vLLM finishes equal requests in clumps (four answers in one step, then nothing for
seconds): the estimate must not read the silence between clumps as a slow GPU. Through
``herdless serve --max-concurrency 4 --max-queue 4`` (vLLM runs four sequences), one
shared ``AsyncClient`` sends a burst at once with a deadline of twice the time the same
burst takes when nobody is refused, measured in this run (so no timing on a noisy CPU
decides the test; the session's vLLM caps its own queue at four, so that baseline is the
burst held by a gateway whose queue takes all of it, as in ``test_flow_control``):

* 30 calls with a hosted fallback (an emulator, ``external=True``): none reaches it;
* 100 calls with no fallback: all are served, none refused by the estimate.

Each also reports the estimator's error as ``stats().wait_error`` measured it (issue 24's
target: median <= 20 %, p90 <= 50 %; ``docs/benchmarks.md`` has the runs), and asserts
only a guard well above it against the failure it had: a batch read as one answer (or
two) per batch time, every wait four (two) times too long, 300-400 %. Every waiter's
first prediction is made at the same moment of the burst, from the burst's first round
(its pace is that round's time), so one run's error is one estimate's, and a first
round ``slow`` times longer than the later ones makes it about ``slow - 1`` with the rule
right (this shared CPU: 1.3 times now and then, 39-53 %; a CI run read 240 %). So the
guard is ``median <= max(100 %, slow)``, ``slow`` measured in the same burst from when
the answers came; a batch read as one answer reads ``4 x slow - 1``. So did a lone first
answer up to a round ahead of its batch's others, read as one answer per lead (a CI run:
139 % with ``slow`` 1.03), and two lone first answers read as an engine answering one at
a time (a CI run: 115 % with ``slow`` 0.99): both are counted with their batch now
(``docs/benchmarks.md``). A failure prints the burst's first answer times.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

import herdless
from herdless.launch.servers import emulator_process, gateway_process
from herdless.launch.vllm import MODEL_NAME

pytestmark = [pytest.mark.vllm]

MESSAGES = [{"role": "user", "content": "Tell me about bread ovens."}]
BODY = {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 16, "ignore_eos": True}


async def _unrefused(url: str, calls: int) -> float:
    """Seconds the burst takes when a queue holds all of it (nobody is refused)."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=900, limits=limits) as client:
        start = time.monotonic()
        responses = await asyncio.gather(
            *(client.post(f"{url}/v1/chat/completions", json=BODY) for _ in range(calls))
        )
        took = time.monotonic() - start
    assert {r.status_code for r in responses} == {200}
    return took


async def _through(
    gateway: str, calls: int, deadline: float, fallback: herdless.Backend | None
) -> tuple[list[herdless.ChatResult | BaseException], herdless.ClientStats, list[float]]:
    """The burst's results, the client's stats, and when each call ended (seconds after
    the burst began, in order)."""
    ended: list[float] = []
    async with herdless.AsyncClient(
        primary=herdless.Backend(name="gpu", base_url=f"{gateway}/v1", model=MODEL_NAME),
        fallback=fallback,
        deadline=deadline,
    ) as client:
        start = time.monotonic()

        async def one() -> herdless.ChatResult:
            try:
                return await client.chat(MESSAGES, max_tokens=16, ignore_eos=True)
            finally:
                ended.append(time.monotonic() - start)

        results = await asyncio.gather(*(one() for _ in range(calls)), return_exceptions=True)
        return list(results), client.stats(), sorted(ended)


def _first_round_slowness(ended: list[float], batch: int = 4) -> float:
    """How many times longer the burst's first round (its first ``batch`` answers, what
    vLLM runs at once) took than each later round did on average."""
    later = (ended[-1] - ended[batch - 1]) / ((len(ended) - batch) / batch)
    return ended[batch - 1] / later


@pytest.mark.parametrize(
    ("calls", "hosted"),
    [pytest.param(30, True, id="30-hosted"), pytest.param(100, False, id="100")],
)
async def test_a_busy_gpu_is_waited_for_within_the_deadline(
    vllm_url: str, calls: int, hosted: bool
) -> None:
    with gateway_process(
        upstream=vllm_url, max_concurrency=4, max_queue=calls, queue_timeout=900
    ) as roomy:
        straight = await _unrefused(roomy.url, calls)
    deadline = max(30.0, 2 * straight)
    with (
        gateway_process(
            upstream=vllm_url, max_concurrency=4, max_queue=4, queue_timeout=deadline
        ) as gateway,
        emulator_process(model="hosted", speed=50) as other,
    ):
        fallback = None
        if hosted:
            fallback = herdless.Backend(
                name="hosted", base_url=f"{other.url}/v1", model="hosted", external=True
            )
        results, stats, ended = await _through(gateway.url, calls, deadline, fallback)
    errors = [r for r in results if isinstance(r, BaseException)]
    assert errors == [], errors[:3]
    backends = [r.backend for r in results if isinstance(r, herdless.ChatResult)]
    assert backends == ["gpu"] * calls, f"{backends.count('hosted')} went to the hosted model"
    slow = _first_round_slowness(ended)
    print(
        f"{calls} calls, unrefused {straight:.1f} s, first round {slow:.2f}x the later ones,"
        f" wait error {stats.wait_error}"
    )
    error = stats.wait_error["gpu"]
    # A guard: a batch read as one answer gave 3-4 with the first round as fast as the rest.
    # On failure the answers' times say how the batches came (no trace is kept otherwise).
    answers = [round(t, 3) for t in ended[:24]]
    assert error["p50"] <= max(1.0, slow), (error, slow, answers)
