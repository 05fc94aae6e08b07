"""The emulated GPU: steps of vLLM V1's scheduler laid on a timeline (pure, no I/O).

The engine never reads a clock and never sleeps: its driver passes ``now`` (in
seconds, any monotonic origin) to :meth:`Engine.add`, :meth:`Engine.abort` and
:meth:`Engine.advance`, and asks :meth:`Engine.next_deadline` when to call again.
Tests drive it with a fake clock; the asyncio driver (``driver.py``) sets one
timer at the deadline.

**Scheduling** is ``scheduler.py``'s (vLLM V1's, read from vLLM 0.32): one token
budget per step, ``max_num_batched_tokens``, shared by the running sequences'
decodes (one token each) and prefill chunks; long prompts are prefilled over
several steps (chunked prefill); KV is held in blocks of ``block_size`` tokens and
a running sequence that needs a block when none is free preempts the newest one;
the waiting queue is served first come first served. A sequence samples a token
at the end of each step that leaves its KV complete (``computed == num_tokens``):
every step while it decodes, and at the end of the step that completes its
prefill.

**Timing model.** A step that runs ``n`` sequences and prefills ``P`` tokens (the
scheduled tokens that are not a decode's one, so ``P <= max_num_batched_tokens``)
lasts::

    step_time = (decode_base + decode_per_seq * n + P / prefill_tokens_per_s) / speed

so one sequence's speed (one token per step) falls as the batch grows while the
total throughput ``n / step_time`` rises and saturates at
``speed / decode_per_seq``, and a step that carries a prefill chunk is longer for
every sequence decoding in it (the chunk's tokens share its budget). Defaults
resemble a Llama-3-8B-class model in bf16 on one 80 GB data-centre GPU: 12 ms per
step alone (about 80 tokens/s for one stream), 0.12 ms more per running sequence
(a batch of 256 steps in 43 ms, about 6,000 tokens/s in total), prefill at 16,000
tokens/s (a full 8,192-token budget of prefill adds 0.51 s to its step), and
400,000 tokens of KV.

**Late wake-ups.** Steps are laid end to end on the emulated timeline: if the
driver wakes late, :meth:`Engine.advance` runs every overdue step at once (a
sequence then receives several tokens in one wake) so that a busy event loop
does not slow the emulated GPU down; more than ``max_lag`` seconds of backlog
is dropped rather than replayed in a burst.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from herdless._bounds import require
from herdless.emulator.kvcache import KVCache
from herdless.emulator.metrics import EngineMetrics
from herdless.emulator.scheduler import KVCacheExhausted, Scheduler
from herdless.emulator.sequence import FinishReason, SeqState, Sequence

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_MAX_NUM_BATCHED_TOKENS",
    "Engine",
    "EngineConfig",
    "FinishReason",
    "KVCacheExhausted",
    "SeqState",
    "Sequence",
]

DEFAULT_BLOCK_SIZE = 16
"""vLLM's KV block size when ``--block-size`` is not given: ``CacheConfig.
DEFAULT_BLOCK_SIZE = 16`` in vLLM 0.32's ``vllm/config/cache.py``."""

DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
"""vLLM 0.32's token budget per step for the OpenAI API server on a large GPU.

``EngineArgs.get_batch_defaults`` (``vllm/engine/arg_utils.py``) picks it by device
memory and usage context: on a GPU of at least 70 GiB that is not an A100 (H100,
H200) it is 8,192 for ``UsageContext.OPENAI_API_SERVER`` (16,384 for the offline
``LLM`` class); at 160 GiB and more (B200) 16,384 for both; on other GPUs (A100
included) 2,048 for the server (``SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS``,
also the fallback); on CPU 2,048 per tensor-parallel rank. Chunked prefill is on by
default (``SchedulerConfig.enable_chunked_prefill = True``, ``vllm/config/
scheduler.py``). The same table sets ``max_num_seqs`` to 1,024 on H100/H200 and 256
on the others; the emulator keeps 256, the figure its benchmarks are measured with.
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """The emulated GPU's capacity and speed. Times in seconds, before ``speed``.

    Args:
        max_num_seqs: most sequences in one batch.
        max_num_batched_tokens: token budget of one step, shared by decodes and
            prefill chunks (vLLM's flag); at least ``max_num_seqs``, as vLLM requires.
        kv_cache_tokens: KV-cache size in tokens; ``kv_cache_tokens // block_size``
            blocks (vLLM's ``num_gpu_blocks``) are lent to the running sequences.
        block_size: tokens per KV block.
        decode_base: seconds of a step, whatever its batch.
        decode_per_seq: seconds added to a step per sequence in its batch.
        prefill_tokens_per_s: prompt tokens prefilled per second.
        speed: time scale; 10 makes every step ten times shorter.
        on_kv_exhausted: ``"preempt"`` (vLLM's behaviour) or ``"crash"``.
        enable_prefix_caching: share the KV blocks of prompts that begin alike, as
            vLLM's prefix cache does (:mod:`.kvcache`).
        max_lag: seconds of backlog replayed after a late wake-up.
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    kv_cache_tokens: int = 400_000
    block_size: int = DEFAULT_BLOCK_SIZE
    decode_base: float = 0.012
    decode_per_seq: float = 0.000_12
    prefill_tokens_per_s: float = 16_000.0
    speed: float = 1.0
    on_kv_exhausted: Literal["preempt", "crash"] = "preempt"
    enable_prefix_caching: bool = False
    max_lag: float = 0.25

    def __post_init__(self) -> None:
        counts = ("max_num_seqs", "max_num_batched_tokens", "kv_cache_tokens", "block_size")
        require(self, ">= 1", *counts)
        require(self, ">= 0", "decode_base", "decode_per_seq", "max_lag")
        require(self, "> 0", "prefill_tokens_per_s", "speed")
        if self.on_kv_exhausted not in ("preempt", "crash"):
            raise ValueError(
                f"on_kv_exhausted must be 'preempt' or 'crash', got {self.on_kv_exhausted!r}"
            )
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(  # vLLM's SchedulerConfig refuses it too
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"max_num_seqs ({self.max_num_seqs})"
            )
        if self.num_gpu_blocks < 1:
            raise ValueError(
                f"kv_cache_tokens ({self.kv_cache_tokens}) must hold one block "
                f"of block_size ({self.block_size})"
            )

    @property
    def num_gpu_blocks(self) -> int:
        """KV blocks: ``kv_cache_tokens // block_size`` (what ``cache_config_info`` says)."""
        return self.kv_cache_tokens // self.block_size

    def step_time(self, batch: int, prefill_tokens: int) -> float:
        """Seconds of one step (the formula in the module docstring)."""
        work = self.decode_base + self.decode_per_seq * batch
        return (work + prefill_tokens / self.prefill_tokens_per_s) / self.speed


class _Step:
    __slots__ = ("batch", "end", "start")

    def __init__(self, start: float, end: float, batch: tuple[Sequence, ...]) -> None:
        self.start = start
        self.end = end
        self.batch = batch


class Engine:
    """The scheduler on a timeline, as described in the module docstring.

    Usage (with any monotonic ``now``)::

        engine = Engine(EngineConfig(max_num_seqs=8))
        seq = Sequence(prompt_tokens=20, max_tokens=5, content_tokens=None, arrival=0.0)
        engine.add(seq, now=0.0)
        progressed = engine.advance(now=1.0)  # the sequences that got tokens
        engine.next_deadline()                # when to call advance again, or None
    """

    __slots__ = ("_free_at", "_step", "config", "kv", "metrics", "scheduler")

    def __init__(self, config: EngineConfig | None = None) -> None:
        self.config = cfg = config or EngineConfig()
        self.metrics = EngineMetrics()
        self.kv = KVCache(cfg.num_gpu_blocks, cfg.block_size)
        self.scheduler = Scheduler(
            max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            kv=self.kv,
            on_kv_exhausted=cfg.on_kv_exhausted,
            metrics=self.metrics,
        )
        self._step: _Step | None = None
        self._free_at = float("-inf")

    # -- what the driver calls ---------------------------------------------------------

    def add(self, seq: Sequence, now: float) -> None:
        """Queue ``seq`` (waiting queue is unbounded, as in vLLM).

        Raises:
            ValueError: when ``seq`` could not finish even alone in the KV cache (its
                prompt plus ``max_tokens``; the server's ``max_model_len`` check comes
                first, as vLLM's does).
        """
        del now  # the arrival time is on the sequence; kept for a uniform driver API
        # The last sampled token's KV is never written: prompt + max_tokens - 1 at most.
        if self.kv.blocks_for(seq.prompt_tokens + seq.max_tokens - 1) > self.kv.num_blocks:
            raise ValueError("the sequence (prompt plus max_tokens) does not fit in the KV cache")
        self.scheduler.add(seq)

    def abort(self, seq: Sequence, now: float) -> None:
        """Stop ``seq`` now (client gone) and free its KV at once. Idempotent."""
        if seq.state is SeqState.FINISHED:
            return
        self.scheduler.remove(seq)
        self._finish(seq, "abort", now)

    def advance(self, now: float) -> list[Sequence]:
        """Run every step that has ended by ``now``; return the sequences that progressed.

        Raises:
            KVCacheExhausted: in ``crash`` mode, when the running sequences outgrow the KV.
        """
        progressed: dict[Sequence, None] = {}
        while True:
            if self._step is None:
                if not self.scheduler.has_work:
                    break
                self._start_step(now)
                if self._step is None:  # pragma: no cover -- add() checks the head fits alone
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
        return self.scheduler.num_running

    @property
    def num_waiting(self) -> int:
        return self.scheduler.num_waiting

    @property
    def num_gpu_blocks(self) -> int:
        return self.kv.num_blocks

    @property
    def block_size(self) -> int:
        return self.kv.block_size

    @property
    def prefix_caching(self) -> bool:
        return self.config.enable_prefix_caching

    @property
    def kv_used(self) -> int:
        """KV tokens held by the running sequences, in whole blocks (blocks x block_size)."""
        return self.kv.used * self.kv.block_size

    def kv_usage(self) -> float:
        """Fraction of the KV blocks in use, 0 to 1 (``vllm:kv_cache_usage_perc``)."""
        return self.kv.usage()

    # -- internals ---------------------------------------------------------------------

    def _start_step(self, now: float) -> None:
        cfg = self.config
        # Steps chain end to end while there is work; an idle engine starts when the
        # first waiting sequence arrived. Never replay more than max_lag of backlog.
        start = self._free_at
        if not self.scheduler.num_running:
            head = self.scheduler.peek_waiting()
            if head is not None:
                start = max(start, head.arrival)
        start = max(start, now - cfg.max_lag)
        batch = self.scheduler.schedule(start)
        if batch is not None:
            end = start + cfg.step_time(len(batch.seqs), batch.prefill_tokens)
            self._step = _Step(start, end, batch.seqs)

    def _end_step(self, step: _Step, progressed: dict[Sequence, None]) -> None:
        self._free_at = end = step.end
        metrics = self.metrics
        made = 0
        # Inter-token latency: the time since each sequence's previous token. Most had
        # theirs when the previous step ended (this step's start): counted in one go.
        in_step = 0
        for seq in step.batch:
            if seq.state is not SeqState.RUNNING:  # aborted during the step
                continue
            if seq.computed < seq.prompt_tokens + seq.generated:  # a prefill chunk: no token
                continue
            seq.generated += 1
            made += 1
            last = seq.last_token_at
            if last is None:
                seq.first_token_at = end
                metrics.ttft.observe(end - seq.arrival)
                # vLLM counts a prompt when its first token comes, once (not on recompute).
                metrics.prompt_tokens += seq.prompt_tokens
            elif last == step.start:
                in_step += 1
            else:  # it waited meanwhile: a preemption, a step without it
                metrics.itl.observe(end - last)
            seq.last_token_at = end
            if seq.content_tokens is not None and seq.generated > seq.content_tokens:
                self.scheduler.remove(seq)
                self._finish(seq, "stop", end)
            elif seq.generated >= seq.max_tokens:
                self.scheduler.remove(seq)
                self._finish(seq, "length", end)
            progressed[seq] = None
        metrics.itl.observe(end - step.start, in_step)
        metrics.generation_tokens += made

    def _finish(self, seq: Sequence, reason: FinishReason, now: float) -> None:
        seq.state = SeqState.FINISHED
        seq.finish_reason = reason
        seq.finished_at = now
        if reason != "abort":  # vLLM 0.32 counts an aborted request nowhere
            self.metrics.finished[reason] += 1
            self.metrics.e2e.observe(now - seq.arrival)
            scheduled = seq.arrival if seq.scheduled_at is None else seq.scheduled_at
            self.metrics.inference.observe(now - scheduled)
            self.metrics.answers.observe(seq.generated)
