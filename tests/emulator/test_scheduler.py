"""vLLM V1's scheduling in the engine, driven with explicit times: the token budget per
step, chunked prefill, KV blocks, full-sequence admission, FCFS and preemption."""

from __future__ import annotations

from typing import Any

import pytest

from herdless.emulator.engine import Engine, EngineConfig, SeqState, Sequence
from herdless.emulator.kvcache import KVCache


def config(**overrides: Any) -> EngineConfig:
    """Round numbers: a step is 10 ms + 1 ms per sequence + 1 ms per prefilled token."""
    options: dict[str, Any] = {
        "max_num_seqs": 8,
        "max_num_batched_tokens": 100,
        "kv_cache_tokens": 10_000,
        "decode_base": 0.010,
        "decode_per_seq": 0.001,
        "prefill_tokens_per_s": 1_000.0,
        "max_lag": 1e9,  # fake-clock tests jump ahead and expect every step replayed
    }
    return EngineConfig(**(options | overrides))


def seq(prompt: int, max_tokens: int = 5, at: float = 0.0) -> Sequence:
    return Sequence(prompt_tokens=prompt, max_tokens=max_tokens, content_tokens=None, arrival=at)


def step(engine: Engine) -> tuple[float, list[Sequence]]:
    """Run the step in flight to its end: (its end, the sequences that got a token)."""
    deadline = engine.next_deadline()
    assert deadline is not None
    return deadline, engine.advance(deadline)


def ended(engine: Engine) -> tuple[float, list[Sequence]]:
    """:func:`step`, its end rounded to the nanosecond (the sums of floats drift)."""
    end, progressed = step(engine)
    return round(end, 9), progressed


def waiting(s: Sequence) -> bool:
    return s.state is SeqState.WAITING


def run_until_idle(engine: Engine, limit: int = 10_000) -> None:
    for _ in range(limit):
        if engine.next_deadline() is None:
            return
        step(engine)
    raise AssertionError("engine never went idle")


def test_a_prompt_longer_than_the_budget_is_prefilled_over_several_steps() -> None:
    engine = Engine(config())
    s = seq(prompt=250, max_tokens=2)
    engine.add(s, 0.0)
    engine.advance(0.0)
    # 100 + 100 + 50 prompt tokens; no token until the chunk that completes the prompt.
    assert (s.computed, engine.kv_used) == (100, 112)  # scheduled: seven blocks of 16
    assert ended(engine) == (0.111, [])
    # When a step ends the next one is scheduled at once: its chunk counts as computed.
    assert (s.computed, s.generated, s.state) == (200, 0, SeqState.RUNNING)
    assert engine.kv_used == 208
    assert ended(engine) == (0.222, [])
    assert s.computed == 250
    end, progressed = step(engine)
    assert progressed == [s]
    assert end == pytest.approx(0.222 + 0.010 + 0.001 + 0.050)
    assert s.first_token_at == end
    assert s.generated == 1
    assert engine.metrics.prompt_tokens == 250  # counted once, with the first token
    assert engine.metrics.ttft.sum == pytest.approx(end)
    assert ended(engine) == (round(end + 0.011, 9), [s])  # then one decode per step
    assert s.finish_reason == "length"


def test_decodes_and_a_prefill_chunk_share_one_budget_and_the_chunk_slows_the_step() -> None:
    engine = Engine(config(max_num_batched_tokens=64))
    a, b = seq(prompt=10, max_tokens=50), seq(prompt=200, max_tokens=1, at=0.005)
    engine.add(a, 0.0)
    engine.advance(0.0)
    engine.add(b, 0.005)  # during a's prefill: it joins the next step
    end, _ = step(engine)
    assert end == pytest.approx(0.021)
    # a decodes first (it was admitted first); b gets the 63 tokens left, each step.
    for scheduled in (126, 189, 200):
        start = end
        end, progressed = step(engine)
        assert progressed == [a]
        assert end - start == pytest.approx(0.010 + 2 * 0.001 + 0.063)  # the chunk's share
        assert b.computed == scheduled  # (the next step's chunk included)
    end, progressed = step(engine)
    assert set(progressed) == {a, b}  # b's last 11 prompt tokens, then its first token
    assert b.finish_reason == "length"
    # a's inter-token latencies are those steps: the prefill chunks slowed its decodes.
    itl = engine.metrics.itl
    assert itl.count == 4
    assert itl.sum == pytest.approx(3 * 0.075 + (0.010 + 0.002 + 0.011))


def test_the_budget_bounds_how_many_prompts_start_in_one_step() -> None:
    engine = Engine(config(max_num_batched_tokens=100))
    seqs = [seq(prompt=40, max_tokens=3) for _ in range(5)]
    for s in seqs:
        engine.add(s, 0.0)
    engine.advance(0.0)
    # 40 + 40 + a first chunk of 20: the budget is spent, two wait without a slot.
    assert [s.computed for s in seqs] == [40, 40, 20, 0, 0]
    assert (engine.num_running, engine.num_waiting) == (3, 2)
    _, progressed = step(engine)
    assert progressed == seqs[:2]
    # Next: two decodes (1 + 1), the rest of the third prompt (20), then 40 and 38.
    assert [s.computed for s in seqs] == [41, 41, 40, 40, 38]
    run_until_idle(engine)
    assert all((s.finish_reason, s.generated) == ("length", 3) for s in seqs)
    assert (engine.kv_used, engine.num_running, engine.num_waiting) == (0, 0, 0)


def test_the_waiting_queue_is_first_come_first_served_a_head_that_does_not_fit_blocks_it() -> None:
    engine = Engine(config(kv_cache_tokens=64, block_size=16))  # four blocks
    a, b, c = seq(prompt=40, max_tokens=8), seq(prompt=40, max_tokens=4), seq(prompt=5)
    for s in (a, b, c):
        engine.add(s, 0.0)
    engine.advance(0.0)
    # a holds three blocks; b's whole prompt needs three, one is free: b waits, and c,
    # which would fit in it, does not overtake b.
    assert (a.state, b.state, c.state) == (SeqState.RUNNING, SeqState.WAITING, SeqState.WAITING)
    run_until_idle(engine)
    assert (b.first_token_at or 0) > (a.finished_at or 0)
    assert (c.first_token_at or 0) >= (b.first_token_at or 0)
    assert engine.metrics.preemptions == 0


def test_a_running_sequence_that_needs_a_block_preempts_the_newest_which_is_recomputed() -> None:
    # Three blocks of 4 tokens; two sequences of 4 + 8 need three blocks each at the end.
    engine = Engine(config(kv_cache_tokens=12, block_size=4))
    a, b = seq(prompt=4, max_tokens=8), seq(prompt=4, max_tokens=8)
    engine.add(a, 0.0)
    engine.add(b, 0.0)
    engine.advance(0.0)
    assert engine.kv.used == 2
    while engine.metrics.preemptions == 0:
        step(engine)
    # a (the older) needed a block with none free: b, the newest, gave all of its back.
    assert (a.state, b.state) == (SeqState.RUNNING, SeqState.WAITING)
    assert (b.computed, b.blocks) == (0, 0)
    assert engine.kv.used == a.blocks
    assert engine.num_waiting == 1
    assert engine.kv_usage() == pytest.approx(a.blocks / 3)
    generated = b.generated
    assert generated > 0  # what b had made stays made: the client already has it
    run_until_idle(engine)
    # b ran again once a left: its prompt and its tokens recomputed, as one prefill.
    assert (a.finished_at or 0) < (b.finished_at or 0)
    assert (a.generated, b.generated) == (8, 8)
    assert engine.metrics.prompt_tokens == 8  # b's prompt is not counted twice
    assert (engine.kv.used, engine.kv_usage()) == (0, 0.0)


def test_a_step_that_preempts_admits_no_one_and_the_preempted_goes_first() -> None:
    # Three blocks of 4; two run at most. a and b run; c waits for a slot.
    engine = Engine(config(max_num_seqs=2, kv_cache_tokens=12, block_size=4))
    a, b, c = seq(prompt=4, max_tokens=8), seq(prompt=4, max_tokens=8), seq(prompt=1)
    for s in (a, b, c):
        engine.add(s, 0.0)
    engine.advance(0.0)
    while engine.metrics.preemptions == 0:
        step(engine)
    # b gave its blocks back; c, which would fit in them, is not admitted in that step.
    assert (engine.num_running, engine.num_waiting) == (1, 2)
    assert c.state is SeqState.WAITING
    while waiting(c):
        step(engine)
    assert b.state is not SeqState.WAITING  # b, back at the head of the queue, went first
    run_until_idle(engine)
    assert (a.generated, b.generated, c.generated) == (8, 8, 5)


def test_a_prefill_chunk_whose_blocks_are_not_free_preempts_itself_when_newest() -> None:
    # Five blocks of 4, eight tokens of budget per step once a decodes.
    engine = Engine(config(max_num_batched_tokens=9, kv_cache_tokens=20, block_size=4))
    a, b = seq(prompt=3, max_tokens=6), seq(prompt=16, max_tokens=1, at=0.001)
    engine.add(a, 0.0)
    engine.advance(0.0)
    engine.add(b, 0.001)
    step(engine)
    # a decodes (one block still); b's whole prompt fits (four blocks) and it is given a
    # first chunk of 8 tokens (two blocks).
    assert (a.computed, b.computed, engine.kv.used) == (4, 8, 3)
    step(engine)
    # a takes a second block; b's next chunk needs two, one is free: b, the newest,
    # is preempted, and waits until its whole prompt fits again.
    assert (b.state, b.computed, b.blocks) == (SeqState.WAITING, 0, 0)
    assert (engine.metrics.preemptions, engine.kv.used) == (1, 2)
    run_until_idle(engine)
    assert (a.finish_reason, b.finish_reason) == ("length", "length")
    assert (b.first_token_at or 0) > (a.finished_at or 0)
    assert engine.kv.used == 0


def test_kv_usage_counts_whole_blocks() -> None:
    engine = Engine(config(kv_cache_tokens=160, block_size=16))  # ten blocks
    engine.add(seq(prompt=17, max_tokens=3), 0.0)
    engine.advance(0.0)
    assert (engine.num_gpu_blocks, engine.block_size) == (10, 16)
    assert (engine.kv.used, engine.kv_used, engine.kv_usage()) == (2, 32, 0.2)


def test_the_kv_cache_lends_blocks_and_takes_them_back() -> None:
    kv = KVCache(num_blocks=3, block_size=4)
    s = seq(prompt=5)
    assert (kv.capacity_tokens, kv.blocks_for(0), kv.blocks_for(4), kv.blocks_for(5)) == (
        12,
        0,
        1,
        2,
    )
    assert kv.admit(seq(prompt=12)) == 0  # fits whole, nothing found (no prefix cache)
    assert kv.admit(seq(prompt=13)) is None
    assert kv.used == 0  # admitting takes only blocks found; growing takes the rest
    assert kv.grow(s, 5)
    assert (s.blocks, kv.used, kv.free) == (2, 2, 1)
    assert kv.grow(s, 8)  # still two blocks
    assert not kv.grow(s, 13)  # a fourth block does not exist: nothing taken
    assert (s.blocks, kv.used) == (2, 2)
    kv.release(s)
    assert (s.blocks, kv.used, kv.usage()) == (0, 0, 0.0)
    with pytest.raises(ValueError, match="num_blocks"):
        KVCache(num_blocks=0, block_size=16)


def test_defaults_are_vllms() -> None:
    cfg = EngineConfig()
    assert (cfg.max_num_batched_tokens, cfg.block_size) == (8192, 16)
    assert cfg.num_gpu_blocks == 400_000 // 16
