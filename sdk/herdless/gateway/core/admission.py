"""Admission: who runs now, who waits, who is refused and when to come back (pure, no I/O).

A clock-injected state machine, apart from the HTTP layer: the async driver
(``gate.py``) and the unit tests drive it by calling methods, never by sleeping. The
fair queue (:mod:`~herdless.gateway.core.fairqueue`: the waiters' order, the service per
user), the sizing rule (:mod:`~herdless.gateway.core.sizing`: how much the engine holds
now) and the reservation schedule (:mod:`~herdless.gateway.core.reservations`: the
Retry-After of every refusal) do the detailed work.

Rules, checked in this order by :meth:`Admission.offer` (each explained, with its
answer, in docs/gateway.md, "Admission"; the code cites them by number):

1. draining -> 503 ``draining``, unless the request names no deadline and its key's hold
   outlasts the announced maintenance window: it waits for the resume; upstream not
   ready -> 503 ``upstream_*``, unless the request (no deadline) holds longer than the
   time left of its load (measured), or, where that time is not known, its client
   would show the 503 as an error (``waits``): it waits for the upstream, up to its hold
   (then 503 ``upstream_*``, not a full queue's ``queue_timeout``).
2. requests per second per key (:mod:`herdless.gateway.core.keys`) -> 429 ``rate_limited``.
   Rules 1-2 need no price: :meth:`Admission.precheck` applies them before the body.
3. a price over the whole KV budget -> 400 ``request_too_large``.
4. LLM tokens per minute per key, settled against real usage -> 429 ``token_budget``.
5. runs now when none of its class waits and the sizing rule holds nothing back: the
   engine's room (or the static limits), and for batch work the interactive headroom.
   Nothing starts while draining.
6. else waits, unless the queue or its key's share is full -> 429 ``queue_full``
   (``kv_budget``), told its user's share of the places that free, or all of them for
   a caller whose retry waits here (``kept_back``); a caller back before the time a
   place is held for it keeps that time; a waiter not started within its
   key's hold (``queue_timeout``, or the key policy's ``hold``; the request's
   ``x-llm-d-inference-ttl`` when shorter; less what a kept request waited before its
   offer) -> 429 ``queue_timeout``.
7. a caller's deadline shorter than its predicted wait (its place over the answers
   finished per second, measured, or the running requests over their mean run time
   when faster) -> ``deadline_unattainable``.
8. an arrival in a full queue (or key share) displaces a waiter (``vtc``) -> 429
   ``displaced``: an interactive arrival the newest batch waiter of the user served
   most; else the newest waiter whose client comes back (``returns``) of the user of
   its class that waits in the most places, two or more beyond its own, where the time
   it is told is at most half what is left of its deadline (it waits for it rather
   than leave for a hosted model).
9. waiters start in the fair order; the head first even when a smaller one would fit.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping
from typing import TypedDict

from herdless._clock import Clock
from herdless.gateway.core.decisions import Admit, Enqueued, Refuse, Ticket
from herdless.gateway.core.engine import Reading
from herdless.gateway.core.fairqueue import FairQueue, Flow
from herdless.gateway.core.holds import Call, Holds
from herdless.gateway.core.keys import KeyBudgets, KeyLimits
from herdless.gateway.core.limits import AdmissionConfig, Priority
from herdless.gateway.core.reservations import Reservations, unattainable
from herdless.gateway.core.service import DrainRate
from herdless.gateway.core.sizing import Hold, Sizing

__all__ = ["Admission", "OfferOptions", "ReleaseOptions"]

_FEWER = "a user that waits in fewer places took this request's place in the full queue"


class OfferOptions(TypedDict, total=False):
    """The keyword arguments of :meth:`Admission.offer` (for those that pass them on)."""

    deadline: float | None
    user: str | None
    priority: Priority
    prompt: int | None
    open_ended: bool
    prefix: tuple[int, ...]
    ttl: float | None
    call: str | None
    kept: float
    kept_for: float | None
    waits: bool
    returns: bool
    kept_back: bool


class ReleaseOptions(TypedDict, total=False):
    """The keyword arguments of :meth:`Admission.release` (for those that pass them on)."""

    used_tokens: int | None
    prompt_tokens: int | None
    completion_tokens: int | None
    whole: bool


class Admission:
    """The admission state machine. Not thread-safe: one event loop drives it.

    Usage::

        adm = Admission(AdmissionConfig(max_concurrency=2, max_queue=4), clock=clock)
        decision = adm.offer("key-1", price=300, prompt=44, user="u-1", priority="batch")
        # Admit: run it; Enqueued: wait for adm.dispatch() to start it; Refuse: answer.
        adm.release(ticket, used_tokens=280)
        for started in adm.dispatch(): ...
    """

    def __init__(
        self,
        config: AdmissionConfig,
        *,
        clock: Clock,
        keys: Mapping[str, KeyLimits] | None = None,
    ) -> None:
        """``keys``: the limits of the keys a key policy names (the others: the flags')."""
        self.config = config
        self._clock = clock
        self._ids = itertools.count(1)
        self._keys = KeyBudgets(config, keys)
        self._queue = FairQueue(config)
        self._reservations = Reservations(config)
        self._holds = Holds()
        self._sizing = Sizing(config)
        self._reservations.capacity = config.key_capacity(self._sizing.limit)
        self._queued = 0
        self._drained = DrainRate()
        self.held: Hold | None = None
        """What held the next waiter back at the last dispatch (``None``: nothing)."""
        self._mean_service = config.initial_service_time
        self._service_measured = False  # a run ended here: the mean is the gateway's own
        self._last_interactive = -math.inf
        self._displacements = 0
        self._draining = False
        self._drain_until: float | None = None  # the announced window's end, clock time
        self._ready = True
        self._not_ready_code = "upstream_loading"
        self.paused = False
        """Nothing starts while set (the engine sleeps): arrivals wait (their hold) instead."""
        self._out_since: float | None = None  # when the upstream was last seen going out
        self.load_time: float | None = None
        """Seconds the upstream took to load, last measured (``None``: never measured):
        by the gateway from its going out to ready again, or as ``herdless maintain``
        reported it; what Retry-After promises while it is out."""

    # -- observation ------------------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        """Requests waiting."""
        return self._queued

    @property
    def queue(self) -> FairQueue:
        """The waiters in their fair order, and the service counters (read it; change
        it through this class only)."""
        return self._queue

    @property
    def inflight(self) -> int:
        """Requests running upstream."""
        return self._sizing.running

    @property
    def inflight_tokens(self) -> int:
        """Sum of the prices of the running requests (the static KV budget in use)."""
        return self._sizing.inflight_tokens

    @property
    def clock(self) -> Clock:
        """The clock admission decides on."""
        return self._clock

    @property
    def sizing(self) -> Sizing:
        """The sizing rule and what it learned of the engine (read it; feed it readings
        through :meth:`observe`; the proxy gives it prompts to count, the watcher the
        engine's counts)."""
        return self._sizing

    @property
    def limit(self) -> int:
        """The dispatch limit now, in requests (static, or sized from the engine)."""
        return self._sizing.limit

    @property
    def key_capacity(self) -> int:
        """Most requests of one key the gateway holds at once (``X-Herdless-Capacity``):
        the dispatch limit now plus the key's share of the queue."""
        return self._reservations.capacity

    def forget(self, key_id: str, call: str) -> None:
        """The caller of ``call`` (refused, told a time) will not come back: the place
        held for it frees now (see :mod:`.holds`)."""
        self._holds.forget((key_id, call))

    def drain_rate(self) -> float:
        """Answers finished per second, measured; before there are enough, the running
        requests (or the limit) over their run time, as the engine predicts it (see
        :meth:`_slots`)."""
        return 1 / self._slots(self._clock.monotonic())[0]

    def _slots(self, now: float) -> tuple[float, float | None]:
        """(seconds between two answers, when the first one comes or ``None``): when a
        place frees for a refused caller.

        Measured: one per answer finished per second, from now. Before there are enough
        answers (a morning's first crowd, the first after a drain), or when none came for
        three of the measured gaps (long answers after short ones), the engine tells: no
        place frees before the first running request ends, then one per run time over
        the running, each predicted by the engine's decode rate; else the mean run time
        (a guess before any ended). A wave of long answers ends together, seconds away:
        told a fraction of a second instead, a client that retries twice has spent its
        retries before any place frees."""
        measured = self._drained.rate(now)
        if measured is not None:
            return 1 / measured, None
        running = max(1, self.inflight or self.limit)
        predicted = self._sizing.predicted_ends(now)
        if predicted is None:
            return self._mean_service / running, None
        first, run_time = predicted
        return run_time / running, first

    def _drain_hope(self) -> float:
        """Rule 7's rate: the answers finished per second measured, or what the running
        requests finish at their mean run time when that is faster (a burst after a
        quiet spell: the window still counts the quiet). A caller leaves late, not early."""
        return max(self.drain_rate(), self.inflight / self._mean_service)

    @property
    def mean_service_time(self) -> float:
        """EWMA of measured run times, seconds."""
        return self._mean_service

    @property
    def displacements(self) -> int:
        """Waiters displaced by arrivals in a full queue so far (rule 8)."""
        return self._displacements

    def user_service(self) -> dict[str, float]:
        """Weighted tokens charged per user over the last ``fair_window`` seconds."""
        return self._queue.service(self._clock.monotonic())

    def fairness(self, priority: Priority = "interactive") -> float:
        """Jain's index over the users of ``priority`` that waited throughout the last
        ``fair_window`` seconds (see :meth:`FairQueue.fairness`)."""
        return self._queue.fairness(priority, self._clock.monotonic())

    @property
    def draining(self) -> bool:
        """Whether new requests are refused with 503 ``draining``."""
        return self._draining

    @property
    def drain_left(self) -> float | None:
        """Seconds left of the announced maintenance window (``None``: none announced)."""
        if not self._draining or self._drain_until is None:
            return None
        return max(0.0, self._drain_until - self._clock.monotonic())

    def key_limits(self, key_id: str) -> KeyLimits:
        """The limits of ``key_id`` (its key policy's, else the flags')."""
        return self._keys.limits(key_id)

    @property
    def upstream_ready(self) -> bool:
        """Whether the upstream answered its last health check."""
        return self._ready

    @property
    def ready(self) -> bool:
        """Whether the upstream is ready and the gateway admits."""
        return self._ready and not self._draining

    @property
    def starting(self) -> bool:
        """Whether anything may start now: the upstream ready, no drain, the engine awake."""
        return self._ready and not self._draining and not self.paused

    @property
    def out_for(self) -> float | None:
        """Seconds since the upstream went out (``None`` while it is ready)."""
        if self._ready or self._out_since is None:
            return None
        return self._clock.monotonic() - self._out_since

    def _back_at(self) -> float | None:
        """When the upstream out now is expected back: its going out plus the last load
        time; ``None`` when ready, never measured, or already past it."""
        if self._ready or self._out_since is None or self.load_time is None:
            return None
        at = self._out_since + self.load_time
        return at if at > self._clock.monotonic() else None

    # -- state changes ------------------------------------------------------------------

    def reconfigure(self, config: AdmissionConfig, keys: Mapping[str, KeyLimits]) -> None:
        """Replace the limits (a reload): the queue, its counters, the running requests,
        the key budgets and the reservations stay; what the new limits change applies
        from the next decision. ``scheduler``, ``sizing``, ``max_users``, ``fair_window``
        and ``reserve_window`` must be unchanged (they shape state already built)."""
        for name in ("scheduler", "sizing", "max_users", "fair_window", "reserve_window"):
            if getattr(config, name) != getattr(self.config, name):
                raise ValueError(f"{name} cannot change while running (restart the gateway)")
        self.config = config
        self._keys.reconfigure(config, keys, self._clock.monotonic())
        self._queue.reconfigure(config)
        self._reservations.reconfigure(config)
        self._sizing.config = config  # read at every decision; the learned state stays
        if not self._sizing.sized:
            self._sizing.limit = self._sizing.static_limit
        self._resized()

    def set_upstream(self, *, ready: bool, code: str = "upstream_loading") -> None:
        """Record the upstream's readiness; ``code`` names why it is not ready.

        Going out starts the outage's clock; ready again after one measures the load time
        (:attr:`load_time`)."""
        now = self._clock.monotonic()
        if not ready and self._ready:
            self._out_since = now
        elif ready and not self._ready and self._out_since is not None:
            self.load_time = now - self._out_since
            self._out_since = None
        self._switch(draining=self._draining, ready=ready, code=code)

    def drain(self, expect: float | None = None) -> list[tuple[Ticket, Refuse]]:
        """Stop admitting; the waiters are refused (returned), running ones finish.

        ``expect``: the maintenance window's expected length in seconds; a waiter whose
        hold outlasts it (and that named no deadline) keeps its place until the resume.
        """
        now = self._clock.monotonic()
        self._draining = True
        self._drain_until = None if expect is None else now + expect
        refused = []
        for ticket in list(self._queue.waiting()):
            if self._holds_through(ticket.waits_out_drain, ticket.hold_ends):
                continue
            self._drop(ticket)
            refused.append((ticket, self.unavailable("draining")))
        return refused

    def _holds_through(self, patient: bool, held_until: float) -> bool:
        """Rule 1: may a request that waits until ``held_until`` wait out the drain?"""
        return patient and self._drain_until is not None and held_until >= self._drain_until

    def _holds_through_load(self, deadline: float | None, held_until: float, waits: bool) -> bool:
        """Rule 1: may a request wait out an upstream that is out (loading)? When it names
        no deadline, and its hold outlasts the time left of the load (measured), or no one
        knows that time and its client ``waits``: waiting may answer it, a 503 would not."""
        back = self._back_at()
        return deadline is None and (waits if back is None else held_until >= back)

    def resume(self) -> None:
        """Admit again after :meth:`drain` (the caller then calls :meth:`dispatch`)."""
        self._drain_until = None
        self._switch(draining=False, ready=self._ready, code=self._not_ready_code)

    def _switch(self, *, draining: bool, ready: bool, code: str) -> None:
        was_ready, upstream_was_ready = self.ready, self._ready
        self._draining, self._ready, self._not_ready_code = draining, ready, code
        if not upstream_was_ready and ready:  # another engine, maybe another model
            self._sizing.reset()
            self._resized()
        if not was_ready and self.ready:  # serving again: the old reservations are void
            self._reservations.serving_again()
            # And the rate measured before: its window would count the outage's quiet as
            # slow service, and tell the crowd coming back waits far past their deadline.
            self._drained = DrainRate()

    def observe(self, reading: Reading) -> None:
        """Take a reading of the engine's metrics (see :mod:`.sizing`); the caller then
        calls :meth:`dispatch`, as room may have grown.

        Until a run ends here, the mean run time is the engine's own over the requests
        it finished (a gateway started in front of an engine that has served), not
        ``initial_service_time``: the first crowd's refusals are told times from it."""
        self._sizing.observe(reading)
        if not self._service_measured and reading.runs and reading.run_seconds:
            self._mean_service = reading.run_seconds / reading.runs
        self._resized()

    def _resized(self) -> None:
        self._reservations.capacity = self.config.key_capacity(self._sizing.limit)

    def precheck(
        self,
        key_id: str,
        *,
        deadline: float | None = None,
        ttl: float | None = None,
        kept: float = 0.0,
        waits: bool = False,
    ) -> Refuse | None:
        """The refusals that do not depend on the request's price: draining, not
        ready, request rate. Lets the HTTP layer refuse a flood before parsing
        bodies; :meth:`offer` checks them again (nothing is taken here). ``ttl``: the
        request's queue TTL (``x-llm-d-inference-ttl``), a cap on its key's hold;
        ``kept``, ``waits``: see :meth:`offer`."""
        now = self._clock.monotonic()
        key = self._keys.get(key_id, now)
        held_until = now + key.limits.hold_for(ttl) - kept
        if self._draining and not self._holds_through(deadline is None, held_until):
            return self.unavailable("draining")
        if not self._ready and not self._holds_through_load(deadline, held_until, waits):
            return self.unavailable(self._not_ready_code, deadline=deadline)
        if key.rate is not None and not key.rate.allows(now, 1):
            return self._reservations.bucket(key.rate, now, 1, "rate_limited")
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
        open_ended: bool = False,
        prefix: tuple[int, ...] = (),
        ttl: float | None = None,
        call: str | None = None,
        kept: float = 0.0,
        kept_for: float | None = None,
        waits: bool = False,
        returns: bool = False,
        kept_back: bool = False,
    ) -> Admit | Enqueued | Refuse:
        """Decide on a new request.

        Args:
            key_id: the caller's key id.
            price: its tokens: estimated prompt + ``max_tokens`` (the KV budget's unit).
            deadline: seconds its caller waits for it to start (``None``: not said).
            user: the hash of the user it names, refining the key as fairness unit.
            priority: its class (the reference schedulers treat all as interactive).
            prompt: estimated prompt tokens within ``price`` (default: all of it).
            open_ended: it named no ``max_tokens`` (``price`` assumed one): its answer is
                predicted as measured, not capped at the assumption (:class:`Ticket`).
            prefix: its prompt's links (:func:`~.prefixes.chain`): where the engine's
                prefix cache holds their blocks, only the rest of its prompt takes KV.
            ttl: seconds it may wait in the queue (llm-d's ``x-llm-d-inference-ttl``):
                caps its key's hold; not a deadline (rule 7 never reads it).
            call: the id its caller comes back with when refused (a herdless client's
                ``X-Request-ID``): a full queue then holds a place for it at the time
                it names (:mod:`.holds`), and its return takes it.
            kept: seconds it already waited in the gateway for a place, outside the
                queue (a request a full queue kept): spent of its hold, so that its
                whole wait is its hold.
            kept_for: seconds it waits here, in all, for the place a full queue names
                (a kept request's hold): a refusal naming a later time is its answer,
                and it takes no place in its user's schedule, as its caller never comes
                back for it (the user's next request is told the same time, not a later
                one).
            waits: its client would show a 503 as an error (it never retries, or this is
                its retry): it waits out an upstream out for a time no one knows.
            returns: its caller comes back when refused, with ``call`` (a herdless
                client): waiting, it may be displaced for a user that waits in fewer
                places (rule 8); a request of another client never is.
            kept_back: its comeback waits here when it meets a full queue (another
                client's than herdless's: its retry is known and kept, or it is a kept
                request): a full queue tells it the next place its user gets at the
                whole rate places free, not at its share of them (rule 6).
        """
        cfg = self.config
        now = self._clock.monotonic()
        early = self.precheck(key_id, deadline=deadline, ttl=ttl, kept=kept, waits=waits)
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
        key = self._keys.get(key_id, now)
        if key.tokens is not None and not key.tokens.allows(now, price):
            return self._reservations.bucket(key.tokens, now, price, "token_budget")
        klass: Priority = priority if cfg.scheduler == "vtc" else "interactive"
        interactive = klass == "interactive"
        if interactive:
            self._last_interactive = now
        flow = self._queue.flow(klass, key_id, user)
        ticket = self._new_ticket(key_id, price, now, flow, prompt)
        ticket.prefix, ticket.open_ended = prefix, open_ended
        ticket.hold, ticket.waits_out_drain = key.limits.hold_for(ttl), deadline is None
        ticket.ttl, ticket.kept = ttl is not None and ttl < key.limits.hold, kept
        ticket.returns = returns and call is not None
        ticket.deadline_at = None if deadline is None else now + deadline
        mine = None if call is None else (key_id, call)
        ahead = self._slots(now)[0] if self._holds else 0.0  # a place's time: see holds
        back = mine is not None and self._holds.claim(mine, now, ahead)
        if self._startable(ticket, now):
            self._start(ticket, flow, now)
            key.charge(price)
            if mine is not None:
                self._holds.forget(mine)  # in before its time: no place is held for it too
            return Admit(ticket)
        victim, fewer = None, False
        key_full = key.queued >= key.limits.queue_limit(cfg.max_queue)
        taken = self._queued
        if self._holds and not back and taken < cfg.max_queue:
            taken += self._holds.held(now, ahead)  # places kept for callers due back
        if taken >= cfg.max_queue or key_full:
            if cfg.scheduler == "vtc":
                # A full key share is freed only by one of the key's own waiters.
                mate = key_id if key_full else None
                victim = self._queue.victim(mate) if interactive else None
                fewer = victim is None
                if fewer:
                    victim = self._waits_anyway(self._queue.longest(flow, mate), now)
            if victim is None:
                code = self._full_code(ticket)
                due = None if mine is None else self._holds.due(mine)
                if due is not None:  # back before its time, to a queue still full
                    told = self._queue_time(flow, now, code, whole=kept_back)
                    wait = min(due - now, cfg.max_retry_after)  # (its time: within the cap)
                    return dataclasses.replace(told, retry_after=wait)  # it keeps it
                stays = None if kept_for is None else kept_for - kept
                return self._queue_refusal(
                    flow, now, code, deadline=deadline, call=mine, whole=kept_back, stays=stays
                )
        if deadline is not None:
            wait = self._queue.place(flow) / self._drain_hope()
            if wait > deadline:
                return unattainable(429, wait, deadline, self.key_capacity)
        displaced = () if victim is None else ((victim, self._displace(victim, now, fewer)),)
        key.charge(price)
        self._queue.push(flow, ticket, now)
        key.queued += 1
        self._queued += 1
        if mine is not None:
            self._holds.forget(mine)
        return Enqueued(ticket, displaced)

    def dispatch(self) -> list[Ticket]:
        """Start waiting tickets while capacity allows, in the fair order."""
        started: list[Ticket] = []
        now = self._clock.monotonic()
        queue = self._queue
        recent = self._recent_interactive(now)
        self.held = None
        while self.starting:
            ticket = queue.head("interactive") or queue.head("batch")
            if ticket is None:
                break
            self.held = self._sizing.hold(ticket, now, recent_interactive=recent)
            if self.held is not None:
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
        whole: bool = True,
    ) -> None:
        """End a ticket: finished or abandoned, queued or running (idempotent).

        Args:
            ticket: the ticket from :meth:`offer`.
            used_tokens: the real prompt + completion tokens, when the upstream
                reported them (else the prompt and ``completion_tokens``, when
                given); the token bucket is settled by ``price - used``.
            prompt_tokens: the real prompt tokens, when reported.
            completion_tokens: the real completion tokens, when reported (else
                ``used_tokens`` less the prompt, or none for a request that generates
                nothing); the user's service counter is settled against them.
            whole: ``False`` for an answer cut short (its client left) or not run:
                its tokens settle the charges and teach nothing (neither the user's
                average answer, nor the engine's, nor the prompts' calibration, nor a
                run time). With no usage and no tokens given (a body not streamed, or
                a stream cut before its first event), it is settled on the tokens the
                engine's measured decode rate made in its run time; its price stands
                where no rate is measured.
        """
        if ticket.state == "done":
            return
        if ticket.state == "queued":
            self._drop(ticket)
        else:
            now = self._clock.monotonic()
            started = now if ticket.started_at is None else ticket.started_at
            if whole:  # a cut run's time is not an answer's
                run = max(0.0, now - started)
                alpha = self.config.ewma_alpha
                self._mean_service = (1 - alpha) * self._mean_service + alpha * run
                self._service_measured = True
            prompt = ticket.prompt if prompt_tokens is None else prompt_tokens
            if not whole and used_tokens is None and completion_tokens is None:
                made = self._sizing.made(ticket, now)  # nothing seen of it: estimate
                completion_tokens = None if made is None else round(made)
            if completion_tokens is None and prompt_tokens is not None and not ticket.answer_cap:
                completion_tokens = 0  # it generates nothing: a usage of its prompt alone
            if used_tokens is None and completion_tokens is not None:
                used_tokens = prompt + completion_tokens
            if used_tokens is not None:
                self._keys[ticket.key_id].settle(ticket.price - used_tokens)
            if completion_tokens is None and used_tokens is not None:
                completion_tokens = max(0, used_tokens - prompt)
            self._queue.finish(
                ticket, now, prompt=prompt_tokens, completion=completion_tokens, learn=whole
            )
            self._sizing.finish(
                ticket,
                now,
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                whole=whole,
            )
            self._drained.add(now)
        ticket.state = "done"

    def expire(self, ticket: Ticket, *, deadline_passed: bool = False) -> Refuse:
        """The ticket waited ``queue_timeout`` (or its caller's deadline passed): drop it
        and say when to come back."""
        self.release(ticket)
        now = self._clock.monotonic()
        if deadline_passed:
            waited = now - ticket.offered_at
            return unattainable(429, waited, waited, self.key_capacity)
        if not self._ready:  # it waited for the upstream, not for a place
            return self.unavailable(self._not_ready_code)
        flow = self._queue.flow(ticket.priority, ticket.key_id, ticket.user)
        message = None
        if ticket.ttl:
            message = f"no capacity freed within the request's queue TTL ({ticket.hold:g}s)"
        elif ticket.hold != self.config.queue_timeout:  # a key policy's hold
            message = f"no capacity freed within this key's hold ({ticket.hold:g}s)"
        return self._queue_refusal(flow, now, "queue_timeout", message=message)

    def unavailable(
        self, code: str, message: str | None = None, *, deadline: float | None = None
    ) -> Refuse:
        """A 503 with a reservation: not serving now (``draining``, ``upstream_*``; also
        when a request finds the upstream gone, ``message`` says how)."""
        return self._reservations.unavailable(
            self._clock.monotonic(),
            code,
            message,
            gap=1 / self.drain_rate(),
            deadline=deadline,
            until=self._drain_until,
            back_at=self._back_at(),
        )

    # -- helpers ------------------------------------------------------------------------

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

    def _startable(self, ticket: Ticket, now: float) -> bool:
        """Rule 5: may a new request start without waiting?"""
        if not self.starting or self._queue.depth("interactive"):
            return False  # interactive waiters go first, and in their fair order
        if ticket.priority == "batch" and self._queue.depth("batch"):
            return False
        recent = self._recent_interactive(now)
        return self._sizing.hold(ticket, now, recent_interactive=recent) is None

    def _recent_interactive(self, now: float) -> bool:
        return now - self._last_interactive < self.config.reserve_window

    def _full_code(self, ticket: Ticket) -> str:
        """What holds a full queue back: the KV budget (the head's price, or this one's
        when none waits, does not fit) or the queue itself."""
        queue = self._queue
        head = queue.head("interactive") or queue.head("batch") or ticket
        now = self._clock.monotonic()
        held = self._sizing.hold(head, now, recent_interactive=self._recent_interactive(now))
        return "kv_budget" if held == "kv" else "queue_full"

    def _start(self, ticket: Ticket, flow: Flow, now: float) -> None:
        ticket.state = "running"
        ticket.started_at = now
        self._sizing.start(ticket, now, predicted=flow.predicted)
        self._queue.start(ticket, flow, now)

    def _drop(self, ticket: Ticket) -> None:
        """A waiter leaves without running: its key gets its token price back."""
        self._queue.remove(ticket)
        (key := self._keys[ticket.key_id]).settle(ticket.price)
        key.queued -= 1
        self._queued -= 1
        ticket.state = "done"

    def _displace(self, victim: Ticket, now: float, fewer: bool) -> Refuse:
        """Rule 8: the waiter ``victim`` leaves the queue with a reservation (``fewer``:
        for a user that waits in fewer places, else for an interactive request)."""
        flow = self._queue.flow_of(victim)
        self._drop(victim)
        self._displacements += 1
        why = _FEWER if fewer else None
        return self._queue_refusal(flow, now, "displaced", message=why)

    def _queue_time(
        self, flow: Flow, now: float, code: str, *, deadline: float | None = None,
        message: str | None = None, whole: bool = False,
    ) -> Refuse:  # fmt: skip
        """The queue refusal a caller of ``flow`` would be told now (nothing moves);
        ``whole``: told at the whole rate places free, not at the user's share."""
        gap, first = self._slots(now)
        return self._reservations.queue(
            now,
            code,
            message=message,
            not_before=self._drain_until if self._draining else None,
            gap=gap,
            first=first,
            share=1.0 if whole else self._queue.share(flow),
            horizon=flow.horizon,
            queued=self._queued,
            deadline=deadline,
        )

    def _waits_anyway(self, victim: Ticket | None, now: float) -> Ticket | None:
        """``victim``, if its caller would wait for the time a displacement tells it: at
        most half what is left of its deadline (the rest for its jitter and its answer).
        A herdless client told a later time sends the call to its fallback: a busy GPU
        never pushes a call out of the building."""
        if victim is None or victim.deadline_at is None:
            return victim
        left = (victim.deadline_at - now) / 2
        told = self._queue_time(self._queue.flow_of(victim), now, "displaced", deadline=left)
        return None if told.code == "deadline_unattainable" else victim

    def _queue_refusal(
        self,
        flow: Flow,
        now: float,
        code: str,
        *,
        deadline: float | None = None,
        message: str | None = None,
        call: Call | None = None,
        whole: bool = False,
        stays: float | None = None,
    ) -> Refuse:
        """A queue refusal at the user's own place: its share of the slots that free
        (``whole``: all of them); ``call``: the caller comes back with this id, so a
        place is held for it then; ``stays``: the caller waits here that long for its
        place, and a later one is no place (see ``kept_for`` in :meth:`offer`)."""
        refused = self._queue_time(flow, now, code, deadline=deadline, message=message, whole=whole)
        if stays is not None and refused.retry_after > stays:
            return refused  # its answer: nobody comes for this place, so it is not taken
        if refused.code != "deadline_unattainable":
            flow.horizon = now + refused.retry_after
            if call is not None and refused.retry:
                self._holds.promise(call, flow.horizon)
        return refused
