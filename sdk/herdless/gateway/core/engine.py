"""What the gateway knows of the engine behind it (pure, no I/O): a reading of its
metrics, the KV peak of the requests it runs, and the interactive demand it saw.

The sizing rule (:mod:`herdless.gateway.core.sizing`) decides with these.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

__all__ = ["InteractiveDemand", "Reading", "kv_peak"]


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
