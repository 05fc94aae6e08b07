"""The token-budget ledger the admission machines check: no sequence of offers, releases
and settlements mints tokens beyond what the clock refilled."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from herdless.gateway.core.admission import Admission
from herdless.gateway.core.decisions import Ticket


def level(adm: Admission, key_id: str) -> float | None:
    """The level of a key's token bucket (``None``: no bucket, or a key not seen yet)."""
    key = adm._keys._keys.get(key_id)  # white-box: the bucket's level
    if key is None or key.tokens is None:
        return None
    return key.tokens.level(adm.clock.monotonic())


def assert_never_minted(
    adm: Admission, tickets: Sequence[Ticket], refilled: Mapping[str, float], tpm: int
) -> None:
    """Each key's level plus what its live tickets hold is at most its bucket's start
    (``tpm``) plus what the clock refilled since."""
    for key_id, given in refilled.items():
        now = level(adm, key_id)
        if now is None:
            continue
        held = sum(t.price for t in tickets if t.key_id == key_id and t.state != "done")
        assert now + held <= tpm + given + 1e-6, f"{key_id} holds more than it was given"
