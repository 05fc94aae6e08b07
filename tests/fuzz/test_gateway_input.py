"""Fuzzed HTTP input to the gateway, in process: always a clean answer, never a 500.

The gateway runs with its real routes, admission and proxy, in front of a scripted
vLLM (``tests.gateway.fakes.FakeVllm``), through Starlette's ``TestClient``. Every
case must end in a 2xx (the input was valid after all) or a 4xx with an OpenAI-style
JSON error; never a 5xx, and afterwards no slot or queue place is left held.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("starlette")

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient
from tests.fuzz._counts import COUNTS
from tests.gateway.fakes import FakeVllm

from herdless.gateway.app import create_app
from herdless.gateway.runtime import Runtime
from herdless.gateway.settings import GatewaySettings

pytestmark = [pytest.mark.server]

MAX_BODY = 64 * 1024
PATH = "/v1/chat/completions"
FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
MESSAGE = st.fixed_dictionaries(
    {"role": JSON | st.sampled_from(["user", "system", "assistant"])},
    optional={
        "content": JSON
        | st.text(max_size=50)
        | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": JSON}), max_size=3)
    },
)
CHAT = st.fixed_dictionaries(
    {"messages": st.lists(MESSAGE, max_size=4) | JSON},
    optional={
        "model": JSON | st.just("m"),
        "stream": JSON | st.booleans(),
        "max_tokens": JSON | st.integers(-5, 10**12),
        "max_completion_tokens": JSON,
        "temperature": JSON,
    },
)


@pytest.fixture(scope="module")
def gateway() -> Iterator[tuple[TestClient, Runtime]]:
    vllm = FakeVllm()
    settings_ = GatewaySettings(
        health_interval=3600,
        max_body_bytes=MAX_BODY,
        max_concurrency=4,
        max_queue=4,
        api_keys="fuzz-key",  # type: ignore[arg-type]  # pydantic turns it into a SecretStr
        admin_token="fuzz-admin",  # type: ignore[arg-type]
    )
    app = create_app(settings_, transport=httpx.ASGITransport(app=vllm.app))
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, app.state.runtime


AUTH = {"authorization": "Bearer fuzz-key"}


def check(response: httpx.Response) -> None:
    """A clean answer: 2xx, or 4xx with an OpenAI-style JSON error. Never a 5xx."""
    assert response.status_code < 500, (response.status_code, response.text[:300])
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error["message"], str)
        assert isinstance(error["code"], str)
        assert "Traceback" not in response.text


def settled(runtime: Runtime) -> None:
    admission = runtime.gate.admission
    assert admission.inflight == 0
    assert admission.queue_depth == 0


def post(
    client: TestClient, content: bytes, headers: dict[str, str] | None = None
) -> httpx.Response:
    return client.post(
        PATH,
        content=content,
        headers={"content-type": "application/json", **AUTH, **(headers or {})},
    )


@FUZZ
@given(body=CHAT)
def test_chat_shaped_bodies_with_wrong_types(
    gateway: tuple[TestClient, Runtime], body: Any
) -> None:
    client, runtime = gateway
    COUNTS["gateway: chat-shaped JSON, wrong types"] += 1
    check(post(client, json.dumps(body).encode()))
    settled(runtime)


@FUZZ
@given(body=JSON)
def test_any_json_value(gateway: tuple[TestClient, Runtime], body: Any) -> None:
    client, runtime = gateway
    COUNTS["gateway: arbitrary JSON values"] += 1
    check(post(client, json.dumps(body).encode()))
    settled(runtime)


@FUZZ
@given(raw=st.binary(max_size=512))
def test_arbitrary_bytes(gateway: tuple[TestClient, Runtime], raw: bytes) -> None:
    client, runtime = gateway
    COUNTS["gateway: arbitrary bytes (malformed JSON, bad UTF-8)"] += 1
    check(post(client, raw))
    settled(runtime)


@FUZZ
@given(prefix=st.binary(min_size=1, max_size=8), text=st.text(max_size=20))
def test_bad_utf8_inside_a_valid_body(
    gateway: tuple[TestClient, Runtime], prefix: bytes, text: str
) -> None:
    client, runtime = gateway
    COUNTS["gateway: bad UTF-8 inside a chat body"] += 1
    content = (
        b'{"messages":[{"role":"user","content":"' + b"\xff" + prefix + text.encode() + b'"}]}'
    )
    check(post(client, content))
    settled(runtime)


@pytest.mark.parametrize("depth", [10, 1_000, 30_000])
@pytest.mark.parametrize("shape", ["array", "object"])
def test_deeply_nested_bodies(gateway: tuple[TestClient, Runtime], depth: int, shape: str) -> None:
    client, runtime = gateway
    COUNTS["gateway: deeply nested bodies"] += 1
    opener, closer = (b"[", b"]") if shape == "array" else (b'{"a":', b"}")
    nested = opener * depth + b"1" + closer * depth
    check(post(client, b'{"messages":' + nested + b"}"))
    check(post(client, nested))
    settled(runtime)


@pytest.mark.parametrize("declared", [True, False])
def test_a_huge_body_is_refused_413(gateway: tuple[TestClient, Runtime], declared: bool) -> None:
    client, runtime = gateway
    COUNTS["gateway: huge bodies"] += 1
    content = b'{"messages":[{"role":"user","content":"' + b"x" * (MAX_BODY * 4) + b'"}]}'
    if declared:
        response = post(client, content)
    else:  # chunked: no Content-Length to refuse early, the size is counted while reading
        response = client.post(
            PATH,
            content=iter([content[i : i + 8192] for i in range(0, len(content), 8192)]),
            headers=AUTH,
        )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "body_too_large"
    settled(runtime)


HEADER_VALUE = st.binary(max_size=64).filter(lambda v: b"\r" not in v and b"\n" not in v)


@FUZZ
@given(
    name=st.sampled_from(
        [b"x-request-id", b"x-herdless-attempt", b"content-type", b"accept", b"authorization"]
    ),
    value=HEADER_VALUE,
)
def test_odd_header_values(gateway: tuple[TestClient, Runtime], name: bytes, value: bytes) -> None:
    client, runtime = gateway
    COUNTS["gateway: odd header values (non-ASCII, control bytes)"] += 1
    headers = [(b"content-type", b"application/json"), (b"authorization", b"Bearer fuzz-key")]
    headers = [(n, v) for n, v in headers if n != name] + [(name, value)]
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
    response = client.post(PATH, content=body, headers=headers)
    check(response)
    echoed = response.headers.get("x-request-id", "-")  # sane when echoed: visible ASCII
    assert echoed.isascii()
    assert echoed.isprintable()
    assert 0 < len(echoed) <= 128
    settled(runtime)


@pytest.mark.parametrize(
    "path",
    [
        "/admin/drain",
        "/admin/resume",
        "/v1/chat/completions/../../admin/drain",
        "/%00",
        "/v1/../etc/passwd",
    ],
)
def test_odd_paths_and_unauthenticated_admin(
    gateway: tuple[TestClient, Runtime], path: str
) -> None:
    client, runtime = gateway
    COUNTS["gateway: odd paths, admin without token"] += 1
    response = client.post(path, content=b"{}")
    assert 400 <= response.status_code < 500
    assert not runtime.gate.admission.draining


def test_the_gateway_still_serves_after_the_fuzzing(gateway: tuple[TestClient, Runtime]) -> None:
    client, runtime = gateway
    response = post(client, json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode())
    assert response.status_code == 200
    settled(runtime)
