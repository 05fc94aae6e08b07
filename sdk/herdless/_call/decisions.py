"""What the rules of one call decide: the values every layer of ``herdless._call`` passes up.

They sit at the bottom of the package, so that the checks, the visit, the race and the
flow all name a decision without importing a rule. A check before an attempt says
``None`` (nothing in the way), ``Wait``, ``Queue``, ``Move`` or ``Fail``; the verdict on
an attempt (``herdless._call.checks.decide``) says ``Move``, ``Fail``, ``Wait``,
``Requeued`` or ``Budgeted``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

from herdless.errors import HerdlessError

if TYPE_CHECKING:
    from herdless._window import SlotTicket

__all__ = ["Budgeted", "Decision", "Fail", "Move", "Queue", "Requeued", "Wait"]


@dataclass(frozen=True, slots=True)
class Wait:
    """Wait ``seconds`` before trying again, for ``why``.

    ``retry``: a retry's backoff (announced as ``RetryScheduled``), else another wait
    (``WaitScheduled``); ``until_release``: or less, until another call leaves the
    backend; ``scheduled``: the server (or the window) gave this retry its time, so it
    spends no retry budget.
    """

    seconds: float
    why: str
    retry: bool = False
    until_release: bool = False
    scheduled: bool = False


@dataclass(frozen=True, slots=True)
class Queue:
    """Wait in the client for ``ticket``'s slot, at most ``timeout`` seconds."""

    ticket: SlotTicket
    timeout: float


@dataclass(frozen=True, slots=True)
class Move:
    """Leave this backend for the next one, for ``reason``; ``error`` is what went wrong."""

    reason: str
    error: HerdlessError


@dataclass(frozen=True, slots=True)
class Fail:
    """The call ends here: the last backend cannot serve it in time."""

    error: HerdlessError


@dataclass(frozen=True, slots=True)
class Requeued:
    """The window shrank below its calls and put this one first in its line: retry as
    soon as the checks let it (announced as ``RetryScheduled`` with no delay)."""

    why: str


@dataclass(frozen=True, slots=True)
class Budgeted:
    """A retry the server gave no time for: take a retry-budget unit and ``wait``;
    without one, ``without`` (the next backend, or a wait for the budget)."""

    wait: Wait
    without: Move | Wait


Decision: TypeAlias = Wait | Queue | Move | Fail | None
"""What a check says; ``None``: nothing in the way, ask the next one."""
