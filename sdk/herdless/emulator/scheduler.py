"""What one engine step runs: vLLM V1's scheduler, for one model on one GPU (pure, no time).

Read from vLLM 0.32's ``Scheduler.schedule`` (``vllm/v1/core/sched/scheduler.py``)
with its default FCFS policy, chunked prefill on (``SchedulerConfig.
enable_chunked_prefill = True``), its prefix cache when on (:mod:`.kvcache`) and no
speculative decoding or KV connector. Each step has one **token budget**,
``max_num_batched_tokens``, that decodes and prefill chunks share:

1. **Running sequences first, in the order they were admitted.** Each is given
   ``min(num_tokens - computed, budget left)`` tokens: one when it decodes, a chunk
   of its prompt while it prefills (a prompt longer than the budget is prefilled
   over several steps, and samples its first token at the end of the step that
   completes it). Its KV grows to ``computed + scheduled`` tokens, in blocks; when
   the free blocks do not cover that, the **newest running sequence is preempted**
   (its blocks freed, ``computed`` back to 0, put at the *front* of the waiting
   queue to be recomputed later, counted in ``vllm:num_preemptions_total``) until
   they do; if that sequence was the one asking, nothing more runs this step. With
   ``on_kv_exhausted="crash"`` the engine raises :class:`KVCacheExhausted` instead.
   The loop stops when the budget is spent.
2. **Then the waiting queue, first come first served**, only if nothing was
   preempted this step: while budget is left and fewer than ``max_num_seqs`` run,
   the head is admitted if its *whole* sequence so far (prompt plus tokens already
   generated) fits in the free blocks (vLLM's ``scheduler_reserve_full_isl``, on by
   default), past the leading blocks the prefix cache holds for it, and is scheduled
   a first chunk of what those leave, ``budget left`` at most. A head that does not
   fit stops the queue: no one overtakes it. A new request's tokens and those found
   are counted (``vllm:prefix_cache_queries_total``, ``..._hits_total``); one resumed
   after a preemption is not, as in vLLM.

A sequence holds KV from the step that admits it until it finishes, is aborted or
is preempted. vLLM would run an empty step after preempting every running
sequence and admit on the next; the emulator admits at once in that case (the same
instant on its timeline).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Literal

from herdless.emulator.kvcache import KVCache
from herdless.emulator.metrics import EngineMetrics
from herdless.emulator.sequence import SeqState, Sequence

__all__ = ["Batch", "KVCacheExhausted", "Scheduler"]


class KVCacheExhausted(RuntimeError):
    """Raised by a step when running sequences outgrow the KV cache in ``crash`` mode."""


@dataclass(frozen=True, slots=True)
class Batch:
    """What one step runs.

    Attributes:
        seqs: the sequences scheduled, each with its ``computed`` already advanced.
        prefill_tokens: scheduled tokens that are not a decode's one token (prompt
            chunks and recomputation after a preemption).
        tokens: every scheduled token (at most ``max_num_batched_tokens``).
    """

    seqs: tuple[Sequence, ...]
    prefill_tokens: int
    tokens: int


class Scheduler:
    """The waiting queue, the running set and their KV blocks (see the module docstring).

    Args:
        max_num_seqs: most sequences running at once.
        max_num_batched_tokens: the token budget of one step.
        kv: the KV cache the running sequences hold blocks of.
        on_kv_exhausted: ``"preempt"`` (vLLM) or ``"crash"``.
        metrics: where preemptions are counted.
    """

    __slots__ = (
        "_running",
        "_waiting",
        "kv",
        "max_num_batched_tokens",
        "max_num_seqs",
        "metrics",
        "num_waiting",
        "on_kv_exhausted",
    )

    def __init__(
        self,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        kv: KVCache,
        on_kv_exhausted: Literal["preempt", "crash"],
        metrics: EngineMetrics,
    ) -> None:
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.kv = kv
        self.on_kv_exhausted = on_kv_exhausted
        self.metrics = metrics
        # Admission order; the newest running sequence is the last key (preempted first).
        self._running: dict[Sequence, None] = {}
        # Aborted sequences stay in here, skipped when popped (removal would be O(n)).
        self._waiting: deque[Sequence] = deque()
        self.num_waiting = 0

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def has_work(self) -> bool:
        return bool(self._running) or self.num_waiting > 0

    def add(self, seq: Sequence) -> None:
        """Queue ``seq`` at the back (the waiting queue is unbounded, as in vLLM)."""
        self._waiting.append(seq)
        self.num_waiting += 1

    def remove(self, seq: Sequence) -> None:
        """Take ``seq`` out (finished or aborted): free its blocks if it runs."""
        if seq.state is SeqState.RUNNING:
            del self._running[seq]
            self.kv.release(seq)
        elif seq.state is SeqState.WAITING:
            self.num_waiting -= 1  # the deque entry is dropped when it reaches the head

    def peek_waiting(self) -> Sequence | None:
        """The head of the waiting queue, or ``None``."""
        while self._waiting and self._waiting[0].state is not SeqState.WAITING:
            self._waiting.popleft()  # drop aborted entries lazily
        return self._waiting[0] if self._waiting else None

    def schedule(self, start: float) -> Batch | None:
        """The batch of a step starting at ``start``, or ``None`` when nothing can run.

        Raises:
            KVCacheExhausted: in ``crash`` mode, when a running sequence needs a block
                that is not free.
        """
        budget = self.max_num_batched_tokens
        seqs: list[Sequence] = []
        prefill = 0
        preempted = False

        # 1. The running sequences, oldest first. (The hot loop: one pass per step over
        # every running sequence, so the decode case is written out inline.)
        block_size = self.kv.block_size
        for seq in list(self._running):
            if budget == 0:
                break
            if seq.state is not SeqState.RUNNING:
                break  # preempted to make room for one ahead of it; so are all after it
            computed = seq.computed
            left = seq.prompt_tokens + seq.generated - computed
            decode = left == 1 and seq.generated > 0  # feeds back its last sampled token
            new = min(left, budget)
            # A new block only when the tokens outgrow the blocks held (1 step in 16).
            if computed + new > seq.blocks * block_size:
                room = self._make_room(seq, computed + new)
                preempted = preempted or room != "free"
                if room == "self":
                    break  # it preempted itself: nothing more runs this step (vLLM's `break`)
            seq.computed = computed + new
            seqs.append(seq)
            if not decode:
                prefill += new
                if seq.shared < len(seq.hashes):
                    self.kv.cache(seq, computed + new)
            budget -= new

        # 2. The waiting queue, first come first served (not after a preemption: that
        # would thrash; unless nothing runs any more).
        if not preempted or not seqs:
            while budget > 0 and len(self._running) < self.max_num_seqs:
                head = self.peek_waiting()
                if head is None or head.arrival > start:
                    break
                found = self.kv.admit(head)
                if found is None:
                    break
                self._waiting.popleft()
                self.num_waiting -= 1
                head.state = SeqState.RUNNING
                if head.scheduled_at is None:
                    head.scheduled_at = start
                self._running[head] = None
                if not head.resumed:
                    self.metrics.prefix_queries += head.num_tokens
                    self.metrics.prefix_hits += found
                new = min(head.num_tokens - found, budget)
                self.kv.grow(head, found + new)  # fits: admit() checked its whole sequence
                head.computed = found + new  # all prefill: its prompt (and tokens, if resumed)
                self.kv.cache(head, found + new)
                seqs.append(head)
                prefill += new
                budget -= new

        if not seqs:
            return None
        return Batch(tuple(seqs), prefill, self.max_num_batched_tokens - budget)

    def _make_room(self, seq: Sequence, tokens: int) -> Literal["free", "preempted", "self"]:
        """Grow ``seq``'s blocks to ``tokens`` tokens, preempting the newest running
        sequences while the free blocks do not cover them.

        Returns:
            ``"free"`` when they did at once; ``"preempted"`` when they did once newer
            sequences were preempted; ``"self"`` when ``seq``, the newest, was preempted.

        Raises:
            KVCacheExhausted: in ``crash`` mode, instead of preempting.
        """
        room: Literal["free", "preempted", "self"] = "free"
        while not self.kv.grow(seq, tokens):
            if self.on_kv_exhausted == "crash":
                raise KVCacheExhausted(
                    f"KV cache exhausted: {self.kv.used} of {self.kv.num_blocks} blocks "
                    f"held by {len(self._running)} sequences"
                )
            victim = next(reversed(self._running))
            self._preempt(victim)
            if victim is seq:
                return "self"
            room = "preempted"
        return room

    def _preempt(self, seq: Sequence) -> None:
        del self._running[seq]
        self.kv.release(seq)
        seq.computed = 0  # recomputed from scratch: prompt plus what it had generated
        seq.resumed = True
        seq.state = SeqState.WAITING
        self._waiting.appendleft(seq)
        self.num_waiting += 1
        self.metrics.preemptions += 1
