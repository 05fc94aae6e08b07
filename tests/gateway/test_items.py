"""The Responses API's output items the gateway keeps for later references: the memory
(pure), what reads them off an answer, and two turns through a gateway in front of the
emulator, in process (a real vLLM refuses a reference: tests/contract/test_responses.py)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from tests.contract.contract_kit import named_events

from herdless.emulator.app import create_app as create_emulator
from herdless.emulator.settings import EmulatorSettings
from herdless.gateway.app import create_app
from herdless.gateway.items import ItemMemory, OutputItems
from herdless.gateway.runtime import Runtime
from herdless.gateway.settings import GatewaySettings
from herdless.gateway.wire import BadRequest

MODEL = "emulated"


def message(item_id: str, text: str = "Blue.") -> dict[str, Any]:
    """An output message as vLLM writes it."""
    part = {"annotations": [], "text": text, "type": "output_text", "logprobs": None}
    return {"id": item_id, "content": [part], "role": "assistant", "status": "completed",
            "type": "message", "phase": None}  # fmt: skip


def cost(item: dict[str, Any]) -> int:
    return len(json.dumps(item, separators=(",", ":"))) + 200


def referring(*ids: str) -> bytes:
    refs = [{"type": "item_reference", "id": i} for i in ids]
    body = {"model": MODEL, "input": [{"role": "user", "content": "Hi"}, *refs]}
    return json.dumps(body).encode()


# -- the memory (pure) ------------------------------------------------------------------


def test_a_reference_is_written_out_as_the_item_its_key_was_answered_with() -> None:
    memory = ItemMemory(10_000)
    memory.remember("k1", message("msg_a"))
    written = json.loads(memory.resolve("k1", referring("msg_a")))
    assert written["input"] == [{"role": "user", "content": "Hi"}, message("msg_a")]
    assert written["model"] == MODEL
    # Another key holds no such item: its reference is a 400 naming the item and the way out.
    with pytest.raises(BadRequest) as refused:
        memory.resolve("k2", referring("msg_a"))
    assert (refused.value.code, refused.value.param) == ("item_not_found", "input[1]")
    assert "'msg_a'" in str(refused.value)
    assert "store = false" in str(refused.value)
    assert memory.references == {"written": 1, "not_held": 1}


def test_a_body_without_references_passes_as_it_came() -> None:
    memory = ItemMemory(10_000)
    body = b'{"model": "m", "input": [{"role": "user", "content": "Hi"}]}'
    assert memory.resolve("k", body) is body
    assert memory.resolve("k", b'{"input": "item_reference"}') == b'{"input": "item_reference"}'


def test_the_least_recently_used_go_first_within_the_budget() -> None:
    a, b, c = message("msg_a"), message("msg_b"), message("msg_c")
    memory = ItemMemory(cost(a) + cost(b))
    memory.remember("k", a)
    memory.remember("k", b)
    assert memory.recall("k", "msg_a") == a  # used: b is now the oldest
    memory.remember("k", c)
    assert (memory.recall("k", "msg_b"), len(memory)) == (None, 2)
    assert memory.held_bytes == cost(a) + cost(c)
    memory.remember("k", a)  # again: counted once
    assert (memory.held_bytes, memory.dropped) == (cost(a) + cost(c), 1)


def test_an_item_past_the_budget_or_without_an_id_is_not_kept() -> None:
    memory = ItemMemory(500)
    memory.remember("k", message("msg_a", text="x" * 400))
    memory.remember("k", {"type": "message", "content": []})
    assert (len(memory), memory.held_bytes) == (0, 0)
    with pytest.raises(ValueError, match="max_bytes"):
        ItemMemory(-1)
    assert ItemMemory(0).keeper("k") is None  # it keeps none: answers pass unread
    keep = memory.keeper("k")
    assert keep is not None
    keep(message("msg_b"))
    assert memory.recall("k", "msg_b") == message("msg_b")


# -- what reads them off an answer ------------------------------------------------------


def stream(*items: dict[str, Any], last: str = "response.completed") -> bytes:
    events = [("response.created", {"response": {"output": []}})]
    events += [("response.output_item.done", {"item": item}) for item in items]
    events.append((last, {"response": {"output": list(items)}}))
    return b"".join(
        f"event: {name}\ndata: {json.dumps({**data, 'type': name})}\n\n".encode()
        for name, data in events
    )


def fed(sniffer: OutputItems, body: bytes, size: int) -> bytes:
    passed = b"".join(sniffer.feed(body[i : i + size]) for i in range(0, len(body), size))
    return passed + sniffer.end()


@pytest.mark.parametrize("size", [1, 7, 10_000])
def test_a_streams_items_are_kept_at_its_last_event_and_it_passes_unchanged(size: int) -> None:
    kept: list[Any] = []
    body = stream(message("msg_a"), message("msg_b"))
    assert fed(OutputItems(kept.append, stream=True), body, size) == body
    assert [item["id"] for item in kept] == ["msg_a", "msg_b"]


def test_a_stream_cut_before_its_last_event_gives_nothing() -> None:
    kept: list[Any] = []
    body = stream(message("msg_a"))
    fed(OutputItems(kept.append, stream=True), body[: body.index(b"event: response.completed")], 9)
    assert kept == []


def test_a_whole_answers_items_are_kept_when_it_parses() -> None:
    kept: list[Any] = []
    body = json.dumps({"id": "resp_1", "output": [message("msg_a")]}).encode()
    assert fed(OutputItems(kept.append, stream=False), body, 5) == body
    assert kept == [message("msg_a")]
    cut: list[Any] = []
    fed(OutputItems(cut.append, stream=False), body[:-3], 5)
    assert cut == []


@pytest.mark.parametrize("is_stream", [False, True], ids=["whole", "stream"])
def test_an_answer_past_the_limit_passes_unread(is_stream: bool) -> None:
    kept: list[Any] = []
    item = message("msg_a", text="x" * 500)
    body = stream(item) if is_stream else json.dumps({"output": [item]}).encode()
    assert fed(OutputItems(kept.append, stream=is_stream, most=400), body, 64) == body
    assert kept == []
    fed(OutputItems(kept.append, stream=is_stream, most=4000), body, 64)
    assert kept == [item]


# -- through a gateway ------------------------------------------------------------------


@asynccontextmanager
async def gateway(**settings: Any) -> AsyncIterator[tuple[httpx.AsyncClient, Runtime]]:
    """A gateway in front of the emulator, both in process; keys k1 and k2."""
    emulator = create_emulator(EmulatorSettings(model=MODEL, speed=1000))
    app = create_app(
        GatewaySettings(api_keys="k1,k2", health_interval=3600, **settings),
        transport=httpx.ASGITransport(app=emulator),
    )
    async with (
        emulator.router.lifespan_context(emulator),
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://g") as client,
    ):
        yield client, app.state.runtime


def turn(*given: dict[str, Any], stream: bool = False) -> dict[str, Any]:
    return {"model": MODEL, "input": list(given), "max_output_tokens": 6, "stream": stream}


def output_of(answer: httpx.Response) -> list[dict[str, Any]]:
    assert answer.status_code == 200, answer.text
    if answer.headers["content-type"].startswith("text/event-stream"):
        return named_events(answer.text)[-1][1]["response"]["output"]
    return list(answer.json()["output"])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_a_second_turn_may_refer_to_the_first_answer(stream: bool) -> None:
    # What the Vercel AI SDK's OpenAI provider sends by default: the answer as a reference.
    hi = {"role": "user", "content": "Hi"}
    more = {"role": "user", "content": "More"}
    async with gateway() as (client, runtime):
        key = {"authorization": "Bearer k1"}
        [item] = output_of(await client.post("/v1/responses", json=turn(hi, stream=stream),
                                             headers=key))  # fmt: skip
        reference = {"type": "item_reference", "id": item["id"]}
        second = await client.post("/v1/responses", json=turn(hi, reference, more), headers=key)
        spelled = await client.post("/v1/responses", json=turn(hi, item, more), headers=key)
        other = await client.post(
            "/v1/responses", json=turn(hi, reference, more), headers={"x-api-key": "k2"}
        )
        held = runtime.items.held_bytes
        metrics = metric_lines((await client.get("/metrics")).text, "herdless_gateway_item")
    assert second.status_code == 200, second.text
    # The engine ran the answer itself: the same prompt as the item sent in full.
    assert second.json()["usage"]["input_tokens"] == spelled.json()["usage"]["input_tokens"]
    assert other.status_code == 400  # another key's answer is not its own
    error = other.json()["error"]
    assert (error["code"], error["param"]) == ("item_not_found", "input[1]")
    assert held > 0
    # The three answers' items kept, none dropped; one reference written, one not held.
    assert metrics == {
        "herdless_gateway_item_memory_bytes": held,
        "herdless_gateway_item_memory_items": 3.0,
        "herdless_gateway_item_memory_dropped_total": 0.0,
        'herdless_gateway_item_references_total{outcome="not_held"}': 1.0,
        'herdless_gateway_item_references_total{outcome="written"}': 1.0,
    }


def metric_lines(text: str, prefix: str) -> dict[str, float]:
    """The samples of ``/metrics`` whose names start with ``prefix``."""
    samples = (line.rpartition(" ") for line in text.splitlines() if line.startswith(prefix))
    return {name: float(value) for name, _, value in samples}


async def test_with_no_memory_a_reference_is_the_gateways_clear_400() -> None:
    async with gateway(item_memory_bytes=0) as (client, runtime):
        first = await client.post(
            "/v1/responses", json=turn({"role": "user", "content": "Hi"}),
            headers={"authorization": "Bearer k1"},
        )  # fmt: skip
        [item] = output_of(first)
        reference = {"type": "item_reference", "id": item["id"]}
        refused = await client.post(
            "/v1/responses", json=turn(reference), headers={"authorization": "Bearer k1"}
        )
        assert len(runtime.items) == 0
        assert runtime.items.references == {"written": 0, "not_held": 1}
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "item_not_found"
