"""The emulator's HTTP layer in-process (httpx.ASGITransport): wire format, errors, faults."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from tests.preflight import PREFLIGHT

from herdless.emulator.app import create_app
from herdless.emulator.settings import EmulatorSettings
from herdless.emulator.state import EmulatorState, NoListener

pytestmark = [pytest.mark.server]

MODEL = "test-model"
HI = [{"role": "user", "content": "hi"}]  # 1 token + 4 per message + 3 = 8 prompt tokens


@asynccontextmanager
async def emulator(
    crash: Callable[[], None] | None = None, **options: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, EmulatorState]]:
    # speed=1000: a step takes microseconds, so responses come at once without a fake loop.
    settings = EmulatorSettings(**{"model": MODEL, "speed": 1000, **options})
    app = create_app(settings, crash=crash or (lambda: None))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://emulator") as client:
        yield client, app.state.emulator


def events(body: str) -> list[Any]:
    assert body.endswith("\n\n")
    out = []
    for block in body.split("\n\n")[:-1]:
        assert block.startswith("data: ")
        data = block[len("data: ") :]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


async def test_non_streaming_completion_has_vllm_fields_and_consistent_usage() -> None:
    async with emulator() as (client, _):
        r = await client.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": HI, "max_tokens": 5}
        )
    assert r.status_code == 200
    assert b", " not in r.content
    assert b": " not in r.content
    body = r.json()
    assert list(body) == [
        "id", "object", "created", "model", "choices", "service_tier", "system_fingerprint",
        "usage", "prompt_logprobs", "prompt_token_ids", "prompt_text", "kv_transfer_params",
        "ec_transfer_params", "metrics",
    ]  # fmt: skip
    assert body["id"].startswith("chatcmpl-")
    assert body["object"] == "chat.completion"
    choice = body["choices"][0]
    assert list(choice) == [
        "index", "message", "logprobs", "finish_reason", "stop_reason", "token_ids",
        "routed_experts",
    ]  # fmt: skip
    assert choice["finish_reason"] == "length"
    assert body["usage"] == {
        "prompt_tokens": 8,
        "total_tokens": 13,
        "completion_tokens": 5,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }
    assert body["system_fingerprint"].startswith("vllm-0.32.0-")


async def test_same_prompt_same_answer_and_eos_counts_as_a_completion_token() -> None:
    async with emulator(answer_min_tokens=3, answer_max_tokens=3) as (client, _):
        a, b = [
            (await client.post("/v1/chat/completions", json={"messages": HI})).json()
            for _ in range(2)
        ]
    assert a["choices"][0]["message"] == b["choices"][0]["message"]
    assert a["choices"][0]["finish_reason"] == "stop"
    assert a["usage"]["completion_tokens"] == 4  # three of text, then EOS


async def test_stream_with_usage_has_vllm_chunk_sequence() -> None:
    body = {"messages": HI, "max_tokens": 3, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    async with emulator() as (client, _):
        r = await client.post("/v1/chat/completions", json=body)
    assert r.headers["content-type"].startswith("text/event-stream")
    assert '", "' not in r.text
    chunks = events(r.text)
    assert chunks[-1] == "[DONE]"
    role, *tokens, usage = chunks[:-1]
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert list(role) == ["id", "object", "created", "model", "choices", "prompt_token_ids",
                          "prompt_text"]  # fmt: skip
    assert len(tokens) == 3
    assert [t["choices"][0]["finish_reason"] for t in tokens] == [None, None, "length"]
    assert tokens[-1]["choices"][0]["delta"]["content"]  # length rides on the last text
    assert "system_fingerprint" not in tokens[-1]
    assert usage["choices"] == []
    assert "system_fingerprint" in usage
    assert usage["usage"] == {"prompt_tokens": 8, "total_tokens": 11, "completion_tokens": 3}
    assert len({c["id"] for c in chunks[:-1]}) == 1


async def test_stream_stop_has_its_own_empty_chunk_and_fingerprint_without_usage() -> None:
    async with emulator(answer_min_tokens=2, answer_max_tokens=2) as (client, _):
        r = await client.post("/v1/chat/completions", json={"messages": HI, "stream": True})
    chunks = events(r.text)
    *_, text2, stop, done = chunks
    assert done == "[DONE]"
    assert text2["choices"][0]["finish_reason"] is None
    assert stop["choices"][0]["delta"] == {"content": ""}
    assert stop["choices"][0]["finish_reason"] == "stop"
    assert "system_fingerprint" in stop


@pytest.mark.parametrize(
    ("payload", "status", "type_", "param"),
    [
        ({"model": "nope", "messages": HI}, 404, "NotFoundError", "model"),
        ({"messages": "hi"}, 400, "Bad Request", "body.messages"),
        ({"messages": HI, "max_tokens": 0}, 400, "Bad Request", "body.max_tokens"),
        ({"messages": HI, "max_tokens": 5000}, 400, "BadRequestError", "max_tokens"),
        (
            {"messages": [{"role": "user", "content": "word " * 2100}]},
            400,
            "BadRequestError",
            "input_tokens",
        ),
        ({"messages": HI, "n": 2}, 400, "BadRequestError", "n"),
    ],
)
async def test_errors_have_vllm_shape(
    payload: dict[str, Any], status: int, type_: str, param: str
) -> None:
    async with emulator(max_model_len=2048, kv_cache_tokens=4096) as (client, _):
        r = await client.post("/v1/chat/completions", json=payload)
    assert r.status_code == status
    error = r.json()["error"]
    assert list(error) == ["message", "type", "param", "code"]
    assert (error["type"], error["param"], error["code"]) == (type_, param, status)
    assert "Traceback" not in error["message"]


async def test_an_answer_asked_past_the_context_is_cut_where_the_context_ends() -> None:
    # vLLM 0.32 caps max_tokens at what the prompt leaves; a prompt that leaves nothing
    # is a 400 naming max_tokens, one past the context a 400 naming the input.
    async with emulator(max_model_len=64, kv_cache_tokens=4096) as (client, _):
        r = await client.post(
            "/v1/chat/completions", json={"messages": HI, "max_tokens": 64, "ignore_eos": True}
        )
        prompt = r.json()["usage"]["prompt_tokens"]
        assert r.json()["usage"]["completion_tokens"] == 64 - prompt
        assert r.json()["choices"][0]["finish_reason"] == "length"
        said = "word " * (64 - prompt + 2)
        full = await client.post(
            "/v1/chat/completions", json={"messages": [*HI, {"role": "user", "content": said}]}
        )
    assert full.status_code == 400
    assert full.json()["error"]["param"] in ("max_tokens", "input_tokens")


async def test_invalid_json_is_a_400_not_a_500() -> None:
    async with emulator() as (client, _):
        r = await client.post("/v1/chat/completions", content=b"{nope")
    assert r.status_code == 400
    assert r.json()["error"]["code"] == 400


async def test_other_routes() -> None:
    async with emulator(max_model_len=1000, kv_cache_tokens=2000) as (client, _):
        health = await client.get("/health")
        models = (await client.get("/v1/models")).json()
        version = (await client.get("/version")).json()
        metrics = await client.get("/metrics")
    assert (health.status_code, health.content) == (200, b"")
    entry = models["data"][0]
    assert (entry["id"], entry["owned_by"], entry["root"], entry["parent"]) == (
        MODEL, "vllm", MODEL, None
    )  # fmt: skip
    assert entry["max_model_len"] == 1000
    assert isinstance(entry["permission"], list)
    assert version == {"version": "0.32.0"}
    assert "vllm:num_requests_running" in metrics.text


async def test_kv_pressure_preempts_yet_every_answer_is_complete() -> None:
    # Four sequences of 8 + 40 tokens in a 64-token cache: they cannot all run at once.
    # speed=10 (a step is about 1 ms): all four are submitted before the first one ends.
    async with emulator(max_model_len=64, kv_cache_tokens=64, speed=10) as (client, state):
        payload = {"messages": HI, "max_tokens": 40, "ignore_eos": True}
        replies = await asyncio.gather(
            *(client.post("/v1/chat/completions", json=payload) for _ in range(4))
        )
        metrics = (await client.get("/metrics")).text
    assert [r.json()["usage"]["completion_tokens"] for r in replies] == [40] * 4
    assert state.engine.metrics.preemptions > 0
    assert f'vllm:num_preemptions_total{{engine="0",model_name="{MODEL}"}} 0\n' not in metrics
    assert state.engine.kv_used == 0


async def test_kv_exhaustion_in_crash_mode_calls_crash() -> None:
    crashed: list[bool] = []
    async with emulator(
        crash=lambda: crashed.append(True), max_model_len=64, kv_cache_tokens=64,
        on_kv_exhausted="crash", speed=10,
    ) as (client, _):  # fmt: skip
        payload = {"messages": HI, "max_tokens": 40, "ignore_eos": True}
        replies = await asyncio.gather(
            *(client.post("/v1/chat/completions", json=payload) for _ in range(4))
        )
    assert crashed == [True]
    assert 503 in {r.status_code for r in replies}


async def test_queue_cap_answers_503_and_counts_it() -> None:
    async with emulator(max_num_queued_reqs=0) as (client, state):
        r = await client.post("/v1/chat/completions", json={"messages": HI})
    assert r.status_code == 503
    assert r.json()["error"]["type"] == "Service Unavailable"
    assert state.engine.metrics.rejected == 1


async def test_faults_api_sets_reads_and_clears() -> None:
    async with emulator() as (client, _):
        r = await client.post("/_emulator/faults", json={"error_rate": 1.0, "error_status": 502})
        assert r.json()["error_rate"] == 1.0
        assert (await client.get("/_emulator/faults")).json()["error_status"] == 502
        failed = await client.post("/v1/chat/completions", json={"messages": HI})
        assert failed.status_code == 502
        assert failed.json()["error"]["code"] == 502
        await client.delete("/_emulator/faults")
        ok = await client.post("/v1/chat/completions", json={"messages": HI})
        assert ok.status_code == 200
        bad = await client.post("/_emulator/faults", json={"error_rate": 3})
        assert bad.status_code == 400
        assert "error_rate" in bad.json()["error"]["message"]


async def test_the_slow_fault_holds_a_completion_before_its_first_byte() -> None:
    async with emulator() as (client, _):
        r = await client.post("/_emulator/faults", json={"slow_rate": 1.0, "slow_latency": 0.3})
        assert (r.json()["slow_rate"], r.json()["slow_latency"]) == (1.0, 0.3)
        for stream in (False, True):
            start = time.monotonic()
            held = await client.post(
                "/v1/chat/completions", json={"messages": HI, "max_tokens": 3, "stream": stream}
            )
            assert held.status_code == 200
            assert time.monotonic() - start >= 0.3  # (speed=1000: the answer itself is ~0)
        cleared = await client.delete("/_emulator/faults")
        assert (cleared.json()["slow_rate"], cleared.json()["slow_latency"]) == (0.0, 0.0)


async def test_maintenance_stops_serving_and_delete_brings_it_back() -> None:
    async with emulator() as (client, state):
        await client.post("/_emulator/faults", json={"maintenance_for": 60})
        assert isinstance(state.control, NoListener)
        assert state.control.refusals == [60]
        assert state.control.dropped == 1
        assert (await client.get("/health")).status_code == 503
        assert (await client.get("/_emulator/faults")).status_code == 200  # never gated
        await client.delete("/_emulator/faults")
        assert (await client.get("/health")).status_code == 200
        assert state.control.reopened == 1


async def test_refuse_and_crash_actions_reach_the_listener_and_the_process() -> None:
    crashed: list[bool] = []
    async with emulator(crash=lambda: crashed.append(True)) as (client, state):
        await client.post("/_emulator/faults", json={"refuse_for": 1.5})
        await client.post("/_emulator/faults", json={"crash": True})
    assert isinstance(state.control, NoListener)
    assert state.control.refusals == [1.5]
    assert crashed == [True]


async def test_text_completions_json_and_stream() -> None:
    async with emulator() as (client, _):
        r = await client.post("/v1/completions", json={"prompt": "Hello, world!", "max_tokens": 3})
        s = await client.post(
            "/v1/completions",
            json={"prompt": "Hi", "max_tokens": 2, "stream": True, "ignore_eos": True,
                  "stream_options": {"include_usage": True}},
        )  # fmt: skip
        bad = await client.post("/v1/completions", json={})
    body = r.json()
    assert body["id"].startswith("cmpl-")
    assert body["object"] == "text_completion"
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["prompt_tokens"] == 6  # the bare prompt: no chat template
    assert body["usage"]["completion_tokens"] == 3
    *tokens, usage, done = events(s.text)
    assert done == "[DONE]"
    assert [t["choices"][0]["finish_reason"] for t in tokens] == [None, "length"]
    assert all(t["object"] == "text_completion" for t in tokens)
    assert usage["usage"]["completion_tokens"] == 2
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "body.prompt"


async def test_tokenize_counts_like_the_completion_usage() -> None:
    async with emulator() as (client, _):
        chat = (await client.post("/tokenize", json={"messages": HI})).json()
        plain = (await client.post("/tokenize", json={"prompt": "Hello, world!"})).json()
        neither = await client.post("/tokenize", json={})
    assert chat["count"] == 8 == len(chat["tokens"])  # as prompt_tokens of a chat completion
    assert plain["count"] == 6
    assert plain["token_strs"] is None
    assert neither.status_code == 400


def outage(state: EmulatorState) -> str | None:
    """The /metrics fault on now (read through a call: each read is a fresh value)."""
    return state.metrics_outage


async def test_metrics_tell_the_kv_geometry_and_the_settings_budget() -> None:
    async with emulator(max_model_len=2048, kv_cache_tokens=46_600) as (client, state):
        text = (await client.get("/metrics")).text
    [line] = [x for x in text.splitlines() if x.startswith("vllm:cache_config_info{")]
    assert 'num_gpu_blocks="2912",' in line
    assert 'block_size="16",' in line
    assert 'kv_cache_max_concurrency="22.75"' in line
    assert line.endswith('engine="0"} 1.0')
    assert state.engine.config.max_num_batched_tokens == 8192


async def test_the_metrics_error_fault_fails_metrics_only_until_cleared() -> None:
    async with emulator() as (client, state):
        r = await client.post("/_emulator/faults", json={"metrics_error_for": 60})
        assert r.status_code == 200
        assert outage(state) == "error"
        failed = await client.get("/metrics")
        assert (failed.status_code, failed.text) == (500, "Internal Server Error")
        assert (await client.get("/health")).status_code == 200
        chat = await client.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 2})
        assert chat.status_code == 200
        await client.delete("/_emulator/faults")
        assert outage(state) is None
        back = await client.get("/metrics")
    assert back.status_code == 200
    assert "vllm:cache_config_info{" in back.text


async def test_the_metrics_stall_fault_holds_scrapes_until_it_ends() -> None:
    async with emulator() as (client, state):
        await client.post("/_emulator/faults", json={"metrics_stall_for": 60})
        assert outage(state) == "stall"
        scrape = asyncio.ensure_future(client.get("/metrics"))
        for _ in range(50):  # give the scrape every chance to be answered: it is not
            await asyncio.sleep(0)
        assert not scrape.done()
        assert (await client.get("/health")).status_code == 200  # the rest is served
        state.end_metrics_outage()  # what the window's timer does when it ends
        answer = await scrape
    assert answer.status_code == 200
    assert "vllm:kv_cache_usage_perc{" in answer.text


async def test_a_new_metrics_window_replaces_the_one_in_progress() -> None:
    async with emulator() as (client, state):
        await client.post("/_emulator/faults", json={"metrics_stall_for": 60})
        scrape = asyncio.ensure_future(client.get("/metrics"))
        for _ in range(50):
            await asyncio.sleep(0)
        await client.post("/_emulator/faults", json={"metrics_error_for": 60})
        assert (await scrape).status_code == 200  # the stall ended: answered
        assert (await client.get("/metrics")).status_code == 500
        await client.post("/_emulator/faults", json={"metrics_error_for": 0})
        for _ in range(50):  # a window of 0 s ends on the next turn of the loop
            await asyncio.sleep(0)
        assert outage(state) is None
        assert (await client.get("/metrics")).status_code == 200


async def test_both_metrics_faults_at_once_are_refused() -> None:
    async with emulator() as (client, state):
        r = await client.post(
            "/_emulator/faults", json={"metrics_error_for": 5, "metrics_stall_for": 5}
        )
    assert r.status_code == 400
    assert "metrics_error_for and metrics_stall_for" in r.json()["error"]["message"]
    assert outage(state) is None


async def test_cors_is_vllms_no_origin_by_default_else_those_named() -> None:
    """As vLLM 0.32 answered it (tests/vllm/test_cors.py asks the real one the same)."""
    body = {"model": MODEL, "messages": HI, "max_tokens": 2}
    async with emulator() as (client, _):
        refused = await client.options("/v1/chat/completions", headers=PREFLIGHT)
    async with emulator(allowed_origins='["https://chat.example"]') as (client, _):
        allowed = await client.options("/v1/chat/completions", headers=PREFLIGHT)
        served = await client.post("/v1/chat/completions", json=body, headers=PREFLIGHT)
    assert (refused.status_code, refused.text) == (400, "Disallowed CORS origin")
    assert "access-control-allow-origin" not in refused.headers
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == "https://chat.example"
    assert "POST" in allowed.headers["access-control-allow-methods"]
    assert served.headers["access-control-allow-origin"] == "https://chat.example"


@pytest.mark.parametrize("text", ["https://chat.example", '{"a": 1}', "[1]"])
def test_allowed_origins_is_a_json_list_as_vllms_flag(text: str) -> None:
    with pytest.raises(ValueError, match="JSON list of origins"):
        EmulatorSettings(allowed_origins=text)
