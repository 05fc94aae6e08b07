"""What the gateway knows of the engine behind it (pure, no I/O): a reading of its
metrics, the requests it runs there and their KV peak, and the interactive demand it saw.

The sizing rule (:mod:`herdless.gateway.core.sizing`) decides with these.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from herdless.gateway.core.prefixes import Held

__all__ = [
    "AHEAD",
    "DEFER",
    "PACE",
    "BatchPacing",
    "InteractiveDemand",
    "Reading",
    "Run",
    "Running",
    "kv_peak",
]

PACE: Final = 0.7
"""A batch start may come after this share of the batch job's own gap between starts."""
AHEAD: Final = 2
"""Gaps batch starts may run ahead of their schedule, and a pause may save, while no
interactive request runs."""
DEFER: Final = 0.6
"""A due batch start waits for running interactive requests that all end within this
share of their typical run time."""
_EWMA = 0.2


@dataclass(frozen=True, slots=True, kw_only=True)
class Reading:
    """One read of the engine's metrics; ``None`` where it does not publish the signal.

    Attributes:
        at: clock time of the read.
        kv_capacity: KV capacity in tokens (``num_gpu_blocks x block_size``).
        block_size: tokens per KV block.
        kv_usage: share of the KV cache in use, 0 to 1.
        running: requests the engine runs.
        waiting: requests waiting in the engine's own queue.
        preemptions: preemptions so far (a counter).
        generation_tokens: tokens generated so far (a counter).
        prefix_hits: prompt tokens found in its prefix cache so far (a counter).
        run_seconds: seconds its finished requests ran, from their first step to their
            end, summed since it started (``vllm:request_inference_time_seconds``).
        runs: how many requests ``run_seconds`` sums.
        answer_tokens: tokens its finished requests generated, summed since it started
            (``vllm:request_generation_tokens``).
        answers: how many requests ``answer_tokens`` sums.
    """

    at: float
    kv_capacity: int | None = None
    block_size: int | None = None
    kv_usage: float | None = None
    running: int | None = None
    waiting: int | None = None
    preemptions: int | None = None
    generation_tokens: int | None = None
    prefix_hits: int | None = None
    run_seconds: float | None = None
    runs: int | None = None
    answer_tokens: float | None = None
    answers: int | None = None

    @property
    def sizable(self) -> bool:
        """Whether it holds what self-sizing needs: the capacity and the KV use."""
        return self.kv_capacity is not None and self.kv_usage is not None


@dataclass(slots=True)
class Run:
    """One request the gateway started, as the KV account sees it (tokens, seconds)."""

    prompt: float  # calibrated prompt tokens, less those found in the engine's cache
    predicted: float  # predicted answer tokens
    budget: float  # its max_tokens: the longest answer it may give
    started: float
    interactive: bool
    open_ended: bool = False
    """It named no ``max_tokens``: ``budget`` is the default its price assumed, and its
    answer may run past it (its prediction is not capped there)."""
    calibrated: bool = False
    """Its prompt is counted at the engine's calibration, not at the gateway's guess
    (:meth:`Running.calibrate`)."""
    taken_in: bool = False
    """A reading showed the engine past its prompt's pass (:meth:`Running.taken_in`)."""
    links: tuple[int, ...] = ()
    """Its prompt's links (:func:`~.prefixes.chain`)."""
    holds: tuple[int, ...] = ()
    """The links whose blocks it holds in the engine: those it found there at its start,
    all of them once the engine has it (:meth:`Running.admitted`)."""
    shared: float = 0.0
    """Prompt tokens it found in the engine's prefix cache at its start (not in
    ``prompt``: another request paid for them)."""

    def final(self, block: int) -> float:
        """What it holds when it ends: prompt, answer and a partly filled block."""
        return self.prompt + self.predicted + block

    def generated(self, now: float, rate: float) -> float:
        """Answer tokens it holds by ``now``, decoding ``rate`` tokens a second (never all
        of its predicted answer: while it runs, one is still to come)."""
        return min(max(0.0, self.predicted - 1), (now - self.started) * rate)

    def made(self, now: float, rate: float, rest: float) -> float:
        """Answer tokens it has made by ``now``, decoding ``rate`` tokens a second after
        ``rest`` seconds of its run that are not decoding (its prompt's pass); at most its
        ``max_tokens``."""
        made = max(0.0, now - self.started - rest) * rate
        return made if self.open_ended else min(self.budget, made)


class Running:
    """The requests the gateway runs, with each class's count and final sizes kept as
    they start and end: the hot path reads these totals, it never sums them."""

    __slots__ = ("_runs", "held", "seqs", "shared_prompts", "taken_in_prompts", "tokens")

    def __init__(self) -> None:
        self._runs: dict[int, Run] = {}
        self.held = Held()
        """Their :attr:`Run.holds`: the prompt blocks the engine holds for them."""
        self.shared_prompts = 0.0
        """Their :attr:`Run.shared` prompt tokens, found in the engine's prefix cache."""
        self.seqs = {True: 0, False: 0}
        """Requests running, per class (interactive?)."""
        self.tokens = {True: 0.0, False: 0.0}
        """Their prompts and predicted answers, per class (interactive?)."""
        self.taken_in_prompts = 0.0
        """The prompts of those the engine has taken in (:meth:`taken_in`)."""

    def __len__(self) -> int:
        return len(self._runs)

    def add(self, key: int, run: Run) -> None:
        self._runs[key] = run
        self.seqs[run.interactive] += 1
        self.tokens[run.interactive] += run.prompt + run.predicted
        self.held.add(run.holds)
        self.shared_prompts += run.shared

    def get(self, key: int) -> Run | None:
        return self._runs.get(key)

    def pop(self, key: int) -> Run | None:
        run = self._runs.pop(key, None)
        if run is not None:
            self.seqs[run.interactive] -= 1
            self.tokens[run.interactive] -= run.prompt + run.predicted
            self.held.remove(run.holds)
            self.shared_prompts -= run.shared
            if run.taken_in:
                self.taken_in_prompts -= run.prompt
        return run

    def calibrate(self, ratio: float) -> None:
        """The engine counted its first prompt: those that started on the guess count
        ``ratio`` times their estimate (not the tokens shared). Those calibrated already
        keep theirs: they started on the engine before, which restarted since."""
        for run in self._runs.values():
            if run.calibrated:
                continue
            run.calibrated = True
            more = run.prompt * (ratio - 1)
            run.prompt += more
            self.tokens[run.interactive] += more
            if run.taken_in:
                self.taken_in_prompts += more

    def oldest_start(self) -> float:
        """When the oldest of them started (``inf``: none runs)."""
        return min((run.started for run in self._runs.values()), default=math.inf)

    def admitted(self, by: float, shared_of: Callable[[int, float], float]) -> None:
        """The engine queues nothing: those started by ``by`` (the reading before) are in
        it, and hold all their links (the engine caches a prompt's blocks as it gives them
        out, before the prompt's pass). In the order they started, one counted whole that
        begins as one in before it holds is counted past their common blocks from now:
        ``shared_of(depth, prompt)``, the tokens of a ``prompt`` whose first ``depth``
        links are held that the engine shares (two sent together: the second finds the
        first's blocks)."""
        for run in self._runs.values():
            if run.started > by or run.holds is run.links:
                continue
            if not run.shared and (shared := shared_of(self.held.depth(run.links), run.prompt)):
                run.prompt -= shared
                run.shared = shared
                self.tokens[run.interactive] -= shared
                self.shared_prompts += shared
                if run.taken_in:
                    self.taken_in_prompts -= shared
            self.held.remove(run.holds)
            run.holds = run.links
            self.held.add(run.holds)

    def taken_in(self, by: float, now: float, rest: float, typical: float) -> float:
        """The prompt tokens of those the engine has taken in whole by ``now``: started by
        ``by`` (the reading before) and past their prompt's pass (``rest`` seconds, for a
        prompt of ``typical`` tokens or less, longer in proportion). They are marked so
        (:attr:`taken_in_prompts`)."""
        for run in self._runs.values():
            if run.taken_in or run.started > by:
                continue
            if run.started + rest * max(1.0, run.prompt / typical) <= now:
                run.taken_in = True
                self.taken_in_prompts += run.prompt
        return self.taken_in_prompts

    def last_interactive_start(self) -> float:
        """When the newest interactive request still running started (``-inf``: none)."""
        starts = (run.started for run in self._runs.values() if run.interactive)
        return max(starts, default=-math.inf)

    def final(self, block: int) -> float:
        """What they all hold when they end: never less than their peak (each of its
        terms is a ``size + left`` of a request still running)."""
        return self.tokens[True] + self.tokens[False] + block * len(self._runs)

    def ends(self, rate: float, now: float, rest: float = 0.0) -> tuple[float, float]:
        """(the earliest end, the mean run time) of the running requests, each running
        ``rest`` seconds beside decoding ``rate`` tokens a second until its answer ends:
        the predicted answer, or its ``max_tokens`` once it has run past that by ``now``
        (all that is known of a longer one; with none named, the default its price
        assumed, or now); with one running at least."""
        first, tokens = math.inf, 0.0
        for run in self._runs.values():
            start = run.started + rest
            answer = run.predicted
            if start + answer / rate <= now:
                answer = max(answer, run.budget)
            first = min(first, start + answer / rate)
            tokens += answer
        return first, rest + tokens / (rate * len(self._runs))

    def sizes(self, now: float, rate: float, block: int) -> list[tuple[float, float]]:
        """(size now, tokens still to come) of each, decoding ``rate`` tokens a second."""
        out = []
        for run in self._runs.values():
            generated = run.generated(now, rate)
            out.append((run.prompt + generated + block, run.predicted - generated))
        return out


def kv_peak(sizes: list[tuple[float, float]]) -> float:
    """The most KV tokens requests will hold at once, each ``(size now, tokens to come)``.

    Every running sequence gains one token per engine step until its answer ends, so
    just before request ``j`` ends the ones still running hold::

        sum(size_i for r_i >= r_j) + r_j x count(r_i >= r_j)

    and the peak is the largest of these (``sizes`` is sorted in place).
    """
    sizes.sort(key=lambda item: -item[1])
    peak = held = 0.0
    for count, (size, left) in enumerate(sizes, 1):
        held += size
        peak = max(peak, held + count * left)
    return peak


class InteractiveDemand:
    """The most KV tokens and sequences interactive work held at once over a window.

    A monotonic queue of ``(time, tokens, sequences)``: a note that holds at least as
    much in both drops the older ones it covers.
    """

    __slots__ = ("_notes", "window")

    def __init__(self, window: float) -> None:
        self.window = window
        self._notes: deque[tuple[float, float, int]] = deque()

    def note(self, now: float, tokens: float, seqs: int) -> None:
        """Interactive work holds ``tokens`` in ``seqs`` sequences from ``now``."""
        notes = self._notes
        while notes and notes[-1][1] <= tokens and notes[-1][2] <= seqs:
            notes.pop()
        notes.append((now, tokens, seqs))

    def peak(self, now: float) -> tuple[int, float]:
        """(sequences, tokens): the most held at once over the last ``window`` seconds."""
        notes = self._notes
        while notes and notes[0][0] < now - self.window:
            notes.popleft()
        return max((n[2] for n in notes), default=0), max((n[1] for n in notes), default=0.0)


class BatchPacing:
    """When the next batch request may start while interactive work is around (rule 4
    of :mod:`~herdless.gateway.core.sizing`).

    A batch start's prefill (thousands of tokens) stalls every running answer for an
    engine step. Started together, a cohort of them is prefilled in a row that every
    chat waits behind, and, ending together too, stays a cohort. So:

    - batch starts keep to a schedule of one per gap, the gap being ``PACE`` of the batch
      job's own (its run time over the most batch requests running lately); while no
      interactive request runs they may run up to ``AHEAD`` gaps ahead of it, and a
      pause saves at most that many (catching up after it), while one runs they keep
      to it;
    - a start that is due while interactive requests run waits for them if they all end
      within ``DEFER`` of their typical run time, never longer than that since it was
      due: a prefill then stalls fewer chats, and a start is never put off for long.
    """

    __slots__ = ("_due", "_next", "_until", "batch_run", "chat_run", "high")

    def __init__(self) -> None:
        self.batch_run: float | None = None
        """Average batch run time, seconds (``None`` before one ended)."""
        self.chat_run: float | None = None
        """Average interactive run time, seconds (``None`` before one ended)."""
        self.high = 0.0
        """The most batch requests running lately (faded by :meth:`fade`)."""
        self._next = -math.inf  # the next start on the schedule
        self._due: float | None = None  # when a start that is due was first put off
        self._until = -math.inf  # when the put-off start goes

    def _gap(self) -> float | None:
        return None if self.batch_run is None else PACE * self.batch_run / max(1.0, self.high)

    def next_start(self, chats: bool) -> float:
        """The earliest time the next batch request may start; ``chats``: an interactive
        request runs now. ``-inf`` before a batch run time is measured."""
        gap = self._gap()
        if not chats:
            return -math.inf if gap is None else self._next - AHEAD * gap
        ready = -math.inf if gap is None else self._next
        return ready if self._due is None else max(ready, self._until)

    def put_off(self, now: float, runs: Running) -> bool:
        """Whether a batch start that is due now waits for the running interactive
        requests (the deferral above)."""
        if not runs.seqs[True] or self.chat_run is None:
            return False
        if self._due is None:
            self._due = now
        longest = DEFER * self.chat_run
        ends = runs.last_interactive_start() + self.chat_run
        if ends - now > longest or now - self._due >= longest:
            return False
        self._until = min(ends, self._due + longest)
        return True

    def started(self, now: float, running_batch: int, *, chats: bool) -> None:
        """A batch request started; ``running_batch`` run now, with it; ``chats``: an
        interactive request runs."""
        gap = self._gap()
        if gap is not None:
            ahead = 0 if chats else AHEAD
            self._next = max(self._next, now - ahead * gap) + gap
        self._due = None
        self.high = max(self.high, float(running_batch))

    def ended(self, run: Run, now: float) -> None:
        """A request ended: its run time joins its class's average."""
        took = now - run.started
        old = self.chat_run if run.interactive else self.batch_run
        new = took if old is None else old + _EWMA * (took - old)
        if run.interactive:
            self.chat_run = new
        else:
            self.batch_run = new

    def fade(self, factor: float) -> None:
        """A reading passed: the most batch running lately fades by ``factor``."""
        self.high *= factor
