"""The pure engine, driven with explicit times: scheduling, timing, KV budget, preemption."""

from __future__ import annotations

import pytest

from herdless.emulator.engine import Engine, EngineConfig, KVCacheExhausted, SeqState, Sequence

# Round numbers so that expected times are exact: a step is 10 ms + 1 ms per sequence,
# prefill 1,000 tokens/s.
CFG = EngineConfig(
    max_num_seqs=4,
    kv_cache_tokens=10_000,
    decode_base=0.010,
    decode_per_seq=0.001,
    prefill_tokens_per_s=1_000.0,
    max_lag=1e9,  # fake-clock tests jump far ahead and expect every step replayed
)


def seq(
    prompt: int = 10, max_tokens: int = 5, content: int | None = None, at: float = 0.0
) -> Sequence:
    return Sequence(prompt_tokens=prompt, max_tokens=max_tokens, content_tokens=content, arrival=at)


def run_until_idle(engine: Engine, limit: int = 100_000) -> float:
    """Advance step by step to each deadline; return the time the engine went idle."""
    now = 0.0
    engine.advance(now)
    for _ in range(limit):
        deadline = engine.next_deadline()
        if deadline is None:
            return now
        now = deadline
        engine.advance(now)
    raise AssertionError("engine never went idle")


def test_one_sequence_timing_is_the_formula() -> None:
    engine = Engine(CFG)
    s = seq(prompt=10, max_tokens=3)
    engine.add(s, 0.0)
    assert engine.advance(0.0) == []
    first = 0.010 + 0.001 + 10 / 1000  # prefill step: base + one seq + prompt/prefill rate
    assert engine.next_deadline() == pytest.approx(first)
    assert engine.advance(first) == [s]
    assert s.first_token_at == pytest.approx(first)
    assert s.generated == 1
    end = run_until_idle(engine)
    assert end == pytest.approx(first + 2 * 0.011)
    assert (s.state, s.finish_reason, s.generated) == (SeqState.FINISHED, "length", 3)
    assert engine.kv_used == 0
    assert engine.metrics.generation_tokens == 3
    assert engine.metrics.prompt_tokens == 10


def test_step_time_formula_and_speed() -> None:
    cfg = EngineConfig(decode_base=0.01, decode_per_seq=0.001, prefill_tokens_per_s=1000, speed=10)
    assert cfg.step_time(5, 100) == pytest.approx((0.01 + 0.005 + 0.1) / 10)


def test_bigger_batches_are_slower_per_sequence_and_faster_in_total() -> None:
    def tokens_per_second(batch: int) -> tuple[float, float]:
        engine = Engine(EngineConfig(max_num_seqs=batch, decode_base=0.01, decode_per_seq=0.001))
        seqs = [seq(max_tokens=50) for _ in range(batch)]
        for s in seqs:
            engine.add(s, 0.0)
        end = run_until_idle(engine)
        return 50 / end, 50 * batch / end  # per sequence, total

    one, many = tokens_per_second(1), tokens_per_second(32)
    assert many[0] < one[0]
    assert many[1] > 5 * one[1]


def test_max_num_seqs_bounds_the_batch_and_the_rest_waits() -> None:
    engine = Engine(CFG)
    seqs = [seq(max_tokens=2) for _ in range(6)]
    for s in seqs:
        engine.add(s, 0.0)
    engine.advance(0.0)
    assert (engine.num_running, engine.num_waiting) == (4, 2)
    run_until_idle(engine)
    assert all(s.finish_reason == "length" for s in seqs)
    # The two that waited got their first token only after the first four finished.
    assert min(s.first_token_at or 0 for s in seqs[4:]) > max(s.finished_at or 0 for s in seqs[:4])


def test_a_sequence_joins_the_running_batch_at_the_next_step() -> None:
    engine = Engine(CFG)
    a, b = seq(max_tokens=10), seq(max_tokens=1, at=0.05)
    engine.add(a, 0.0)
    engine.advance(0.05)
    engine.add(b, 0.05)
    engine.advance(0.06)
    assert a.state is b.state is SeqState.RUNNING  # continuous batching: no wait for a
    run_until_idle(engine)
    assert (b.finished_at or 0) < (a.finished_at or 0)


def test_eos_finishes_with_stop_and_counts_the_eos_token() -> None:
    engine = Engine(CFG)
    s = seq(max_tokens=10, content=3)
    engine.add(s, 0.0)
    run_until_idle(engine)
    assert (s.finish_reason, s.generated, s.text_tokens) == ("stop", 4, 3)


def test_kv_exhaustion_preempts_the_newest_and_everything_still_finishes() -> None:
    cfg = EngineConfig(max_num_seqs=8, kv_cache_tokens=100, decode_base=0.01, max_lag=1e9)
    engine = Engine(cfg)
    seqs = [seq(prompt=20, max_tokens=20) for _ in range(4)]  # 4 x 40 tokens > 100
    for s in seqs:
        engine.add(s, 0.0)
    engine.advance(0.0)
    peak = 0
    while (deadline := engine.next_deadline()) is not None:
        engine.advance(deadline)
        peak = max(peak, engine.kv_used)
    assert peak <= 100
    assert engine.metrics.preemptions > 0
    assert all((s.finish_reason, s.generated) == ("length", 20) for s in seqs)
    assert engine.kv_used == 0


def test_kv_exhaustion_in_crash_mode_raises() -> None:
    # Four blocks of 16: both prompts fit at once (one block each), their answers do not.
    cfg = EngineConfig(max_num_seqs=8, kv_cache_tokens=64, on_kv_exhausted="crash", max_lag=1e9)
    engine = Engine(cfg)
    for _ in range(2):
        engine.add(seq(prompt=16, max_tokens=40), 0.0)
    with pytest.raises(KVCacheExhausted, match="KV cache exhausted"):
        engine.advance(100.0)


def test_abort_frees_kv_at_once_and_skips_waiting_entries() -> None:
    engine = Engine(EngineConfig(max_num_seqs=1, max_lag=1e9))
    running, waiting = seq(prompt=30, max_tokens=100), seq(max_tokens=1)
    engine.add(running, 0.0)
    engine.add(waiting, 0.0)
    engine.advance(1.0)
    assert engine.kv_used > 30
    engine.abort(waiting, 1.0)
    engine.abort(running, 1.0)
    engine.abort(running, 1.0)  # idempotent
    assert (engine.kv_used, engine.num_running, engine.num_waiting) == (0, 0, 0)
    assert running.finish_reason == waiting.finish_reason == "abort"
    assert engine.metrics.finished["abort"] == 0  # as in vLLM: not a finished request
    engine.advance(2.0)
    assert engine.next_deadline() is None


def test_late_wake_up_replays_overdue_steps_in_one_call() -> None:
    engine = Engine(CFG)
    s = seq(prompt=10, max_tokens=5)
    engine.add(s, 0.0)
    assert engine.advance(1.0) == [s]  # every step ended by t=1: one call, five tokens
    assert s.generated == 5
    assert s.finished_at == pytest.approx(0.021 + 4 * 0.011)


def test_backlog_beyond_max_lag_is_dropped_not_replayed() -> None:
    engine = Engine(EngineConfig(decode_base=0.01, decode_per_seq=0.0, max_lag=0.1))
    s = seq(prompt=1, max_tokens=1000, at=0.0)
    engine.add(s, 0.0)
    engine.advance(10.0)
    # Steps start no earlier than now - max_lag: about 0.1 s / 10 ms of them, not 1000.
    assert 5 <= s.generated <= 12


def test_idle_engine_starts_at_the_arrival_not_at_the_late_tick() -> None:
    engine = Engine(CFG)
    s = seq(prompt=1, max_tokens=1, at=5.0)
    engine.add(s, 5.0)
    engine.advance(5.5)  # the tick comes late; the step still began at the arrival
    assert s.first_token_at == pytest.approx(5.0 + 0.011 + 0.001)


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_num_seqs", 0), ("kv_cache_tokens", 0), ("speed", 0.0), ("decode_base", -1.0),
     ("on_kv_exhausted", "explode"), ("max_num_batched_tokens", 0), ("block_size", 0),
     ("max_num_batched_tokens", 100), ("kv_cache_tokens", 15), ("speed", float("nan")),
     ("max_lag", float("nan"))],
)  # fmt: skip
def test_config_rejects_bad_values_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        EngineConfig(**{field: value})  # type: ignore[arg-type]


def test_a_sequence_that_could_not_finish_alone_in_the_kv_cache_is_refused() -> None:
    engine = Engine(EngineConfig(kv_cache_tokens=32, block_size=16))  # two blocks
    engine.add(seq(prompt=30, max_tokens=3), 0.0)  # at most 32 tokens of KV: fits
    with pytest.raises(ValueError, match="does not fit in the KV cache"):
        engine.add(seq(prompt=30, max_tokens=4), 0.0)
