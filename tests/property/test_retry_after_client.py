"""No attempt ever goes out earlier than a server's Retry-After: the whole SDK, on a fake clock.

A real ``herdless.Client`` over ``httpx.MockTransport`` (no socket, no sleeping: the
injected ``sleep`` advances a ``FakeClock``) is answered by a hypothesis-chosen script
of 429/502/503/200 responses, with or without ``retry-after-ms``. Several calls run
one after another on the same client, so the rule is checked across calls too (the
client-wide gate). Every call ends in a ``ChatResult`` or a ``HerdlessError``.
"""

from __future__ import annotations

import json
import random

import httpx
from hypothesis import given
from hypothesis import strategies as st
from tests.property._profile import PROPERTY

from herdless import Client, HerdlessError, RetryPolicy
from herdless.testing import FakeClock

OK = json.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
).encode()

ANSWER = st.tuples(
    st.sampled_from([200, 429, 502, 503]),
    st.none() | st.floats(0.0, 12.0),  # the server's Retry-After, seconds
)
MAX_RETRY_AFTER = 8.0


@PROPERTY
@given(script=st.lists(ANSWER, min_size=1, max_size=25), calls=st.integers(1, 4))
def test_no_attempt_before_the_servers_retry_after(
    script: list[tuple[int, float | None]], calls: int
) -> None:
    clock = FakeClock()
    not_before = 0.0  # the latest time any answer so far asked the client to wait for
    sends: list[float] = []
    answers = iter(script)

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal not_before
        now = clock.monotonic()
        assert now >= not_before - 1e-9, f"sent {not_before - now:.3f}s before Retry-After"
        sends.append(now)
        status, retry_after = next(answers, (200, None))
        if status == 200:
            return httpx.Response(200, content=OK, headers={"content-type": "application/json"})
        headers = {}
        if retry_after is not None:
            headers["retry-after-ms"] = str(round(retry_after * 1000))
            not_before = max(
                not_before, now + min(round(retry_after * 1000) / 1000, MAX_RETRY_AFTER)
            )
        body = {"error": {"message": "busy", "type": "x", "code": None}}
        return httpx.Response(status, json=body, headers=headers)

    client = Client(
        primary="http://gateway.test/v1",
        model="m",
        retry=RetryPolicy(max_retry_after=MAX_RETRY_AFTER, budget_floor=100),
        deadline=120.0,
        clock=clock,
        sleep=clock.sleep,
        rng=random.Random(0),
        transport=httpx.MockTransport(handler),
        env_file=None,
    )
    outcomes = []
    with client:
        for _ in range(calls):
            try:
                outcomes.append(client.chat([{"role": "user", "content": "hi"}]).content)
            except HerdlessError as exc:
                outcomes.append(type(exc).__name__)
    assert len(outcomes) == calls  # each call ended, in a result or a typed error
    assert sends == sorted(sends)
