"""Events: one frozen record per decision the client takes.

Every retry, wait, breaker change and fallback is emitted as an event to the
client's ``on_event`` hook *before* any wait happens, so that a fallback buys
time without hiding a primary that has been dead for days. ``client.stats()``
is computed from the same events.

All events share ``call_id`` (the request id of the logical call, also sent as
``X-Request-ID``; ``None`` for client-wide events), ``backend`` (the backend's
name) and ``at`` (the client clock's monotonic time, in seconds).

    Event
    ├── AttemptStarted
    ├── AttemptFailed
    ├── RetryScheduled
    ├── WaitScheduled
    ├── SlotAwaited
    ├── WindowResized
    ├── BackpressureReceived
    ├── BreakerStateChanged
    ├── FallbackUsed
    ├── HedgeStarted
    ├── HedgeFinished
    ├── PrimaryDegraded
    ├── ResponseReceived
    ├── CallFinished
    └── CallFailed
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Literal, Protocol, TypeAlias

from herdless._types import WaitEstimate

__all__ = [
    "AttemptFailed",
    "AttemptStarted",
    "BackpressureReceived",
    "BreakerState",
    "BreakerStateChanged",
    "CallFailed",
    "CallFinished",
    "Event",
    "EventHook",
    "FallbackUsed",
    "HedgeFinished",
    "HedgeStarted",
    "PrimaryDegraded",
    "ResponseReceived",
    "RetryScheduled",
    "SlotAwaited",
    "WaitScheduled",
    "WindowResized",
]

BreakerState: TypeAlias = Literal["closed", "open", "half_open"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """Fields every event carries."""

    call_id: str | None
    """Request id of the logical call (``X-Request-ID``); ``None`` for client-wide events."""
    backend: str | None
    """Name of the backend the decision is about."""
    at: float
    """Monotonic time of the decision, in seconds, from the client's clock."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptStarted(Event):
    """One HTTP attempt is about to be sent."""

    attempt: int
    """1 for the first attempt of the call, counting across backends."""
    model: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptFailed(Event):
    """One HTTP attempt ended without a usable answer."""

    attempt: int
    kind: str
    """What went wrong: ``"status"``, ``"connect"``, ``"timeout"``, ``"first_byte_timeout"``,
    ``"read"``, ``"protocol"``, ``"stream_cut"``."""
    status: int | None = None
    """HTTP status when the server answered."""
    retry_after: float | None = None
    """Seconds the server asked us to wait, when it said so."""
    message: str = ""
    """A short description; never contains an API key."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryScheduled(Event):
    """The call will try the same backend again after ``delay`` seconds."""

    attempt: int
    """The attempt that failed."""
    delay: float
    """Seconds the client is about to wait."""
    reason: str
    """Why: ``"status_429"``, ``"status_503"``, ``"connect"``, ``"timeout"``, ..."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WaitScheduled(Event):
    """The call will wait ``delay`` seconds before its next attempt, other than a retry's
    backoff: behind another call's Retry-After, for retry budget, for a breaker's probe
    time, for the spend guard or for the client's own pacing."""

    delay: float
    """Seconds the client is about to wait."""
    reason: str
    """Why: ``"backpressure"`` (the backend is out and said when to come back),
    ``"draining"``, ``"budget"``, ``"breaker_open"``, ``"spend"``, ``"pacing"``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotAwaited(Event):
    """The call waits in the client for a slot of the backend's window (flow control):
    the client's calls already fill it. Nothing is sent until a call leaves."""

    position: int
    """Calls ahead of this one in the client's queue (0: next)."""
    expected: float | None
    """Seconds the client expects the wait to last; ``None`` before anything is measured."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowResized(Event):
    """The client changed how many calls it lets be at ``backend`` at once: it shrank on a
    refusal, or took the capacity the server advertised. (Growth on success is not an
    event: it happens on every call; ``client.stats().windows`` shows the size.)"""

    size: float
    """Calls let through at once from now on."""
    reason: str
    """Why: ``"refused"`` (a 429 or a busy 503) or ``"advertised"``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BackpressureReceived(Event):
    """A backend asked the whole client to slow down (Retry-After or drain)."""

    retry_after: float
    """Seconds until the backend said it would have room."""
    draining: bool = False
    """True when the backend is draining for maintenance: switch to the fallback now."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BreakerStateChanged(Event):
    """A backend's circuit breaker moved between closed, open and half-open."""

    old: BreakerState
    new: BreakerState
    reason: str
    """Why: ``"failure_rate"``, ``"consecutive_failures"``, ``"draining"``, ``"probe_ok"``,
    ``"probe_failed"``, ``"open_elapsed"``, ``"drain_ended"`` (open to closed: a drain's
    named time came; the first failure opens it again)."""
    open_for: float | None = None
    """When ``new == "open"``: seconds until a probe is allowed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FallbackUsed(Event):
    """The call moved to the next backend; ``backend`` is the one it moves to."""

    from_backend: str
    reason: str
    """Why: ``"breaker_open"``, ``"unavailable"`` (the backend says it is out: loading, or
    its upstream down), ``"draining"``, ``"busy"`` (the wait for a busy backend no longer
    fits the deadline, or ``FallbackPolicy.max_busy_wait``), ``"deadline_unattainable"``
    (the server predicted the deadline cannot be met there), ``"retry_after_exceeds_deadline"``,
    ``"retries_exhausted"``, ``"budget_exhausted"``, ``"deadline"``, ``"backpressure"`` (a
    reservation with ``on_backpressure="fallback"``), ``"timeout"`` (a hung backend is not
    waited on twice), ``"failed"`` (an error retrying the same backend cannot fix),
    ``"hedge"`` (the call's hedge at this backend answered, or outlived the late attempt:
    ``HedgePolicy``)."""
    estimate: WaitEstimate | None = None
    """For ``"busy"`` when the client's own estimate sent the call away: the numbers it
    compared (expected wait and answer, margin, time left, reserve); ``None`` otherwise."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HedgeStarted(Event):
    """An attempt had no first byte after the hedge delay: the same request was just sent
    to ``backend`` too (``HedgePolicy``). Both run until one answers."""

    from_backend: str
    """The backend of the late attempt, which keeps running."""
    attempt: int
    """The hedge's attempt number (counting across backends)."""
    after: float
    """Seconds the late attempt had waited for its first byte."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HedgeFinished(Event):
    """A hedge's race is decided; ``backend`` is the hedge's backend (as in
    ``HedgeStarted``)."""

    from_backend: str
    """The backend of the attempt that was hedged."""
    winner: str | None
    """The backend whose answer the call takes (its first chunk, for a stream); ``None``
    when both attempts failed (the call goes on from the last failure)."""
    loser_cancelled: bool
    """Whether the other attempt was still running and was cancelled (its connection
    closed); ``False`` when it had failed already."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PrimaryDegraded(Event):
    """Repeated while fallbacks keep serving: the primary is not answering.

    ``backend`` is the primary. Emitted at most once per ``interval`` per client,
    so a primary dead for days stays visible behind a working fallback.
    """

    since: float
    """Monotonic time of the first fallback in this degraded period."""
    fallbacks: int
    """Calls served elsewhere since then."""
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseReceived(Event):
    """A backend's answer is complete: a whole answer, or a stream that ended (or that
    the caller closed). Emitted just before ``CallFinished``, with what the answer says
    about itself: the tokens it used (``stats().tokens``, the spend guard's token and
    money caps and the adapters' token metrics count them), what it cost, and where it
    came from. Not emitted for a stream that broke (``StreamInterrupted``)."""

    model: str | None
    """The model the server says answered (``gen_ai.response.model``)."""
    input_tokens: int | None
    """Prompt tokens (``usage.prompt_tokens``); ``None`` when the server sent no usage."""
    output_tokens: int | None
    """Completion tokens (``usage.completion_tokens``); ``None`` without usage."""
    cost: float | None = None
    """What the answer cost at the backend's ``Price``; ``None`` without a price or usage."""
    finish_reason: str | None = None
    response_id: str | None = None
    """The answer's ``id`` (``chatcmpl-...``)."""
    server_address: str | None = None
    """The backend's host (``server.address``)."""
    server_port: int | None = None
    """The backend's port, explicit or implied by the scheme (``server.port``)."""
    external: bool = False
    """Whether the backend is ``external`` (its tokens count toward the spend guard)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CallFinished(Event):
    """A call returned a result; ``backend`` is the one that answered."""

    attempts: int
    latency: float
    """Seconds from the start of the call to the result (to the end of the stream)."""
    fallback_reason: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CallFailed(Event):
    """A call raised; ``error`` is the exception's class name."""

    attempts: int
    latency: float
    error: str


class EventHook(Protocol):
    """What ``AsyncClient(on_event=...)`` takes (one, or a sequence of them): a callable
    that receives each event, a plain function or a coroutine function (awaited before
    the client goes on). ``Client`` takes plain callables only. A hook that raises is
    logged and never breaks the call.

    >>> async def on_event(event: Event) -> None:
    ...     print(type(event).__name__, event.backend)
    """

    def __call__(self, event: Event, /) -> Awaitable[None] | None: ...
