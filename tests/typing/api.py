"""Type-checked by mypy (nox -s typecheck), never executed: every public signature."""

from __future__ import annotations

import random

import httpx

import herdless
from herdless import events
from herdless.testing import FakeClock, MockBackend, Reply, ok

version: str = herdless.__version__

# -- configuration objects -------------------------------------------------------------

timeouts = herdless.Timeouts(connect=1.0, first_byte=10.0, read=5.0)
hosted = herdless.Backend(
    name="hosted",
    base_url="https://api.example.com/v1",
    api_key="sk-...",
    model="gpt-4o-mini",
    external=True,
    timeouts=timeouts,
    price=herdless.Price(input=0.15, output=0.6),
)
cost: float = herdless.Price(input=1.0, output=2.0).cost(input_tokens=10, output_tokens=5)
retry = herdless.RetryPolicy(max_attempts=3, base=0.5, cap=8.0, max_retry_after=60.0)
breaker = herdless.BreakerPolicy(consecutive_failures=5, open_for=5.0)
fallback_policy = herdless.FallbackPolicy(
    reserve=0.4,
    allow_external=True,
    max_external_tokens=1_000_000,
    max_external_cost=50.0,
    spend_window=86_400.0,
)
pacing = herdless.PacingPolicy(rate=20.0, burst=5)
hedge = herdless.HedgePolicy(after="auto", max_share=0.05, min_after=0.1)
fixed_hedge = herdless.HedgePolicy(after=2.0)
clock = FakeClock()
# herdless.testing re-exports mock's names (its __all__): a user's type check sees them.
scripted: type[MockBackend] = MockBackend
reply: Reply = ok("hi")


def on_event(event: events.Event) -> None:
    if isinstance(event, events.RetryScheduled):
        delay: float = event.delay
        del delay
    if isinstance(event, events.HedgeStarted):
        waited: float = event.after
        late: str = event.from_backend
        del waited, late
    if isinstance(event, events.HedgeFinished):
        winner: str | None = event.winner
        cancelled: bool = event.loser_cancelled
        del winner, cancelled


async def on_event_async(event: events.Event) -> None:
    return None


# EventHook is what AsyncClient(on_event=...) takes: a coroutine function or a plain one.
async_hooks: list[events.EventHook] = [on_event_async, on_event]


# -- the sync client ---------------------------------------------------------------------


def sync_usage() -> None:
    with herdless.Client(
        primary="http://gpu:8080/v1",
        fallback=hosted,
        model="gemma",
        retry=retry,
        breaker=breaker,
        deadline=30.0,
        stream_deadline=300.0,
        on_event=[on_event, on_event],
        timeouts=timeouts,
        fallback_policy=fallback_policy,
        pacing=pacing,
        priority="interactive",
        hedge=hedge,
        clock=clock,
        rng=random.Random(1),
        sleep=clock.sleep,
        transport=httpx.MockTransport(lambda request: httpx.Response(200)),
    ) as client:
        result: herdless.ChatResult = client.chat(
            [{"role": "user", "content": "hi"}],
            model="gemma",
            max_tokens=10,
            temperature=0.0,
            deadline=5.0,
            allow_fallback=False,
            priority="batch",
            extra_body={"guided_regex": "[a-z]+"},
            extra_headers={"X-Tenant": "blue"},
            seed=1,
            tools=[],
        )
        # chat()'s options are ChatOptions: a misspelled one is the type checker's error.
        client.chat([{"role": "user", "content": "hi"}], max_token=10)  # type: ignore[call-overload]
        calls: tuple[herdless.ToolCall, ...] = result.tool_calls
        if calls:
            function: herdless.FunctionCall = calls[0].function
            name: str = function.name
            arguments: str = function.arguments
            del name, arguments
        content: str = result.content
        backend: str = result.backend
        model: str | None = result.model
        usage: herdless.Usage | None = result.usage
        attempts: tuple[herdless.AttemptRecord, ...] = result.attempts
        reason: str | None = result.fallback_reason
        request_id: str = result.request_id
        finish: str | None = result.finish_reason
        del content, backend, model, usage, attempts, reason, request_id, finish

        with client.chat(
            [{"role": "user", "content": "hi"}], stream=True, stream_deadline=60.0
        ) as stream:
            for chunk in stream:
                delta: str = chunk.content
                pieces: tuple[herdless.ToolCallDelta, ...] = chunk.tool_calls
                if pieces and pieces[0].function is not None:
                    piece: herdless.FunctionCallDelta = pieces[0].function
                    del piece
                del delta
            stream_usage: herdless.Usage | None = stream.usage
            joined: tuple[herdless.ToolCall, ...] = stream.tool_calls
            del stream_usage, joined
        stats: herdless.ClientStats = client.stats()
        tokens: int = stats.tokens["primary"]["prompt_tokens"]
        spent: float = stats.cost.get("hosted", 0.0)
        hedges: int = stats.hedges.get("hosted", 0)
        wins: int = stats.hedge_wins.get("primary", 0)
        error: float = stats.wait_error.get("primary", {}).get("p50", 0.0)
        del stats, tokens, spent, hedges, wins, error
        strict: herdless.Client = client.with_options(
            deadline=5.0,
            stream_deadline=30.0,
            timeouts=timeouts,
            retry=retry,
            fallback_policy=fallback_policy,
            model="gemma",
            allow_fallback=False,
            priority="batch",
        )
        # with_options()'s are DerivedOptions: a misspelled one is the type checker's error.
        client.with_options(deadlin=5.0)  # type: ignore[call-arg]
        del strict
    herdless.Client.from_env(env_file=None, on_event=on_event).close()
    herdless.Client(primary=[hosted, "http://gpu-2:8080/v1"]).close()


# -- the async client --------------------------------------------------------------------


async def async_usage() -> None:
    async with herdless.AsyncClient(
        primary="http://gpu:8080/v1",
        fallback=[hosted],
        hedge=fixed_hedge,
        on_event=(on_event_async, on_event),
        sleep=clock.asleep,
        http_client=httpx.AsyncClient(),
    ) as client:
        result: herdless.ChatResult = await client.chat(
            [{"role": "user", "content": "hi"}], priority="batch"
        )
        del result
        stream: herdless.AsyncStream = await client.chat(
            [{"role": "user", "content": "hi"}], stream=True
        )
        async with stream:
            async for chunk in stream:
                chunk_: herdless.Chunk = chunk
                del chunk_
        derived: herdless.AsyncClient = client.with_options(deadline=5.0)
        del derived
    async with herdless.AsyncClient.from_env(on_event=on_event) as from_env:
        del from_env
    async with herdless.AsyncClient("http://gpu:8080/v1", on_event=async_hooks) as hooked:
        del hooked


# -- errors ------------------------------------------------------------------------------


def error_usage(error: herdless.HerdlessError) -> None:
    request_id: str | None = error.request_id
    attempts: tuple[herdless.AttemptRecord, ...] = error.attempts
    retry_after: float | None = error.retry_after
    del request_id, attempts, retry_after
    if isinstance(error, herdless.APIStatusError):
        status: int | None = error.status
        status_code: int | None = error.status_code
        server_message: str = error.server_message
        del status, status_code, server_message
    if isinstance(error, herdless.SpendLimitExceeded):
        limit: str | None = error.limit
        del limit
    if isinstance(error, herdless.StreamDeadlineExceeded):
        deadline: float | None = error.deadline
        del deadline
    if isinstance(error, herdless.StreamInterrupted):
        chars: int = error.delivered_chars
        del chars
    if isinstance(error, herdless.AllBackendsFailed):
        each: dict[str, herdless.HerdlessError] = error.errors
        del each
    if isinstance(error, herdless.ConfigurationError):
        variable: str | None = error.variable
        del variable


errors: tuple[type[herdless.HerdlessError], ...] = (
    herdless.BadRequestError,
    herdless.NotFoundError,
    herdless.ConflictError,
    herdless.UnprocessableEntityError,
    herdless.AuthenticationError,
    herdless.PermissionDeniedError,
    herdless.RateLimitError,
    herdless.ServiceUnavailableError,
    herdless.InternalServerError,
    herdless.APIConnectionError,
    herdless.APITimeoutError,
    herdless.DeadlineExceeded,
    herdless.StreamDeadlineExceeded,
    herdless.FallbackNotAllowed,
    herdless.SpendLimitExceeded,
)
received: events.ResponseReceived = events.ResponseReceived(
    call_id="r",
    backend="hosted",
    at=0.0,
    model="m",
    input_tokens=1,
    output_tokens=2,
    cost=None,
)


def wait_estimates(moved: events.FallbackUsed, late: herdless.DeadlineExceeded) -> None:
    estimate: herdless.WaitEstimate | None = moved.estimate or late.estimate
    if estimate is not None:
        best: float = estimate.best
        words: str = estimate.describe()
        numbers: tuple[float, float, float, int, float, float] = (
            estimate.wait,
            estimate.answer,
            estimate.margin,
            estimate.samples,
            estimate.left,
            estimate.reserve,
        )
        del best, words, numbers
