"""Per-key budgets: each key's request-rate and LLM-token buckets, and its waiters (pure).

:class:`herdless.gateway.core.admission.Admission` asks these before it queues anything
(rules 2 and 4 of its docstring); the buckets themselves are
:class:`herdless.gateway.core.limits.TokenBucket`. The table is bounded by the configured
keys (or the one anonymous id of an open gateway): a key id never comes from a client.
"""

from __future__ import annotations

from dataclasses import dataclass

from herdless.gateway.core.limits import AdmissionConfig, TokenBucket

__all__ = ["KeyBudget", "KeyBudgets"]


@dataclass(slots=True)
class KeyBudget:
    """One key's buckets (``None``: that limit is off) and how many of its requests wait."""

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
    """The budgets of every key seen, made on first use from the admission config."""

    __slots__ = ("_config", "_keys")

    def __init__(self, config: AdmissionConfig) -> None:
        self._config = config
        self._keys: dict[str, KeyBudget] = {}

    def get(self, key_id: str, now: float) -> KeyBudget:
        """The budget of ``key_id``, full at ``now`` when it is new."""
        key = self._keys.get(key_id)
        if key is None:
            cfg = self._config
            rate = tpm = None
            if cfg.rate is not None:
                rate = TokenBucket(capacity=cfg.effective_burst, refill=cfg.rate, now=now)
            if cfg.tokens_per_minute is not None:
                tpm = TokenBucket(
                    capacity=cfg.tokens_per_minute, refill=cfg.tokens_per_minute / 60, now=now
                )
            key = self._keys[key_id] = KeyBudget(rate=rate, tokens=tpm)
        return key

    def __getitem__(self, key_id: str) -> KeyBudget:
        """The budget of a key that has a ticket (so was seen)."""
        return self._keys[key_id]
