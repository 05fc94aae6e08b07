"""Malformed upstream responses become typed SDK errors, never a crash.

A real ``herdless.Client`` (and ``AsyncClient``) over ``httpx.MockTransport`` gets
bodies that are not what an OpenAI-compatible server sends: bad JSON, JSON of the
wrong shape, truncated or garbled SSE, the wrong content type. Each call must end in
a ``ChatResult`` / chunks (when the SDK can make sense of it) or a ``HerdlessError``;
any other exception is a defect. No fake clock is needed: nothing retries for long
(``protocol`` failures are not retried; statuses here are 2xx or 4xx).
"""

from __future__ import annotations

import json
import random

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.fuzz._counts import COUNTS

from herdless import AsyncClient, Client, HerdlessError, RetryPolicy
from herdless.testing import FakeClock

FUZZ = settings(
    max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
GOOD_CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'

FIELDS = ["choices", "message", "content", "usage", "delta", "x"]
CONTENT_TYPES = st.sampled_from(
    ["application/json", "text/event-stream", "text/html", "text/plain", "", "application/xml"]
)
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["choices", "message", "content", "usage", "delta", "x"]),
            inner,
            max_size=3,
        )
    ),
    max_leaves=10,
)
BODIES = st.one_of(
    st.binary(max_size=300),
    JSONISH.map(lambda value: json.dumps(value).encode()),
    st.lists(st.binary(max_size=40) | JSONISH.map(json.dumps).map(str.encode), max_size=5).map(
        lambda parts: b"".join(b"data: " + part + b"\n\n" for part in parts)
    ),
    st.integers(0, 3).map(lambda n: GOOD_CHUNK * n + b'data: {"choices":[{"delta":{"cont'),
)


def client(handler: httpx.MockTransport) -> Client:
    clock = FakeClock()
    return Client(
        primary="http://gpu.test/v1",
        model="m",
        retry=RetryPolicy(max_attempts=2),
        deadline=30.0,
        clock=clock,
        sleep=clock.sleep,
        rng=random.Random(0),
        transport=handler,
        env_file=None,
    )


def reply(status: int, body: bytes, content_type: str) -> httpx.MockTransport:
    headers = {"content-type": content_type} if content_type else {}
    return httpx.MockTransport(
        lambda request: httpx.Response(status, content=body, headers=headers)
    )


@FUZZ
@given(body=BODIES, content_type=CONTENT_TYPES, status=st.sampled_from([200, 200, 400, 404, 422]))
@pytest.mark.parametrize("stream", [False, True])
def test_malformed_answers_end_in_a_result_or_a_typed_error(
    body: bytes, content_type: str, status: int, stream: bool
) -> None:
    COUNTS[f"sdk: malformed upstream answer (stream={stream})"] += 1
    with client(reply(status, body, content_type)) as sdk:
        try:
            if stream:
                with sdk.chat([{"role": "user", "content": "hi"}], stream=True) as chunks:
                    text = "".join(chunk.content for chunk in chunks)
                assert isinstance(text, str)
            else:
                result = sdk.chat([{"role": "user", "content": "hi"}])
                assert isinstance(result.content, str)
        except HerdlessError:
            pass  # typed: what a caller catches


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b"{not json", "application/json"),
        (b"", "application/json"),
        (b"<html>502 Bad Gateway</html>", "text/html"),
        (b'{"choices": "nope"}', "application/json"),
        (b'{"choices": [{"message": null}]}', "application/json"),
        (GOOD_CHUNK * 2 + b"data: {trunc", "text/event-stream"),
    ],
)
async def test_async_client_types_malformed_answers(body: bytes, content_type: str) -> None:
    COUNTS["sdk: malformed upstream answer (AsyncClient)"] += 1
    clock = FakeClock()
    headers = {"content-type": content_type}
    transport = httpx.MockTransport(
        lambda request: httpx.Response(200, content=body, headers=headers)
    )
    messages = [{"role": "user", "content": "hi"}]
    async with AsyncClient(
        primary="http://gpu.test/v1",
        model="m",
        deadline=30.0,
        clock=clock,
        sleep=clock.asleep,
        rng=random.Random(0),
        transport=transport,
        env_file=None,
    ) as sdk:
        for stream in (False, True):
            try:
                if stream:
                    async with await sdk.chat(
                        [{"role": "user", "content": "hi"}], stream=True
                    ) as chunks:
                        async for chunk in chunks:
                            assert isinstance(chunk.content, str)
                else:
                    result = await sdk.chat(messages)
                    assert isinstance(result.content, str)
            except HerdlessError:
                pass
