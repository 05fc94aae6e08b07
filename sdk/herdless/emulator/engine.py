"""The emulated GPU: a continuous-batching scheduler and its timing model (pure, no I/O).

The engine never reads a clock and never sleeps: its driver passes ``now`` (in
seconds, any monotonic origin) to :meth:`Engine.add`, :meth:`Engine.abort` and
:meth:`Engine.advance`, and asks :meth:`Engine.next_deadline` when to call again.
Tests drive it with a fake clock; the asyncio driver (``driver.py``) sets one
timer at the deadline.

**Scheduling** (as vLLM's scheduler does it, simplified). The engine runs one
*step* at a time. At the start of a step:

1. every running sequence needs one more KV slot for its next token; while
   they do not all fit in ``kv_cache_tokens``, the most recently admitted running
   sequence is *preempted*: its KV is freed and it goes back to the front of the
   waiting queue, to be recomputed later (prompt plus what it already generated),
   and ``num_preemptions`` counts it. With ``on_kv_exhausted="crash"`` the
   engine raises :class:`KVCacheExhausted` instead, as a GPU server without
   admission control would die;
2. if nothing was preempted, waiting sequences are admitted first-come
   first-served while fewer than ``max_num_seqs`` run and their prompt (plus
   tokens already generated) plus one fits in the free KV;
3. every sequence in the batch produces one token when the step ends (an
   admitted one after its prefill, in the same step).

A sequence holds ``prompt_tokens + generated`` KV tokens while it runs; aborting
or finishing frees them at once.

**Timing model.** A step that runs ``n`` sequences and prefills ``P`` tokens
lasts::

    step_time = (decode_base + decode_per_seq * n + P / prefill_tokens_per_s) / speed

so one sequence's speed (one token per step) falls as the batch grows while the
total throughput ``n / step_time`` rises and saturates at
``speed / decode_per_seq``. Defaults resemble a Llama-3-8B-class model in bf16 on
one 80 GB data-centre GPU: 12 ms per step alone (about 80 tokens/s for one
stream), 0.12 ms more per running sequence (a batch of 256 steps in 43 ms, about
6,000 tokens/s in total), prefill at 16,000 tokens/s, and 400,000 tokens of KV.

**Late wake-ups.** Steps are laid end to end on the emulated timeline: if the
driver wakes late, :meth:`Engine.advance` runs every overdue step at once (a
sequence then receives several tokens in one wake) so that a busy event loop
does not slow the emulated GPU down; more than ``max_lag`` seconds of backlog
is dropped rather than replayed in a burst.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass
from typing import Literal

from herdless.emulator.metrics import EngineMetrics

__all__ = [
    "Engine",
    "EngineConfig",
    "FinishReason",
    "KVCacheExhausted",
    "SeqState",
    "Sequence",
]

FinishReason = Literal["stop", "length", "abort"]


class KVCacheExhausted(RuntimeError):
    """Raised by a step when running sequences outgrow the KV cache in ``crash`` mode."""


class SeqState(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """The emulated GPU's capacity and speed. Times in seconds, before ``speed``.

    Args:
        max_num_seqs: most sequences in one batch.
        kv_cache_tokens: KV-cache size in tokens, shared by the running sequences.
        decode_base: seconds of a step, whatever its batch.
        decode_per_seq: seconds added to a step per sequence in its batch.
        prefill_tokens_per_s: prompt tokens prefilled per second.
        speed: time scale; 10 makes every step ten times shorter.
        on_kv_exhausted: ``"preempt"`` (vLLM's behaviour) or ``"crash"``.
        max_lag: seconds of backlog replayed after a late wake-up.
    """

    max_num_seqs: int = 256
    kv_cache_tokens: int = 400_000
    decode_base: float = 0.012
    decode_per_seq: float = 0.000_12
    prefill_tokens_per_s: float = 16_000.0
    speed: float = 1.0
    on_kv_exhausted: Literal["preempt", "crash"] = "preempt"
    max_lag: float = 0.25

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "kv_cache_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        for name in ("decode_base", "decode_per_seq", "max_lag"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        for name in ("prefill_tokens_per_s", "speed"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.on_kv_exhausted not in ("preempt", "crash"):
            raise ValueError(
                f"on_kv_exhausted must be 'preempt' or 'crash', got {self.on_kv_exhausted!r}"
            )

    def step_time(self, batch: int, prefill_tokens: int) -> float:
        """Seconds of one step (the formula in the module docstring)."""
        work = self.decode_base + self.decode_per_seq * batch
        return (work + prefill_tokens / self.prefill_tokens_per_s) / self.speed


class Sequence:
    """One request's generation, shared by the engine (writer) and its stream (reader).

    Args:
        prompt_tokens: tokens of the prompt.
        max_tokens: most tokens to generate (EOS included).
        content_tokens: tokens before EOS, or ``None`` to ignore EOS.
        arrival: ``now`` when it was submitted.
    """

    __slots__ = (
        "arrival",
        "content_tokens",
        "finish_reason",
        "finished_at",
        "first_token_at",
        "generated",
        "max_tokens",
        "prompt_tokens",
        "state",
        "waiter",
        "wake_at",
    )

    def __init__(
        self, *, prompt_tokens: int, max_tokens: int, content_tokens: int | None, arrival: float
    ) -> None:
        if prompt_tokens < 1 or max_tokens < 1:
            raise ValueError("prompt_tokens and max_tokens must be >= 1")
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.content_tokens = content_tokens
        self.arrival = arrival
        self.generated = 0
        self.state = SeqState.WAITING
        self.finish_reason: FinishReason | None = None
        self.first_token_at: float | None = None
        self.finished_at: float | None = None
        # The driver's wake-up handle for the stream reading this sequence, and the token
        # count at which to use it (opaque here).
        self.waiter: object = None
        self.wake_at = 1

    @property
    def kv_tokens(self) -> int:
        """KV tokens this sequence holds while it runs."""
        return self.prompt_tokens + self.generated

    @property
    def text_tokens(self) -> int:
        """Generated tokens that carry text (the EOS token carries none)."""
        if self.content_tokens is None:
            return self.generated
        return min(self.generated, self.content_tokens)

    def __repr__(self) -> str:
        return (
            f"Sequence(state={self.state.value}, prompt={self.prompt_tokens}, "
            f"generated={self.generated}/{self.max_tokens}, finish={self.finish_reason})"
        )


class _Step:
    __slots__ = ("batch", "end", "start")

    def __init__(self, start: float, end: float, batch: list[Sequence]) -> None:
        self.start = start
        self.end = end
        self.batch = batch


class Engine:
    """The scheduler and timing model described in the module docstring.

    Usage (with any monotonic ``now``)::

        engine = Engine(EngineConfig(max_num_seqs=8))
        seq = Sequence(prompt_tokens=20, max_tokens=5, content_tokens=None, arrival=0.0)
        engine.add(seq, now=0.0)
        progressed = engine.advance(now=1.0)  # the sequences that got tokens
        engine.next_deadline()                # when to call advance again, or None
    """

    __slots__ = ("_free_at", "_kv_used", "_running", "_step", "_waiting", "config", "metrics")

    def __init__(self, config: EngineConfig | None = None) -> None:
        self.config = config or EngineConfig()
        self.metrics = EngineMetrics()
        # Admission order; the newest running sequence is the last key (preempted first).
        self._running: dict[Sequence, None] = {}
        # Aborted sequences stay in here, skipped when popped (removal would be O(n)).
        self._waiting: deque[Sequence] = deque()
        self._kv_used = 0
        self._step: _Step | None = None
        self._free_at = float("-inf")

    # -- what the driver calls ---------------------------------------------------------

    def add(self, seq: Sequence, now: float) -> None:
        """Queue ``seq`` (waiting queue is unbounded, as in vLLM)."""
        del now  # the arrival time is on the sequence; kept for a uniform driver API
        if seq.prompt_tokens + 1 > self.config.kv_cache_tokens:
            raise ValueError("prompt does not fit in the KV cache")
        self._waiting.append(seq)
        self.metrics.waiting += 1

    def abort(self, seq: Sequence, now: float) -> None:
        """Stop ``seq`` now (client gone) and free its KV at once. Idempotent."""
        if seq.state is SeqState.FINISHED:
            return
        if seq.state is SeqState.RUNNING:
            self._release(seq)
        else:
            self.metrics.waiting -= 1
        self._finish(seq, "abort", now)

    def advance(self, now: float) -> list[Sequence]:
        """Run every step that has ended by ``now``; return the sequences that progressed.

        Raises:
            KVCacheExhausted: in ``crash`` mode, when the running sequences outgrow the KV.
        """
        progressed: dict[Sequence, None] = {}
        while True:
            if self._step is None:
                if not self._running and self.metrics.waiting == 0:
                    break
                self._start_step(now)
                if self._step is None:  # pragma: no cover -- kv >= one prompt is validated
                    break
            step = self._step
            if step.end > now:
                break
            self._step = None
            self._end_step(step, progressed)
        return list(progressed)

    def next_deadline(self) -> float | None:
        """When the step in flight ends (call :meth:`advance` then), or ``None`` when idle."""
        return None if self._step is None else self._step.end

    # -- observation -------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return self.metrics.waiting

    @property
    def kv_used(self) -> int:
        """KV tokens held by the running sequences."""
        return self._kv_used

    def kv_usage(self) -> float:
        """Fraction of the KV cache in use, 0 to 1."""
        return self._kv_used / self.config.kv_cache_tokens

    # -- internals ---------------------------------------------------------------------

    def _start_step(self, now: float) -> None:
        cfg = self.config
        # Steps chain end to end while there is work; an idle engine starts when the
        # first waiting sequence arrived. Never replay more than max_lag of backlog.
        start = self._free_at
        if not self._running:
            head = self._peek_waiting()
            if head is not None:
                start = max(start, head.arrival)
        start = max(start, now - cfg.max_lag)

        preempted = False
        # 1. Each running sequence needs one more slot for the token this step makes.
        while self._running and self._kv_used + len(self._running) > cfg.kv_cache_tokens:
            if cfg.on_kv_exhausted == "crash":
                raise KVCacheExhausted(
                    f"KV cache exhausted: {self._kv_used} of {cfg.kv_cache_tokens} tokens used "
                    f"by {len(self._running)} sequences"
                )
            self._preempt(next(reversed(self._running)))
            preempted = True

        # 2. Admit waiting sequences (not when we just preempted: that would thrash).
        prefill = 0
        batch = list(self._running)
        if not preempted:
            free = cfg.kv_cache_tokens - self._kv_used - len(self._running)
            while len(self._running) < cfg.max_num_seqs:
                head = self._peek_waiting()
                if head is None or head.arrival > start or head.kv_tokens + 1 > free:
                    break
                self._waiting.popleft()
                self.metrics.waiting -= 1
                if head.generated == 0:
                    self.metrics.prompt_tokens += head.prompt_tokens
                head.state = SeqState.RUNNING
                self._running[head] = None
                self._kv_used += head.kv_tokens
                free -= head.kv_tokens + 1
                prefill += head.kv_tokens
                batch.append(head)
        if not batch:
            return
        self._step = _Step(start, start + cfg.step_time(len(batch), prefill), batch)

    def _end_step(self, step: _Step, progressed: dict[Sequence, None]) -> None:
        self._free_at = step.end
        made = 0
        for seq in step.batch:
            if seq.state is not SeqState.RUNNING:  # aborted or preempted during the step
                continue
            seq.generated += 1
            self._kv_used += 1
            made += 1
            if seq.first_token_at is None:
                seq.first_token_at = step.end
                self.metrics.ttft.observe(step.end - seq.arrival)
            if seq.content_tokens is not None and seq.generated > seq.content_tokens:
                self._release(seq)
                self._finish(seq, "stop", step.end)
            elif seq.generated >= seq.max_tokens:
                self._release(seq)
                self._finish(seq, "length", step.end)
            progressed[seq] = None
        self.metrics.generation_tokens += made
        # Every token of this step took one step to come: that is the inter-token latency.
        self.metrics.itl.observe(step.end - step.start, made)

    def _peek_waiting(self) -> Sequence | None:
        while self._waiting and self._waiting[0].state is not SeqState.WAITING:
            self._waiting.popleft()  # drop aborted entries lazily
        return self._waiting[0] if self._waiting else None

    def _preempt(self, seq: Sequence) -> None:
        self._release(seq)
        seq.state = SeqState.WAITING
        self._waiting.appendleft(seq)
        self.metrics.waiting += 1
        self.metrics.preemptions += 1

    def _release(self, seq: Sequence) -> None:
        del self._running[seq]
        self._kv_used -= seq.kv_tokens

    def _finish(self, seq: Sequence, reason: FinishReason, now: float) -> None:
        seq.state = SeqState.FINISHED
        seq.finish_reason = reason
        seq.finished_at = now
        if reason != "abort":  # vLLM 0.32 counts an aborted request nowhere
            self.metrics.finished[reason] += 1
            self.metrics.e2e.observe(now - seq.arrival)
