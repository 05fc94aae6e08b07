"""The KV cache as vLLM V1 counts it: fixed-size blocks, held by the running sequences.

vLLM allocates KV in blocks of ``block_size`` tokens (16 unless ``--block-size``
says otherwise: ``CacheConfig.DEFAULT_BLOCK_SIZE`` in ``vllm/config/cache.py``);
a sequence that has ``t`` tokens of KV holds ``ceil(t / block_size)`` blocks, and
``vllm:kv_cache_usage_perc`` is the share of blocks held
(``BlockPool.get_usage`` in ``vllm/v1/core/block_pool.py``). ``num_gpu_blocks``
and ``block_size`` are what ``vllm:cache_config_info`` publishes; the capacity in
tokens is their product.

One simplification: vLLM keeps one block aside (its "null block") and counts usage
over ``num_gpu_blocks - 1``; the emulator lends all of them (one block in
thousands).
"""

from __future__ import annotations

from herdless.emulator.sequence import Sequence

__all__ = ["KVCache"]


class KVCache:
    """Blocks of KV, lent to sequences (``seq.blocks`` is the one record of what each holds).

    Args:
        num_blocks: blocks in the cache (vLLM's ``num_gpu_blocks``), >= 1.
        block_size: tokens per block, >= 1.
    """

    __slots__ = ("block_size", "num_blocks", "used")

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.used = 0

    @property
    def capacity_tokens(self) -> int:
        """Tokens the whole cache holds: ``num_blocks * block_size``."""
        return self.num_blocks * self.block_size

    @property
    def free(self) -> int:
        """Blocks not held by any sequence."""
        return self.num_blocks - self.used

    def blocks_for(self, tokens: int) -> int:
        """Blocks that ``tokens`` tokens of KV take: ``ceil(tokens / block_size)``."""
        return -(-tokens // self.block_size)

    def fits(self, tokens: int) -> bool:
        """Whether a sequence holding nothing yet could take ``tokens`` tokens now."""
        return self.blocks_for(tokens) <= self.free

    def grow(self, seq: Sequence, tokens: int) -> bool:
        """Make ``seq`` hold blocks for ``tokens`` tokens; ``False`` (and nothing taken)
        when the free blocks do not cover the difference."""
        need = self.blocks_for(tokens) - seq.blocks
        if need > self.free:
            return False
        if need > 0:
            seq.blocks += need
            self.used += need
        return True

    def release(self, seq: Sequence) -> None:
        """Free every block ``seq`` holds."""
        self.used -= seq.blocks
        seq.blocks = 0

    def usage(self) -> float:
        """Share of the blocks held, 0 to 1."""
        return self.used / self.num_blocks
