"""A request whose client does not retry (its key's ``retries = false``, or a client that
shows it), or a retry (an OpenAI SDK's says so; any other is the same request again),
waits out a full queue in the gateway (in process: a fake vLLM that holds its answers
until told)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.gateway.fakes import FakeVllm, GatewayFactory, chat_body, until

from herdless.bench.vtime import VirtualClock, run_virtual
from herdless.gateway.core.admission import Admission
from herdless.gateway.core.decisions import Admit, Enqueued, Refuse
from herdless.gateway.core.limits import AdmissionConfig
from herdless.gateway.edge import keeps, waited_out, waits_out
from herdless.gateway.gate import Gate
from herdless.gateway.policies import KeyPolicy
from herdless.gateway.runtime import Runtime
from herdless.gateway.wire import client_timeout, never_retries, returned
from herdless.testing import FakeClock

ADMIN = {"authorization": "Bearer admin-secret"}
APPS = {"authorization": "Bearer sk-apps-secret"}  # the default: by what the client shows
WEBUI = {"authorization": "Bearer sk-webui-secret"}  # a front-end that never retries
BRIEF = {"authorization": "Bearer sk-brief-secret"}  # never retries, and holds 0.2 s
TOLD = {"authorization": "Bearer sk-told-secret"}  # its clients retry, says its key
NODE_FETCH = {"user-agent": "node"}  # Node's own fetch (as sent by node 20), no retry
# The headers of each client, as sent (captured from the npm clients of tests/clients,
# curl 8, aiohttp 3 and Chrome 131); an OpenAI SDK's headers cut to the one that counts.
OPENAI_NODE = {"user-agent": "OpenAI/JS 7.59.0", "x-stainless-retry-count": "0"}
LANGCHAIN_JS = {"user-agent": "langchainjs-openai/1.0.0 ((node/v20.20.2; linux; x64))"}
VERCEL = {"user-agent": "ai/6.0.326 ai-sdk/provider-utils/4.0.65 runtime/node.js/v20.20.2"}
CHROME = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0"
POLICIES = """\
[keys.apps]
key = "sk-apps-secret"

[keys.told]
key = "sk-told-secret"
retries = true

[keys.webui]
key = "sk-webui-secret"
retries = false
hold = 30

[keys.brief]
key = "sk-brief-secret"
retries = false
hold = 0.2
"""

Started = AbstractAsyncContextManager[tuple[httpx.AsyncClient, Runtime]]


@pytest.fixture
def keyed(gateway: GatewayFactory, tmp_path: Path) -> Callable[..., Started]:
    """One running and one waiting fill the gateway (a place frees about a second on)."""
    path = tmp_path / "keys.toml"
    path.write_text(POLICIES)

    def start(**overrides: Any) -> Started:
        return gateway(key_policies=path, **({"max_concurrency": 1, "max_queue": 1} | overrides))

    return start


async def fill(client: httpx.AsyncClient, runtime: Runtime) -> list[asyncio.Task[httpx.Response]]:
    """One request running and one waiting: the queue is full."""
    tasks = []
    for _ in range(2):
        post = client.post("/v1/chat/completions", json=chat_body(), headers=APPS)
        tasks.append(asyncio.create_task(post))
        await until(
            lambda: (
                runtime.gate.admission.inflight + runtime.gate.admission.queue_depth == len(tasks)
            )
        )
    return tasks


def waited(runtime: Runtime) -> int:
    return sum(runtime.metrics.waited_out.values())


@pytest.mark.parametrize(
    ("told", "kept"),
    [
        (APPS, WEBUI),  # a key whose clients do not retry
        (APPS, APPS | NODE_FETCH),  # a client that shows it never retries
        (  # an OpenAI SDK's retry, whatever its key: its first try is told at once
            TOLD | {"x-stainless-retry-count": "0"},
            TOLD | {"x-stainless-retry-count": "1", "x-stainless-timeout": "600"},
        ),
        (TOLD | VERCEL, TOLD | VERCEL),  # a retry that says nothing: the same request again
    ],
    ids=[
        "retries = false",
        "a client that never retries",
        "an OpenAI SDK's retry",
        "the same request again",
    ],
)
async def test_a_request_whose_429_would_be_an_error_waits_out_a_full_queue(
    keyed: Callable[..., Started], fake_vllm: FakeVllm, told: dict[str, str], kept: dict[str, str]
) -> None:
    fake_vllm.hold = asyncio.Event()
    async with keyed() as (client, runtime):
        filling = await fill(client, runtime)
        refused = await client.post("/v1/chat/completions", json=chat_body(), headers=told)
        herdless = await client.post(  # a herdless client decides itself: told at once
            "/v1/chat/completions",
            json=chat_body(),
            headers=kept | {"x-herdless-attempt": "1", "x-herdless-deadline-ms": "30000"},
        )
        waiting = asyncio.create_task(
            client.post("/v1/chat/completions", json=chat_body(), headers=kept)
        )
        await until(lambda: waited(runtime) == 1)
        assert not waiting.done()  # no 429 for it: it waits here
        fake_vllm.hold.set()  # the GPU answers: places free
        answers = await asyncio.gather(*filling, waiting)
        metrics = (await client.get("/metrics")).text
    assert (refused.status_code, refused.json()["error"]["code"]) == (429, "queue_full")
    assert herdless.status_code == 429
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert answers[-1].headers["x-herdless-backend"] == "upstream"
    assert int(answers[-1].headers["x-herdless-queue-ms"]) > 0  # it waited in the gateway
    assert len(fake_vllm.received) == 3
    assert 'herdless_gateway_waited_out_total{reason="queue_full"} 1' in metrics
    assert 'herdless_gateway_rejections_total{reason="queue_full"} 2' in metrics  # not its


async def test_a_request_sent_again_is_known_by_its_key_address_and_body(
    keyed: Callable[..., Started], fake_vllm: FakeVllm
) -> None:
    fake_vllm.hold = asyncio.Event()
    herdless = {"x-herdless-attempt": "1", "x-herdless-deadline-ms": "30000"}

    async def post(seed: int, headers: dict[str, str] = TOLD) -> httpx.Response:
        return await client.post(
            "/v1/chat/completions", json=chat_body(seed=seed), headers=headers | VERCEL
        )

    async with keyed() as (client, runtime):
        filling = await fill(client, runtime)
        told = [await post(1), await post(2), await post(3, TOLD | herdless)]
        again = asyncio.create_task(post(1))  # the same request: it waits here
        await until(lambda: waited(runtime) == 1)
        refused = [
            await post(1),  # sent a third time: one refusal, one comeback
            await post(2, APPS),  # another key's
            await post(3),  # a herdless client's refusal: it decides itself, not remembered
        ]
        assert not again.done()
        fake_vllm.hold.set()
        answers = await asyncio.gather(*filling, again)
        metrics = (await client.get("/metrics")).text
    assert [r.status_code for r in told + refused] == [429] * 6
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert "herdless_gateway_comebacks_total 1\n" in metrics


async def test_a_drain_s_503_is_known_when_its_request_comes_back_to_a_full_queue(
    keyed: Callable[..., Started], fake_vllm: FakeVllm
) -> None:
    fake_vllm.hold = asyncio.Event()
    herdless = {"x-herdless-attempt": "1", "x-herdless-deadline-ms": "30000"}

    async def post(seed: int, headers: dict[str, str] = TOLD | VERCEL) -> httpx.Response:
        return await client.post("/v1/chat/completions", json=chat_body(seed=seed), headers=headers)

    async with keyed(admin_token="admin-secret", drain_retry_after=0.1) as (client, runtime):
        await client.post("/admin/drain", headers=ADMIN)  # no window: refused at once
        drained = [await post(1), await post(1), await post(2, TOLD | VERCEL | herdless)]
        await client.post("/admin/resume", headers=ADMIN)
        filling = await fill(client, runtime)  # the crowd came back first
        again = asyncio.create_task(post(1))  # the same request: it waits here
        await until(lambda: waited(runtime) == 1)
        refused = [
            await post(1),  # refused twice in the drain, and still one refusal
            await post(2),  # a herdless client's 503: it decides itself, not remembered
        ]
        assert not again.done()
        fake_vllm.hold.set()
        answers = await asyncio.gather(*filling, again)
        metrics = (await client.get("/metrics")).text
    assert [r.status_code for r in drained] == [503] * 3
    assert [r.status_code for r in refused] == [429] * 2
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert "herdless_gateway_comebacks_total 2\n" in metrics  # in the drain, and after it


async def test_an_upstream_out_for_a_time_no_one_knows_is_waited_out_by_who_would_show_a_503(
    keyed: Callable[..., Started], fake_vllm: FakeVllm
) -> None:
    herdless = {"x-herdless-attempt": "1", "x-herdless-deadline-ms": "30000"}

    async def post(headers: dict[str, str], seed: int = 1) -> httpx.Response:
        return await client.post("/v1/chat/completions", json=chat_body(seed=seed), headers=headers)

    async with keyed(max_queue=4) as (client, runtime):
        runtime.gate.set_upstream(ready=False, code="upstream_unavailable")  # vLLM restarts
        told = [await post(TOLD | VERCEL), await post(TOLD | VERCEL | herdless, seed=2)]
        waiting = [
            asyncio.create_task(post(headers))
            for headers in (
                WEBUI,  # its key says it never retries
                APPS | NODE_FETCH,  # its client shows it
                TOLD | VERCEL,  # the same request again: a retry
            )
        ]
        await until(lambda: runtime.gate.admission.queue_depth == 3)
        again = await post(TOLD | VERCEL | herdless, seed=2)  # a herdless client decides
        assert not any(task.done() for task in waiting)
        runtime.gate.set_upstream(ready=True)  # loaded
        answers = await asyncio.gather(*waiting)
    assert [(r.status_code, r.json()["error"]["code"]) for r in [*told, again]] == [
        (503, "upstream_unavailable")
    ] * 3
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert len(fake_vllm.received) == 3


async def test_a_request_that_waited_out_its_hold_is_known_when_sent_again(
    gateway: GatewayFactory, fake_vllm: FakeVllm
) -> None:
    fake_vllm.hold = asyncio.Event()
    async with gateway(max_concurrency=1, max_queue=4, queue_timeout=0.05) as (client, runtime):
        running = asyncio.create_task(client.post("/v1/chat/completions", json=chat_body()))
        await until(lambda: runtime.gate.admission.inflight == 1)
        timed_out = [
            await client.post("/v1/chat/completions", json=chat_body(seed=1)) for _ in range(2)
        ]
        fake_vllm.hold.set()
        await running
    assert [r.json()["error"]["code"] for r in timed_out] == ["queue_timeout"] * 2
    assert runtime.metrics.comebacks == 1  # kept: no full queue to wait out, it waited again


@pytest.mark.parametrize(
    ("headers", "comes_back"),
    [
        (BRIEF, False),  # it holds 0.2 s
        (WEBUI | {"x-stainless-read-timeout": "0.2"}, False),  # openai-python's read timeout
        (TOLD | NODE_FETCH, True),  # its key says its clients retry, whatever the client shows
    ],
    ids=["its hold", "its client's timeout", "its key's retries = true"],
)
async def test_a_refusal_it_may_not_wait_out_is_answered_at_once(
    keyed: Callable[..., Started], fake_vllm: FakeVllm, headers: dict[str, str], comes_back: bool
) -> None:
    """And only a caller that comes back takes the place it is told: the user's next
    request is told a later one. A kept request's refusal is its answer: its place
    stays its user's next (else each refusal would push the next past its hold too)."""
    fake_vllm.hold = asyncio.Event()
    async with keyed() as (client, runtime):
        filling = await fill(client, runtime)
        told = [  # two requests (two bodies: the same one again would be its retry)
            await client.post("/v1/chat/completions", json=chat_body(seed=n), headers=headers)
            for n in range(2)
        ]
        fake_vllm.hold.set()
        await asyncio.gather(*filling)
        assert waited(runtime) == 0
    for refused in told:
        assert (refused.status_code, refused.json()["error"]["code"]) == (429, "queue_full")
    first, second = (float(refused.headers["retry-after-ms"]) for refused in told)
    assert first > 200  # past 0.2 s: a place frees at ~1 s
    if comes_back:
        assert second > first + 200  # the place after the first one's
    else:
        assert second <= first  # the same place, a moment later
    assert len(fake_vllm.received) == 2


@pytest.mark.parametrize(
    ("headers", "client"),
    [
        ({"user-agent": "Python/3.11 aiohttp/3.9.5"}, "aiohttp"),  # Open WebUI's backend
        ({"user-agent": "Python/3.11 aiohttp/3.9.5", "x-openwebui-user-id": "u1"}, "open-webui"),
        ({"user-agent": CHROME}, "browser"),
        ({"user-agent": "curl/8.5.0"}, "curl"),
        (NODE_FETCH, "fetch"),
        ({"user-agent": "undici"}, "fetch"),
        ({"user-agent": "node-fetch/1.0 (+https://github.com/bitinn/node-fetch)"}, "fetch"),
        ({"user-agent": "node-red/4.0"}, None),  # not Node's fetch: unknown
        ({"user-agent": CHROME, "x-stainless-retry-count": "0"}, None),  # openai-node
        (OPENAI_NODE, None),
        (LANGCHAIN_JS | {"x-stainless-retry-count": "0"}, None),  # retries itself, 6 times
        (VERCEL, None),  # 2 retries
        ({"user-agent": "python-httpx/0.28.1"}, None),  # its app decides
        ({"user-agent": "OpenAI/Python 1.99.0", "x-stainless-lang": "python"}, None),
        ({}, None),
    ],
)
def test_which_clients_show_that_they_never_retry(
    headers: dict[str, str], client: str | None
) -> None:
    assert never_retries(headers) == client


HERDLESS = {"x-herdless-attempt": "1"}
RETRY = {"x-stainless-retry-count": "1"}


@pytest.mark.parametrize(
    ("retries", "headers", "kept"),
    [
        (None, NODE_FETCH, True),  # the default: the client shows it never retries
        (None, VERCEL, False),  # it retries, and says nothing of which attempt it sends
        (None, {"user-agent": "python-httpx/0.28.1"}, False),  # its app decides
        (None, RETRY, True),  # an OpenAI SDK's retry, whatever its key
        (True, RETRY, True),
        (True, NODE_FETCH, False),  # the key says its clients retry
        (False, VERCEL, True),  # the key says they never do
        (False, NODE_FETCH | HERDLESS, False),  # a herdless client decides itself
        (None, RETRY | HERDLESS, False),
    ],
)
def test_which_requests_a_full_queue_keeps(
    retries: bool | None, headers: dict[str, str], kept: bool
) -> None:
    assert keeps(KeyPolicy(name="k", retries=retries), headers, deadline=None) is kept


@pytest.mark.parametrize(
    ("headers", "came_back", "timeout"),
    [
        ({}, False, None),
        ({"x-stainless-retry-count": "0"}, False, None),  # a first try (LangChain.js: always)
        ({"x-stainless-retry-count": "2", "x-stainless-timeout": "600"}, True, 600.0),  # node
        ({"x-stainless-retry-count": " 1 ", "x-stainless-read-timeout": "60.0"}, True, 60.0),
        ({"x-stainless-timeout": "30", "x-stainless-read-timeout": "60"}, False, 30.0),
        ({"x-stainless-retry-count": "-1", "x-stainless-timeout": "0"}, False, None),
        ({"x-stainless-retry-count": "\u00b2", "x-stainless-timeout": "\u00b2"}, False, None),
        ({"x-stainless-retry-count": "many", "x-stainless-timeout": "inf"}, False, None),
        ({"x-stainless-retry-count": "1" * 9, "x-stainless-read-timeout": "nan"}, False, None),
    ],
)
def test_what_an_openai_sdk_says_of_its_attempt_and_its_timeout(
    headers: dict[str, str], came_back: bool, timeout: float | None
) -> None:
    assert returned(headers) is came_back
    assert client_timeout(headers) == timeout


async def test_a_caller_that_goes_away_while_it_waits_leaves_nothing_behind(
    keyed: Callable[..., Started], fake_vllm: FakeVllm
) -> None:
    fake_vllm.hold = asyncio.Event()
    async with keyed() as (client, runtime):
        filling = await fill(client, runtime)
        told = await client.post("/v1/chat/completions", json=chat_body(), headers=APPS)
        kept = asyncio.create_task(
            client.post("/v1/chat/completions", json=chat_body(), headers=WEBUI)
        )
        await until(lambda: waited(runtime) == 1)
        kept.cancel()  # the employee closed the tab
        with pytest.raises(asyncio.CancelledError):
            await kept
        fake_vllm.hold.set()
        await asyncio.gather(*filling)
        # Told one place after the refusal before it: past twice that, it would be back.
        await asyncio.sleep(2 * float(told.headers["retry-after-ms"]) / 1000 + 0.2)
        assert waited(runtime) == 1
        assert (runtime.gate.admission.inflight, runtime.gate.admission.queue_depth) == (0, 0)
    assert len(fake_vllm.received) == 2


@pytest.mark.parametrize(
    ("code", "retry", "retry_after", "left", "waits"),
    [
        ("queue_full", True, 1.0, 5.0, True),
        ("kv_budget", True, 1.0, 5.0, True),
        ("queue_full", True, 6.0, 5.0, False),  # past its hold: told at once
        ("queue_full", False, 1.0, 5.0, False),  # a window's refusal with no time to retry
        ("rate_limited", True, 1.0, 5.0, False),  # the key's own limits are its to keep
        ("token_budget", True, 1.0, 5.0, False),
        ("queue_timeout", True, 1.0, 5.0, False),  # it waited its hold in the queue
        ("deadline_unattainable", True, 1.0, 5.0, False),
        ("draining", True, 1.0, 5.0, False),  # not a busy GPU: a drain holds by its own rule
    ],
)
def test_only_a_full_queue_s_reservation_within_the_hold_is_waited_out(
    code: str, retry: bool, retry_after: float, left: float, waits: bool
) -> None:
    refused = Refuse(status=429, code=code, message="m", retry_after=retry_after, retry=retry)
    assert waits_out(refused, left) is waits


def test_a_kept_request_waits_its_hold_in_all_outside_then_in_the_queue() -> None:
    async def scenario() -> tuple[list[float], float, Refuse | None]:
        loop = asyncio.get_running_loop()
        config = AdmissionConfig(max_concurrency=1, max_queue=4, queue_timeout=30.0)
        gate = Gate(Admission(config, clock=VirtualClock(loop)))
        assert isinstance(gate.offer("a", 1), Admit)
        full = Refuse(status=429, code="queue_full", message="m", retry_after=8.0, retry=True)
        offers: list[float] = []

        def offer(kept: float) -> Admit | Enqueued | Refuse:
            offers.append(kept)  # refused twice, 8 s each, then queued
            return full if len(offers) < 3 else gate.offer("a", 1, kept=kept)

        queued = await waited_out(offer, full, 30.0, Counter(), gate.until_place)
        assert isinstance(queued, Enqueued)
        assert queued.ticket.hold_ends == 30.0  # offered at 24 s: 6 s of its hold are left
        refused = await gate.wait(queued.ticket)
        return offers, loop.time(), refused

    offers, at, refused = run_virtual(scenario())
    assert offers == [8.0, 16.0, 24.0]
    assert at == 30.0  # its hold from its first refusal, not 30 s more in the queue
    assert refused is not None
    assert refused.code == "queue_timeout"


def test_a_queue_run_dry_wakes_the_kept_request_told_the_earliest_time() -> None:
    """Told 8 s and 4 s, two kept requests wait. An end while others wait in the queue
    wakes neither (the callers told later times count on those places); the end that
    leaves the queue empty wakes the one told 4 s; the other comes back at its time."""

    async def scenario() -> list[tuple[str, bool, float]]:
        loop = asyncio.get_running_loop()
        config = AdmissionConfig(max_concurrency=1, max_queue=2, queue_timeout=30.0)
        gate = Gate(Admission(config, clock=VirtualClock(loop)))
        running, first, second = (gate.offer("a", 1) for _ in range(3))
        assert isinstance(running, Admit)
        assert isinstance(first, Enqueued)
        assert isinstance(second, Enqueued)
        woken: list[tuple[str, bool, float]] = []

        async def kept(name: str, seconds: float) -> None:
            woken.append((name, await gate.until_place(seconds), loop.time()))

        both = asyncio.gather(kept("told 8 s", 8.0), kept("told 4 s", 4.0))
        await asyncio.sleep(1.0)
        gate.release(running.ticket)  # the first waiter starts; the second still waits
        await asyncio.sleep(0.5)
        assert woken == []
        gate.release(first.ticket)  # the second starts: the queue is empty
        await both
        return woken

    assert run_virtual(scenario()) == [("told 4 s", True, 1.5), ("told 8 s", False, 8.0)]


def test_nothing_wakes_a_kept_request_while_the_gateway_drains() -> None:
    """An end while draining (or while the upstream is out, or the engine sleeps) wakes
    no kept request: offered then it would find a 503 before its time."""

    async def scenario() -> tuple[bool, float]:
        loop = asyncio.get_running_loop()
        config = AdmissionConfig(max_concurrency=1, max_queue=1, queue_timeout=30.0)
        gate = Gate(Admission(config, clock=VirtualClock(loop)))
        running = gate.offer("a", 1)
        assert isinstance(running, Admit)
        kept = asyncio.ensure_future(gate.until_place(4.0))
        await asyncio.sleep(1.0)
        gate.drain()
        gate.release(running.ticket)  # the queue is empty, but the gateway drains
        return await kept, loop.time()

    assert run_virtual(scenario()) == (False, 4.0)


def test_a_kept_request_woken_early_for_a_place_another_took_keeps_its_time() -> None:
    async def scenario() -> tuple[list[float], list[float], Counter[str], Refuse]:
        loop = asyncio.get_running_loop()
        frees = [1.0, 9.0]  # when a place frees
        waits: list[float] = []

        async def place(seconds: float) -> bool:
            waits.append(seconds)
            if frees and frees[0] < loop.time() + seconds:
                await asyncio.sleep(frees.pop(0) - loop.time())
                return True
            await asyncio.sleep(seconds)
            return False

        def refused(after: float, code: str = "queue_full") -> Refuse:
            return Refuse(status=429, code=code, message="m", retry_after=after)

        answers = [refused(7.0), refused(8.0), refused(1.0, code="draining")]
        offers: list[float] = []

        def offer(kept: float) -> Admit | Enqueued | Refuse:
            offers.append(kept)
            return answers.pop(0)

        counted: Counter[str] = Counter()
        last = await waited_out(offer, refused(8.0), 30.0, counted, place)
        assert isinstance(last, Refuse)
        return offers, waits, counted, last

    offers, waits, counted, last = run_virtual(scenario())
    # Told 8 s: woken at 1 s, the place taken, its time kept (7 s left); back at 8 s,
    # told 8 s more; woken at 9 s: a refusal it does not wait out is the answer.
    assert (waits, offers) == ([8.0, 7.0, 8.0], [1.0, 8.0, 9.0])
    assert counted == Counter(queue_full=2)  # the two times told, not the one kept
    assert last.code == "draining"


def test_what_a_kept_request_waited_counts_against_an_announced_drain() -> None:
    config = AdmissionConfig(max_concurrency=1, max_queue=4, queue_timeout=30.0)
    adm = Admission(config, clock=FakeClock())
    assert isinstance(adm.offer("a", 1), Admit)
    fresh, kept = adm.offer("a", 1), adm.offer("a", 1, kept=25.0)
    assert isinstance(fresh, Enqueued)
    assert isinstance(kept, Enqueued)
    refused = adm.drain(expect=10.0)  # its hold has 5 s left: it cannot wait the window out
    assert [(ticket.id, r.code) for ticket, r in refused] == [(kept.ticket.id, "draining")]
    draining = adm.precheck("a", kept=25.0)
    assert draining is not None
    assert draining.code == "draining"
    assert adm.precheck("a") is None


def test_a_kept_request_told_past_its_hold_leaves_its_users_schedule_as_it_was() -> None:
    """Each refusal a caller comes back for moves its user's next place on. A kept
    request told a place past its hold gets the refusal as its answer, and its caller
    never comes back: that place stays the user's next. Were it taken, a client that
    never retries, sending its next request at once, would be told a later place each
    time and refused each time, however soon the GPU frees."""
    config = AdmissionConfig(
        max_concurrency=1, max_queue=1, queue_timeout=30.0, initial_service_time=10.0
    )
    adm = Admission(config, clock=FakeClock())
    assert isinstance(adm.offer("a", 1, user="other"), Admit)
    assert isinstance(adm.offer("a", 1, user="other"), Enqueued)

    def told(n: int, **kept: float) -> float:
        refused = adm.offer("a", 1, user="u", call=f"kept {n}", kept_back=True, **kept)
        assert isinstance(refused, Refuse)
        assert refused.code == "queue_full"
        return refused.retry_after

    # A place frees each 10 s; the user gets each one (a kept request: the whole rate).
    assert [told(n, kept_for=30.0) for n in range(5)] == [10.0, 20.0, 30.0, 40.0, 40.0]
    assert told(5, kept=12.0, kept_for=30.0) == 40.0  # 18 s of its hold left: not within
    assert told(6) == 40.0  # a caller that comes back takes it, and the next is after it
    assert told(7) == 50.0


@pytest.mark.parametrize("patient", [True, False], ids=["patient", "spills"])
def test_a_kept_request_told_past_its_hold_waits_for_a_place_the_gpu_would_leave_idle(
    patient: bool,
) -> None:
    """Told 40 s with a hold of 30 s (run times learned on longer answers): a patient
    request (its key may not spill) waits anyway, taking no place; the queue runs dry at
    5 s, and it takes the place there, first in line. A key that may spill gets the
    refusal at once."""

    async def scenario() -> tuple[Admit | Enqueued | Refuse, float]:
        loop = asyncio.get_running_loop()
        config = AdmissionConfig(
            max_concurrency=1, max_queue=1, queue_timeout=30.0, initial_service_time=40.0
        )
        gate = Gate(Admission(config, clock=VirtualClock(loop)))
        running, waiting = gate.offer("a", 1, user="other"), gate.offer("a", 1, user="other")
        assert isinstance(running, Admit)
        assert isinstance(waiting, Enqueued)

        def offer(kept: float) -> Admit | Enqueued | Refuse:
            return gate.offer("a", 1, user="u", call="kept 1", kept=kept, kept_for=30.0)

        refused = offer(0.0)
        assert isinstance(refused, Refuse)
        assert refused.retry_after > 30.0

        async def kept() -> tuple[Admit | Enqueued | Refuse, float]:
            counted: Counter[str] = Counter()
            decision = await waited_out(
                offer, refused, 30.0, counted, gate.until_place, patient=patient
            )
            return decision, loop.time()

        answer = asyncio.ensure_future(kept())
        await asyncio.sleep(5.0)
        gate.release(running.ticket)  # the waiter starts: the queue has run dry
        await asyncio.sleep(1.0)
        gate.release(waiting.ticket)
        return await answer

    decision, at = run_virtual(scenario())
    if patient:
        assert isinstance(decision, Enqueued)
        assert (at, decision.ticket.started_at) == (5.0, 6.0)
    else:
        assert isinstance(decision, Refuse)
        assert at == 0.0


def test_a_patient_request_the_gpu_never_frees_for_is_answered_before_its_hold_ends() -> None:
    """No place frees: it is offered once more a second before its hold ends (a client
    whose timeout is its hold reads the refusal), and that refusal is its answer."""

    async def scenario() -> tuple[list[float], Refuse, float]:
        loop = asyncio.get_running_loop()
        offers: list[float] = []
        told = Refuse(status=429, code="queue_full", message="m", retry_after=40.0)

        def offer(kept: float) -> Admit | Enqueued | Refuse:
            offers.append(kept)
            return dataclasses.replace(told, retry_after=40.0 - kept)

        async def place(seconds: float) -> bool:
            await asyncio.sleep(seconds)
            return False

        last = await waited_out(offer, told, 30.0, Counter(), place, patient=True)
        assert isinstance(last, Refuse)
        return offers, last, loop.time()

    offers, last, at = run_virtual(scenario())
    assert (offers, at) == ([29.0], 29.0)
    assert last.retry_after == 11.0
