"""The tokenisation rule, deterministic text, fault parsing and the Prometheus text."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from herdless._exposition import Histogram
from herdless.emulator import text
from herdless.emulator.engine import Engine, EngineConfig, Sequence
from herdless.emulator.faults import FaultActions, Faults, parse_faults
from herdless.emulator.metrics import render


@pytest.mark.parametrize(
    ("value", "tokens"),
    [
        ("", 0),
        ("Hello, world!", 6),
        ("a b c", 3),
        ("tokenisation", 3),
        ("  ", 0),
        ("안녕하세요", 2),
    ],
)
def test_count_tokens_follows_the_documented_rule(value: str, tokens: int) -> None:
    assert text.count_tokens(value) == tokens


@given(seed=st.integers(min_value=0, max_value=2**63), n=st.integers(min_value=0, max_value=200))
def test_any_answer_prefix_tokenises_to_its_length(seed: int, n: int) -> None:
    answer = "".join(text.token_text(seed, i) for i in range(n))
    assert text.count_tokens(answer) == n
    assert [json.loads(text.token_json(seed, i)) for i in range(n)] == [
        text.token_text(seed, i) for i in range(n)
    ]


def test_answers_are_deterministic_from_seed_or_prompt() -> None:
    assert text.answer_seed(7, ["x"]) == 7
    assert text.answer_seed(None, ["hi", "there"]) == text.answer_seed(None, ["hi", "there"])
    assert text.answer_seed(None, ["hi"]) != text.answer_seed(None, ["ho"])
    lengths = {text.answer_length(s, 3, 9) for s in range(200)}
    assert lengths == set(range(3, 10))


def test_parse_faults_splits_steady_faults_and_actions() -> None:
    faults, actions = parse_faults({"error_rate": 0.5, "error_status": 503, "refuse_for": 2})
    assert faults == Faults(error_rate=0.5, error_status=503)
    assert actions == FaultActions(refuse_for=2)
    assert faults.active
    assert not Faults().active


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "JSON object"),
        ({"explode": True}, "unknown fault"),
        ({"hang": "yes"}, "hang: wrong type"),
        ({"error_rate": 2}, "error_rate must be within"),
        ({"error_status": 200}, "error_status must be"),
        ({"cut_after": -1}, "cut_after must be"),
        ({"maintenance_for": -1}, "maintenance_for must be"),
        ({"extra_latency": True}, "extra_latency: wrong type"),
        ({"slow_rate": 1.5}, "slow_rate must be within"),
        ({"slow_latency": -1}, "slow_latency must be"),
        ({"slow_rate": "often"}, "slow_rate: wrong type"),
    ],
)
def test_parse_faults_rejects_bad_input_clearly(body: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_faults(body)


def test_error_rate_draws_from_the_injected_rng() -> None:
    rng = random.Random(1)
    draws = [Faults(error_rate=0.5).should_fail(rng) for _ in range(100)]
    replay = random.Random(1)
    assert draws == [replay.random() < 0.5 for _ in range(100)]  # one draw per decision
    assert True in draws
    assert False in draws
    assert not any(Faults().should_fail(rng) for _ in range(10))


def test_the_slow_fault_holds_its_share_drawn_from_the_injected_rng() -> None:
    faults, _ = parse_faults({"slow_rate": 0.1, "slow_latency": 5})
    assert faults == Faults(slow_rate=0.1, slow_latency=5.0)
    assert faults.active
    rng = random.Random(3)
    holds = [faults.hold(rng) for _ in range(1000)]
    replay = random.Random(3)
    assert holds == [5.0 if replay.random() < 0.1 else 0.0 for _ in range(1000)]
    assert 50 < holds.count(5.0) < 150  # about a tenth (seed 3: a fixed count)
    untouched = random.Random(3)
    assert Faults().hold(untouched) == 0.0
    assert untouched.random() == random.Random(3).random()  # off: no draw


def test_histogram_is_cumulative_with_inf_last() -> None:
    h = Histogram((0.1, 1.0))
    h.observe(0.05)
    h.observe(0.5, count=3)
    h.observe(5.0)
    h.observe(1.0, count=0)
    assert h.cumulative() == [("0.1", 1), ("1.0", 4), ("+Inf", 5)]
    assert (h.count, h.sum) == (5, pytest.approx(6.55))


def test_render_has_vllm_names() -> None:
    engine = Engine(EngineConfig(max_lag=1e9))
    engine.add(Sequence(prompt_tokens=5, max_tokens=2, content_tokens=None, arrival=0.0), 0.0)
    engine.advance(10.0)
    out = render(engine, "m")
    for name in (
        'vllm:num_requests_running{engine="0",model_name="m"} 0',
        "vllm:num_requests_waiting{",
        "vllm:kv_cache_usage_perc{",
        "vllm:num_preemptions_total{",
        'vllm:prompt_tokens_total{engine="0",model_name="m"} 5',
        'vllm:generation_tokens_total{engine="0",model_name="m"} 2',
        'vllm:request_success_total{engine="0",model_name="m",finished_reason="length"} 1',
        'vllm:time_to_first_token_seconds_bucket{engine="0",model_name="m",le="+Inf"} 1',
        "vllm:inter_token_latency_seconds_count{",
        "vllm:e2e_request_latency_seconds_sum{",
    ):
        assert name in out
