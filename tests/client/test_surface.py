"""The openai-style surface, on both clients (``client_kind``): keyword arguments and
``extra_body`` / ``extra_headers``, several hooks, typed tool calls, token and money
accounting, the spend guard's token and money caps, and ``with_options``."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from tests.client.client_harness import HOSTED, HOSTED_KEY, KEY, Harness

import herdless
from herdless.events import CallFinished, Event, ResponseReceived
from herdless.testing import draining, ok, rate_limited, server_error, stream

WEATHER = {"name": "weather", "arguments": '{"city": "Seoul"}'}
TIME = {"name": "time", "arguments": '{"zone": "KST"}', "id": "call_time"}


# -- keyword arguments ---------------------------------------------------------------------


async def test_a_misspelled_argument_is_a_type_error_naming_the_right_one(
    harness: Harness,
) -> None:
    with pytest.raises(TypeError, match="'temprature'; did you mean 'temperature'"):
        await harness.chat(temprature=0.2)
    assert harness.primary.requests == []


async def test_known_openai_and_vllm_fields_are_keywords(harness: Harness) -> None:
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {}}}]
    await harness.chat(
        seed=1,
        stop=["\n"],
        tools=tools,
        tool_choice="auto",
        top_p=0.9,
        user="u-1",
        logit_bias={"50256": -100},
        min_tokens=2,
        ignore_eos=True,
    )
    body = harness.primary.bodies[0]
    assert body["tools"] == tools
    assert (body["seed"], body["top_p"], body["min_tokens"], body["ignore_eos"]) == (
        1,
        0.9,
        2,
        True,
    )


async def test_extra_body_and_extra_headers_reach_every_backend(harness: Harness) -> None:
    harness.primary.script(draining())
    harness.build(fallback=harness.hosted_backend())
    await harness.chat(extra_body={"guided_regex": "[a-z]+"}, extra_headers={"X-Tenant": "blue"})
    for backend in (harness.primary, harness.hosted):
        [request] = backend.requests
        assert json.loads(request.content)["guided_regex"] == "[a-z]+"
        assert request.headers["x-tenant"] == "blue"
    # Each backend still gets its own key, and herdless's headers are its own.
    assert harness.primary.requests[0].headers["authorization"] == f"Bearer {KEY}"
    assert harness.hosted.requests[0].headers["authorization"] == f"Bearer {HOSTED_KEY}"
    assert harness.hosted.requests[0].headers["x-herdless-attempt"] == "2"


async def test_extra_headers_may_not_carry_a_key(harness: Harness) -> None:
    with pytest.raises(ValueError, match="Authorization"):
        await harness.chat(extra_headers={"Authorization": "Bearer sk-other"})
    assert harness.primary.requests == []


async def test_a_404_from_a_base_url_without_v1_says_so(router: Any, client_kind: str) -> None:
    from herdless.testing import MockBackend

    MockBackend(router, "http://gpu.test").script(server_error(404, "Not Found"))
    h = Harness(client_kind, router)
    h.build(primary=herdless.Backend(name="primary", base_url="http://gpu.test"))
    with pytest.raises(herdless.NotFoundError) as caught:
        await h.chat()
    await h.close()
    assert isinstance(caught.value, herdless.BadRequestError)  # the old except still works
    assert caught.value.status_code == 404
    assert "does not end in /v1" in str(caught.value)
    assert "try http://gpu.test/v1" in str(caught.value)


# -- hooks ---------------------------------------------------------------------------------


async def test_on_event_takes_several_hooks(harness: Harness) -> None:
    first: list[Event] = []
    second: list[Event] = []

    def broken(event: Event) -> None:
        raise RuntimeError("a broken hook")

    harness.build(on_event=[first.append, broken, second.append])
    await harness.chat()
    assert first == second
    assert any(isinstance(event, CallFinished) for event in first)


async def test_the_async_client_awaits_each_async_hook(router: Any) -> None:
    seen: list[str] = []

    async def slow(event: Event) -> None:
        seen.append(f"async {type(event).__name__}")

    h = Harness("async", router)
    h.build(on_event=(slow, lambda event: seen.append(f"sync {type(event).__name__}")))
    await h.chat()
    await h.close()
    assert "async CallFinished" in seen
    assert "sync CallFinished" in seen
    assert seen.index("async CallFinished") < seen.index("sync CallFinished")


def test_the_sync_client_refuses_an_async_hook_in_a_sequence() -> None:
    async def hook(event: Event) -> None:
        return None

    with pytest.raises(TypeError, match="AsyncClient"):
        herdless.Client("http://gpu.test/v1", on_event=[print, hook], env_file=None)
    with pytest.raises(TypeError, match="callable"):
        herdless.Client("http://gpu.test/v1", on_event=[print, 3], env_file=None)  # type: ignore[list-item]


# -- tool calls ----------------------------------------------------------------------------


async def test_a_whole_answer_has_typed_tool_calls(harness: Harness) -> None:
    harness.primary.script(ok("", tool_calls=[WEATHER, TIME]))
    result = await harness.chat()
    assert result.finish_reason == "tool_calls"
    assert result.content == ""
    assert [(c.id, c.type, c.function.name, c.function.arguments) for c in result.tool_calls] == [
        ("call_0", "function", "weather", '{"city": "Seoul"}'),
        ("call_time", "function", "time", '{"zone": "KST"}'),
    ]


async def test_a_stream_joins_its_tool_call_pieces(harness: Harness) -> None:
    harness.primary.script(stream(["Let me check."], tool_calls=[WEATHER, TIME]))
    result, chunks = await harness.stream()
    pieces = [delta for chunk in chunks for delta in chunk.tool_calls]
    assert len(pieces) == 6  # per call: the head (id, name), then two pieces of arguments
    assert pieces[0].id == "call_0"
    assert pieces[0].function is not None
    assert pieces[0].function.name == "weather"
    assert result.finish_reason == "tool_calls"
    assert [(c.id, c.function.name, c.function.arguments) for c in result.tool_calls] == [
        ("call_0", "weather", '{"city": "Seoul"}'),
        ("call_time", "time", '{"zone": "KST"}'),
    ]


# -- tokens and money ----------------------------------------------------------------------


def _priced(harness: Harness, **policy: Any) -> herdless.Backend:
    return herdless.Backend(
        name="hosted",
        base_url=HOSTED,
        api_key=HOSTED_KEY,
        model="gpt-mini",
        external=True,
        price=herdless.Price(input=2.0, output=10.0),
    )


async def test_stats_count_tokens_and_cost_per_backend(harness: Harness) -> None:
    harness.primary.script(ok("one two three"), draining())
    harness.hosted.script(ok("four five"))
    harness.build(fallback=_priced(harness))
    await harness.chat()
    await harness.chat()
    stats = harness.client.stats()
    # ok(): 1 prompt token, one completion token per word.
    assert stats.tokens == {
        "primary": {"prompt_tokens": 1, "completion_tokens": 3},
        "hosted": {"prompt_tokens": 1, "completion_tokens": 2},
    }
    assert stats.cost == {"hosted": pytest.approx((1 * 2.0 + 2 * 10.0) / 1e6)}
    assert stats.as_dict()["tokens"]["hosted"] == {"prompt_tokens": 1, "completion_tokens": 2}


async def test_a_stream_counts_the_tokens_of_its_usage_chunk(harness: Harness) -> None:
    harness.primary.script(stream(["a", "b", "c", "d"]))
    await harness.stream()
    assert harness.client.stats().tokens == {
        "primary": {"prompt_tokens": 1, "completion_tokens": 4}
    }


async def test_response_received_comes_before_call_finished(harness: Harness) -> None:
    harness.primary.script(draining())
    harness.hosted.script(ok("four five"))
    harness.build(fallback=_priced(harness))
    await harness.chat()
    names = [type(e).__name__ for e in harness.events]
    assert names.index("ResponseReceived") == names.index("CallFinished") - 1
    [received] = [e for e in harness.events if isinstance(e, ResponseReceived)]
    assert (received.backend, received.model, received.finish_reason) == (
        "hosted",
        "gpt-mini",
        "stop",
    )
    assert (received.input_tokens, received.output_tokens) == (1, 2)
    assert received.cost == pytest.approx(22.0 / 1e6)
    assert (received.server_address, received.server_port) == ("hosted.test", 443)
    assert received.external is True
    assert received.response_id == harness.hosted.requests[0].headers["x-request-id"]


async def test_the_token_cap_keeps_calls_off_the_external_fallback(harness: Harness) -> None:
    harness.primary.script(server_error(502))
    harness.hosted.script(ok("one two three four"))
    harness.build(
        fallback=_priced(harness),
        retry=herdless.RetryPolicy(max_attempts=1),
        fallback_policy=herdless.FallbackPolicy(max_external_tokens=5),
    )
    await harness.chat()  # 1 + 4 tokens: the cap is reached, not passed
    with pytest.raises(herdless.SpendLimitExceeded) as caught:
        await harness.chat()
    assert caught.value.limit == "tokens"
    assert "max_external_tokens" in str(caught.value)
    assert "5 tokens" in str(caught.value)
    assert len(harness.hosted.requests) == 1


async def test_the_money_cap_names_itself(harness: Harness) -> None:
    harness.primary.script(server_error(502))
    harness.hosted.script(ok("one two three four"))
    harness.build(
        fallback=_priced(harness),
        retry=herdless.RetryPolicy(max_attempts=1),
        fallback_policy=herdless.FallbackPolicy(max_external_cost=40e-6),
    )
    await harness.chat()  # (1 * 2 + 4 * 10) / 1e6 = 42e-6
    with pytest.raises(herdless.SpendLimitExceeded) as caught:
        await harness.chat()
    assert caught.value.limit == "cost"
    assert "max_external_cost" in str(caught.value)


# -- with_options --------------------------------------------------------------------------


async def _chat(harness: Harness, client: Any, **kwargs: Any) -> Any:
    """A call through ``client`` (a derived one), the harness keeping its own to close."""
    own, harness.client = harness.client, client
    try:
        return await harness.chat(**kwargs)
    finally:
        harness.client = own


async def test_with_options_shares_state_and_changes_defaults(harness: Harness) -> None:
    harness.primary.script(ok())
    client = harness.build()
    strict = client.with_options(deadline=7.0, timeouts=herdless.Timeouts(first_byte=4.0))
    assert strict.config.deadline == 7.0
    assert client.config.deadline == 60.0
    await _chat(harness, strict)
    await harness.chat()
    # The same counters (and the same breakers, windows, budgets behind them).
    assert client.stats() == strict.stats()
    assert client.stats().succeeded == 2
    assert strict._state.breaker(client.config.primaries[0]) is client._state.breaker(
        client.config.primaries[0]
    )
    first, second = harness.primary.requests
    assert first.headers["x-herdless-deadline-ms"] == "7000"
    assert second.headers["x-herdless-deadline-ms"] == "60000"
    assert first.extensions["timeout"]["read"] == 4.0


async def test_with_options_allow_fallback_false_guards_every_call(harness: Harness) -> None:
    harness.primary.script(draining())
    client = harness.build(fallback=harness.hosted_backend())
    guarded = client.with_options(allow_fallback=False)
    with pytest.raises(herdless.FallbackNotAllowed):
        await _chat(harness, guarded, allow_fallback=True)  # the client's guard wins
    assert harness.hosted.requests == []


async def test_with_options_may_keep_a_module_off_external_backends(harness: Harness) -> None:
    harness.primary.script(server_error(502))
    client = harness.build(
        fallback=harness.hosted_backend(), retry=herdless.RetryPolicy(max_attempts=1)
    )
    internal = client.with_options(fallback_policy=herdless.FallbackPolicy(allow_external=False))
    with pytest.raises(herdless.FallbackNotAllowed, match="allow_external=False"):
        await _chat(harness, internal)
    result = await harness.chat()
    assert result.backend == "hosted"


async def test_with_options_refuses_to_change_shared_state(harness: Harness) -> None:
    client = harness.build()
    with pytest.raises(ValueError, match="budget_ratio"):
        client.with_options(retry=herdless.RetryPolicy(budget_ratio=0.5))
    with pytest.raises(ValueError, match="max_external_share"):
        client.with_options(fallback_policy=herdless.FallbackPolicy(max_external_share=0.1))
    with pytest.raises(ValueError, match="deadline"):
        client.with_options(deadline=-1)
    # Other retry fields are per-call defaults.
    assert (
        client.with_options(retry=herdless.RetryPolicy(max_attempts=9)).config.retry.max_attempts
        == 9
    )


async def test_with_options_refuses_a_name_it_does_not_know(harness: Harness) -> None:
    client = harness.build()
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'deadlin'.*'deadline'"):
        client.with_options(deadlin=5.0)  # type: ignore[call-arg]
    # A ClientOptions name that is shared state is no call default: refused by name too.
    with pytest.raises(TypeError, match="'breaker'"):
        client.with_options(breaker=herdless.BreakerPolicy())  # type: ignore[call-arg]


async def test_closing_a_derived_client_leaves_the_pool_open(harness: Harness) -> None:
    harness.primary.script(ok())
    client = harness.build()
    derived = client.with_options(deadline=5.0)
    if harness.kind == "sync":
        derived.close()
    else:
        await derived.aclose()
    assert not client._http.is_closed
    await harness.chat()
    assert derived._http is client._http


async def test_rate_limit_waits_are_shared_with_a_derived_client(harness: Harness) -> None:
    harness.primary.script(rate_limited(2.0), ok())
    client = harness.build()
    derived = client.with_options(deadline=30.0)
    await _chat(harness, derived)
    assert client.stats().retries == 1


def test_a_derived_sync_client_keeps_the_bounded_transport() -> None:
    with herdless.Client("http://gpu.test/v1", env_file=None) as client:
        derived = client.with_options(deadline=5.0)
        assert derived._limit is client._limit is not None
        assert isinstance(derived._http, httpx.Client)
