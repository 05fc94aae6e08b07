"""The sans-I/O protocol between the call flow (decisions) and the drivers (I/O).

The flow (``herdless._call.flow``) is a generator. It yields *actions* (``Action``) and
is resumed with what each came to (``Resume``): a ``Send``'s ``Outcome``; for a
``Race``, the ``Ended`` send, or ``None`` when its time ran out first; ``None`` after a
``Sleep`` or a ``SlotWait``. It ends with ``StopIteration(value=Accepted(...))`` or
raises a ``HerdlessError``. ``herdless._drive`` is the loop that runs it, once for both
clients and the tests.

A hedged attempt (``herdless._call.race``) runs as ``Race`` actions: the driver starts a
send without waiting for it, and reports whichever of its running sends ends first.
Every send still running when the flow yields anything but a ``Race``, or ends, is
cancelled (its connection closed): the loser of a race is never read.

``Client`` performs the actions with ``httpx.Client`` and ``time.sleep``;
``AsyncClient`` with ``httpx.AsyncClient`` and ``asyncio.sleep``. Every rule
(retry, backoff, breaker, budget, fallback, deadline) lives in the flow, once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeAlias

from herdless._backend import Backend, Timeouts
from herdless._types import AttemptRecord
from herdless._wire import Completion

__all__ = [
    "ATTEMPT_HEADER",
    "DEADLINE_HEADER",
    "FAIRNESS_HEADER",
    "PRIORITY_HEADER",
    "REQUEST_ID_HEADER",
    "TTL_HEADER",
    "Accepted",
    "Action",
    "Ended",
    "Outcome",
    "Race",
    "Response",
    "Resume",
    "Send",
    "Sleep",
    "SlotWait",
    "TransportFailure",
    "TransportFailureKind",
]


REQUEST_ID_HEADER: Final = "X-Request-ID"
"""The header that carries the call's request id, on every attempt."""
ATTEMPT_HEADER: Final = "X-Herdless-Attempt"
"""The header that carries the attempt's number (1 for the call's first)."""
DEADLINE_HEADER: Final = "X-Herdless-Deadline-Ms"
"""The header that carries the milliseconds the call still waits for this attempt's
answer (its deadline, less the reserve kept for a fallback): a herdless gateway refuses
at once (``deadline_unattainable``) what it predicts it cannot start in that time."""
FAIRNESS_HEADER: Final = "x-llm-d-inference-fairness-id"
"""llm-d's fairness unit: the call's user (``X-Herdless-User``, else the body's ``user``),
sent when ``llm_d_headers`` is on. A herdless gateway reads it as ``X-Herdless-User``."""
TTL_HEADER: Final = "x-llm-d-inference-ttl"
"""llm-d's queue time-to-live, a Go duration (``1500ms``): the longest this attempt may
wait in a queue and still be answered in time (``DEADLINE_HEADER`` less the least an
answer takes), sent when ``llm_d_headers`` is on. Not the call's deadline."""
PRIORITY_HEADER: Final = "X-Herdless-Priority"
"""The header that carries the call's class, ``interactive`` or ``batch``: a herdless
gateway serves interactive work first and lets batch work use the capacity it leaves idle."""


@dataclass(slots=True, kw_only=True)
class Send:
    """Perform one HTTP attempt: ``POST backend.chat_url`` with ``body`` and ``headers``.

    The driver adds ``Authorization`` from ``backend.api_key`` and sends
    ``{"model": model, **body}`` when ``model`` is set (``body`` never holds ``model``:
    the flow chose it for this backend); ``headers`` are the attempt's own,
    ``REQUEST_ID_HEADER`` and ``ATTEMPT_HEADER``. ``timeouts`` are already clipped to the
    call's remaining deadline. With ``stream=True`` the driver returns once the status
    and the first body chunk arrived (or failed), keeping the stream open.
    """

    backend: Backend
    attempt: int
    body: Mapping[str, Any]
    headers: Mapping[str, str]
    timeouts: Timeouts
    stream: bool = False
    model: str | None = None


@dataclass(slots=True, kw_only=True)
class Sleep:
    """Wait ``seconds`` before the next action. The flow never sleeps itself."""

    seconds: float


@dataclass(slots=True, kw_only=True)
class SlotWait:
    """Wait until ``listen`` reports that the call's place in a backend's window was
    decided (a slot, or "leave"), at most ``timeout`` seconds; then send ``None`` back.

    The driver passes ``listen`` a callback that wakes it; the callback may run on any
    thread (the one that freed the slot), at once if the place is already decided.
    """

    listen: Callable[[Callable[[], None]], None]
    timeout: float


@dataclass(slots=True, kw_only=True)
class Race:
    """Start ``send`` (when not ``None``) beside the sends this call already has running,
    then wait until one of them ends, at most ``timeout`` seconds (``None``: until one
    does); send back its ``Ended``, or ``None`` when the time ran out first (the sends
    keep running).

    Sends still running are cancelled, their connections closed, as soon as the flow
    yields anything but a ``Race`` or ends; one that ended but was not reported yet is
    closed unread. ``timeout`` is real time, as ``SlotWait``'s: the driver waits on its
    sends, not on the flow's clock.
    """

    send: Send | None
    timeout: float | None


Action: TypeAlias = Send | Sleep | SlotWait | Race


@dataclass(slots=True, kw_only=True)
class Response:
    """The backend answered with a status.

    ``body`` is the whole body for a non-streaming answer and for any error status
    (read with a size cap); it is ``b""`` for an accepted (2xx) stream. ``elapsed`` is
    seconds since the send. The flow never reads the last two fields; the driver fills
    them for itself, for the call's result:

    - ``completion``: an accepted (2xx) non-streaming answer, decoded. The driver decodes
      it before handing the outcome over, so that garbage in a 200 comes back as a
      ``TransportFailure(kind="protocol")``, a failed attempt, not an error after the
      call was accepted.
    - ``opened``: an accepted stream, open, its first event read
      (``herdless._outcomes.OpenStream``).
    """

    status: int
    headers: Mapping[str, str]
    body: bytes
    elapsed: float
    completion: Completion | None = field(default=None, repr=False, compare=False)
    opened: Any = field(default=None, repr=False, compare=False)


TransportFailureKind: TypeAlias = Literal[
    "connect",  # refused, DNS, reset before any answer: nothing was processed, safe to retry
    "connect_timeout",  # no connection within timeouts.connect
    "first_byte_timeout",  # connected, sent, then silence: the backend may be generating
    "read_timeout",  # a stream went idle longer than timeouts.read
    "read",  # the connection broke while reading the answer
    "protocol",  # the answer was not HTTP or not the expected format
]


@dataclass(slots=True, kw_only=True)
class TransportFailure:
    """The attempt ended without an HTTP status. ``message`` never contains a secret."""

    kind: TransportFailureKind
    message: str
    elapsed: float


Outcome: TypeAlias = Response | TransportFailure
"""What one ``Send`` came to."""


@dataclass(slots=True, kw_only=True)
class Ended:
    """One send of a ``Race`` ended: ``send`` is the action the flow yielded (the same
    object), ``outcome`` what it came to."""

    send: Send
    outcome: Outcome


@dataclass(slots=True, kw_only=True)
class Accepted:
    """The flow's result: ``response`` (2xx) from ``backend`` is the call's answer."""

    backend: Backend
    response: Response
    attempts: tuple[AttemptRecord, ...]
    """The call's attempt records, oldest first."""
    fallback_reason: str | None = None


Resume: TypeAlias = Outcome | Ended | None
"""What the driver sends back into the flow: a ``Send``'s ``Outcome``; a ``Race``'s
``Ended``, or ``None`` when its time ran out; ``None`` after a ``Sleep`` or ``SlotWait``."""
