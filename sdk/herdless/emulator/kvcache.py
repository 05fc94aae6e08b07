"""The KV cache as vLLM V1 counts it: fixed-size blocks, held by the running sequences,
and its prefix cache when on.

vLLM allocates KV in blocks of ``block_size`` tokens (16 unless ``--block-size``
says otherwise: ``CacheConfig.DEFAULT_BLOCK_SIZE`` in ``vllm/config/cache.py``);
a sequence that has ``t`` tokens of KV holds ``ceil(t / block_size)`` blocks, and
``vllm:kv_cache_usage_perc`` is the share of blocks held
(``BlockPool.get_usage`` in ``vllm/v1/core/block_pool.py``). ``num_gpu_blocks``
and ``block_size`` are what ``vllm:cache_config_info`` publishes; the capacity in
tokens is their product.

**The prefix cache** (``--enable-prefix-caching``; ``vllm/v1/core/kv_cache_manager.py``
and ``block_pool.py``): each full block of a prompt has a hash over its tokens and
every token before it (:func:`block_hashes`). A block is cached the moment it is
allocated to a prompt chunk, so a request admitted in the same step already finds
it. A new request finds the longest run of its leading blocks cached, one token short
of its whole prompt at most (the last token is always computed), holds those blocks
with whoever else holds them, and computes only the rest. A cached block nobody holds
counts as free, stays findable, and is the first taken (oldest first) when a block is
needed and none is plain free. A request that computed a block another request cached
meanwhile keeps its own copy, and caches nothing past it. What the emulator leaves
out: the blocks of generated tokens are never cached (a conversation's next turn
finds its last prompt, not its last answer).

One simplification: vLLM keeps one block aside (its "null block") and counts usage
over ``num_gpu_blocks - 1``; the emulator lends all of them (one block in
thousands).
"""

from __future__ import annotations

from collections.abc import Sequence as Pieces

from herdless.emulator.sequence import Sequence

__all__ = ["KVCache", "block_hashes"]


def block_hashes(tokens: Pieces[str], block_size: int, salt: str | None = None) -> tuple[int, ...]:
    """The hash of each full block of ``tokens``, each over its tokens and every block
    before it (and ``salt``: vLLM's ``cache_salt``, a first block no other salt finds)."""
    chain: list[int] = []
    h = hash(("salt", salt))
    for start in range(0, len(tokens) - block_size + 1, block_size):
        h = hash((h, *tokens[start : start + block_size]))
        chain.append(h)
    return tuple(chain)


class KVCache:
    """Blocks of KV, lent to sequences (``seq.blocks`` is the one record of what each
    holds, ``seq.shared`` how many of them, leading, are held by their hash).

    Args:
        num_blocks: blocks in the cache (vLLM's ``num_gpu_blocks``), >= 1.
        block_size: tokens per block, >= 1.
    """

    __slots__ = ("_idle", "_refs", "block_size", "num_blocks", "used")

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.used = 0  # blocks held by a running sequence, shared ones once
        self._refs: dict[int, int] = {}  # a cached block held: its holders
        self._idle: dict[int, None] = {}  # a cached block nobody holds, oldest first

    @property
    def capacity_tokens(self) -> int:
        """Tokens the whole cache holds: ``num_blocks * block_size``."""
        return self.num_blocks * self.block_size

    @property
    def free(self) -> int:
        """Blocks not held by any sequence (cached ones nobody holds included)."""
        return self.num_blocks - self.used

    @property
    def cached(self) -> int:
        """Blocks a new prompt may find: held or not."""
        return len(self._refs) + len(self._idle)

    def blocks_for(self, tokens: int) -> int:
        """Blocks that ``tokens`` tokens of KV take: ``ceil(tokens / block_size)``."""
        return -(-tokens // self.block_size)

    def admit(self, seq: Sequence) -> int | None:
        """Admit ``seq``, holding nothing yet, if its whole sequence fits: it takes the
        leading blocks of its prompt the cache holds; returns their tokens (``None``, and
        nothing taken, when it does not fit)."""
        found = 0
        idle = 0
        most = (seq.num_tokens - 1) // self.block_size  # its last token is computed
        for h in seq.hashes[:most]:
            if h in self._refs:
                found += 1
            elif h in self._idle:
                found += 1
                idle += 1  # free now, held once taken
            else:
                break
        if self.blocks_for(seq.num_tokens) - found + idle > self.free:
            return None
        for h in seq.hashes[:found]:
            if h in self._idle:
                del self._idle[h]
                self._refs[h] = 1
            else:
                self._refs[h] += 1
        self.used += idle
        seq.blocks = seq.shared = found
        return found * self.block_size

    def grow(self, seq: Sequence, tokens: int) -> bool:
        """Make ``seq`` hold blocks for ``tokens`` tokens; ``False`` (and nothing taken)
        when the free blocks do not cover the difference."""
        need = self.blocks_for(tokens) - seq.blocks
        if need > self.free:
            return False
        if need > 0:
            for _ in range(need - (self.free - len(self._idle))):
                del self._idle[next(iter(self._idle))]  # the oldest cached block goes
            seq.blocks += need
            self.used += need
        return True

    def cache(self, seq: Sequence, tokens: int) -> None:
        """Cache the full prompt blocks of ``seq``'s first ``tokens`` tokens (its own
        blocks, now findable by their hash)."""
        end = min(tokens // self.block_size, len(seq.hashes))
        for i in range(seq.shared, end):
            h = seq.hashes[i]
            if h in self._refs or h in self._idle:
                seq.hashes = seq.hashes[:i]  # another's copy: its own stays its own
                return
            self._refs[h] = 1
            seq.shared += 1

    def release(self, seq: Sequence) -> None:
        """Free every block ``seq`` holds; its cached ones stay findable while free."""
        self.used -= seq.blocks - seq.shared
        for h in reversed(seq.hashes[: seq.shared]):  # the tail is taken first, as in vLLM
            if self._refs[h] == 1:
                del self._refs[h]
                self._idle[h] = None
                self.used -= 1
            else:
                self._refs[h] -= 1
        seq.blocks = seq.shared = 0

    def usage(self) -> float:
        """Share of the blocks held, 0 to 1."""
        return self.used / self.num_blocks
