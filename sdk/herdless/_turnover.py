"""How fast one backend's window turns over, and how long a waiting call will wait there.

``Turnover`` is the estimator behind a waiter's expected wait (``SlotAwaited.expected``)
and behind the decision to leave a busy backend (``FallbackUsed(reason="busy")``, or a
``DeadlineExceeded`` that says "not sent"). Pure, no lock of its own: the window
(``herdless._window.Window``) calls it under its lock. The rule, kept in sync with
``docs/concepts.md`` ("How long a call waits for a busy GPU"):

**What is measured.** Only slots freed by *answers* (a served call's release; a stream's
at its end): a call that leaves without one frees a place too, but says nothing of the
backend's pace. Answers less than ``_CLUMP`` seconds apart (and within ``_CLUMP_SPAN``
of the first) are one *clump*: a batching engine (vLLM's continuous batching) finishes
equal requests in the same step, four at once, then nothing for seconds. A clump is
over when ``_CLUMP`` passes without an answer, or at once when it has as many answers
as the clumps before had on average. One sample per clump::

    seconds = time since the previous clump        if the window stayed full since then
                                                   (the backend always had our next call)
            = the fastest hold (send -> slot freed) of the clump's answers     otherwise
    answers = the clump's answers

over the last ``_SAMPLES`` clumps (only those of a full window, once there is one)::

    period = sum(seconds) / k          (k samples)
    clump  = sum(answers) / n          (every clump that is over, full window or not;
                                        until the first is over, the wait is not known)

Nothing is measured "to now": the silence between two clumps is not a slowdown, and a
rate taken between them reads up to twice too slow on a burst's first clumps.

**The wait** of a waiter that needs ``ahead`` more slots (those of the calls ahead of it,
its own, and any the window holds beyond its size), at ``now``::

    rest  = clump - answers of the latest clump, until it is over (_CLUMP passes
            without an answer, or it has ``clump`` answers); else 0
    next  = max(now, latest clump + period)
    wait  = 0                                                  if ahead <= rest
          = next + (ceil((ahead - rest) / clump) - 1) * period - now      otherwise

then its answer, ``answer``: an EWMA of the time from sending an attempt to its accepted
answer (a stream: its first chunk).

**Leaving.** A waiter leaves only when even its best case misses the time it may stay
(its deadline, less the reserve kept for the backends after it)::

    now + (1 - margin) * (wait + answer) > end         or: wait > its patience
    margin = 0.35 / sqrt(k)   (k: a full window's samples; 1 before there is one),
             doubled, at most 0.7, when no backend follows (an error is worse than a
             call cut at its deadline)

Before an answer is measured everyone fits: a call that hoped wrongly leaves when its
time runs out, never later.

**Its error**, per waiter that got its slot, from the first prediction made for it
once anything was measured: ``|predicted - actual wait| / max(actual wait, answer)``
(the last ``_ERRORS``; ``client.stats().wait_error``).
"""

from __future__ import annotations

import math
from collections import deque

from herdless._percentiles import nearest_rank

__all__ = ["Turnover"]

# Weight of the newest sample in the answer EWMA: about the last ten answers.
_EWMA = 0.2
# Seconds: an answer this close to the previous one joins its clump (one engine step's
# answers reach the client up to ~30 ms apart through the gateway on a busy machine)...
_CLUMP = 0.04
# ...unless the clump began longer ago than this (a dense stream is no one clump).
_CLUMP_SPAN = 0.25
# Clumps the pace is measured over: several rounds of a batching GPU, few enough to
# follow a change within a minute.
_SAMPLES = 16
# The best case's margin with one sample; it shrinks as 1 / sqrt(samples).
_MARGIN = 0.35
# Waiters' errors kept for ``stats()``.
_ERRORS = 64


class Turnover:
    """How fast one backend's window turns over (seconds, the window's clock); see the
    module docstring for the rule."""

    __slots__ = (
        "_done",
        "_errors",
        "_fresh",
        "_in_clump",
        "_last",
        "_latest",
        "_period",
        "_samples",
        "_steady",
        "_weight",
        "answer",
    )

    def __init__(self) -> None:
        # One per clump: [seconds, answers, measured while the window was full].
        self._samples: deque[list[float]] = deque(maxlen=_SAMPLES)
        self._latest = -math.inf  # when the latest clump began
        self._last = -math.inf  # when its latest answer came
        self._in_clump = 0  # answers in it so far
        self._steady = False  # the window stayed full since the latest clump began
        self._fresh = False  # the last completion began a clump
        self._period: float | None = None  # seconds between clumps
        self._done = (0.0, 0)  # answers and clumps of the finished clumps
        self._weight = 1  # samples behind the estimate (for the margin)
        self._errors: deque[float] = deque(maxlen=_ERRORS)
        self.answer: float | None = None
        """An EWMA of the time from sending an attempt to its accepted answer."""

    # -- what happened ---------------------------------------------------------------------

    def answered(self, elapsed: float) -> None:
        """An attempt was answered with success after ``elapsed`` seconds."""
        answer = self.answer
        self.answer = elapsed if answer is None else answer + _EWMA * (elapsed - answer)

    def completed(self, now: float, held: float) -> None:
        """A served call freed its slot at ``now``, after holding it ``held`` seconds."""
        if now - self._last <= _CLUMP and now - self._latest <= _CLUMP_SPAN and self._samples:
            sample = self._samples[-1]
            sample[1] += 1
            if not sample[2]:  # the clump's fastest hold is the backend's own pace
                sample[0] = min(sample[0], held)
            self._in_clump += 1
            self._fresh = False
        else:
            steady = self._steady and self._samples
            since = now - self._latest
            self._samples.append([since if steady else held, 1.0, 1.0 if steady else 0.0])
            self._latest, self._in_clump, self._fresh = now, 1, True
        self._last = now
        self._measure()

    def settled(self, full: bool) -> None:
        """After a release was handed over: whether the window is still full (its calls
        fill it, or calls wait). A clump's gap counts as the backend's pace only when the
        window stayed full all along."""
        self._steady = full if self._fresh else self._steady and full
        self._fresh = False

    def waited(self, predicted: float, actual: float) -> None:
        """A waiter got its slot ``actual`` seconds after a prediction of ``predicted``."""
        scale = max(actual, self.answer or 0.0)
        if scale > 0:
            self._errors.append(abs(predicted - actual) / scale)

    # -- what it says ----------------------------------------------------------------------

    @property
    def measured(self) -> bool:
        """Whether a wait can be estimated: a clump and an answer are known."""
        return self.answer is not None and self._period is not None

    @property
    def samples(self) -> int:
        """The samples behind the estimate (a full window's clumps; 1 before any)."""
        return self._weight if self._period is not None else 0

    def margin(self, last: bool) -> float:
        """The share of the expected wait and answer a best case takes off."""
        margin = _MARGIN / math.sqrt(max(1, self._weight))
        return min(0.7, 2 * margin) if last else margin

    def settles_at(self) -> float | None:
        """When the latest clump is over (no answer of the same step can come after);
        ``None`` when it is over already by its size (as many answers as the clumps
        before had) or when there is none."""
        if not self._samples or self._full():
            return None
        return self._last + _CLUMP

    def _full(self) -> bool:
        """Whether the latest clump has as many answers as the finished ones had."""
        answers, clumps = self._done
        return clumps > 0 and self._in_clump >= round(answers / clumps)

    def wait(self, ahead: float, now: float) -> float | None:
        """Seconds until ``ahead`` more slots are freed; ``None`` before a clump is
        complete (its size unknown)."""
        period = self._period
        if period is None:
            return None
        answers, clumps = self._done
        settled = now - self._last > _CLUMP or self._full()
        if settled:
            answers, clumps = answers + self._in_clump, clumps + 1
        if not clumps:
            return None  # the first clump is not over: its size is not known yet
        clump = answers / clumps
        rest = 0.0 if settled else max(0.0, clump - self._in_clump)
        if ahead <= rest:
            return 0.0
        rounds = math.ceil((ahead - rest) / clump - 1e-9)
        return max(now, self._latest + period) + (rounds - 1) * period - now

    def fits(
        self, *, wait: float | None, end: float, max_wait: float, last: bool, now: float
    ) -> bool:
        """Whether a call ``wait`` seconds from a slot still fits: its wait within its
        patience (``max_wait``), and its best case (``now + (1 - margin) * (wait +
        answer)``) before its ``end``."""
        answer = self.answer
        if wait is None or answer is None:
            return True  # nothing measured: no grounds to send anyone away
        best = (1 - self.margin(last)) * (wait + answer)
        return wait <= max_wait and now + best <= end

    def error(self) -> dict[str, float]:
        """The recent waiters' errors: ``p50``, ``p90`` and ``samples`` (empty before any)."""
        if not self._errors:
            return {}
        ordered = sorted(self._errors)
        return {
            "p50": nearest_rank(ordered, 0.5),
            "p90": nearest_rank(ordered, 0.9),
            "samples": float(len(ordered)),
        }

    def _measure(self) -> None:
        samples = list(self._samples)
        steady = [s for s in samples if s[2]]
        used = steady or samples
        seconds = sum(s[0] for s in used)
        if seconds <= 0:
            return  # answers with no time between them say nothing of the pace yet
        self._period = seconds / len(used)
        # A clump's size is the engine's batching, full window or not; the latest clump
        # may still grow: it counts once it is over (``wait``).
        done = samples[:-1]
        self._done = (sum(s[1] for s in done), len(done))
        self._weight = len(steady) or 1
