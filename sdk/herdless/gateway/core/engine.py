"""What the gateway knows of the engine behind it (pure, no I/O): a reading of its
metrics, the requests it runs there and their KV peak, and the interactive demand it saw.

The sizing rule (:mod:`herdless.gateway.core.sizing`) decides with these.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

__all__ = ["InteractiveDemand", "Reading", "Run", "Running", "kv_peak"]


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
    """

    at: float
    kv_capacity: int | None = None
    block_size: int | None = None
    kv_usage: float | None = None
    running: int | None = None
    waiting: int | None = None
    preemptions: int | None = None
    generation_tokens: int | None = None

    @property
    def sizable(self) -> bool:
        """Whether it holds what self-sizing needs: the capacity and the KV use."""
        return self.kv_capacity is not None and self.kv_usage is not None


@dataclass(slots=True)
class Run:
    """One request the gateway started, as the KV account sees it (tokens, seconds)."""

    prompt: float  # calibrated prompt tokens
    predicted: float  # predicted answer tokens
    started: float
    interactive: bool

    def final(self, block: int) -> float:
        """What it holds when it ends: prompt, answer and a partly filled block."""
        return self.prompt + self.predicted + block


class Running:
    """The requests the gateway runs, with each class's count and final sizes kept as
    they start and end: the hot path reads these totals, it never sums them."""

    __slots__ = ("_runs", "seqs", "tokens")

    def __init__(self) -> None:
        self._runs: dict[int, Run] = {}
        self.seqs = {True: 0, False: 0}
        """Requests running, per class (interactive?)."""
        self.tokens = {True: 0.0, False: 0.0}
        """Their prompts and predicted answers, per class (interactive?)."""

    def __len__(self) -> int:
        return len(self._runs)

    def add(self, key: int, run: Run) -> None:
        self._runs[key] = run
        self.seqs[run.interactive] += 1
        self.tokens[run.interactive] += run.prompt + run.predicted

    def pop(self, key: int) -> Run | None:
        run = self._runs.pop(key, None)
        if run is not None:
            self.seqs[run.interactive] -= 1
            self.tokens[run.interactive] -= run.prompt + run.predicted
        return run

    def final(self, block: int) -> float:
        """What they all hold when they end: never less than their peak (each of its
        terms is a ``size + left`` of a request still running)."""
        return self.tokens[True] + self.tokens[False] + block * len(self._runs)

    def sizes(self, now: float, rate: float, block: int) -> list[tuple[float, float]]:
        """(size now, tokens still to come) of each, decoding ``rate`` tokens a second."""
        out = []
        for run in self._runs.values():
            generated = min(max(0.0, run.predicted - 1), (now - run.started) * rate)
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
