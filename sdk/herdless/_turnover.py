"""How fast one backend's window turns over, and how long a waiting call will wait there.

``Turnover`` is the estimator behind a waiter's expected wait (``SlotAwaited.expected``)
and behind the decision to leave a busy backend (``FallbackUsed(reason="busy")``, or a
``DeadlineExceeded`` that says "not sent"). Pure, no lock of its own: the window
(``herdless._window.Window``) calls it under its lock. The rule, kept in sync with
``docs/concepts.md`` ("How long a call waits for a busy GPU"):

**What is measured.** Only slots freed by *answers* (a served call's release; a stream's
at its end): a call that leaves without one frees a place too, but says nothing of the
backend's pace. A batching engine (vLLM's continuous batching) finishes equal requests
in *clumps*: four answers, then nothing for a while. How close together a clump's
answers reach the client depends on the engine and the machine: on a busy CPU, vLLM's
first answer of a batch leads the other three by one engine step (50-225 ms measured,
a fifth of the time between clumps; more when a step is slow), or two answers lead
two (65 ms). So an answer joins the latest clump when it comes within ``gap`` of the
clump's previous answer and within ``span`` of its first::

    pace = period (below)                  once it is measured
         = the clump's fastest hold        before (send -> slot freed)
    gap  = max(_CLUMP, _GAP * pace)
    span = max(_CLUMP_SPAN, _SPAN * pace)

A clump is over when ``gap`` passes without an answer, or at once when it has as many
answers as the measured clumps had on average. The pace is measured between the
*starts* of clumps, while the window stayed full (the backend always had our next call),
over the last ``_SAMPLES`` such pairs::

    one pair = (seconds from a clump's first answer to the next clump's first answer,
                answers of the earlier clump)
    period   = sum(seconds) / k,   clump = sum(answers) / k      (k pairs)

so ``clump / period`` is answers per second counted from one clump start to a later
one: right whether the clumps are split or whole, and nothing is measured "to now" (the
silence between two clumps is not a slowdown). The period is **firm** once the pairs
span at least ``_FIRM`` of the answer time (below). Before, the latest clump, once it is
over, gives a first estimate: ``clump`` = its answers, ``period`` = its fastest hold
(a burst's first batch goes straight in).

**Lone first answers** while the window held more calls at the backend are either a
batch's leading answers whose others came later than ``gap`` (slow engine steps on a
busy CPU put one, or one and then another, up to a whole batch time ahead) or an
engine that answers one at a time. Read as clumps of one, they make every wait two to
four times too long, so they form no pair and no estimate of their own until the
clump after them tells which (``leads``: the lone answers held back)::

    a clump of several      the leaders' batch:  clump = its answers + leads,
                            period = the fastest hold of all (the first leader's);
                            its pair counts the leaders among its answers
    a third lone answer     one at a time:       clump = 1, period = the mean of
                            the seconds between them; every pair counts as it is

**The wait** of a waiter that waits for ``ahead`` more answers (the window counts them:
enough to free the slots of the calls ahead of it, its own, and any the window holds
beyond its size, less the slots the window adds as it grows meanwhile), at ``now``::

    rest  = clump - answers of the latest clump, until it is over; else 0
    next  = max(now, latest clump + period)
    wait  = 0                                                  if ahead <= rest
          = next + (ceil((ahead - rest) / clump) - 1) * period - now      otherwise

While the first clump is not over only a best case is known: the calls the window held
at the backend when the clump began (``calls``) all answer in it, then as many per
fastest hold (``hold``)::

    rest  = calls - answers of the latest clump
    best  = 0                                                  if ahead <= rest
          = (ceil((ahead - rest) / calls) - 1) * hold                    otherwise

Then its answer, ``answer``: an EWMA of the time from sending an attempt to its accepted
answer (a stream: its first chunk).

**Leaving.** A waiter leaves only when even its best case misses the time it may stay
(its deadline, less the reserve kept for the backends after it)::

    now + (1 - margin) * (wait + answer) > end         or: wait > its patience
    margin = 0.35 / sqrt(k)   (k pairs; 1 before the period is firm),
             doubled, at most 0.7, when no backend follows (an error is worse than a
             call cut at its deadline)

with ``wait`` the estimate, or the best case before one. Before an answer is measured
everyone fits: a call that hoped wrongly leaves when its time runs out.

**Its error**, per waiter that got its slot, from the first prediction made for it (once
a clump is over):
``|predicted - actual wait| / max(actual wait, answer)`` (the last ``_ERRORS``;
``client.stats().wait_error``).
"""

from __future__ import annotations

import math
from collections import deque

from herdless._percentiles import nearest_rank

__all__ = ["Turnover"]

# Weight of the newest sample in the answer EWMA: about the last ten answers.
_EWMA = 0.2
# Seconds: answers this close always join one clump (one engine step's answers reach the
# client up to ~30 ms apart through the gateway on a busy machine)...
_CLUMP = 0.04
# ...and closer than this share of the pace (vLLM on a busy CPU: part of a batch one
# step ahead of the rest, ~0.2 of the period, more when that step is slow; the next
# batch is a whole period on)...
_GAP = 0.5
# ...unless the clump began longer ago than this (or this share of the pace): a dense
# stream is no one clump.
_CLUMP_SPAN = 0.25
_SPAN = 0.5
# Lone answers in a row at a burst's start that show an engine answering one at a time
# (fewer may be the leaders of a batch split by slow steps, see the module docstring).
_LONE = 3
# Pairs of clumps the pace is measured over: several rounds of a batching GPU, few
# enough to follow a change within a minute.
_SAMPLES = 16
# The period is firm once its pairs span this share of the answer time.
_FIRM = 0.5
# The best case's margin with one sample; it shrinks as 1 / sqrt(samples).
_MARGIN = 0.35
# Waiters' errors kept for ``stats()``.
_ERRORS = 64


class Turnover:
    """How fast one backend's window turns over (seconds, the window's clock); see the
    module docstring for the rule."""

    __slots__ = (
        "_calls",
        "_clump",
        "_errors",
        "_firm",
        "_fresh",
        "_hold",
        "_in_clump",
        "_last",
        "_latest",
        "_leads",
        "_pairs",
        "_period",
        "_steady",
        "answer",
    )

    def __init__(self) -> None:
        # (seconds from a clump's start to the next one's, answers of the earlier clump),
        # measured while the window stayed full.
        self._pairs: deque[tuple[float, float]] = deque(maxlen=_SAMPLES)
        self._latest = -math.inf  # when the latest clump began
        self._last = -math.inf  # when its latest answer came
        self._in_clump = 0  # answers in it so far
        self._hold = math.inf  # the fastest hold of its answers
        self._calls = 0  # the calls the window held at the backend when it began
        # Lone first answers held back (see the module docstring): seconds from each to
        # the next clump's start.
        self._leads: tuple[float, ...] = ()
        self._steady = False  # the window stayed full since the latest clump began
        self._fresh = False  # the last completion began a clump
        self._period: float | None = None  # seconds between clump starts (pairs)
        self._clump = 0.0  # answers per clump (pairs)
        self._firm = False  # the pairs span enough of the answer time
        self._errors: deque[float] = deque(maxlen=_ERRORS)
        self.answer: float | None = None
        """An EWMA of the time from sending an attempt to its accepted answer."""

    # -- what happened ---------------------------------------------------------------------

    def answered(self, elapsed: float) -> None:
        """An attempt was answered with success after ``elapsed`` seconds."""
        answer = self.answer
        self.answer = elapsed if answer is None else answer + _EWMA * (elapsed - answer)

    def completed(self, now: float, held: float, calls: int = 1) -> None:
        """A served call freed its slot at ``now``, after holding it ``held`` seconds;
        ``calls``: the window's calls at the backend just before (this one included)."""
        span = max(_CLUMP_SPAN, _SPAN * self._pace())
        if self._in_clump and now - self._last <= self._gap() and now - self._latest <= span:
            self._in_clump += 1
            self._hold = min(self._hold, held)
            self._fresh = False
        else:
            if self._steady and self._in_clump:  # the backend had our calls all along
                self._pair(now - self._latest)
            else:
                self._leads = ()
            self._latest, self._in_clump, self._fresh = now, 1, True
            # Perhaps the lone leaders' batch: their fastest hold, kept in ``_hold``.
            self._hold = min(held, self._hold) if self._leads else held
            self._calls = calls
        self._last = now
        self._measure()

    def settled(self, full: bool) -> None:
        """After a release was handed over: whether the window is still full (its calls
        fill it, or calls wait). The time from a clump to the next counts as the
        backend's pace only when the window stayed full all along."""
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
        """Whether a wait can be judged: an answer and a clump are known (the best case
        until the estimate is firm)."""
        return self.answer is not None and self._in_clump > 0

    @property
    def firm(self) -> bool:
        """Whether the pace is measured over enough of the answer time to predict by."""
        return self._firm

    @property
    def samples(self) -> int:
        """The pairs of clumps behind the estimate (0 before it is firm: the first
        clump's answers per its fastest hold)."""
        return len(self._pairs) if self._firm else 0

    def margin(self, last: bool) -> float:
        """The share of the expected wait and answer a best case takes off."""
        margin = _MARGIN / math.sqrt(max(1, self.samples))
        return min(0.7, 2 * margin) if last else margin

    def settles_at(self) -> float | None:
        """When the latest clump is over (no answer of the same step can come after);
        ``None`` when it is over already by its size, or when there is none."""
        if not self._in_clump or self._full():
            return None
        return self._last + self._gap()

    def wait(self, ahead: float, now: float) -> float | None:
        """Seconds until ``ahead`` more slots are freed; ``None`` until a clump is over."""
        period, clump, rest = self._period, self._clump, 0.0
        over = now - self._last > self._gap() or self._full()
        if not self._firm or period is None:
            if not self._in_clump or not over:
                return None  # the first clump is not over: its size is not known yet
            leads = self._leads
            if leads and self._in_clump > 1:  # the lone leaders' batch
                period, clump = self._hold, float(self._in_clump + len(leads))
            elif leads and len(leads) + 1 >= _LONE:  # one answer at a time
                period, clump = sum(leads) / len(leads), 1.0
            elif self._in_clump == 1 and self._calls > 1:
                return None  # a batch's leading answers, or one at a time: not known yet
            else:  # a first estimate: the clump's answers per its fastest hold
                period, clump = self._hold, float(self._in_clump)
        elif not over:
            rest = max(0.0, clump - self._in_clump)
        if ahead <= rest:
            return 0.0
        rounds = math.ceil((ahead - rest) / clump - 1e-9)
        return max(now, self._latest + period) + (rounds - 1) * period - now

    def best(self, ahead: float, now: float) -> float | None:
        """The wait a waiter is judged on: the estimate, or while the first clump is not
        over its best case (see the module docstring); ``None`` before any answer."""
        wait = self.wait(ahead, now)
        if wait is not None or not self._in_clump:
            return wait
        calls = max(self._calls, self._in_clump)
        rest = calls - self._in_clump
        if ahead <= rest:
            return 0.0
        return (math.ceil((ahead - rest) / calls - 1e-9) - 1) * self._hold

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

    def _gap(self) -> float:
        """Seconds without an answer after which the latest clump is over."""
        return max(_CLUMP, _GAP * self._pace())

    def _pace(self) -> float:
        """Seconds between clumps: measured once firm, the latest clump's fastest hold
        before."""
        period = self._period
        if self._firm and period is not None:
            return period
        return 0.0 if self._hold == math.inf else self._hold

    def _full(self) -> bool:
        """Whether the latest clump has as many answers as the measured ones had."""
        return self._firm and self._in_clump >= round(self._clump)

    def _pair(self, seconds: float) -> None:
        """The latest clump is over, ``seconds`` after it began, as the next one begins:
        its pair, or a lone first answer held back until a later clump tells what the
        lone ones were (see the module docstring)."""
        answers, leads = float(self._in_clump), self._leads
        if answers == 1 and self._calls > 1 and not self._pairs and len(leads) + 1 < _LONE:
            self._leads = (*leads, seconds)
            return
        self._leads = ()
        if leads and answers > 1:  # the leaders' batch: count them in
            self._pairs.append((seconds, answers + len(leads)))
        else:  # one at a time, or a clump with no leader
            self._pairs.extend((lead, 1.0) for lead in leads)
            self._pairs.append((seconds, answers))

    def _measure(self) -> None:
        pairs = self._pairs
        seconds = sum(s for s, _ in pairs)
        if seconds <= 0:
            return  # answers with no time between them say nothing of the pace yet
        self._period = seconds / len(pairs)
        self._clump = sum(a for _, a in pairs) / len(pairs)
        self._firm = self._firm or seconds >= _FIRM * (self.answer or 0.0)
