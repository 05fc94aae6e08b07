"""Admission: who runs now, who waits, who is refused and when to come back (pure, no I/O).

The gateway's decisions live here, apart from its HTTP layer: :class:`Admission`
is a clock-injected state machine that the async driver (``gate.py``) and the
unit tests both drive by calling methods, never by sleeping. Two pure parts do
the detailed work: the fair queue (:mod:`herdless.gateway.fairqueue`: the order
of the waiters, the service counters per user) and the reservation schedule
(:mod:`herdless.gateway.reservations`: the Retry-After of every refusal).

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
5. runs now when no request of its class (nor, for a batch one, of any class)
   waits, a concurrency slot is free, its price fits the KV budget
   (``inflight_tokens + price <= max_inflight_tokens``) and, for a batch one, the
   interactive reserve stays free (rule 9).
6. otherwise waits in the bounded queue, unless the queue (or this key's share
   of it, ``ceil(max_queue * key_queue_share)``) is full -> 429 ``queue_full``,
   or ``kv_budget`` when slots are free and only the KV budget blocks. A waiter
   that is not started within ``queue_timeout`` gets 429 ``queue_timeout``.
7. a caller that says how long it will wait (``X-Herdless-Deadline-Ms``, the
   ``deadline`` argument) is refused at once with ``deadline_unattainable`` (429;
   503 while the upstream is out) when the wait predicted for it is longer: in the
   queue, ``place * mean_service / max_concurrency`` with ``place`` its place in
   the fair order (:meth:`FairQueue.place`); refused, the time its reservation
   would give it. No reservation is taken for it (it will not come back for this
   request). A caller's waiter is dropped from the queue when its deadline passes.
8. an interactive request that finds the queue (or its key's share) full takes the
   place of a waiting batch one (the newest of the batch user served last; of its
   own key when its key's share is what is full), which is answered 429
   ``displaced`` with a reservation: never a 5xx, and never once it started.
9. waiters start in the fair order (:mod:`herdless.gateway.fairqueue`): every
   interactive one before any batch one, token-fair between keys then users. A
   batch request starts only while no interactive one waits and, while interactive
   work arrived within ``reserve_window`` seconds, only if ``interactive_reserve``
   slots stay free after it: batch uses the capacity interactive work leaves idle.
   The head of the order is served first even when a smaller request behind it
   would fit the KV budget: skipping would starve large prompts.

Why not aiolimiter here: ``AsyncLimiter`` is built to *wait* for capacity on the
event loop's clock; the gateway must *refuse at once* and say when capacity will
exist, for the k-th caller, on an injected clock that tests control. A token
bucket with a reservation horizon is a dozen lines and gives exactly that.
aiolimiter keeps the places where waiting is right (the benchmark's pacing).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from herdless._clock import Clock
from herdless.gateway.decisions import Admit, Enqueued, Refuse, Ticket
from herdless.gateway.fairqueue import FairQueue, Flow
from herdless.gateway.limits import AdmissionConfig, Priority, TokenBucket
from herdless.gateway.reservations import Reservations, unattainable

__all__ = [
    "Admission",
    "AdmissionConfig",
    "Admit",
    "Enqueued",
    "Refuse",
    "Ticket",
    "TokenBucket",
]


@dataclass(slots=True)
class _Key:
    """Per-key state: buckets and how many of its requests wait."""

    rate: TokenBucket | None
    tokens: TokenBucket | None
    queued: int = 0


class Admission:
    """The admission state machine. Not thread-safe: one event loop drives it.

    Usage::

        adm = Admission(AdmissionConfig(max_concurrency=2, max_queue=4), clock=clock)
        decision = adm.offer("key-1", price=300, prompt=44, user="u-1", priority="batch")
        # Admit: run it; Enqueued: wait for adm.dispatch() to start it; Refuse: answer.
        adm.release(ticket, used_tokens=280)
        for started in adm.dispatch(): ...
    """

    def __init__(self, config: AdmissionConfig, *, clock: Clock) -> None:
        self.config = config
        self._clock = clock
        self._ids = itertools.count(1)
        self._keys: dict[str, _Key] = {}
        self._queue = FairQueue(config)
        self._reservations = Reservations(config)
        self._queued = 0
        self._running = 0
        self._inflight_tokens = 0
        self._mean_service = config.initial_service_time
        self._last_interactive = -math.inf
        self._displacements = 0
        self._draining = False
        self._ready = True
        self._not_ready_code = "upstream_loading"

    # -- observation ------------------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        """Requests waiting."""
        return self._queued

    def class_depth(self, priority: Priority) -> int:
        """Requests of ``priority`` waiting."""
        return self._queue.depth(priority)

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
    def displacements(self) -> int:
        """Batch waiters displaced by interactive arrivals so far."""
        return self._displacements

    @property
    def served_tokens(self) -> dict[Priority, int]:
        """Tokens (prompt + completion; the price when no usage came) of the finished
        requests, per class."""
        return dict(self._queue.served_tokens)

    def user_service(self) -> dict[str, float]:
        """Weighted tokens charged per user over the last ``fair_window`` seconds."""
        return self._queue.service(self._clock.monotonic())

    def fairness(self, priority: Priority = "interactive") -> float:
        """Jain's index over the users of ``priority`` that waited throughout the last
        ``fair_window`` seconds (see :meth:`FairQueue.fairness`)."""
        return self._queue.fairness(priority, self._clock.monotonic())

    def counter(self, unit: str, priority: Priority = "interactive") -> float | None:
        """The service counter of a user (``key`` or ``key/user``), if remembered."""
        return self._queue.counter(priority, unit)

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
            self._reservations.serving_again()

    def drain(self) -> list[tuple[Ticket, Refuse]]:
        """Stop admitting; the waiters are refused (returned), running ones finish."""
        self._draining = True
        refused = []
        for ticket in list(self._queue.waiting()):
            self._unqueue(ticket)
            self._refund(ticket)
            ticket.state = "done"
            refused.append((ticket, self.unavailable("draining")))
        return refused

    def resume(self) -> None:
        """Admit again after :meth:`drain`."""
        was_ready = self.ready
        self._draining = False
        if not was_ready and self.ready:
            self._reservations.serving_again()

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
                return self._reservations.bucket(rate, now, 1, "rate_limited")
        return None

    def offer(
        self,
        key_id: str,
        price: int,
        *,
        deadline: float | None = None,
        user: str | None = None,
        priority: Priority = "interactive",
        prompt: int | None = None,
    ) -> Admit | Enqueued | Refuse:
        """Decide on a new request.

        Args:
            key_id: the caller's key id.
            price: its tokens: estimated prompt + ``max_tokens`` (the KV budget's unit).
            deadline: seconds its caller waits for it to start (``None``: not said).
            user: the hash of the user it names, refining the key as fairness unit.
            priority: its class (the reference schedulers treat all as interactive).
            prompt: estimated prompt tokens within ``price`` (default: all of it).
        """
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
            return self._reservations.bucket(key.tokens, now, price, "token_budget")
        klass: Priority = priority if cfg.scheduler == "vtc" else "interactive"
        interactive = klass == "interactive"
        if interactive:
            self._last_interactive = now
        flow = self._queue.flow(klass, key_id, user)
        if self._startable(klass, price, now):
            ticket = self._new_ticket(key_id, price, now, flow, prompt)
            self._start(ticket, flow, now)
            self._charge(key, price)
            return Admit(ticket)
        victim = None
        key_full = key.queued >= cfg.key_queue_limit
        if self._queued >= cfg.max_queue or key_full:
            if interactive and cfg.scheduler == "vtc":
                # A full key share is freed only by one of the key's own batch waiters.
                victim = self._queue.victim(key_id if key_full else None)
            if victim is None:
                return self._queue_refusal(flow, now, self._full_code(price), deadline=deadline)
        if deadline is not None:
            wait = self._queue.place(flow) * self._mean_service / cfg.max_concurrency
            if wait > deadline:
                return unattainable(429, wait, deadline, cfg.key_capacity)
        displaced = () if victim is None else ((victim, self._displace(victim, now)),)
        ticket = self._new_ticket(key_id, price, now, flow, prompt)
        self._charge(key, price)
        self._queue.push(flow, ticket, now)
        key.queued += 1
        self._queued += 1
        return Enqueued(ticket, displaced)

    def dispatch(self) -> list[Ticket]:
        """Start waiting tickets while capacity allows, in the fair order."""
        started: list[Ticket] = []
        now = self._clock.monotonic()
        queue = self._queue
        while self._running < self.config.max_concurrency:
            ticket = queue.head("interactive")
            if ticket is None:
                ticket = queue.head("batch")
                if ticket is None or not self._batch_room(now):
                    break
            if not self._fits_kv(ticket.price):
                break  # head-of-line: skipping it would starve large prompts
            # Charged first: a flow that stops waiting leaves with this charge counted.
            self._start(ticket, queue.flow_of(ticket), now)
            queue.remove(ticket, served=True)
            self._keys[ticket.key_id].queued -= 1
            self._queued -= 1
            started.append(ticket)
        return started

    def release(
        self,
        ticket: Ticket,
        *,
        used_tokens: int | None = None,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
    ) -> None:
        """End a ticket: finished or abandoned, queued or running (idempotent).

        Args:
            ticket: the ticket from :meth:`offer`.
            used_tokens: the real prompt + completion tokens, when the upstream
                reported them; the token bucket is settled by ``price - used``.
            prompt_tokens: the real prompt tokens, when reported.
            completion_tokens: the real completion tokens, when reported (else
                ``used_tokens`` less the prompt); the user's service counter is
                settled against them.
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
            if completion_tokens is None and used_tokens is not None:
                prompt = ticket.prompt if prompt_tokens is None else prompt_tokens
                completion_tokens = max(0, used_tokens - prompt)
            self._queue.finish(ticket, now, prompt=prompt_tokens, completion=completion_tokens)
        ticket.state = "done"

    def expire(self, ticket: Ticket, *, deadline_passed: bool = False) -> Refuse:
        """The ticket waited ``queue_timeout`` (or its caller's deadline passed): drop it
        and say when to come back."""
        self.release(ticket)
        now = self._clock.monotonic()
        if deadline_passed:
            waited = now - ticket.offered_at
            return unattainable(429, waited, waited, self.config.key_capacity)
        flow = self._queue.flow(ticket.priority, ticket.key_id, ticket.user)
        return self._queue_refusal(flow, now, "queue_timeout")

    def predicted_wait(self) -> float:
        """Seconds a request queued now at the back of the whole queue would wait before
        it starts, at the rate slots free (``max_concurrency`` per ``mean_service``).
        :meth:`offer` predicts from the request's own place in the fair order."""
        return (self._queued + 1) * self._mean_service / self.config.max_concurrency

    def unavailable(
        self, code: str, message: str | None = None, *, deadline: float | None = None
    ) -> Refuse:
        """A 503: not serving now (``draining``, ``upstream_loading``, ``upstream_unavailable``),
        with a reservation (:meth:`Reservations.unavailable`). Also used by the HTTP
        layer when a request finds the upstream gone (``message`` says how)."""
        return self._reservations.unavailable(
            self._clock.monotonic(),
            code,
            message,
            mean_service=self._mean_service,
            deadline=deadline,
        )

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

    def _new_ticket(
        self, key_id: str, price: int, now: float, flow: Flow, prompt: int | None
    ) -> Ticket:
        return Ticket(
            id=next(self._ids),
            key_id=key_id,
            price=price,
            offered_at=now,
            user=flow.user,
            priority=flow.priority,
            prompt=price if prompt is None else min(prompt, price),
        )

    def _startable(self, klass: Priority, price: int, now: float) -> bool:
        """Rule 5: may a new request of ``klass`` start without waiting?"""
        if self._running >= self.config.max_concurrency or not self._fits_kv(price):
            return False
        if self._queue.depth("interactive"):
            return False  # interactive waiters go first, and in their fair order
        if klass == "interactive":
            return True
        return not self._queue.depth("batch") and self._batch_room(now)

    def _batch_room(self, now: float) -> bool:
        """Whether a batch request may take a slot: the reserve stays free after it."""
        recent = now - self._last_interactive < self.config.reserve_window
        reserve = self.config.effective_reserve if recent else 0
        return self._running + 1 <= self.config.max_concurrency - reserve

    def _full_code(self, price: int) -> str:
        """What holds a full queue back: the KV budget (slots are free but the head's
        price, or this one's when none waits, does not fit) or the queue itself."""
        queue = self._queue
        head = queue.head("interactive") or queue.head("batch")
        blocked = price if head is None else head.price
        kv_blocks = self._running < self.config.max_concurrency and not self._fits_kv(blocked)
        return "kv_budget" if kv_blocks else "queue_full"

    def _fits_kv(self, price: int) -> bool:
        limit = self.config.max_inflight_tokens
        return limit is None or self._inflight_tokens + price <= limit

    def _start(self, ticket: Ticket, flow: Flow, now: float) -> None:
        ticket.state = "running"
        ticket.started_at = now
        self._running += 1
        self._inflight_tokens += ticket.price
        self._queue.start(ticket, flow, now)

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
        self._queue.remove(ticket)
        self._keys[ticket.key_id].queued -= 1
        self._queued -= 1

    def _displace(self, victim: Ticket, now: float) -> Refuse:
        """Rule 8: the batch waiter ``victim`` leaves the queue with a reservation."""
        flow = self._queue.flow_of(victim)
        self._unqueue(victim)
        self._refund(victim)
        victim.state = "done"
        self._displacements += 1
        return self._queue_refusal(flow, now, "displaced")

    def _queue_refusal(
        self, flow: Flow, now: float, code: str, *, deadline: float | None = None
    ) -> Refuse:
        """A queue refusal at the user's own place: its share of the slots that free."""
        refused = self._reservations.queue(
            now,
            code,
            gap=self._mean_service / max(1, self._running),
            share=self._queue.share(flow),
            horizon=flow.horizon,
            queued=self._queued,
            deadline=deadline,
        )
        if refused.code != "deadline_unattainable":
            flow.horizon = now + refused.retry_after
        return refused
