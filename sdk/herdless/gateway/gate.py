"""The async driver of :class:`~herdless.gateway.core.admission.Admission`: waiting, not deciding.

Admission decides; this module only parks the queued requests on futures and
wakes them when the core starts them, times them out, or drains them, and the kept
requests (refused, waiting here to be offered again) when the queue runs dry. Offers
that are admitted or refused at once never touch the event loop (the refusal
path stays cheap). Whatever may start or wake a request goes through :class:`Gate`;
the HTTP edge reads the core's state, and asks it what wakes no one (a precheck, a 503),
on ``gate.admission``.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections.abc import Callable
from typing import Unpack

from herdless.gateway.core.admission import Admission, OfferOptions, ReleaseOptions
from herdless.gateway.core.comebacks import Comebacks
from herdless.gateway.core.decisions import Admit, Enqueued, Refuse, Ticket
from herdless.gateway.core.engine import Reading
from herdless.gateway.core.keys import KeyLimits
from herdless.gateway.core.limits import CLASSES, AdmissionConfig
from herdless.gateway.logs import LOG, event
from herdless.gateway.metrics import Fairness, SizingFigures

__all__ = ["Gate"]

_ARRIVAL = itertools.count()  # between kept requests told the same time: the first first


class Gate:
    """Waits for :class:`Admission` on one event loop.

    Usage::

        decision = gate.offer(key_id, price)
        if isinstance(decision, Enqueued):
            refused = await gate.wait(decision.ticket)   # None once started
        ...
        gate.release(ticket, used_tokens=usage)
    """

    __slots__ = (
        "_early",
        "_kept",
        "_kept_waiting",
        "_timer",
        "_upstream_state",
        "_waiters",
        "admission",
        "comebacks",
        "on_held",
    )

    def __init__(self, admission: Admission) -> None:
        self.admission = admission
        self.comebacks = Comebacks(admission.clock)
        """The refusals whose requests may come again (the edge feeds it)."""
        # The upstream's state as last logged: None until the first health poll.
        self._upstream_state: str | None = None
        self._waiters: dict[int, asyncio.Future[Refuse | None]] = {}
        # Refusals of queued tickets whose caller was not waiting yet (displaced or
        # drained between its offer and its wait); taken by wait(), dropped by release().
        self._early: dict[int, Refuse] = {}
        self._timer: asyncio.TimerHandle | None = None  # the next spaced batch start
        # The kept requests waiting for a place (see until_place), by the time each was
        # told; a future already done (woken, timed out, gone) is skipped when reached.
        self._kept: list[tuple[float, int, asyncio.Future[None]]] = []
        self._kept_waiting = 0
        self.on_held: Callable[[], None] | None = None
        """Called when a request waits because the engine sleeps (the sleeper wakes it)."""

    def offer(
        self, key_id: str, price: int, **options: Unpack[OfferOptions]
    ) -> Admit | Enqueued | Refuse:
        """Decide at once (see :meth:`Admission.offer`); the batch waiters an interactive
        arrival displaced are woken with their refusal."""
        decision = self.admission.offer(key_id, price, **options)
        if type(decision) is Enqueued:
            for ticket, refused in decision.displaced:
                self._wake(ticket, refused)
            if self.admission.paused and self.on_held is not None:
                self.on_held()
        return decision

    async def wait(self, ticket: Ticket, *, deadline: float | None = None) -> Refuse | None:
        """Wait for a queued ticket to start; ``None`` once running, else the refusal.
        ``deadline``: seconds its caller waits (it is dropped when they pass).

        Cancellation (the client went away) drops the ticket and frees what it held.
        """
        state = ticket.state  # (a local: the attribute changes while this waits)
        if state == "running":  # started before its caller came to wait
            return None
        if state == "done":  # refused before its caller came to wait
            early = self._early.pop(ticket.id, None)
            return early if early is not None else self.admission.expire(ticket)
        future: asyncio.Future[Refuse | None] = asyncio.get_running_loop().create_future()
        self._waiters[ticket.id] = future
        # Its key's queue_timeout (or its queue TTL when shorter), less what it waited kept.
        limit = ticket.hold - ticket.kept
        caller_first = deadline is not None and deadline < limit
        try:
            async with asyncio.timeout(deadline if caller_first else limit):
                return await future
        except TimeoutError:
            if ticket.state == "running":  # started in the same tick as the timeout
                return None
            refused = self.admission.expire(ticket, deadline_passed=caller_first)
            self._dispatch(ended=True)
            return refused
        except asyncio.CancelledError:
            self.release(ticket)
            raise
        finally:
            self._waiters.pop(ticket.id, None)

    async def until_place(self, seconds: float) -> bool:
        """Wait ``seconds``, or less where the queue runs dry: a request a full queue
        keeps (:func:`herdless.gateway.edge.waited_out`) is offered again at the time
        its refusal named, a prediction; where the queue has emptied before then, each
        request that ends wakes the kept request told the earliest time, so the GPU does
        not idle until its time. While others wait the times stand: the callers told
        later ones count on the places before theirs being taken then. Nothing wakes
        while the gateway drains, the upstream is not ready or the engine sleeps.
        Returns whether a place woke it (``False``: its time came)."""
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()
        heapq.heappush(self._kept, (loop.time() + seconds, next(_ARRIVAL), woken))
        self._kept_waiting += 1
        try:
            async with asyncio.timeout(seconds):
                await woken
            return True
        except TimeoutError:
            return False
        finally:
            woken.cancel()  # (a no-op once woken): the place goes to the next one
            self._kept_waiting -= 1
            if len(self._kept) > 2 * self._kept_waiting + 64:  # mostly done: drop them
                self._kept = [item for item in self._kept if not item[2].done()]
                heapq.heapify(self._kept)

    def release(self, ticket: Ticket, **usage: Unpack[ReleaseOptions]) -> None:
        """End a ticket (settled against the usage given, see :meth:`Admission.release`)
        and start whoever now fits."""
        self._early.pop(ticket.id, None)
        self.admission.release(ticket, **usage)
        self._dispatch(ended=True)

    def drain(self, expect: float | None = None) -> int:
        """Stop admitting; waiters get 503 ``draining`` now (but those whose hold outlasts
        an announced window of ``expect`` seconds), running requests finish.

        Returns:
            How many waiting requests were refused.
        """
        refused = self.admission.drain(expect)
        for ticket, refusal in refused:
            self._wake(ticket, refusal)
        return len(refused)

    def resume(self) -> None:
        """Admit again; the requests held through the drain start as room allows."""
        self.admission.resume()
        self._dispatch()

    def pause(self) -> None:
        """The engine is going to sleep: nothing starts from now on."""
        self.admission.paused = True

    def unpause(self) -> None:
        """The engine is awake: the requests held meanwhile start as room allows."""
        self.admission.paused = False
        self._dispatch()

    def reconfigure(self, config: AdmissionConfig, keys: dict[str, KeyLimits]) -> None:
        """New limits (a reload, see :meth:`Admission.reconfigure`); whoever now fits
        starts.

        Raises:
            ValueError: a limit that cannot change while running changed.
        """
        self.admission.reconfigure(config, keys)
        self._dispatch()

    def set_upstream(self, *, ready: bool, code: str = "upstream_loading") -> None:
        """Record the upstream's readiness; a ready upstream may start waiters.

        A change of state (``loading``, ``ready``, ``unavailable``) is logged once on
        ``herdless.gateway``; the same state again (every health poll) is not.
        """
        self.admission.set_upstream(ready=ready, code=code)
        state = "ready" if ready else code.removeprefix("upstream_")
        if state != self._upstream_state:
            level = logging.WARNING if state == "unavailable" else logging.INFO
            more = {}
            if ready and self._upstream_state is not None:
                more["load_time"] = self.admission.load_time
            event(
                LOG,
                level,
                f"upstream {state}",
                state=state,
                previous=self._upstream_state,
                **more,
            )
            self._upstream_state = state
        if ready:
            self._dispatch()

    # -- what the edge reads ---------------------------------------------------------------

    def status(self) -> dict[str, object]:
        """What ``/readyz`` and the admin routes answer."""
        adm = self.admission
        return {
            "ready": adm.ready,
            "draining": adm.draining,
            "upstream_ready": adm.upstream_ready,
            "inflight": adm.inflight,
            "queue_depth": adm.queue_depth,
            "load_time": adm.load_time,
        }

    def gauges(self) -> dict[str, float]:
        """The queue and in-flight gauges of ``/metrics``."""
        adm = self.admission
        gauges: dict[str, float] = {
            "queue_depth": adm.queue_depth,
            "inflight": adm.inflight,
            "inflight_tokens": adm.inflight_tokens,
            "draining": int(adm.draining),
            "upstream_ready": int(adm.upstream_ready),
            "upstream_asleep": int(adm.paused),
        }
        if adm.load_time is not None:
            gauges["upstream_load_seconds"] = round(adm.load_time, 3)
        return gauges

    def fairness(self) -> Fairness:
        """The fair-share figures of ``/metrics``."""
        adm = self.admission
        return Fairness(
            depth={name: adm.queue.depth(name) for name in CLASSES},
            served={name: adm.queue.served_tokens[name] for name in CLASSES},
            displacements=adm.displacements,
            users=adm.user_service(),
            jain={name: adm.fairness(name) for name in CLASSES},
        )

    def sizing_figures(self) -> SizingFigures:
        """The self-sizing figures of ``/metrics``."""
        adm = self.admission
        size, last = adm.sizing, adm.sizing.last
        return SizingFigures(
            limit=size.limit,
            mode="engine" if size.sized else "static",
            held=adm.held if adm.queue_depth else None,
            kv_capacity=size.kv_capacity,
            kv_usage=None if last is None else last.kv_usage,
            running=None if last is None else last.running,
            waiting=None if last is None else last.waiting,
            fill=size.fill,
            preemptions=size.preemptions_seen,
            stale=size.stale,
            shared_prompt=size.shared_prompt_tokens,
        )

    # -- the engine's readings -------------------------------------------------------------

    def readings_failed(self) -> bool:
        """A read of the engine failed or came late; returns whether they are stale now."""
        return self.admission.sizing.failed(self.admission.clock.monotonic())

    def observe(self, reading: Reading) -> None:
        """Take a reading of the engine (see :mod:`herdless.gateway.core.sizing`) and start
        whoever now fits."""
        self.admission.observe(reading)
        self._dispatch()

    def _dispatch(self, ended: bool = False) -> None:
        """Start whoever fits. ``ended``: a request just ended or left the queue; where
        nothing waits any more, it wakes the kept request told the earliest time (see
        :meth:`until_place`)."""
        admission = self.admission
        for ticket in admission.dispatch():
            self._wake(ticket, None)
        kept = self._kept
        # (Nothing wakes while nothing may start: woken, it would find a 503.)
        while ended and kept and admission.starting and not admission.queue_depth:
            woken = heapq.heappop(kept)[2]
            if not woken.done():
                woken.set_result(None)
                ended = False
        if admission.held == "spacing" and self._timer is None:
            # Spaced batch starts wait for a time, not for an event: wake at that time.
            delay = admission.sizing.batch_spaced_until - admission.clock.monotonic()
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(max(0.0, delay), self._spaced)

    def _spaced(self) -> None:
        self._timer = None
        self._dispatch()

    def _wake(self, ticket: Ticket, result: Refuse | None) -> None:
        future = self._waiters.get(ticket.id)
        if future is not None:
            if not future.done():
                future.set_result(result)
        elif result is not None:
            self._early[ticket.id] = result
