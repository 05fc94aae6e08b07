"""Contract: JSON bodies, error bodies and the plain routes, as vLLM 0.32 serves them.

The field sets are the ones captured from vLLM (``VLLM_WIRE.md``); a client that
reads a field must find it on both upstreams, and nothing more may appear.
"""

from __future__ import annotations

import re

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.contract.contract_kit import MAX_MODEL_LEN, Upstream

from herdless.launch.vllm import forced_answer, read_metric

CHAT_KEYS = {
    "id", "object", "created", "model", "choices", "service_tier", "system_fingerprint",
    "usage", "prompt_logprobs", "prompt_token_ids", "prompt_text", "kv_transfer_params",
    "ec_transfer_params", "metrics",
}  # fmt: skip
CHOICE_KEYS = {
    "index", "message", "logprobs", "finish_reason", "stop_reason", "token_ids", "routed_experts"
}  # fmt: skip
MESSAGE_KEYS = {"role", "content", "refusal", "annotations", "audio", "function_call", "reasoning"}
USAGE_KEYS = {
    "prompt_tokens", "total_tokens", "completion_tokens", "prompt_tokens_details",
    "completion_tokens_details",
}  # fmt: skip
ERROR_KEYS = {"message", "type", "param", "code"}
ENGINE = {"engine", "model_name"}
# Each metric the gateway, the bench or a dashboard reads, with its label names.
METRICS = {
    "vllm:num_requests_running": ENGINE,
    "vllm:num_requests_waiting": ENGINE,
    "vllm:num_requests_waiting_by_reason": ENGINE | {"reason"},
    "vllm:kv_cache_usage_perc": ENGINE,
    "vllm:prompt_tokens_total": ENGINE,
    "vllm:generation_tokens_total": ENGINE,
    "vllm:request_success_total": ENGINE | {"finished_reason"},
    "vllm:admission_rejections_total": {"model_name", "reason"},
}


def test_health_is_200_with_an_empty_body(http: httpx.Client) -> None:
    response = http.get("/health")
    assert (response.status_code, response.content) == (200, b"")


def test_models_lists_the_served_model(http: httpx.Client, upstream: Upstream) -> None:
    body = http.get("/v1/models").raise_for_status().json()
    assert body["object"] == "list"
    [model] = body["data"]
    assert {"id", "object", "created", "owned_by", "root", "parent", "max_model_len"} <= set(model)
    assert "permission" in model
    assert (model["id"], model["object"], model["owned_by"]) == (upstream.model, "model", "vllm")
    assert (model["parent"], model["max_model_len"]) == (None, MAX_MODEL_LEN)


def test_chat_completion_has_vllms_field_sets(http: httpx.Client, upstream: Upstream) -> None:
    answer = forced_answer(3, ending="length")  # the model's own words may stop sooner
    body = http.post("/v1/chat/completions", json=upstream.chat(**answer)).json()
    assert set(body) == CHAT_KEYS
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{16}", body["id"])
    assert (body["object"], body["model"]) == ("chat.completion", upstream.model)
    assert body["system_fingerprint"].startswith("vllm-")
    [choice] = body["choices"]
    assert set(choice) == CHOICE_KEYS
    assert set(choice["message"]) == MESSAGE_KEYS
    assert choice["message"]["role"] == "assistant"
    assert (choice["finish_reason"], choice["stop_reason"]) == ("length", None)
    usage = body["usage"]
    assert set(usage) == USAGE_KEYS
    assert usage["completion_tokens"] == 3
    assert usage["total_tokens"] == usage["prompt_tokens"] + 3


def test_unknown_model_is_404(http: httpx.Client, upstream: Upstream) -> None:
    response = http.post("/v1/chat/completions", json={**upstream.chat(), "model": "nope"})
    assert response.status_code == 404
    error = response.json()["error"]
    assert set(error) == ERROR_KEYS
    assert error["message"] == (
        f"The model `nope` does not exist. Valid aliases: {upstream.model}."
    )
    assert (error["type"], error["param"], error["code"]) == ("NotFoundError", "model", 404)


def test_schema_error_is_400(http: httpx.Client, upstream: Upstream) -> None:
    response = http.post("/v1/chat/completions", json={**upstream.chat(), "messages": "x"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == ERROR_KEYS
    assert (error["type"], error["param"], error["code"]) == ("Bad Request", "body.messages", 400)


def test_max_tokens_over_the_context_is_400(http: httpx.Client, upstream: Upstream) -> None:
    response = http.post("/v1/chat/completions", json=upstream.chat(max_tokens=5000))
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == ERROR_KEYS
    assert error["message"].startswith(
        f"max_tokens=5000 cannot be greater than max_model_len={MAX_MODEL_LEN}."
    )
    assert (error["type"], error["param"], error["code"]) == ("BadRequestError", "max_tokens", 400)


def test_an_answer_asked_past_the_context_is_cut_where_it_ends(
    http: httpx.Client, upstream: Upstream
) -> None:
    said = "word " * 2000  # about 2,000 tokens: what is left of the context is short
    answer = http.post(
        "/v1/chat/completions", json=upstream.chat(said, max_tokens=100, ignore_eos=True)
    )
    assert answer.status_code == 200  # not refused: cut
    usage = answer.json()["usage"]
    assert usage["prompt_tokens"] + 100 > MAX_MODEL_LEN
    assert usage["completion_tokens"] == MAX_MODEL_LEN - usage["prompt_tokens"]
    assert answer.json()["choices"][0]["finish_reason"] == "length"


def test_a_prompt_past_the_context_is_400_naming_the_input(
    http: httpx.Client, upstream: Upstream
) -> None:
    response = http.post("/v1/chat/completions", json=upstream.chat("word " * 2100))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["message"].startswith(
        f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, your "
        f"prompt contains at least {MAX_MODEL_LEN + 1} input tokens"
    )
    assert (error["type"], error["param"], error["code"]) == (
        "BadRequestError",
        "input_tokens",
        400,
    )


def test_metrics_carry_vllms_names_and_labels(http: httpx.Client, upstream: Upstream) -> None:
    answer = forced_answer(2, ending="length")
    http.post("/v1/chat/completions", json=upstream.chat(**answer)).raise_for_status()
    families = {f.name: f for f in text_string_to_metric_families(http.get("/metrics").text)}
    for name, labels in METRICS.items():
        # The parser names a counter's family without its `_total`.
        family = families.get(name.removesuffix("_total"))
        assert family is not None, f"no {name}"
        assert family.samples, f"no sample of {name}"
        for sample in family.samples:
            assert set(sample.labels) == labels, (name, sample.labels)
            assert sample.labels["model_name"] == upstream.model
    assert {s.labels["finished_reason"] for s in families["vllm:request_success"].samples} == {
        "stop", "length", "abort", "error", "repetition"
    }  # fmt: skip
    assert {s.labels["reason"] for s in families["vllm:admission_rejections"].samples} == {
        "max_num_queued_reqs", "max_num_queued_tokens"
    }  # fmt: skip
    assert read_metric(upstream.url, "vllm:generation_tokens_total") >= 2
    # What a request ran, first step to end: the gateway's mean run time before its own.
    runs = families["vllm:request_inference_time_seconds"]
    [count] = [s for s in runs.samples if s.name.endswith("_count")]
    [total] = [s for s in runs.samples if s.name.endswith("_sum")]
    assert set(count.labels) == set(total.labels) == ENGINE
    assert count.value >= 1
    assert total.value > 0
    # The tokens each finished request generated: the gateway's first predicted answers.
    answers = families["vllm:request_generation_tokens"]
    [count] = [s for s in answers.samples if s.name.endswith("_count")]
    [total] = [s for s in answers.samples if s.name.endswith("_sum")]
    assert set(count.labels) == set(total.labels) == ENGINE
    assert count.value >= 1
    assert total.value >= 2  # this test's answer alone: 2 tokens


def test_tokenize_counts_a_chats_prompt_as_its_usage_does(
    http: httpx.Client, upstream: Upstream
) -> None:
    # What the gateway asks to calibrate its prompt estimate before any answer ends.
    chat = upstream.chat(max_tokens=2)
    asked = {"model": chat["model"], "messages": chat["messages"]}
    counted = http.post("/tokenize", json=asked).raise_for_status().json()
    answer = http.post("/v1/chat/completions", json=chat).raise_for_status().json()
    assert isinstance(counted["count"], int)
    assert counted["count"] == answer["usage"]["prompt_tokens"] > 0


def test_version_and_ping(http: httpx.Client) -> None:
    assert set(http.get("/version").raise_for_status().json()) == {"version"}
    assert http.get("/ping").status_code == 200


@pytest.mark.parametrize("route", ["/v1/completions", "/tokenize"])
def test_other_vllm_routes_exist(http: httpx.Client, route: str) -> None:
    # An empty body is a schema error there, not a missing route.
    assert http.post(route, json={}).status_code == 400
