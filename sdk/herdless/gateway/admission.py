"""Admission: who runs now, who waits, who is refused and when to come back (pure, no I/O).

The gateway's decisions live here, apart from its HTTP layer: :class:`Admission`
is a clock-injected state machine that the async driver (``gate.py``) and the
unit tests both drive by calling methods, never by sleeping.

Rules, checked in this order by :meth:`Admission.offer`:

1. draining -> 503 ``draining``; upstream not ready -> 503 ``upstream_loading``
   or ``upstream_unavailable``.
2. requests per second, one token bucket per key (``rate``, ``burst``) ->
   429 ``rate_limited``. (Rules 1-2 need no price: :meth:`Admission.precheck`
   applies them before the body is parsed, so a flood is refused cheaply.)
3. a request that could never fit the KV budget (its price alone exceeds
   ``max_inflight_tokens``) -> 400 ``request_too_large``: retrying cannot help.
4. LLM tokens per minute, one bucket per key, priced before the request runs
   (estimated prompt tokens + ``max_tokens``) and settled against the real
   usage afterwards (refund or debt) -> 429 ``token_budget``.
5. runs now when nobody waits, a concurrency slot is free and its price fits
   the KV budget (``inflight_tokens + price <= max_inflight_tokens``).
6. otherwise waits in the bounded queue, unless the queue (or this key's share
   of it, ``ceil(max_queue * key_queue_share)``) is full -> 429 ``queue_full``,
   or ``kv_budget`` when slots are free and only the KV budget blocks. A waiter
   that is not started within ``queue_timeout`` gets 429 ``queue_timeout``.
7. a caller that says how long it will wait (``X-Herdless-Deadline-Ms``, the
   ``deadline`` argument) is refused at once with ``deadline_unattainable`` (429;
   503 while the upstream is out) when the wait predicted for it is longer: in the
   queue, ``(queued + 1) * mean_service / max_concurrency``; refused, the time its
   reservation would give it. No reservation is taken for it (it will not come
   back for this request). A caller's waiter is dropped from the queue when its
   deadline passes (it stopped waiting).

The queue is fair between keys: one FIFO per key, served round-robin, so a key
with a hundred waiting requests does not hold back a key with one. The key at
the head of the rotation is served first even when a smaller request behind it
would fit the KV budget: skipping would starve large prompts.

Retry-After is a *reservation*, not a constant. Each limit keeps a horizon
(the latest time it has already promised to a refused caller) and hands the
next refused caller the next free slot after it:

* queue (``queue_full``, ``queue_timeout``, ``kv_budget``): a slot frees every
  ``gap = mean_service / max(1, running)`` seconds, where ``mean_service`` is an
  EWMA (weight ``ewma_alpha``) of measured run times, so
  ``retry_at = max(now, horizon) + gap``;
* token buckets (``rate_limited``, ``token_budget``): the bucket holds ``cost``
  again at ``now + (cost - level) / refill``, and the next caller needs another
  ``cost / refill``: ``retry_at = max(now + (cost - level) / refill, horizon + cost / refill)``.

* not serving (``draining``, ``upstream_loading``, ``upstream_unavailable``):
  service is expected back after the configured ``delay`` (``drain_retry_after``
  or ``upstream_retry_after``), and then the GPU takes a request every
  ``gap = mean_service / max_concurrency`` seconds (``mean_service`` starts at
  ``initial_service_time`` until a run is measured), so
  ``retry_at = max(now + delay, horizon + gap)``. When the gateway serves again
  the promises still outstanding pass to the queue's horizon (a caller refused
  by a full queue is told a time after them) and the next outage starts afresh.

So the k-th refused caller is told a later time than the (k-1)-th, at the rate
capacity frees: they come back spread out, not as a herd on the next second.
Every answer is capped at ``max_retry_after``. Reservations are advisory: a
caller that comes back early is judged like anyone else.

Why not aiolimiter here: ``AsyncLimiter`` is built to *wait* for capacity on the
event loop's clock; the gateway must *refuse at once* and say when capacity will
exist, for the k-th caller, on an injected clock that tests control. A token
bucket with a reservation horizon is a dozen lines and gives exactly that.
aiolimiter keeps the places where waiting is right (the benchmark's pacing).
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass, field

from herdless._clock import Clock
from herdless.gateway.decisions import Admit, Enqueued, Refuse, Ticket
from herdless.gateway.limits import AdmissionConfig, TokenBucket

__all__ = [
    "Admission",
    "AdmissionConfig",
    "Admit",
    "Enqueued",
    "Refuse",
    "Ticket",
    "TokenBucket",
]

_NEVER = -math.inf
_DRAINING = "the gateway is draining for maintenance; use your fallback"
_NOT_READY = "the model server is not ready; try again shortly"
_BUCKET_MESSAGES = {
    "rate_limited": "this key is over its requests per second; retry after the given time",
    "token_budget": "this key is over its tokens per minute; retry after the given time",
}


@dataclass(slots=True)
class _Key:
    """Per-key state: buckets and the FIFO of waiting tickets."""

    rate: TokenBucket | None
    tokens: TokenBucket | None
    waiting: deque[Ticket] = field(default_factory=deque)


class Admission:
    """The admission state machine. Not thread-safe: one event loop drives it.

    Usage::

        adm = Admission(AdmissionConfig(max_concurrency=2, max_queue=4), clock=clock)
        decision = adm.offer("key-1", price=300)
        # Admit: run it; Enqueued: wait for adm.dispatch() to start it; Refuse: answer.
        adm.release(ticket, used_tokens=280)
        for started in adm.dispatch(): ...
    """

    def __init__(self, config: AdmissionConfig, *, clock: Clock) -> None:
        self.config = config
        self._clock = clock
        self._ids = itertools.count(1)
        self._keys: dict[str, _Key] = {}
        # Keys with waiters, in round-robin order (a dict is an ordered set).
        self._rotation: dict[str, None] = {}
        self._queued = 0
        self._running = 0
        self._inflight_tokens = 0
        self._mean_service = config.initial_service_time
        self._queue_horizon = _NEVER
        self._outage_horizon = _NEVER
        # The refusal path runs once per refused request of a flood: its constant
        # parts (policies, messages) are built once here, not per refusal.
        self._policies = {
            "rate_limited": _bucket_policy("rate_limited", config.effective_burst, config.rate),
            "token_budget": _bucket_policy(
                "token_budget", config.tokens_per_minute, (config.tokens_per_minute or 0) / 60
            ),
        }
        self._draining = False
        self._ready = True
        self._not_ready_code = "upstream_loading"

    # -- observation ------------------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        """Requests waiting."""
        return self._queued

    @property
    def inflight(self) -> int:
        """Requests running upstream."""
        return self._running

    @property
    def inflight_tokens(self) -> int:
        """Sum of the prices of the running requests (the KV budget in use)."""
        return self._inflight_tokens

    @property
    def mean_service_time(self) -> float:
        """EWMA of measured run times, seconds."""
        return self._mean_service

    @property
    def draining(self) -> bool:
        """Whether new requests are refused with 503 ``draining``."""
        return self._draining

    @property
    def upstream_ready(self) -> bool:
        """Whether the upstream answered its last health check."""
        return self._ready

    @property
    def ready(self) -> bool:
        """Whether the upstream is ready and the gateway admits."""
        return self._ready and not self._draining

    # -- state changes ------------------------------------------------------------------

    def set_upstream(self, *, ready: bool, code: str = "upstream_loading") -> None:
        """Record the upstream's readiness; ``code`` names why it is not ready."""
        was_ready = self.ready
        self._ready = ready
        self._not_ready_code = code
        if not was_ready and self.ready:
            self._serving_again()

    def drain(self) -> list[tuple[Ticket, Refuse]]:
        """Stop admitting; the waiters are refused (returned), running ones finish."""
        self._draining = True
        refused = []
        for key in list(self._rotation):
            for ticket in self._keys[key].waiting:
                self._refund(ticket)
                ticket.state = "done"
                refused.append((ticket, self.unavailable("draining")))
            self._keys[key].waiting.clear()
        self._rotation.clear()
        self._queued = 0
        return refused

    def resume(self) -> None:
        """Admit again after :meth:`drain`."""
        was_ready = self.ready
        self._draining = False
        if not was_ready and self.ready:
            self._serving_again()

    def precheck(self, key_id: str, *, deadline: float | None = None) -> Refuse | None:
        """The refusals that do not depend on the request's price: draining, not
        ready, request rate. Lets the HTTP layer refuse a flood before parsing
        bodies; :meth:`offer` checks them again (nothing is taken here)."""
        if self._draining:
            return self.unavailable("draining")
        if not self._ready:
            return self.unavailable(self._not_ready_code, deadline=deadline)
        if self.config.rate is not None:
            now = self._clock.monotonic()
            rate = self._key(key_id, now).rate
            if rate is not None and not rate.allows(now, 1):
                return self._bucket_refusal(rate, now, 1, "rate_limited")
        return None

    def offer(
        self, key_id: str, price: int, *, deadline: float | None = None
    ) -> Admit | Enqueued | Refuse:
        """Decide on a new request from ``key_id`` priced ``price`` tokens, whose caller
        waits at most ``deadline`` seconds for it to start (``None``: no limit said)."""
        cfg = self.config
        now = self._clock.monotonic()
        early = self.precheck(key_id, deadline=deadline)
        if early is not None:
            return early
        if cfg.max_inflight_tokens is not None and price > cfg.max_inflight_tokens:
            return Refuse(
                status=400,
                code="request_too_large",
                message=(
                    f"this request needs {price} tokens (prompt + max_tokens); "
                    f"the gateway admits at most {cfg.max_inflight_tokens}"
                ),
                retry_after=0.0,
            )
        key = self._key(key_id, now)
        if key.tokens is not None and not key.tokens.allows(now, price):
            return self._bucket_refusal(key.tokens, now, price, "token_budget")
        fits_kv = self._fits_kv(price)
        if not self._queued and self._running < cfg.max_concurrency and fits_kv:
            ticket = self._new_ticket(key_id, price, now)
            self._start(ticket, now)
            self._charge(key, price)
            return Admit(ticket)
        if self._queued >= cfg.max_queue or len(key.waiting) >= cfg.key_queue_limit:
            # What holds the queue back: the head's price, or this one's when none waits.
            head = (
                self._keys[next(iter(self._rotation))].waiting[0].price if self._queued else price
            )
            kv_blocks = self._running < cfg.max_concurrency and not self._fits_kv(head)
            code = "kv_budget" if kv_blocks else "queue_full"
            return self._queue_refusal(now, code, deadline=deadline)
        if deadline is not None and self.predicted_wait() > deadline:
            return _unattainable(429, self.predicted_wait(), deadline, cfg.key_capacity)
        ticket = self._new_ticket(key_id, price, now)
        self._charge(key, price)
        key.waiting.append(ticket)
        self._rotation.setdefault(key_id, None)
        self._queued += 1
        return Enqueued(ticket)

    def dispatch(self) -> list[Ticket]:
        """Start waiting tickets while capacity allows (round-robin over keys)."""
        started: list[Ticket] = []
        now = self._clock.monotonic()
        while self._rotation and self._running < self.config.max_concurrency:
            key_id = next(iter(self._rotation))
            waiting = self._keys[key_id].waiting
            if not self._fits_kv(waiting[0].price):
                break  # head-of-line: skipping it would starve large prompts
            ticket = waiting.popleft()
            self._queued -= 1
            # Move the key to the back of the rotation (or out of it).
            del self._rotation[key_id]
            if waiting:
                self._rotation[key_id] = None
            self._start(ticket, now)
            started.append(ticket)
        return started

    def release(self, ticket: Ticket, *, used_tokens: int | None = None) -> None:
        """End a ticket: finished or abandoned, queued or running (idempotent).

        Args:
            ticket: the ticket from :meth:`offer`.
            used_tokens: the real prompt + completion tokens, when the upstream
                reported them; the token bucket is settled by ``price - used``.
        """
        if ticket.state == "done":
            return
        if ticket.state == "queued":
            self._unqueue(ticket)
            self._refund(ticket)
        else:
            now = self._clock.monotonic()
            self._running -= 1
            self._inflight_tokens -= ticket.price
            started = now if ticket.started_at is None else ticket.started_at
            run = max(0.0, now - started)
            alpha = self.config.ewma_alpha
            self._mean_service = (1 - alpha) * self._mean_service + alpha * run
            tokens = self._keys[ticket.key_id].tokens
            if tokens is not None and used_tokens is not None:
                tokens.settle(ticket.price - used_tokens)
        ticket.state = "done"

    def expire(self, ticket: Ticket, *, deadline_passed: bool = False) -> Refuse:
        """The ticket waited ``queue_timeout`` (or its caller's deadline passed): drop it
        and say when to come back."""
        self.release(ticket)
        if deadline_passed:
            waited = self._clock.monotonic() - ticket.offered_at
            return _unattainable(429, waited, waited, self.config.key_capacity)
        return self._queue_refusal(self._clock.monotonic(), "queue_timeout")

    def predicted_wait(self) -> float:
        """Seconds a request queued now would wait before it starts: the queue ahead of
        it, at the rate slots free (``max_concurrency`` per ``mean_service``)."""
        return (self._queued + 1) * self._mean_service / self.config.max_concurrency

    # -- helpers ------------------------------------------------------------------------

    def _key(self, key_id: str, now: float) -> _Key:
        key = self._keys.get(key_id)
        if key is None:
            # Bounded: key ids come from the configured keys (or one anonymous id).
            cfg = self.config
            rate = tpm = None
            if cfg.rate is not None:
                rate = TokenBucket(capacity=cfg.effective_burst, refill=cfg.rate, now=now)
            if cfg.tokens_per_minute is not None:
                tpm = TokenBucket(
                    capacity=cfg.tokens_per_minute, refill=cfg.tokens_per_minute / 60, now=now
                )
            key = self._keys[key_id] = _Key(rate=rate, tokens=tpm)
        return key

    def _new_ticket(self, key_id: str, price: int, now: float) -> Ticket:
        return Ticket(id=next(self._ids), key_id=key_id, price=price, offered_at=now)

    def _fits_kv(self, price: int) -> bool:
        limit = self.config.max_inflight_tokens
        return limit is None or self._inflight_tokens + price <= limit

    def _start(self, ticket: Ticket, now: float) -> None:
        ticket.state = "running"
        ticket.started_at = now
        self._running += 1
        self._inflight_tokens += ticket.price

    def _charge(self, key: _Key, price: int) -> None:
        if key.rate is not None:
            key.rate.take(1)
        if key.tokens is not None:
            key.tokens.take(price)

    def _refund(self, ticket: Ticket) -> None:
        # A request that never ran gives its token price back (not its request-rate token).
        tokens = self._keys[ticket.key_id].tokens
        if tokens is not None:
            tokens.settle(ticket.price)

    def _unqueue(self, ticket: Ticket) -> None:
        waiting = self._keys[ticket.key_id].waiting
        waiting.remove(ticket)
        self._queued -= 1
        if not waiting:
            self._rotation.pop(ticket.key_id, None)

    def _capped(self, seconds: float) -> float:
        return min(seconds, self.config.max_retry_after)

    def unavailable(
        self, code: str, message: str | None = None, *, deadline: float | None = None
    ) -> Refuse:
        """A 503: not serving now (``draining``, ``upstream_loading``, ``upstream_unavailable``).

        A reservation like the queue's: ``retry_at = max(now + delay, horizon + gap)``
        with ``delay`` the configured time until service is expected back and
        ``gap = mean_service / max_concurrency`` (the rate at which the GPU will
        take the callers back), capped at ``max_retry_after`` (a drain's at ``2 x
        delay``: its callers go to their fallback meanwhile). Also used by the
        HTTP layer when a request finds the upstream gone (``message`` says how).
        """
        cfg = self.config
        now = self._clock.monotonic()
        draining = code == "draining"
        delay = cfg.drain_retry_after if draining else cfg.upstream_retry_after
        gap = self._mean_service / cfg.max_concurrency
        # Relative to now, so that the cap holds exactly despite float rounding.
        wait = min(max(delay, self._outage_horizon + gap - now), cfg.max_retry_after)
        if draining:
            # A drain tells callers to use their fallback, and they do: spread over a
            # second drain period at most, a crowd's promises would otherwise pile up
            # for the whole maintenance and keep them off the GPU long after it resumed.
            wait = min(wait, 2 * delay)
        if deadline is not None and wait > deadline and not draining:
            # No reservation: it will not come back for this request.
            return _unattainable(503, wait, deadline, cfg.key_capacity)
        self._outage_horizon = now + wait
        return Refuse(
            status=503,
            code=code,
            message=message or (_DRAINING if draining else _NOT_READY),
            retry_after=wait,
            drain=draining,
            capacity=cfg.key_capacity,
        )

    def _serving_again(self) -> None:
        # Callers promised a time during the outage are still on their way back:
        # a queue refusal must not send anyone ahead of them. The next outage
        # starts its own reservations from its own delay.
        self._queue_horizon = max(self._queue_horizon, self._outage_horizon)
        self._outage_horizon = _NEVER

    def _queue_refusal(self, now: float, code: str, *, deadline: float | None = None) -> Refuse:
        cfg = self.config
        gap = self._mean_service / max(1, self._running)
        wait = min(max(now, self._queue_horizon) + gap - now, cfg.max_retry_after)
        if deadline is not None and wait > deadline:
            # No reservation: it will not come back for this request.
            return _unattainable(429, wait, deadline, cfg.key_capacity)
        self._queue_horizon = now + wait
        messages = {
            "queue_full": "the gateway's queue is full",
            "kv_budget": "the model server's KV-cache budget is in use",
            "queue_timeout": f"no capacity freed within the queue timeout ({cfg.queue_timeout:g}s)",
        }
        return Refuse(
            status=429,
            code=code,
            message=f"{messages[code]}; retry after the given time",
            retry_after=wait,
            policy=f'"queue";q={cfg.max_queue}',
            remaining=max(0, cfg.max_queue - self._queued),
            capacity=cfg.key_capacity,
        )

    def _bucket_refusal(self, bucket: TokenBucket, now: float, cost: float, code: str) -> Refuse:
        wait = self._capped(bucket.reserve(now, cost))  # refills the bucket to now
        return Refuse(
            status=429,
            code=code,
            message=_BUCKET_MESSAGES[code],
            retry_after=wait,
            policy=self._policies[code],
            remaining=max(0, math.floor(bucket.level(now))),
            capacity=self.config.key_capacity,
        )


def _unattainable(status: int, wait: float, deadline: float, capacity: int) -> Refuse:
    """A refusal for a caller whose deadline the predicted ``wait`` passes."""
    return Refuse(
        capacity=capacity,
        status=status,
        code="deadline_unattainable",
        message=(
            f"this request would wait about {wait:.1f}s here, longer than the "
            f"{deadline:.1f}s its caller waits (X-Herdless-Deadline-Ms); use your fallback"
        ),
        retry_after=wait,
    )


def _bucket_policy(code: str, capacity: float | None, refill: float | None) -> str | None:
    """A bucket's IETF ``RateLimit-Policy`` item (``None`` when the limit is off)."""
    if capacity is None or not refill:
        return None
    return f'"{code}";q={math.floor(capacity)};w={math.ceil(capacity / refill)}'
