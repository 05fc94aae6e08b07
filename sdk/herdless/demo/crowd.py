"""The crowd: employees chatting through herdless clients while the day plays.

Each employee owns a :class:`herdless.AsyncClient` (as each app on each laptop
would) whose ``on_event`` feeds the shared :class:`Tally`, or, for the share on a chat
front-end, sends each question once with the front-end's key and never retries (as
Open WebUI's backend does): the gateway holds or spills it. The employee is
active while its index is below :meth:`Day.active`, thinks for a random while
(exponential, mean ``think`` seconds), then asks a question of realistic
length. The operator's side of the day (the model swap by ``herdless maintain``, the
gateway's queue gauge) runs beside the crowd. Everything random comes from
one seeded ``random.Random`` per employee.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import ssl
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import httpx

import herdless
from herdless.demo.day import Day
from herdless.demo.settings import DemoSettings
from herdless.demo.stack import Stack
from herdless.demo.tally import Tally
from herdless.gateway.maintain import MaintainSettings, maintain

__all__ = ["FALLBACK", "PRIMARY", "Crowd"]

PRIMARY = "company-gpu"
FALLBACK = "hosted"
_WORDS = (
    "please",
    "summarise",
    "the",
    "quarterly",
    "report",
    "draft",
    "and",
    "list",
    "the",
    "open",
    "risks",
    "for",
    "the",
    "team",
    "meeting",
    "explain",
    "this",
    "error",
    "message",
    "in",
    "the",
    "deployment",
    "logs",
    "rewrite",
    "the",
    "customer",
    "email",
    "politely",
    "translate",
    "the",
    "onboarding",
    "guide",
    "into",
    "plain",
    "English",
    "with",
    "examples",
)
# Answer lengths people ask for: mostly short, sometimes a page.
_MAX_TOKENS = (64, 128, 128, 256, 256, 512)
_METRIC = re.compile(r"^herdless_gateway_(queue_depth|inflight) (\S+)$", re.MULTILINE)
_RUNNING = re.compile(r"^vllm:num_requests_running(?:\{[^}]*\})? (\S+)$", re.MULTILINE)


@dataclass(slots=True)
class Crowd:
    """Plays the day against ``stack`` with the demo's ``settings``; :meth:`run` returns
    when every call has ended.

    Attributes:
        hold: seconds the chat front-end's gateway key holds a request.
        think: mean seconds an employee thinks between two questions.
        started: calls started (each ends served or failed: the accounting checks it).
    """

    stack: Stack
    day: Day
    tally: Tally
    settings: DemoSettings
    hold: float = 20.0
    think: float = 3.0
    started: int = 0

    def on_frontend(self, index: int) -> bool:
        """Whether employee ``index`` is on the chat front-end (spread evenly)."""
        return int((index + 1) * self.settings.frontend) > int(index * self.settings.frontend)

    def _client(self, index: int, http: httpx.AsyncClient) -> herdless.AsyncClient:
        fallback = None
        if self.settings.fallback:
            fallback = herdless.Backend(
                name=FALLBACK,
                base_url=f"{self.stack.hosted}/v1",
                model="hosted-llm",
                external=True,
            )

        def hook(event: herdless.events.Event) -> None:
            self.tally.record(event, client=index)

        return herdless.AsyncClient(
            primary=herdless.Backend(
                name=PRIMARY,
                base_url=f"{self.stack.gateway}/v1",
                model=self.stack.gpu_model,
                api_key=self.stack.app_key,
            ),
            fallback=fallback,
            deadline=self.settings.deadline,
            on_event=hook,
            rng=random.Random(self.settings.seed * 100_003 + index),
            env_file=None,
            http_client=http,
        )

    async def _employee(self, index: int, stop: asyncio.Event, http: httpx.AsyncClient) -> None:
        if self.on_frontend(index):
            await self._frontend_user(index, stop, http)
            return
        async with self._client(index, http) as client:
            async for words, max_tokens in self._questions(index, stop):
                self.started += 1
                # Failures are counted from the client's CallFailed event; the
                # employee shrugs and asks again later.
                with contextlib.suppress(herdless.HerdlessError):
                    await client.chat([{"role": "user", "content": words}], max_tokens=max_tokens)

    async def _questions(self, index: int, stop: asyncio.Event) -> AsyncIterator[tuple[str, int]]:
        """Employee ``index``'s questions, each when they ask it (at their desk, after a
        thought), with the answer length they ask for; until ``stop``."""
        rng = random.Random(self.settings.seed * 7_919 + index)
        most = self.settings.max_words
        while not stop.is_set():
            if index >= self.day.active(time.monotonic() - self.tally.start):
                await _pause(stop, 0.25)  # not at their desk right now
                continue
            await _pause(stop, rng.expovariate(1 / self.think))
            if stop.is_set():
                return
            words = " ".join(rng.choices(_WORDS, k=rng.randint(min(15, most), most)))
            yield words, min(rng.choice(_MAX_TOKENS), self.settings.max_tokens)

    async def _frontend_user(
        self, index: int, stop: asyncio.Event, http: httpx.AsyncClient
    ) -> None:
        """An employee on the chat front-end: each question is one request, never retried;
        its outcome (the GPU's answer, after a hold or not, the hosted model's, or an error)
        goes to the tally."""
        headers = {
            "authorization": f"Bearer {self.stack.frontend_key}",
            "x-openwebui-user-id": f"employee-{index}",
        }
        async for words, max_tokens in self._questions(index, stop):
            body = {
                "model": self.stack.gpu_model,
                "messages": [{"role": "user", "content": words}],
                "max_tokens": max_tokens,
            }
            self.tally.frontend_started += 1
            try:
                answer = await http.post(
                    f"{self.stack.gateway}/v1/chat/completions",
                    json=body,
                    headers=headers,
                    timeout=self.hold + self.settings.deadline,
                )
            except httpx.HTTPError:
                self.tally.frontend["refused"] += 1
                continue
            self.tally.frontend[_outcome(answer)] += 1

    async def _operator(self, stop: asyncio.Event) -> None:
        """Runs the model swap with ``herdless maintain`` on the day's schedule: drain
        (the window announced), wait until idle, the swap, the GPU probed, resume."""
        drain_at, resume_at = self.day.maintenance
        await _pause(stop, drain_at - (time.monotonic() - self.tally.start))
        if stop.is_set():
            return
        settings = MaintainSettings(
            gateway=self.stack.gateway,  # type: ignore[arg-type]
            upstream=self.stack.gpu,  # type: ignore[arg-type]
            expect=resume_at - drain_at,
            admin_token=self.stack.admin_token,  # type: ignore[arg-type]
        )

        def swap(argv: Sequence[str]) -> int:
            # The swap takes the window's length, as a real one takes its time: a drain
            # that began late (a busy machine) moves the resume, never shortens the window.
            time.sleep(resume_at - drain_at)
            return 0

        report = await asyncio.to_thread(
            maintain, settings, ["swap-model"], say=lambda line: None, run=swap
        )
        self.tally.maintenance = report.as_dict()

    async def _gauges(self, stop: asyncio.Event) -> None:
        """Polls the gateway's queue depth and running requests for the live view, and
        the GPU's running sequences (vLLM's own gauge) for its busy share."""
        async with httpx.AsyncClient() as http:
            while not stop.is_set():
                with contextlib.suppress(httpx.HTTPError):
                    text = (await http.get(f"{self.stack.gateway}/metrics")).text
                    for name, value in _METRIC.findall(text):
                        self.tally.gauges[name] = float(value)
                with contextlib.suppress(httpx.HTTPError):
                    text = (await http.get(f"{self.stack.gpu}/metrics")).text
                    running = _RUNNING.search(text)
                    if running is not None:
                        busy = min(1.0, float(running.group(1)) / self.settings.gpu_seqs)
                        self.tally.sample_gpu(time.monotonic(), busy)
                await _pause(stop, 0.25)

    async def run(self, on_tick: Callable[[], None]) -> None:
        """Play the whole day, calling ``on_tick`` a few times a second; then let calls end."""
        stop = asyncio.Event()
        # One connection pool per employee, as each app on each laptop has. A pool
        # shared by the whole crowd held requests for seconds before they were sent
        # (httpcore hands one idle connection to every queued request and retries the
        # losers), which the clients' per-attempt timeouts do not cover. Building the
        # TLS context once keeps 150 pools cheap to open.
        tls = ssl.create_default_context()
        async with contextlib.AsyncExitStack() as pools:
            http = [
                await pools.enter_async_context(httpx.AsyncClient(verify=tls))
                for _ in range(self.day.crowd)
            ]
            await self._play(stop, http, on_tick)

    async def _play(
        self, stop: asyncio.Event, http: list[httpx.AsyncClient], on_tick: Callable[[], None]
    ) -> None:
        employees = [
            asyncio.create_task(self._employee(i, stop, http[i])) for i in range(self.day.crowd)
        ]
        helpers = [
            asyncio.create_task(self._operator(stop)),
            asyncio.create_task(self._gauges(stop)),
        ]
        try:
            while time.monotonic() - self.tally.start < self.day.length:
                on_tick()
                await asyncio.sleep(0.25)
            stop.set()
            # Calls in flight finish (within their deadline): nobody is cut off.
            pending = {t for t in employees if not t.done()}
            while pending:
                _, pending = await asyncio.wait(pending, timeout=0.25)
                on_tick()
            await asyncio.gather(*employees, *helpers)
        finally:
            stop.set()
            for task in (*employees, *helpers):
                task.cancel()
            await asyncio.gather(*employees, *helpers, return_exceptions=True)


def _outcome(answer: httpx.Response) -> str:
    """What became of a chat front-end's request: ``gpu``, ``held`` (the GPU's answer
    after waiting in the gateway), ``spilled`` (the hosted model's) or ``refused``."""
    if answer.status_code != 200:
        return "refused"
    if answer.headers.get("x-herdless-backend") == "hosted":
        return "spilled"
    return "held" if "x-herdless-queue-ms" in answer.headers else "gpu"


async def _pause(stop: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds`` or until ``stop`` is set, whichever comes first."""
    if seconds > 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=seconds)
