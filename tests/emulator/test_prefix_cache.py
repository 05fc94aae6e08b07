"""The emulator's prefix cache, as vLLM V1's: prompt blocks hashed in a chain, shared
by the running requests that begin alike, found by a request admitted in the same
step, free (and still findable) once nobody holds them, the oldest taken first."""

from __future__ import annotations

import asyncio
import re

from tests.emulator.test_app import emulator
from tests.emulator.test_scheduler import config

from herdless.emulator.engine import Engine, SeqState, Sequence
from herdless.emulator.kvcache import KVCache, block_hashes

WORDS = [f"w{i}" for i in range(64)]


def prompt(tokens: list[str], max_tokens: int = 4, block_size: int = 16) -> Sequence:
    return Sequence(
        prompt_tokens=len(tokens),
        max_tokens=max_tokens,
        content_tokens=None,
        arrival=0.0,
        hashes=block_hashes(tokens, block_size),
    )


def computed(kv: KVCache, tokens: list[str]) -> Sequence:
    """A request admitted, its whole prompt computed (and so cached)."""
    seq = prompt(tokens)
    assert kv.admit(seq) is not None
    assert kv.grow(seq, len(tokens))
    kv.cache(seq, len(tokens))
    return seq


def test_a_block_hash_covers_its_tokens_and_every_one_before() -> None:
    a = block_hashes(WORDS[:40], 16)
    assert len(a) == 2  # the last 8 tokens fill no block
    assert block_hashes(WORDS[:32] + ["x"] * 8, 16) == a  # the same first 32 tokens
    other_first = block_hashes(["x", *WORDS[1:40]], 16)
    assert other_first[0] != a[0]
    assert other_first[1] != a[1]
    assert block_hashes(WORDS[:16] + ["x"] * 16, 16)[0] == a[0]
    assert block_hashes(WORDS[:16] + ["x"] * 16, 16)[1] != a[1]
    assert block_hashes(WORDS[:40], 16, salt="s")[0] != a[0]  # vLLM's cache_salt


def test_requests_that_begin_alike_hold_their_common_blocks_once() -> None:
    kv = KVCache(num_blocks=10, block_size=16)
    a, b = prompt(WORDS[:40]), prompt(WORDS[:32] + ["x"] * 8)
    assert kv.admit(a) == 0
    assert kv.grow(a, 40)
    kv.cache(a, 40)
    assert (a.blocks, a.shared, kv.used, kv.cached) == (3, 2, 3, 2)
    assert kv.admit(b) == 32  # both its full blocks are a's
    assert kv.grow(b, 40)
    kv.cache(b, 40)
    assert (b.blocks, b.shared, kv.used) == (3, 2, 4)  # its own last block only
    kv.release(a)
    assert kv.used == 3  # b still holds the two shared blocks
    kv.release(b)
    assert (kv.used, kv.free, kv.cached) == (0, 10, 2)  # free, and still findable
    c = prompt(WORDS[:40])
    assert kv.admit(c) == 32
    assert kv.used == 2  # taking cached free blocks back holds them again


def test_the_last_token_is_always_computed() -> None:
    kv = KVCache(num_blocks=10, block_size=16)
    computed(kv, WORDS[:32])
    assert kv.admit(prompt(WORDS[:32])) == 16  # the same 32 tokens: one block found


def test_a_full_sequence_that_does_not_fit_takes_nothing() -> None:
    kv = KVCache(num_blocks=4, block_size=16)
    kv.release(computed(kv, WORDS[:32]))  # two cached blocks, free
    b = prompt(WORDS[:32] + ["x"] * 48)  # 5 blocks, 2 found: needs 5 - 2 + 2 taken back
    assert kv.admit(b) is None
    assert (b.blocks, kv.used, kv.cached) == (0, 0, 2)


def test_cached_free_blocks_are_taken_oldest_first_the_tail_before_its_head() -> None:
    kv = KVCache(num_blocks=4, block_size=16)
    kv.release(computed(kv, WORDS[:32]))
    other = prompt(["y"] * 48)
    assert kv.admit(other) == 0
    assert kv.grow(other, 48)  # two plain free blocks, then the oldest cached: a's tail
    assert kv.cached == 1
    assert kv.admit(prompt([*WORDS[:32], "x"])) is None  # needs 3 blocks, 1 free
    kv.release(other)
    assert kv.admit(prompt([*WORDS[:32], "x"])) == 16  # a's head is still there


def test_a_block_another_cached_meanwhile_stays_its_own() -> None:
    kv = KVCache(num_blocks=10, block_size=16)
    a, b = prompt(WORDS[:48]), prompt(WORDS[:48])
    assert kv.admit(a) == 0
    assert kv.admit(b) == 0
    kv.grow(a, 48)
    kv.grow(b, 48)
    kv.cache(a, 48)
    kv.cache(b, 48)  # a cached them first: b's copies stay b's
    assert (a.shared, b.shared, b.hashes, kv.used) == (3, 0, (), 6)
    kv.release(b)
    kv.release(a)
    assert (kv.used, kv.cached) == (0, 3)


def test_a_request_admitted_in_the_same_step_finds_the_blocks_and_skips_their_prefill() -> None:
    engine = Engine(config(enable_prefix_caching=True, block_size=16))
    system = WORDS[:48]
    a, b = prompt(system + ["a"] * 8), prompt(system + ["b"] * 8)
    engine.add(a, 0.0)
    engine.add(b, 0.0)
    engine.advance(0.0)
    step = engine._step
    assert step is not None
    assert set(step.batch) == {a, b}
    # a: its 56 tokens; b: 8 past the 48 it found. Both done in one step.
    assert (a.computed, b.computed, b.shared) == (56, 56, 3)
    assert engine.kv.used == 3 + 1 + 1  # the shared three once, and each one's last block
    m = engine.metrics
    assert (m.prefix_queries, m.prefix_hits) == (112, 48)
    engine.advance(step.end)
    assert (a.generated, b.generated) == (1, 1)


def test_a_resumed_request_is_not_counted_again() -> None:
    # Two sequences whose answers outgrow a 4-block cache: the newer one is preempted.
    engine = Engine(config(enable_prefix_caching=True, block_size=16, kv_cache_tokens=64))
    a, b = prompt(WORDS[:16], max_tokens=30), prompt(WORDS[16:32], max_tokens=30)
    engine.add(a, 0.0)
    engine.add(b, 0.0)
    engine.advance(100.0)
    assert engine.metrics.preemptions >= 1
    assert a.state is b.state is SeqState.FINISHED
    assert engine.metrics.prefix_queries == 32  # each one's first admission only
    assert engine.kv.used == 0


async def test_the_server_shares_a_system_prompt_and_shows_it_in_metrics() -> None:
    system = {"role": "system", "content": "You are a helpful assistant. " * 40}

    def chat(question: str, **extra: object) -> dict[str, object]:
        messages = [system, {"role": "user", "content": question}]
        return {"messages": messages, "max_tokens": 2, **extra}

    async with emulator(enable_prefix_caching=True) as (client, state):
        first = await client.post("/v1/chat/completions", json=chat("one"))
        assert first.status_code == 200
        prompt_tokens = first.json()["usage"]["prompt_tokens"]
        await asyncio.gather(
            *(client.post("/v1/chat/completions", json=chat(q)) for q in ("two", "three"))
        )
        salted = await client.post("/v1/chat/completions", json=chat("four", cache_salt="s"))
        assert salted.status_code == 200
        text = (await client.get("/metrics")).text
    # "one" is 1 token, then the 3 of the generation prompt: the rest is the system
    # message and the user's header, whose full blocks "two" and "three" find ("four"
    # has another salt: none).
    common = prompt_tokens - 1 - 3
    hits = state.engine.metrics.prefix_hits
    assert hits == 2 * (common // 16 * 16) > 0
    assert state.engine.metrics.prefix_queries == 4 * prompt_tokens + 1  # "three": 2 tokens
    assert f'vllm:prefix_cache_hits_total{{engine="0",model_name="test-model"}} {hits}' in text
    assert re.search(r'vllm:cache_config_info\{[^}]*enable_prefix_caching="True"', text)


async def test_off_by_default_nothing_is_found() -> None:
    same = {"messages": [{"role": "user", "content": "x " * 200}], "max_tokens": 2}
    async with emulator() as (client, state):
        for _ in range(2):
            assert (await client.post("/v1/chat/completions", json=same)).status_code == 200
        text = (await client.get("/metrics")).text
    assert state.engine.metrics.prefix_hits == 0
    assert 'vllm:prefix_cache_hits_total{engine="0",model_name="test-model"} 0' in text
    assert re.search(r'enable_prefix_caching="False"', text)
