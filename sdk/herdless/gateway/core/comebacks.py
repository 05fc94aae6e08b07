"""The requests the gateway refused lately, so that their retries are known (pure, no I/O).

A client that retries a 429 or a 503 sends the same request again: the same key, from the
same address, the same body byte for byte (the Vercel AI SDK, LangChain.js, a loop around
httpx or requests), though most say nothing of which attempt it is (an OpenAI SDK does:
:func:`herdless.gateway.wire.returned`). Its retry has had its refusal at once; another
costs a round trip and one of its few retries, and the last is an error on a screen. So a
request that comes again is kept like one that says it is a retry
(:func:`herdless.gateway.edge.keeps`): it waits out a full queue here.

Each refusal is remembered by a keyed hash of (key id, client address, body) (Python's own
``hash``: SipHash, with a key of this process) for :data:`REMEMBER` seconds, and each
comeback takes one refusal away: two callers that sent the same body were refused twice,
and both of their retries are kept. Another caller that sends what a refused one sent is
kept too; it waits for a place, as the retry it stands for would have.
"""

from __future__ import annotations

from typing import Final

from herdless._clock import Clock

__all__ = ["MOST", "REMEMBER", "Comebacks", "Sender"]

REMEMBER: Final = 120.0
"""Seconds a refusal is remembered: past the longest ``Retry-After`` by default (59 s), and
a client's own backoff, which may come later (LangChain.js doubles from 1 s over its six
retries; the Vercel AI SDK's own 2 s and 4 s where it was told 60 s or more)."""

MOST: Final = 16_384
"""Refusals remembered at most (the oldest go first): a flood's memory stays bounded."""

Sender = tuple[str, str | None]
"""(key id, the client's address: ``None`` where the server does not know it)."""


class Comebacks:
    """The refusals not yet come back, by (sender, body). Not thread-safe.

    Usage::

        comebacks.refused(("key-1", "10.0.0.7"), body)   # it was told a 429
        comebacks.back(("key-1", "10.0.0.7"), body)      # True: the same again (once)
    """

    __slots__ = ("_clock", "_due", "_most")

    def __init__(self, clock: Clock, *, most: int = MOST) -> None:
        self._clock = clock
        self._most = most
        # hash -> (refusals not come back, when the last is forgotten), in the order of
        # their last refusal: the front is forgotten first.
        self._due: dict[int, tuple[int, float]] = {}

    def __len__(self) -> int:
        return len(self._due)

    def refused(self, sender: Sender, body: bytes) -> None:
        """The request was refused (told to come back)."""
        now = self._clock.monotonic()
        self._forget(now)
        mark = hash((sender, body))
        count, _ = self._due.pop(mark, (0, 0.0))
        self._due[mark] = (count + 1, now + REMEMBER)
        if len(self._due) > self._most:
            del self._due[next(iter(self._due))]

    def back(self, sender: Sender, body: bytes) -> bool:
        """Whether the request is one refused lately come back (each refusal answers once)."""
        if not self._due:  # the common case: nothing refused lately, nothing to hash
            return False
        self._forget(self._clock.monotonic())
        mark = hash((sender, body))
        count, until = self._due.get(mark, (0, 0.0))
        if count == 1:
            del self._due[mark]
        elif count > 1:
            self._due[mark] = (count - 1, until)  # its place in the order kept
        return count > 0

    def _forget(self, now: float) -> None:
        """Drop the refusals remembered long enough (the oldest are first)."""
        due = self._due
        while due:
            mark = next(iter(due))
            if due[mark][1] > now:
                return
            del due[mark]
