"""What :class:`~herdless.gateway.core.admission.Admission` hands out: tickets and decisions.

Plain data, no logic; imported from here by the admission's modules and by the gate,
the proxy and the refusals that read its answers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from herdless.gateway.core.limits import Priority

__all__ = ["Admit", "Enqueued", "Refuse", "Ticket"]


@dataclass(eq=False, slots=True, kw_only=True)
class Ticket:
    """One request inside the gateway, from offer to release (identity-compared).

    Attributes:
        id: sequence number, unique per :class:`Admission`.
        key_id: the caller's key id (never the key).
        price: tokens priced before the run (estimated prompt + ``max_tokens``).
        offered_at: clock time of the offer.
        started_at: clock time it started running upstream, or ``None``.
        user: the hash of the user the request named (``user`` field or
            ``X-Herdless-User``), or ``None``.
        priority: its class as the queue treats it (``interactive`` or ``batch``).
        prompt: estimated prompt tokens (the rest of ``price`` is ``max_tokens``).
        open_ended: it named no ``max_tokens`` (a chat front-end's request): its answer
            ends where the engine's context does, and ``price`` assumed the gateway's
            ``default_max_tokens``, a guess that is no cap on its prediction.
        prefix: its prompt's links (:func:`~herdless.gateway.core.prefixes.chain`).
        charged: weighted tokens charged to its user when it started (the fair
            queue's counters), settled against the real usage at its end.
        hold: seconds it may wait in the queue (its key's ``queue_timeout``).
        waits_out_drain: it named no deadline, so it may wait out an announced
            maintenance window its hold covers.
        ttl: its hold is the queue TTL it named (``x-llm-d-inference-ttl``), shorter
            than its key's.
        kept: seconds it waited in the gateway before this offer, outside the queue (a
            request a full queue kept: :func:`herdless.gateway.edge.waited_out`), spent
            of its hold.
        returns: its caller comes back when refused (a herdless client, that says who
            it is): a full queue may give its place to a user that waits in fewer.
        deadline_at: clock time its caller stops waiting for it to start (``None``: not
            said).
    """

    id: int
    key_id: str
    price: int
    offered_at: float
    started_at: float | None = None
    state: Literal["queued", "running", "done"] = "queued"
    user: str | None = None
    priority: Priority = "interactive"
    prompt: int = 0
    open_ended: bool = False
    prefix: tuple[int, ...] = ()
    charged: float = 0.0
    hold: float = 30.0
    waits_out_drain: bool = False
    ttl: bool = False
    kept: float = 0.0
    returns: bool = False
    deadline_at: float | None = None

    @property
    def answer_cap(self) -> float:
        """The longest answer it may give as far as the gateway knows: its ``max_tokens``
        (the rest of ``price``), unbounded when it named none."""
        return math.inf if self.open_ended else self.price - self.prompt

    @property
    def unit(self) -> str:
        """Its fairness unit: the key id, refined by the user (``key-1a2b3c4d/u-...``)."""
        return self.key_id if self.user is None else f"{self.key_id}/{self.user}"

    @property
    def hold_ends(self) -> float:
        """Clock time its hold runs out (what it waited before its offer included)."""
        return self.offered_at + self.hold - self.kept

    @property
    def queue_wait(self) -> float:
        """Seconds spent waiting before the start (0 until started)."""
        return 0.0 if self.started_at is None else self.started_at - self.offered_at


@dataclass(frozen=True, slots=True)
class Admit:
    """Run now: the ticket holds a concurrency slot and its price of the KV budget."""

    ticket: Ticket


@dataclass(frozen=True, slots=True)
class Enqueued:
    """Wait: the driver waits until :meth:`Admission.dispatch` starts the ticket.

    ``displaced``: queued batch requests this interactive one took the place of (the
    queue was full), each with its refusal (429 ``displaced``); the driver answers them.
    """

    ticket: Ticket
    displaced: tuple[tuple[Ticket, Refuse], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Refuse:
    """Refused, with when to come back.

    Attributes:
        status: HTTP status: 429 (come back later), 503 (not serving now), 400.
        code: machine-readable reason (``queue_full``, ``rate_limited``, ...).
        message: human-readable reason.
        retry_after: seconds until the caller may come back (precise).
        drain: the gateway is draining; herdless clients fall back at once.
        policy: the limit as an IETF ``RateLimit-Policy`` item, or ``None``.
        remaining: quota left in that policy.
        capacity: requests of one key the gateway holds at once (``X-Herdless-Capacity``),
            or ``None``.
        retry: whether coming back within the capped Retry-After can help
            (``x-should-retry: false`` when not: a maintenance window with more than the
            cap left).
    """

    status: int
    code: str
    message: str
    retry_after: float
    drain: bool = False
    policy: str | None = None
    remaining: int = 0
    capacity: int | None = None
    retry: bool = True
