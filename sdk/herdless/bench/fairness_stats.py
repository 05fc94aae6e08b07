"""What the ``fairness`` scenarios measure, from the clients' own records (pure).

Every call the load generator makes is a :class:`CallRecord`: who sent it, when, when
its answer came, and the usage vLLM reported. The GPU's work is not visible from the
client while it happens, so a call's tokens are spread evenly over the time it ran,
estimated as the end of the call less ``completion_tokens x step`` (the emulator's
step time, known from its settings), and never before the call was sent. The
figures:

- **service**: ``prompt_weight x prompt + completion_weight x completion`` tokens per
  user within an interval (the gateway's definition of service, weights 1 and 2);
- **throughput**: completion tokens per second within an interval (the GPU's work);
- **Jain per window**: for each window, Jain's index over the service of the users
  that were *backlogged throughout it* (a call of theirs outstanding at every instant
  of it): a user who asks for little is not counted as starved.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from herdless.gateway.core.service import jain_index

__all__ = [
    "CallRecord",
    "FairnessParams",
    "backlogged_throughout",
    "cumulative_service",
    "service",
    "throughput",
    "window_jain",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class FairnessParams:
    """Sizes of the fairness scenarios (bounded: each run lasts ``warmup + seconds``).

    Attributes:
        slots: the emulator's ``max_num_seqs`` and the gateway's ``max_concurrency``.
        queue: the gateway's ``max_queue``.
        speed: the emulator's time scale.
        warmup: seconds of each run not measured.
        seconds: seconds measured per run.
        window: seconds per window of the Jain index.
        long_tokens: answer length of the heavy user (scenario 1).
        short_tokens: answer length of the light user (scenario 1).
        backlog: calls each user of scenario 1 keeps outstanding.
        users: interactive users (scenarios 2 and 3).
        think: mean think time between two chats of a user, seconds.
        chat_tokens: answer lengths of the chats, drawn per chat.
        batch_tokens: answer length of the batch user's calls.
        batch_calls: calls the batch user keeps outstanding.
        repeats: interleaved repetitions of every arm.
        seed: first seed (repetition ``r`` uses ``seed + r``; the same in every arm).
    """

    slots: int = 8
    queue: int = 32
    speed: float = 2.0
    warmup: float = 5.0
    seconds: float = 30.0
    window: float = 10.0
    long_tokens: int = 512
    short_tokens: int = 64
    backlog: int = 16
    users: int = 20
    think: float = 3.0
    chat_tokens: tuple[int, ...] = (32, 64, 96, 128)
    batch_tokens: int = 256
    batch_calls: int = 40
    repeats: int = 1
    seed: int = 1

    @property
    def step(self) -> float:
        """Seconds per token of one sequence in a full batch (the emulator's defaults)."""
        return (0.012 + 0.000_12 * self.slots) / self.speed

    @property
    def end(self) -> float:
        """When the measured interval ends, seconds from the run's start."""
        return self.warmup + self.seconds

    @property
    def stop(self) -> float:
        """When the run stops: the load goes on past ``end`` for twice the longest
        answer, so that the calls running at ``end`` finish and count (a call cut off
        would take its share of the interval with it, and the longest calls most)."""
        longest = max(self.long_tokens, self.batch_tokens, *self.chat_tokens)
        return self.end + 2 * longest * self.step


@dataclass(frozen=True, slots=True, kw_only=True)
class CallRecord:
    """One call as its client saw it (times in seconds from the run's start).

    Attributes:
        user: who sent it.
        sent: when it was sent (the first attempt).
        ended: when its answer came, or ``None`` (unfinished, failed).
        prompt: prompt tokens vLLM reported (0 when unknown).
        completion: completion tokens vLLM reported (0 when unknown).
        ok: whether it was answered.
        backend: the backend that answered (``None`` when not).
    """

    user: str
    sent: float
    ended: float | None
    prompt: int = 0
    completion: int = 0
    ok: bool = True
    backend: str | None = None

    def ran(self, step: float) -> tuple[float, float] | None:
        """The interval the call ran on the GPU (estimated), or ``None`` if unanswered."""
        if self.ended is None or not self.ok:
            return None
        return max(self.sent, self.ended - self.completion * step), self.ended


def _overlap(interval: tuple[float, float], start: float, end: float) -> float:
    """The share of ``interval`` inside ``[start, end)`` (a zero-length one: 0 or 1)."""
    low, high = interval
    if high <= low:
        return 1.0 if start <= high < end else 0.0
    return max(0.0, min(high, end) - max(low, start)) / (high - low)


def service(
    calls: Iterable[CallRecord],
    *,
    start: float,
    end: float,
    step: float,
    weights: tuple[float, float] = (1.0, 2.0),
) -> dict[str, float]:
    """Weighted tokens served per user within ``[start, end)``."""
    served: dict[str, float] = {}
    for call in calls:
        ran = call.ran(step)
        if ran is None:
            continue
        share = _overlap(ran, start, end)
        if share:
            tokens = weights[0] * call.prompt + weights[1] * call.completion
            served[call.user] = served.get(call.user, 0.0) + share * tokens
    return served


def throughput(calls: Iterable[CallRecord], *, start: float, end: float, step: float) -> float:
    """Completion tokens per second served within ``[start, end)``."""
    total = 0.0
    for call in calls:
        ran = call.ran(step)
        if ran is not None:
            total += _overlap(ran, start, end) * call.completion
    return total / (end - start)


def backlogged_throughout(
    calls: Iterable[CallRecord], *, start: float, end: float, stop: float
) -> set[str]:
    """The users with a call outstanding at every instant of ``[start, end)``; a call
    never answered counts as outstanding until ``stop`` (the end of the run)."""
    spans: dict[str, list[tuple[float, float]]] = {}
    for call in calls:
        until = stop if call.ended is None else call.ended
        spans.setdefault(call.user, []).append((call.sent, until))
    covered = set()
    for user, intervals in spans.items():
        reach = start
        for low, high in sorted(intervals):
            if low > reach:
                break
            reach = max(reach, high)
            if reach >= end:
                covered.add(user)
                break
    return covered


def window_jain(
    calls: Sequence[CallRecord],
    *,
    start: float,
    end: float,
    window: float,
    step: float,
    stop: float,
) -> list[tuple[float, int]]:
    """Per whole window in ``[start, end)``: (Jain's index over the users backlogged
    throughout it, how many they were)."""
    results = []
    count = math.floor((end - start) / window + 1e-9)
    for index in range(count):
        low = start + index * window
        high = low + window
        users = backlogged_throughout(calls, start=low, end=high, stop=stop)
        served = service(calls, start=low, end=high, step=step)
        results.append((jain_index([served.get(user, 0.0) for user in users]), len(users)))
    return results


def cumulative_service(
    calls: Iterable[CallRecord], *, step: float, until: float, bin_width: float = 1.0
) -> dict[str, list[float]]:
    """Per user, the weighted tokens served up to the end of each bin (for plots)."""
    bins = math.ceil(until / bin_width)
    per_bin: dict[str, list[float]] = {}
    for call in calls:
        ran = call.ran(step)
        if ran is None:
            continue
        tokens = call.prompt + 2.0 * call.completion
        row = per_bin.setdefault(call.user, [0.0] * bins)
        first = max(0, math.floor(ran[0] / bin_width))
        last = min(bins - 1, math.floor(ran[1] / bin_width))
        for index in range(first, last + 1):
            row[index] += tokens * _overlap(ran, index * bin_width, (index + 1) * bin_width)
    totals = {}
    for user, row in per_bin.items():
        running = 0.0
        totals[user] = [running := running + value for value in row]
    return totals
