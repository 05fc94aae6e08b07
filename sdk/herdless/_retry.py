"""Retry decisions: which outcomes retry, how long to wait, what the server asked for.

Everything here is pure: the random source and the wall-clock ``now`` (only for an
HTTP-date ``Retry-After``) are passed in. The call flow (``herdless._call.flow``) asks;
it alone acts.

The wait before retry number ``n`` (0 for the first retry) is **full jitter**::

    delay = uniform(0, min(cap, base * 2**n))

unless the server said when to come back (``retry-after-ms`` or ``Retry-After``,
capped at ``max_retry_after``); then that is a floor, with a little jitter above it
so that clients told the same number do not all come back in the same instant::

    delay = ra + uniform(0, clamp(retry_after_jitter * ra, min_jitter, max_jitter))

The spread is capped (``max_jitter``) because a gateway that staggers its answers
(herdless's does) already told each client its own time: a proportional spread on
top of a 10 s reservation would only stretch the tail of the queue.

.. keep in sync with docs/resilience.md
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

from herdless._actions import Outcome, Response
from herdless._bounds import require

__all__ = [
    "CAPACITY_HEADER",
    "DROPPED_REASON_HEADER",
    "OUTAGE_CODES",
    "RetryPolicy",
    "Verdict",
    "classify",
    "parse_capacity",
    "parse_retry_after",
]

# Statuses a live server refuses a call with now: 429 and 503 (vLLM, llm-d, Ray Serve,
# SMG), 408 (SMG's queue timeout), 529 (NVIDIA Dynamo's "all workers busy").
_REFUSAL_STATUSES = frozenset({408, 429, 503, 529})
# Statuses that mean "the server is alive but cannot take this now": retried.
_RETRY_STATUSES = _REFUSAL_STATUSES | {502, 504}
# Transport failures worth another attempt. "protocol" is not: a server that answers
# garbage will answer garbage again.
_RETRY_KINDS = frozenset(
    {"connect", "connect_timeout", "first_byte_timeout", "read_timeout", "read"}
)
_TIMEOUT_KINDS = frozenset({"connect_timeout", "first_byte_timeout", "read_timeout"})
DRAIN_HEADER = "x-herdless-drain"
CAPACITY_HEADER = "x-herdless-capacity"
# llm-d's endpoint picker names why it dropped a request (pkg/common/error/error.go):
# ``rejected-saturated``, ``rejected-ttl-expired``, ``evicted``, ``evicted-*`` are busy (429);
# these two say the whole pool is out (503).
DROPPED_REASON_HEADER = "x-llm-d-request-dropped-reason"
_DROPPED_DOWN = "rejected-no-endpoints"
_DROPPED_DRAINING = "rejected-shutting-down"
# A herdless gateway's codes for "the whole backend is out": every call keeps off it.
OUTAGE_CODES = frozenset({"upstream_loading", "upstream_unavailable"})
UNATTAINABLE = "deadline_unattainable"


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """How a call retries one backend, and how much retrying a backend may take.

    Args:
        max_attempts: attempts per backend per call that fail as if the backend were
            broken (5xx, timeouts, refused connections), the first included (5 = 4 retries).
            A refusal by a live server (429, a busy 503) does not count: such a call keeps
            trying until its deadline. Waiting (for budget, a slot, a drain) is no attempt.
        base: seconds; the full-jitter ceiling of the first retry.
        cap: seconds; the full-jitter ceiling never grows past this.
        max_retry_after: seconds; a server's Retry-After is honoured up to this.
        retry_after_jitter: fraction of the server's Retry-After added at most above it.
        min_jitter: seconds; the least spread added above a server's Retry-After.
        max_jitter: seconds; the most spread added above a server's Retry-After.
        budget_ratio: retries toward one backend stay below ``budget_ratio`` times its
            recent calls, plus ``budget_floor`` (the retry budget).
        budget_floor: retries always allowed per ``budget_window``, however few the calls.
        budget_window: seconds of history the retry budget looks at.

    >>> policy = RetryPolicy(base=0.5, cap=8.0)
    >>> policy.ceiling(0), policy.ceiling(3), policy.ceiling(10)
    (0.5, 4.0, 8.0)
    """

    max_attempts: int = 5
    base: float = 0.5
    cap: float = 8.0
    max_retry_after: float = 60.0
    retry_after_jitter: float = 0.25
    min_jitter: float = 0.1
    max_jitter: float = 1.0
    # Attempts per call under a lasting overload tend to 1 + ratio + floor / calls per
    # window: at or below 1.1 from 40 calls per window (4 a second) up.
    budget_ratio: float = 0.05
    budget_floor: int = 2
    budget_window: float = 10.0

    def __post_init__(self) -> None:
        require(self, ">= 1", "max_attempts")
        require(self, "> 0", "base", "cap", "max_retry_after", "budget_window")
        require(
            self,
            ">= 0",
            "retry_after_jitter",
            "min_jitter",
            "max_jitter",
            "budget_ratio",
            "budget_floor",
        )
        if self.min_jitter > self.max_jitter:
            raise ValueError(
                f"RetryPolicy.min_jitter ({self.min_jitter!r}) must be <= max_jitter "
                f"({self.max_jitter!r})"
            )

    def ceiling(self, n: int) -> float:
        """The full-jitter upper bound before retry ``n`` (0-based): ``min(cap, base * 2**n)``."""
        # Past the cap, 2**n is not computed: it would overflow a float from n = 1024.
        if n >= math.log2(self.cap / self.base):
            return self.cap
        return min(self.cap, self.base * 2.0**n)

    def backoff(self, n: int, rng: random.Random) -> float:
        """Seconds to wait before retry ``n`` (0-based) when the server gave no time."""
        return rng.uniform(0.0, self.ceiling(n))

    def after_server(self, retry_after: float, rng: random.Random) -> float:
        """Seconds to wait when the server asked for ``retry_after``: that, capped, plus jitter."""
        floor = min(max(retry_after, 0.0), self.max_retry_after)
        spread = min(self.max_jitter, max(self.min_jitter, self.retry_after_jitter * floor))
        return floor + rng.uniform(0.0, spread)

    def delay(self, n: int, retry_after: float | None, rng: random.Random) -> float:
        """The wait before retry ``n``: the server's time as a floor if given, else full jitter."""
        if retry_after is None:
            return self.backoff(n, rng)
        return self.after_server(retry_after, rng)


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """What one attempt's outcome means for the call, the breaker and the client.

    Three kinds of "no" are told apart, because each asks for a different answer:

    - **busy**: a live server refuses this call now (429, or a 503 that names no
      outage, like vLLM's full queue; 408, SMG's queue timeout; 529, NVIDIA Dynamo's
      "all workers busy"; llm-d's ``rejected-saturated``, ``rejected-ttl-expired`` and
      ``evicted*``). The call keeps its place and comes back: at the server's time when
      it gave one (a reservation for this call alone: a herdless gateway's
      ``displaced``, SMG's ``X-SMG-Preempted``, Ray Serve's static Retry-After), else
      after full-jitter backoff, until its deadline. The client's window shrinks.
    - **down** / **draining**: the server says the whole backend is out (a herdless
      gateway's ``upstream_loading`` / ``upstream_unavailable``, llm-d's
      ``rejected-no-endpoints``; a drain, or llm-d's ``rejected-shutting-down``). Every
      call of the client keeps off it for the Retry-After; a call with a fallback goes
      there at once.
    - **broken**: 5xx other than those, timeouts, refused or broken connections. Counted
      against the breaker and against ``RetryPolicy.max_attempts``.

    Attributes:
        ok: a 2xx answer.
        kind: the attempt record's kind: ``"ok"``, ``"status"`` or the transport failure kind.
        status: the HTTP status, if any.
        retryable: another attempt at the same backend may succeed.
        fallback_may_help: another backend may succeed (not for a request the server refuses
            as such: 4xx other than 429).
        breaker_failure: counts against the backend's circuit breaker (connect errors,
            timeouts, 5xx). A 429 does not: the server is alive and asked us to slow down.
        breaker_refusal: a 503 that says neither why nor when: counted in the breaker's
            failure *rate* only (a backend that refuses most calls opens), never in its
            consecutive count (a burst of refusals from a busy vLLM does not).
        timeout: the attempt timed out (a hung backend is not waited on twice).
        retry_after: seconds the server asked to wait, capped, or ``None``.
        busy: a live server refused this call now (see above).
        down: the server says the backend is out (see above).
        draining: the backend is draining for maintenance: switch to the fallback now.
        unattainable: the server predicts this call's deadline cannot be met there
            (``deadline_unattainable``): move on at once.
        message: a short description for events and errors.
    """

    ok: bool
    kind: str
    status: int | None = None
    retryable: bool = False
    fallback_may_help: bool = False
    breaker_failure: bool = False
    breaker_refusal: bool = False
    timeout: bool = False
    retry_after: float | None = None
    busy: bool = False
    down: bool = False
    draining: bool = False
    unattainable: bool = False
    message: str = ""

    @property
    def backend_wide(self) -> bool:
        """Whether the signal is about the whole backend (held for every call)."""
        return self.down or self.draining


def _header(headers: Mapping[str, str], name: str) -> str | None:
    """Case-insensitive lookup that works on ``httpx.Headers`` and on a plain dict."""
    value = headers.get(name)
    if value is not None:
        return value
    for key, item in headers.items():
        if key.lower() == name:
            return item
    return None


def parse_retry_after(headers: Mapping[str, str], *, now: float) -> float | None:
    """Seconds the server asked to wait, or ``None`` when it did not say (or said nonsense).

    ``retry-after-ms`` wins when valid (it is precise); else ``Retry-After`` as
    delay-seconds or as an HTTP-date, counted from ``now`` (Unix seconds: the only
    use of the wall clock in herdless). A date in the past means "now": ``0.0``.
    """
    millis = _header(headers, "retry-after-ms")
    if millis is not None:
        try:
            value = float(millis) / 1000.0
        except ValueError:
            value = math.nan
        if math.isfinite(value) and value >= 0:
            return value
    text = _header(headers, "retry-after")
    if text is None:
        return None
    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:  # RFC 9110 dates are GMT; a naive parse means just that
            return None
        return max(0.0, when.timestamp() - now)
    return value if math.isfinite(value) and value >= 0 else None


def parse_capacity(headers: Mapping[str, str]) -> int | None:
    """The requests a server holds at once for this client (``X-Herdless-Capacity``), or
    ``None`` when it did not say (or said nonsense)."""
    text = headers.get(CAPACITY_HEADER)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value > 0 else None


def _error_code(body: bytes) -> str | None:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    error = data.get("error") if isinstance(data, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


_OK = Verdict(ok=True, kind="ok", status=200)  # frozen: one for every 200, as it is most calls


def classify(outcome: Outcome, policy: RetryPolicy, *, now: float) -> Verdict:
    """Judge one attempt's outcome. ``now`` is wall-clock Unix seconds (HTTP-date only)."""
    if not isinstance(outcome, Response):
        return Verdict(
            ok=False,
            kind=outcome.kind,
            retryable=outcome.kind in _RETRY_KINDS,
            fallback_may_help=True,
            breaker_failure=True,
            timeout=outcome.kind in _TIMEOUT_KINDS,
            message=outcome.message,
        )
    status = outcome.status
    if 200 <= status < 300:
        return _OK if status == 200 else Verdict(ok=True, kind="ok", status=status)
    retry_after = parse_retry_after(outcome.headers, now=now)
    if retry_after is not None:
        retry_after = min(retry_after, policy.max_retry_after)
    refusal = status in _REFUSAL_STATUSES
    code = dropped = None
    if refusal:
        code = _error_code(outcome.body)
        dropped = _header(outcome.headers, DROPPED_REASON_HEADER)
    out = status == 503
    drain_header = out and _header(outcome.headers, DRAIN_HEADER) == "1"
    draining = out and (drain_header or code == "draining" or dropped == _DROPPED_DRAINING)
    down = out and (code in OUTAGE_CODES or dropped == _DROPPED_DOWN)
    unattainable = refusal and code == UNATTAINABLE
    busy = refusal and not (draining or down or unattainable)
    return Verdict(
        ok=False,
        kind="status",
        status=status,
        retryable=status in _RETRY_STATUSES,
        fallback_may_help=refusal or status >= 500,
        # A refusal, a drain or an outage the server announced is not a failure of the
        # backend: it answered, and said why. Only a bare 503 (no why, no when) counts,
        # and only toward the failure rate.
        breaker_failure=status >= 500 and not refusal,
        breaker_refusal=busy and status == 503 and retry_after is None,
        retry_after=retry_after,
        busy=busy,
        down=down,
        draining=draining,
        unattainable=unattainable,
        message=f"status {status}",
    )
