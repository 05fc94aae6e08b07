"""The errors one call raises, built with its context (request id, attempts so far).

Kept apart from the flow's decisions: what to say is not how to decide. Every message
says what happened and what to do; none contains an API key (``status_error`` and
``transport_error``, ``herdless._attempt_errors``, redact what a server echoes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from herdless._actions import Outcome, Response
from herdless._attempt_errors import status_error, transport_error
from herdless._backend import Backend
from herdless._retry import Verdict
from herdless._types import AttemptRecord, WaitEstimate
from herdless.errors import (
    AllBackendsFailed,
    APIConnectionError,
    DeadlineExceeded,
    FallbackNotAllowed,
    HerdlessError,
    SpendLimitExceeded,
)

if TYPE_CHECKING:
    from herdless._spend import SpendGuard

__all__ = ["CallErrors"]


class CallErrors:
    """Error builders for one call.

    Args:
        request_id: the call's ``X-Request-ID``.
        deadline: the call's deadline, seconds.
        allow_fallback: the call's data-guard flag (to say why a fallback was refused).
        attempts: the call's attempt records, a live list the flow appends to.
    """

    __slots__ = ("_allow_fallback", "_attempts", "_deadline", "_request_id")

    def __init__(
        self,
        *,
        request_id: str,
        deadline: float,
        allow_fallback: bool,
        attempts: Sequence[AttemptRecord],
    ) -> None:
        self._request_id = request_id
        self._deadline = deadline
        self._allow_fallback = allow_fallback
        self._attempts = attempts

    def _context(self, name: str | None) -> dict[str, Any]:
        return {"request_id": self._request_id, "attempts": tuple(self._attempts), "backend": name}

    def attempt(self, backend: Backend, outcome: Outcome, verdict: Verdict) -> HerdlessError:
        """The error one failed attempt stands for (status or transport)."""
        request_id, attempts = self._request_id, tuple(self._attempts)
        if isinstance(outcome, Response):
            return status_error(
                outcome,
                backend=backend,
                request_id=request_id,
                attempts=attempts,
                retry_after=verdict.retry_after,
            )
        return transport_error(outcome, backend=backend, request_id=request_id, attempts=attempts)

    def deadline(self, name: str) -> DeadlineExceeded:
        """No time was left to (re)try ``name``."""
        return DeadlineExceeded(
            f"The call's {self._deadline:g} s deadline does not leave time to try {name} "
            "again. Raise the deadline or add a fallback.",
            deadline=self._deadline,
            **self._context(name),
        )

    def busy(
        self, name: str, expected: float | None = None, *, estimate: WaitEstimate | None = None
    ) -> DeadlineExceeded:
        """``name`` is busy and the call's wait for it no longer fits its deadline:
        ``estimate``, the client's numbers; ``expected``, the server's predicted wait."""
        if estimate is not None:
            why = estimate.describe()
        elif expected is not None:
            why = f"it would wait about {expected:.1f} s for its turn"
        else:
            why = "it ran out of time waiting for its turn"
        return DeadlineExceeded(
            f"{name} is busy: {why}, against a {self._deadline:g} s deadline, so it was not "
            "sent. Raise the deadline, add a fallback, or add capacity.",
            deadline=self._deadline,
            estimate=estimate,
            **self._context(name),
        )

    def blocked(self, name: str) -> APIConnectionError:
        """``name`` was left alone because of a Retry-After or drain window."""
        return APIConnectionError(
            f"{name} asked clients to wait (Retry-After or drain); the call did not send to it.",
            kind="backpressure",
            **self._context(name),
        )

    def breaker_open(self, name: str) -> APIConnectionError:
        """``name``'s breaker is open and its probe comes too late."""
        return APIConnectionError(
            f"{name}'s circuit breaker is open (it failed recently) and its next probe "
            "comes too late for this call's deadline; nothing was sent.",
            kind="breaker_open",
            **self._context(name),
        )

    def spend(self, name: str, guard: SpendGuard | None = None) -> SpendLimitExceeded:
        """The spend guard kept the call off the external ``name``; ``guard`` says which
        of its caps did."""
        blocking = guard.blocking() if guard is not None else None
        if blocking is None:
            return SpendLimitExceeded(
                f"The spend limit for external backends is reached; the call was not sent to "
                f"{name}. Raise the FallbackPolicy.max_external_* cap, or add primary "
                "capacity.",
                **self._context(name),
            )
        limit, why = blocking
        return SpendLimitExceeded(
            f"The spend limit for external backends is reached ({why}); the call was not "
            f"sent to {name}. Raise that cap, or add primary capacity.",
            limit=limit,
            **self._context(name),
        )

    def final(
        self, errors: Mapping[str, HerdlessError], refused: tuple[Backend, ...]
    ) -> HerdlessError:
        """What the call raises when no backend served: the one error, all of them, or the
        data guard's refusal when only a refused backend was left."""
        if refused:
            names = ", ".join(b.name for b in refused)
            why = (
                "this call has allow_fallback=False"
                if not self._allow_fallback
                else "the client's FallbackPolicy has allow_external=False"
            )
            tried = "; ".join(f"{n}: {e.message}" for n, e in errors.items()) or "none"
            return FallbackNotAllowed(
                f"No allowed backend could serve, and {names} may not be used because {why}. "
                f"Tried: {tried}",
                **self._context(next(iter(errors), None)),
            )
        if len(errors) == 1:
            return next(iter(errors.values()))
        summary = "; ".join(f"{n}: {e.message}" for n, e in errors.items())
        return AllBackendsFailed(
            f"Every backend failed. {summary}", errors=errors, **self._context(None)
        )
