"""The reservation schedule: when a refused caller may come back (pure, no I/O).

Retry-After is a *reservation*, not a constant. Each limit keeps a horizon (the
latest time it has already promised to a refused caller) and hands the next
refused caller the next free slot after it:

* queue (``queue_full``, ``queue_timeout``, ``kv_budget``, ``displaced``): a slot
  frees every ``gap = 1 / drain_rate`` seconds, where ``drain_rate`` is the answers
  finished per second the gateway measured (``Admission.drain_rate``), and the refused
  caller's user
  gets ``share`` of the slots that free (its place in the fair order, see
  :meth:`herdless.gateway.core.fairqueue.FairQueue.share`), so each user keeps its own
  horizon::

      retry_at = max(now, horizon_user, floor, first) + gap / share

  where ``first`` is when the first running request ends, predicted by the engine,
  while the answers per second are not measured yet or have stalled (``-inf``
  otherwise): no slot frees before it, and the first caller is told one slot past
  it, as it is told one slot past now (told a predicted end itself, about half the
  callers would come back a moment before it, to a queue still full). A user
  alone (or the ``fcfs`` order) has ``share = 1``: one horizon for all, as before
  fairness had users. A light user refused while a heavy one floods is told
  a time near its turn, not after the heavy user's callers. A caller whose retry
  waits in the gateway (another client's than herdless's) is told ``share = 1``:
  early costs it nothing, and the share counts who waits now, not who will;
* token buckets (``rate_limited``, ``token_budget``): the bucket holds ``cost``
  again at ``now + (cost - level) / refill``, and the next caller needs another
  ``cost / refill``: ``retry_at = max(now + (cost - level) / refill, horizon + cost / refill)``;
* not serving (``draining``, ``upstream_loading``, ``upstream_unavailable``):
  service is expected back after ``delay``, the configured ``drain_retry_after`` or
  ``upstream_retry_after``; and then the GPU takes a request every
  ``gap = 1 / drain_rate`` seconds, so
  ``retry_at = max(now + delay, horizon + gap)``. When the gateway serves again
  the promises still outstanding become the queue's ``floor`` (a caller refused
  by a full queue is told a time after them) and the next outage starts afresh.
  An announced maintenance window (``POST /admin/drain?expect=SECONDS``) is the
  exception: every caller is told its end, unspread (see :meth:`Reservations.unavailable`).

So the k-th refused caller of a user is told a later time than the (k-1)-th, at the
rate capacity frees for that user: they come back spread out, not as a herd on the
next second. Every answer is capped at ``max_retry_after``. A caller that comes back
early is judged like anyone else; one that says who it is (a herdless client) finds
a place kept for it at its time (:mod:`herdless.gateway.core.holds`).
"""

from __future__ import annotations

import functools
import math

from herdless.gateway.core.decisions import Refuse
from herdless.gateway.core.limits import AdmissionConfig, TokenBucket

__all__ = ["Reservations", "unattainable"]

_NEVER = -math.inf
_DRAINING = "the gateway is draining for maintenance; use your fallback"
_NOT_READY = "the model server is not ready"
_BUCKET_MESSAGES = {
    "rate_limited": "this key is over its requests per second",
    "token_budget": "this key is over its tokens per minute",
}


class Reservations:
    """The horizons of the refusals and the refusals themselves. Not thread-safe.

    Args:
        config: the gateway's limits (caps, delays, the queue's size).
    """

    __slots__ = ("_config", "_messages", "_outage_horizon", "capacity", "floor")

    def __init__(self, config: AdmissionConfig) -> None:
        self._config = config
        self.capacity = config.key_capacity(config.static_concurrency)
        """``X-Herdless-Capacity`` of the refusals: set by admission as its limit moves."""
        self._outage_horizon = _NEVER
        self.floor = _NEVER
        """The earliest time a queue refusal may name: promises of the last outage."""
        # The refusal path runs once per refused request of a flood: its constant
        # parts (messages, policies: see _bucket_policy) are built once, not per refusal.
        self._messages = {
            "queue_full": "the gateway's queue is full",
            "kv_budget": "the model server's KV-cache budget is in use",
            "queue_timeout": (
                f"no capacity freed within the queue timeout ({config.queue_timeout:g}s)"
            ),
            "displaced": "an interactive request took this batch request's place in the full queue",
        }

    def queue(
        self,
        now: float,
        code: str,
        *,
        gap: float,
        share: float,
        horizon: float,
        queued: int,
        deadline: float | None = None,
        message: str | None = None,
        not_before: float | None = None,
        first: float | None = None,
    ) -> Refuse:
        """A queue refusal for a user whose horizon is ``horizon``; ``gap``: seconds
        between two slots freeing; ``share``: the user's share of them (0 < share <= 1);
        ``not_before``: no slot frees before then (an announced maintenance window's end);
        ``first``: the first slot frees then (the first running request's predicted end).

        The caller moves the user's horizon to ``now + retry_after``, unless the answer
        is ``deadline_unattainable`` (no reservation: it will not come back for this)."""
        cfg = self._config
        start = max(now, horizon, self.floor, _NEVER if not_before is None else not_before)
        promise = max(start, _NEVER if first is None else first) + gap / share - now
        wait = min(promise, cfg.max_retry_after)
        if deadline is not None and wait > deadline:
            return unattainable(429, wait, deadline, self.capacity)
        retry = not_before is None or not_before - now <= cfg.max_retry_after
        return Refuse(
            status=429,
            code=code,
            message=(message or self._messages[code]) + (f"; {_retry_in(wait)}" if retry else ""),
            retry_after=wait,
            policy=f'"queue";q={cfg.max_queue}',
            remaining=max(0, cfg.max_queue - queued),
            capacity=self.capacity,
            retry=retry,
        )

    def unavailable(
        self,
        now: float,
        code: str,
        message: str | None = None,
        *,
        gap: float,
        deadline: float | None = None,
        until: float | None = None,
        back_at: float | None = None,
    ) -> Refuse:
        """A 503: not serving now (``draining``, ``upstream_loading``, ``upstream_unavailable``).

        ``retry_at = max(now + delay, horizon + gap)`` with ``delay`` the time until
        service is expected back and ``gap`` the seconds between two answers the GPU
        finishes (the rate at which it will take the callers back), capped at
        ``max_retry_after``. ``delay`` is the configured ``drain_retry_after`` (a drain's
        wait then capped at ``2 x delay``: its callers go to their fallback meanwhile) or
        ``upstream_retry_after``. ``back_at`` (clock time): when an upstream that is out
        is expected back, by its last measured load time; the delay is then the time
        left of it.

        A drain with an announced window (``until``, clock time) tells every caller what
        is left of it, unspread: a 503's Retry-After says how long the service is
        expected to be out (RFC 9110). Its callers use their fallback until then, and a
        promise past the end kept them there while the GPU served again; callers that
        wait instead come back at the end, to the queue and its spread 429s like any
        crowd. When the window has more left than the cap, coming back at the cap cannot
        help: the refusal says so (``retry=False``).
        """
        cfg = self._config
        draining = code == "draining"
        if draining and until is not None:
            # Past the announced end, the window ran over: expect it back shortly.
            left = until - now if until > now else cfg.upstream_retry_after
            self._outage_horizon = max(self._outage_horizon, now + left)
            return Refuse(
                status=503,
                code=code,
                message=message or _maintenance(left),
                retry_after=min(left, cfg.max_retry_after),
                drain=True,
                capacity=self.capacity,
                retry=left <= cfg.max_retry_after,
            )
        delay = cfg.drain_retry_after if draining else cfg.upstream_retry_after
        if not draining and back_at is not None and back_at > now:
            delay = back_at - now  # measured, not guessed
        # Relative to now, so that the cap holds exactly despite float rounding.
        wait = min(max(delay, self._outage_horizon + gap - now), cfg.max_retry_after)
        if draining:
            # A drain tells callers to use their fallback, and they do: spread over a
            # second drain period at most, a crowd's promises would otherwise pile up
            # for the whole maintenance and keep them off the GPU long after it resumed.
            wait = min(wait, 2 * delay)
        if deadline is not None and wait > deadline and not draining:
            # No reservation: it will not come back for this request.
            return unattainable(503, wait, deadline, self.capacity)
        self._outage_horizon = now + wait
        return Refuse(
            status=503,
            code=code,
            message=message or (_DRAINING if draining else f"{_NOT_READY}; {_retry_in(wait)}"),
            retry_after=wait,
            drain=draining,
            capacity=self.capacity,
        )

    def reconfigure(self, config: AdmissionConfig) -> None:
        """New limits (a reload); the horizons stay."""
        self._config = config

    def serving_again(self) -> None:
        """The gateway serves again: the outage's promises become the queue's floor."""
        # Callers promised a time during the outage are still on their way back:
        # a queue refusal must not send anyone ahead of them. The next outage
        # starts its own reservations from its own delay.
        self.floor = max(self.floor, self._outage_horizon)
        self._outage_horizon = _NEVER

    def bucket(self, bucket: TokenBucket, now: float, cost: float, code: str) -> Refuse:
        """A token-bucket refusal (``rate_limited`` or ``token_budget``)."""
        # reserve() refills the bucket to now and moves its horizon.
        wait = min(bucket.reserve(now, cost), self._config.max_retry_after)
        return Refuse(
            status=429,
            code=code,
            message=f"{_BUCKET_MESSAGES[code]}; {_retry_in(wait)}",
            retry_after=wait,
            policy=_bucket_policy(code, bucket.capacity, bucket.refill),
            remaining=max(0, math.floor(bucket.level(now))),
            capacity=self.capacity,
        )


def unattainable(status: int, wait: float, deadline: float, capacity: int) -> Refuse:
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


def _maintenance(left: float) -> str:
    """The message of a refusal during an announced maintenance window."""
    return f"the model server is down for maintenance for about {math.ceil(left)}s more; retry then"


def _retry_in(seconds: float) -> str:
    """A refusal's last words for whoever reads it (a chat front-end shows the message):
    when to come back, in the whole seconds ``Retry-After`` says."""
    return f"retry in {math.ceil(seconds)}s"


@functools.lru_cache(maxsize=64)  # a few buckets per gateway: one per limit and key policy
def _bucket_policy(code: str, capacity: float, refill: float) -> str:
    """A bucket's IETF ``RateLimit-Policy`` item."""
    return f'"{code}";q={math.floor(capacity)};w={math.ceil(capacity / refill)}'
