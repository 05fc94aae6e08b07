"""The record of one call: ``Call`` (what it asks, its deadline, attempts and events).

Its visits to backends (``herdless._call.visit.Visit``) and the flow
(``herdless._call.flow``) build on it. Events are counted for ``stats()`` here and kept
for the driver's hook; a complete answer's tokens and cost too (``response_received``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from herdless._backend import Backend
from herdless._breaker import Transition
from herdless._config import PRIORITIES
from herdless._log import log_event, logged
from herdless._types import AttemptRecord
from herdless.events import (
    AttemptStarted,
    BreakerStateChanged,
    CallFinished,
    Event,
    ResponseReceived,
)

if TYPE_CHECKING:
    from herdless._state import ClientState
    from herdless._types import Usage
    from herdless._window import SlotTicket, Window

__all__ = ["Call", "response_received"]


class Call:
    """One logical call: what it asks, its deadline, its attempts and events so far.

    Args:
        state: the client's shared state (and, through it, its configuration).
        request_id: sent as ``X-Request-ID`` on every attempt.
        body: the JSON body without ``model`` (messages, max_tokens, ..., extra fields).
        model: the call's model override; ``None`` uses the backend's, then the client's.
        stream: a streaming call (accepted at its first chunk).
        deadline: seconds for the whole call; ``None`` uses the client's default.
        allow_fallback: ``False`` keeps the call on the primaries (data guard).
        priority: its class (``X-Herdless-Priority``); ``None`` uses the client's.
        fairness: llm-d's fairness id to send (the call's user), or ``None``.
        queue_ttl: send llm-d's queue TTL with each attempt.
    """

    __slots__ = (
        "_events",
        "_sent",
        "allow_fallback",
        "body",
        "deadline",
        "deadline_at",
        "fairness",
        "model",
        "priority",
        "queue_ttl",
        "records",
        "request_id",
        "start",
        "state",
        "stream",
        "stream_slot",
        "streaming",
        "watched",
    )

    def __init__(
        self,
        state: ClientState,
        *,
        request_id: str,
        body: Mapping[str, Any],
        model: str | None = None,
        stream: bool = False,
        deadline: float | None = None,
        allow_fallback: bool = True,
        priority: str | None = None,
        fairness: str | None = None,
        queue_ttl: bool = False,
    ) -> None:
        self.state = state
        self.fairness = fairness
        self.queue_ttl = queue_ttl
        self.request_id = request_id
        self.body = body
        self.model = model
        self.stream = stream
        self.allow_fallback = allow_fallback
        self.deadline = state.config.deadline if deadline is None else deadline
        if not self.deadline > 0:
            raise ValueError(f"deadline must be > 0 seconds, got {self.deadline!r}")
        if priority is None:
            self.priority = state.config.priority  # checked when the client was made
        elif priority in PRIORITIES:
            self.priority = priority
        else:
            raise ValueError(f"priority must be one of {PRIORITIES}, got {priority!r}")
        self.start = 0.0
        self.deadline_at = math.inf
        self.records: list[AttemptRecord] = []
        self.watched = False
        """Whether the two events of every call are built (for the hook, or the log)."""
        self._sent = 0  # attempts sent so far, across backends
        self._events: list[Event] = []
        self.streaming: tuple[Backend, str | None] | None = None
        """An accepted stream's backend and fallback reason, until the stream ends."""
        self.stream_slot: tuple[Window, SlotTicket] | None = None
        """An accepted stream's place in its backend's window, until the stream ends."""

    @property
    def attempts(self) -> tuple[AttemptRecord, ...]:
        """The call's attempt records so far, oldest first."""
        return tuple(self.records)

    @property
    def sent(self) -> int:
        """How many attempts the call sent so far, across backends."""
        return self._sent

    def begin(self) -> None:
        """The call starts now: its deadline runs from here."""
        state = self.state
        self.start = state.clock.monotonic()
        self.deadline_at = self.start + self.deadline
        # Asked once a call: the events nobody sees are counted, never built.
        self.watched = state.keep_events or logged(CallFinished)

    def next_attempt(self) -> int:
        """Count one more attempt; return its number (1 for the call's first)."""
        self._sent += 1
        return self._sent

    def model_for(self, backend: Backend) -> str | None:
        """The model name sent to ``backend``."""
        state = self.state
        if backend.name in state.fallback_names:
            # A fallback serves another model than the primary: its own name comes first.
            return backend.model or self.model or state.config.model
        return self.model or backend.model or state.config.model

    def fits(self, resume_at: float, end: float) -> bool:
        """Whether a wait until ``resume_at`` still leaves an attempt its minimum time."""
        return resume_at + self.state.config.fallback_policy.min_attempt <= end

    def keep_slot(self, window: Window, ticket: SlotTicket) -> None:
        """Keep a visit's slot past the visit: an accepted stream occupies the backend
        until it ends (``release_slot``)."""
        self.stream_slot = (window, ticket)

    def release_slot(self) -> None:
        """The accepted stream ended: its slot goes to the next waiting call."""
        if self.stream_slot is not None:
            (window, ticket), self.stream_slot = self.stream_slot, None
            window.release(ticket)

    def elapsed(self) -> float:
        """Seconds since the call began."""
        return self.state.clock.monotonic() - self.start

    # -- events ----------------------------------------------------------------------------

    def take_events(self) -> list[Event]:
        """Return and clear the events emitted since the last call (oldest first)."""
        events, self._events = self._events, []
        return events

    def emit(
        self,
        event_type: type[Event],
        /,
        now: float | None = None,
        *,
        counted: bool = False,
        **fields: Any,
    ) -> None:
        """Emit one event of this call, at ``now`` when the caller just read the clock.

        ``counted``: the caller has counted it already (an event of every call, counted
        without building it); the caller emits it only when ``watched``."""
        state = self.state
        at = state.clock.monotonic() if now is None else now
        event = event_type(call_id=self.request_id, at=at, **fields)
        if not counted:
            state.counts.record(event)
        self.publish(event)

    def publish(self, event: Event) -> None:
        """Hand a counted event to the hook's outbox (when there is a hook) and the log."""
        if self.state.keep_events:
            self._events.append(event)
        log_event(event)

    def attempt_started(
        self, backend: Backend, attempt: int, model: str | None, now: float
    ) -> None:
        """An attempt is about to be sent: ``AttemptStarted`` (counted; built only when
        someone would see it)."""
        self.state.counts.sent(backend.name)
        if self.watched:
            name = backend.name
            self.emit(AttemptStarted, now, counted=True, backend=name, attempt=attempt, model=model)

    def transition(self, backend: Backend, transition: Transition | None) -> None:
        """Emit ``BreakerStateChanged`` for a breaker's transition, if any."""
        if transition is not None:
            self.emit(
                BreakerStateChanged,
                backend=backend.name,
                old=transition.old,
                new=transition.new,
                reason=transition.reason,
                open_for=transition.open_for,
            )


@functools.lru_cache(maxsize=64)
def _address(base_url: str) -> tuple[str | None, int | None]:
    """``(host, port)`` of a base URL; the port implied by the scheme when not given."""
    parts = urlsplit(base_url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    return parts.hostname, port


def response_received(
    call: Call,
    backend: Backend,
    *,
    usage: Usage | None,
    model: str | None,
    finish_reason: str | None,
    response_id: str | None = None,
    raw: Mapping[str, Any] | None = None,
) -> None:
    """A call's answer from ``backend`` is complete: count its tokens and cost (stats, and
    the spend guard for an external backend), and emit ``ResponseReceived`` when someone
    would see it (an event nobody sees is never built). The answer's id is
    ``response_id``, or read from its ``raw`` JSON only then."""
    state = call.state
    if usage is None and not call.watched:
        return  # nothing to count, nobody to tell
    input_tokens = output_tokens = None
    cost = None
    if usage is not None:
        input_tokens, output_tokens = usage.prompt_tokens, usage.completion_tokens
        if backend.price is not None:
            cost = backend.price.cost(input_tokens=input_tokens, output_tokens=output_tokens)
        if backend.external:
            state.spend.record_usage(input_tokens + output_tokens, cost)
    state.counts.response(backend.name, input_tokens, output_tokens, cost)
    if call.watched:
        if response_id is None and raw is not None:
            ident = raw.get("id")
            response_id = ident if isinstance(ident, str) else None
        host, port = _address(backend.base_url)
        call.emit(
            ResponseReceived,
            counted=True,
            backend=backend.name,
            model=model,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cost=cost,
            finish_reason=finish_reason,
            response_id=response_id,
            server_address=host,
            server_port=port,
            external=backend.external,
        )
