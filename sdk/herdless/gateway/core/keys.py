"""Per-key budgets: each key's limits, its request-rate and LLM-token buckets, and its
waiters (pure).

:class:`herdless.gateway.core.admission.Admission` asks these before it queues anything
(rules 2 and 4 of its docstring); the buckets themselves are
:class:`herdless.gateway.core.limits.TokenBucket`. The table is bounded by the configured
keys (or the one anonymous id of an open gateway): a key id never comes from a client.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from herdless._bounds import require
from herdless.gateway.core.limits import AdmissionConfig, TokenBucket

__all__ = ["KeyBudget", "KeyBudgets", "KeyLimits"]


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyLimits:
    """One key's limits (``None``: that limit is off); the gateway's flags unless the key
    policies (:mod:`herdless.gateway.policies`) say otherwise.

    Attributes:
        rate: requests per second (token bucket refill).
        burst: requests at once (bucket size); ``None``: ``max(1, ceil(rate))``.
        tokens_per_minute: LLM tokens (prompt + completion) per minute.
        queue_share: fraction of the queue the key may hold (0 < share <= 1).
        hold: seconds one of its requests may wait in the queue (its ``queue_timeout``).
    """

    rate: float | None = None
    burst: int | None = None
    tokens_per_minute: int | None = None
    queue_share: float = 1.0
    hold: float = 30.0

    def __post_init__(self) -> None:
        require(self, "> 0", "rate", "burst", "tokens_per_minute", optional=True)
        require(self, "> 0", "hold")
        if not 0 < self.queue_share <= 1:
            raise ValueError(f"queue_share must be in (0, 1], got {self.queue_share!r}")

    @classmethod
    def of(cls, config: AdmissionConfig) -> KeyLimits:
        """The limits every key has by the gateway's flags."""
        return cls(
            rate=config.rate,
            burst=config.burst,
            tokens_per_minute=config.tokens_per_minute,
            queue_share=config.key_queue_share,
            hold=config.queue_timeout,
        )

    def hold_for(self, ttl: float | None) -> float:
        """Seconds one of its requests may wait: its ``hold``, or the request's queue TTL
        (``x-llm-d-inference-ttl``) when shorter."""
        return self.hold if ttl is None else min(self.hold, ttl)

    def queue_limit(self, max_queue: int) -> int:
        """Most of its requests waiting at once: ``ceil(max_queue * queue_share)``."""
        return math.ceil(max_queue * self.queue_share)


@dataclass(slots=True)
class KeyBudget:
    """One key's limits, its buckets (``None``: that limit is off) and how many of its
    requests wait."""

    limits: KeyLimits
    rate: TokenBucket | None
    tokens: TokenBucket | None
    queued: int = 0

    def charge(self, price: int) -> None:
        """Take one request and ``price`` tokens (call after both buckets allowed it)."""
        if self.rate is not None:
            self.rate.take(1)
        if self.tokens is not None:
            self.tokens.take(price)

    def settle(self, tokens: int) -> None:
        """Give ``tokens`` back to the token bucket (a debt when negative). A request
        that never ran gives its whole price back, never its request-rate token."""
        if self.tokens is not None:
            self.tokens.settle(tokens)


class KeyBudgets:
    """The budgets of every key seen, made on first use from its limits: ``limits`` for
    the keys it names, the admission config's flags for the others."""

    __slots__ = ("_default", "_keys", "_limits")

    def __init__(
        self, config: AdmissionConfig, limits: Mapping[str, KeyLimits] | None = None
    ) -> None:
        self._default = KeyLimits.of(config)
        self._limits = dict(limits or {})
        self._keys: dict[str, KeyBudget] = {}

    def reconfigure(
        self, config: AdmissionConfig, limits: Mapping[str, KeyLimits], now: float
    ) -> None:
        """New limits (a reload). A key whose limits changed gets buckets of the new size
        holding no more than it had (a reload frees no budget); its waiters stay counted."""
        self._default = KeyLimits.of(config)
        self._limits = dict(limits)
        for key_id, old in list(self._keys.items()):
            lim = self.limits(key_id)
            if lim == old.limits:
                continue
            del self._keys[key_id]
            new = self.get(key_id, now)
            new.queued = old.queued
            for mine, theirs in ((new.rate, old.rate), (new.tokens, old.tokens)):
                if mine is not None and theirs is not None:
                    mine.settle(min(0.0, theirs.level(now) - mine.capacity))

    def limits(self, key_id: str) -> KeyLimits:
        """The limits of ``key_id``."""
        return self._limits.get(key_id, self._default)

    def get(self, key_id: str, now: float) -> KeyBudget:
        """The budget of ``key_id``, full at ``now`` when it is new."""
        key = self._keys.get(key_id)
        if key is None:
            lim = self.limits(key_id)
            rate = tpm = None
            if lim.rate is not None:
                burst = lim.burst if lim.burst is not None else max(1, math.ceil(lim.rate))
                rate = TokenBucket(capacity=burst, refill=lim.rate, now=now)
            if lim.tokens_per_minute is not None:
                tpm = TokenBucket(
                    capacity=lim.tokens_per_minute, refill=lim.tokens_per_minute / 60, now=now
                )
            key = self._keys[key_id] = KeyBudget(limits=lim, rate=rate, tokens=tpm)
        return key

    def __getitem__(self, key_id: str) -> KeyBudget:
        """The budget of a key that has a ticket (so was seen)."""
        return self._keys[key_id]
