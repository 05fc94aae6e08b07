"""/v1/completions, /v1/embeddings, /v1/responses and /v1/messages through admission, the
JSON 404 of other /v1 routes, and their pricing (in process, a fake vLLM behind)."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import pytest
from tests.gateway.fakes import (
    EMBEDDING,
    RESPONSE,
    TEXT_COMPLETION,
    TEXT_SSE,
    FakeVllm,
    GatewayFactory,
    message_body,
    until,
    without_usage,
)

from herdless.gateway.routes import (
    parse_completion_request,
    parse_embedding_request,
    parse_response_request,
)
from herdless.gateway.wire import BadRequest

pytestmark = [pytest.mark.server]

COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"


def completion_body(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": "hello", **extra}


def embedding_body(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "input": "hello", **extra}


def response_body(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "input": "hello", **extra}


BODIES = {
    COMPLETIONS: completion_body,
    EMBEDDINGS: embedding_body,
    RESPONSES: response_body,
    MESSAGES: message_body,
}


# -- pricing (pure) ---------------------------------------------------------------------


def test_a_completion_is_priced_per_prompt() -> None:
    one = parse_completion_request(b'{"prompt":"' + b"x" * 40 + b'","max_tokens":100}')
    assert (one.prompt_tokens, one.price(512), one.open_ended) == (10, 110, False)
    three = parse_completion_request(b'{"prompt":["abcd","abcd","abcd"],"max_tokens":100}')
    assert (three.prompt_tokens, three.sequences, three.price(512)) == (3, 3, 303)
    ids = parse_completion_request(b'{"prompt":[1,2,3,4,5]}')
    assert (ids.prompt_tokens, ids.sequences, ids.price(16), ids.open_ended) == (5, 1, 21, True)
    nested = parse_completion_request(b'{"prompt":[[1,2],[3]],"user":"u","stream":true}')
    assert (nested.prompt_tokens, nested.sequences, nested.user, nested.stream) == (3, 2, "u", True)


def test_an_embedding_is_priced_by_its_input_only() -> None:
    text = parse_embedding_request(b'{"input":"' + b"x" * 40 + b'"}')
    assert (text.price(512), text.open_ended) == (10, False)  # it generates nothing
    many = parse_embedding_request(b'{"input":["abcdefgh","abcd"],"user":"u"}')
    assert (many.price(512), many.sequences, many.user) == (3, 2, "u")
    assert parse_embedding_request(b'{"input":[[1,2,3],[4]]}').price(512) == 4


def test_a_response_is_priced_by_its_input_instructions_and_max_output_tokens() -> None:
    text = parse_response_request(b'{"input":"' + b"x" * 40 + b'","max_output_tokens":100}')
    assert (text.prompt_tokens, text.sequences, text.price(512)) == (10, 1, 110)
    told = parse_response_request(b'{"input":"abcd","instructions":"abcdefgh","user":"u"}')
    assert (told.prompt_tokens, told.price(16), told.user, told.open_ended) == (3, 19, "u", True)
    items = b'[{"role":"user","content":[{"type":"input_text","text":"hello there"}]}]'
    listed = parse_response_request(b'{"input":' + items + b',"stream":true}')
    assert listed.prompt_tokens == math.ceil(len(json.dumps(json.loads(items))) / 4)
    assert listed.stream


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"input":[]}', "input"),
        (b'{"input":3}', "input"),
        (b'{"input":"a","instructions":7}', "instructions"),
        (b'{"input":"a","max_output_tokens":0}', "max_output_tokens"),
        (b'{"input":"a","background":true}', "background"),
    ],
)
def test_a_response_that_cannot_be_priced_or_held_is_a_bad_request(body: bytes, param: str) -> None:
    with pytest.raises(BadRequest) as refused:
        parse_response_request(body)
    assert refused.value.param == param
    with pytest.raises(BadRequest, match="at most 3") as too_many:
        parse_response_request(b'{"input":["a","b","c","d"]}', max_messages=3)
    assert too_many.value.code == "request_too_large"


@pytest.mark.parametrize(
    ("parse", "body", "param", "code"),
    [
        (parse_completion_request, b"nope", None, "invalid_request"),
        (parse_completion_request, b"[]", None, "invalid_request"),
        (parse_completion_request, b'{"prompt":[]}', "prompt", "invalid_request"),
        (parse_completion_request, b'{"prompt":3}', "prompt", "invalid_request"),
        (parse_completion_request, b'{"prompt":["a",1]}', "prompt[1]", "invalid_request"),
        (
            parse_completion_request,
            b'{"prompt":"a","max_tokens":0}',
            "max_tokens",
            "invalid_request",
        ),
        (
            parse_completion_request,
            b'{"prompt":"a","max_tokens":9}',
            "max_tokens",
            "request_too_large",
        ),
        (parse_completion_request, b'{"prompt":["a","b","c"]}', "prompt", "request_too_large"),
        (parse_completion_request, b'{"prompt":"a","stream":"yes"}', "stream", "invalid_request"),
        (parse_embedding_request, b'{"input":null}', "input", "invalid_request"),
        (parse_embedding_request, b'{"input":[[]]}', "input[0]", "invalid_request"),
        (parse_embedding_request, b'{"input":"a","user":5}', "user", "invalid_request"),
        (parse_embedding_request, b'{"input":"a","model":5}', "model", "invalid_request"),
    ],
)
def test_what_cannot_be_priced_is_a_bad_request(
    parse: Any, body: bytes, param: str | None, code: str
) -> None:
    with pytest.raises(BadRequest) as caught:
        parse(body, max_messages=2, max_tokens_cap=8)
    assert (caught.value.param, caught.value.code) == (param, code)


# -- over HTTP --------------------------------------------------------------------------


async def test_completions_and_embeddings_are_proxied_to_their_own_upstream_route(
    gateway: GatewayFactory, fake_vllm: FakeVllm
) -> None:
    async with gateway() as (client, runtime):
        text = await client.post(
            COMPLETIONS, json=completion_body(), headers={"x-request-id": "r1"}
        )
        stream = await client.post(COMPLETIONS, json=completion_body(stream=True))
        vectors = await client.post(EMBEDDINGS, json=embedding_body())
        answer = await client.post(RESPONSES, json=response_body())
    assert (text.status_code, text.content, text.headers["x-request-id"]) == (
        200,
        TEXT_COMPLETION,
        "r1",
    )
    assert stream.content == without_usage(TEXT_SSE)  # its client asked for none
    assert vectors.content == EMBEDDING
    assert answer.content == RESPONSE
    assert fake_vllm.paths == [COMPLETIONS, COMPLETIONS, EMBEDDINGS, RESPONSES]
    assert runtime.gate.admission.inflight == 0


async def test_usage_is_settled_and_the_user_field_is_the_fairness_unit(
    gateway: GatewayFactory,
) -> None:
    async with gateway() as (client, runtime):
        await client.post(COMPLETIONS, json=completion_body(user="ann"))
        await client.post(EMBEDDINGS, json=embedding_body(user="bob"))
        await client.post(RESPONSES, json=response_body(user="cy"))
        queue, admission = runtime.gate.admission.queue, runtime.gate.admission
        # vLLM's usage, weighted (prompt 1, completion 2): 5 + 3 * 2 and 7 + 0.
        assert queue.counter("interactive", f"anonymous/{runtime.users('ann')}") == 11
        assert queue.counter("interactive", f"anonymous/{runtime.users('bob')}") == 7
        # The Responses API's names: input_tokens 9, output_tokens 4.
        assert queue.counter("interactive", f"anonymous/{runtime.users('cy')}") == 9 + 4 * 2
        assert admission.inflight_tokens == 0


async def test_the_kv_budget_prices_each_route_by_its_own_tokens(gateway: GatewayFactory) -> None:
    async with gateway(max_inflight_tokens=250, default_max_tokens=200) as (client, _):
        one = await client.post(COMPLETIONS, json=completion_body(max_tokens=100))
        three = await client.post(
            COMPLETIONS, json=completion_body(prompt=["a", "b", "c"], max_tokens=100)
        )
        # default_max_tokens (200) + a prompt fits; an embedding is never charged for it.
        embedding = await client.post(EMBEDDINGS, json=embedding_body(input="x" * 900))
        too_long = await client.post(EMBEDDINGS, json=embedding_body(input="x" * 1200))
    assert (one.status_code, three.status_code, embedding.status_code) == (200, 400, 200)
    assert three.json()["error"]["code"] == "request_too_large"
    assert too_long.status_code == 400


@pytest.mark.parametrize("path", [COMPLETIONS, EMBEDDINGS, RESPONSES, MESSAGES])
async def test_a_full_gateway_refuses_them_with_retry_after(
    gateway: GatewayFactory, fake_vllm: FakeVllm, path: str
) -> None:
    fake_vllm.hold = asyncio.Event()
    async with gateway(max_concurrency=1, max_queue=0) as (client, runtime):
        running = asyncio.create_task(client.post(path, json=BODIES[path]()))
        await until(lambda: runtime.gate.admission.inflight >= 1)
        refused = await client.post(path, json=BODIES[path]())
        fake_vllm.hold.set()
        done = await running
    assert done.status_code == 200
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "queue_full"
    assert int(refused.headers["retry-after"]) >= 1
    assert fake_vllm.paths == [path]


@pytest.mark.parametrize("path", [COMPLETIONS, EMBEDDINGS, RESPONSES, MESSAGES])
async def test_they_share_the_chat_limits(
    gateway: GatewayFactory, fake_vllm: FakeVllm, path: str
) -> None:
    async with gateway(api_keys="k1", max_body_bytes=200, rate=0.5, burst=1) as (client, _):
        no_key = await client.post(path, json=BODIES[path]())
        auth = {"authorization": "Bearer k1"}
        too_big = await client.post(path, json=BODIES[path](user="x" * 300), headers=auth)
        served = await client.post(path, json=BODIES[path](), headers=auth)
        limited = await client.post(path, json=BODIES[path](), headers=auth)
    assert no_key.status_code == 401
    assert too_big.status_code == 413
    assert served.status_code == 200
    assert limited.status_code == 429
    assert limited.json()["error"]["code"] == "rate_limited"
    assert "authorization" not in fake_vllm.received[0][0]


async def test_a_deadline_the_queue_cannot_meet_refuses_an_embedding_at_once(
    gateway: GatewayFactory, fake_vllm: FakeVllm
) -> None:
    fake_vllm.hold = asyncio.Event()
    async with gateway(max_concurrency=1, max_queue=4) as (client, runtime):
        running = asyncio.create_task(client.post(EMBEDDINGS, json=embedding_body()))
        await until(lambda: runtime.gate.admission.inflight >= 1)
        hurried = await client.post(
            EMBEDDINGS, json=embedding_body(), headers={"x-herdless-deadline-ms": "50"}
        )
        fake_vllm.hold.set()
        await running
    assert hurried.status_code == 429
    assert hurried.json()["error"]["code"] == "deadline_unattainable"
    assert int(hurried.headers["retry-after"]) >= 1


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/v1/messages/batches"), ("POST", "/v1/audio/speech"), ("GET", "/v1/embeddings/x")],
)
async def test_other_v1_routes_are_a_json_404_naming_the_served_ones(
    gateway: GatewayFactory, fake_vllm: FakeVllm, method: str, path: str
) -> None:
    async with gateway() as (client, _):
        response = await client.request(method, path, json={})
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] == "not_found"
    for served in (
        "POST /v1/chat/completions",
        "POST /v1/completions",
        "POST /v1/embeddings",
        "POST /v1/responses",
        "POST /v1/messages",
        "POST /v1/messages/count_tokens",
    ):
        assert served in error["message"]
    assert "GET /v1/models" in error["message"]
    assert fake_vllm.paths == []


async def test_an_unknown_path_outside_v1_names_no_routes(gateway: GatewayFactory) -> None:
    async with gateway() as (client, _):
        response = await client.get("/v2/embeddings")
    assert response.json()["error"]["message"] == "no route GET /v2/embeddings"


async def test_get_on_an_admitted_route_is_a_405(gateway: GatewayFactory) -> None:
    async with gateway() as (client, _):
        paths = (COMPLETIONS, EMBEDDINGS, RESPONSES, MESSAGES)
        responses = [await client.get(path) for path in paths]
    assert [r.status_code for r in responses] == [405] * len(paths)
