"""Script an OpenAI-compatible backend for tests, with respx: no network, no sleeping.

Each *reply* is a small callable that turns the request into an answer (an
``httpx.Response``) or raises what a broken network would raise. A
:class:`MockBackend` plays a script of replies in order and then repeats the
last one, so ``429 then 200`` is two lines::

    import respx
    from herdless.testing import MockBackend, ok, rate_limited

    with respx.mock(assert_all_called=False) as router:
        gpu = MockBackend(router, "http://gpu.test/v1").script(rate_limited(2.0), ok("hi"))
        ...  # your code calls http://gpu.test/v1/chat/completions
        assert len(gpu.requests) == 2

Replies:

- :func:`ok` / :func:`stream`: a chat completion, whole or as SSE chunks
  (``stream(..., cut_after=2)`` breaks the connection after two chunks); both take
  ``tool_calls=[{"name": ..., "arguments": ...}]`` for an answer that calls tools
  (streamed in pieces, as vLLM and OpenAI stream them);
- :func:`rate_limited` (429), :func:`unavailable` (503), :func:`draining`
  (503 + ``X-Herdless-Drain: 1``), :func:`deadline_unattainable`,
  :func:`server_error`: the gateway's refusals, with ``Retry-After`` and
  ``retry-after-ms`` and an OpenAI-style error body;
- :func:`overloaded`: vLLM's bare 503 when its queue is full;
- :func:`hang`: the backend accepted the connection and never answered (the
  client sees its read timeout expire at once: nothing waits for real);
- :func:`connect_error`: nothing listens there.

respx patches ``httpx``, the library the herdless clients use.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import httpx

if TYPE_CHECKING:
    import respx

__all__ = [
    "MockBackend",
    "Reply",
    "ToolCallSpec",
    "connect_error",
    "deadline_unattainable",
    "draining",
    "hang",
    "ok",
    "overloaded",
    "rate_limited",
    "server_error",
    "stream",
    "unavailable",
]

Reply: TypeAlias = Callable[[httpx.Request], httpx.Response]
"""Turns one request into its answer, or raises an ``httpx`` transport error."""

ToolCallSpec: TypeAlias = Mapping[str, str]
"""A tool call a scripted answer makes: ``{"name": ..., "arguments": ...}`` (JSON text),
and optionally ``"id"`` (default ``call_<n>``)."""


def _call_id(spec: ToolCallSpec, index: int) -> str:
    return spec.get("id") or f"call_{index}"


def _body(request: httpx.Request) -> dict[str, Any]:
    try:
        parsed = json.loads(request.content or b"{}")
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _model(request: httpx.Request, model: str | None) -> str:
    return model or str(_body(request).get("model") or "mock-model")


def _request_id(request: httpx.Request) -> str:
    return str(request.headers.get("x-request-id", "chatcmpl-mock"))


def ok(
    content: str = "Hello from the mock.",
    *,
    model: str | None = None,
    tool_calls: Sequence[ToolCallSpec] = (),
) -> Reply:
    """A ``200`` chat completion whose message is ``content``.

    Args:
        content: the assistant's answer.
        model: the model reported; default: the ``model`` of the request (so tests can
            check which model name each backend was sent).
        tool_calls: tools the answer calls (``finish_reason`` is then ``"tool_calls"``).
    """

    def reply(request: httpx.Request) -> httpx.Response:
        completion_tokens = max(1, len(content.split()))
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if tool_calls:
            message["content"] = content or None
            message["tool_calls"] = [
                {
                    "id": _call_id(spec, index),
                    "type": "function",
                    "function": {"name": spec["name"], "arguments": spec["arguments"]},
                }
                for index, spec in enumerate(tool_calls)
            ]
        return httpx.Response(
            200,
            json={
                "id": _request_id(request),
                "object": "chat.completion",
                "created": 0,
                "model": _model(request, model),
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "finish_reason": "tool_calls" if tool_calls else "stop",
                    }
                ],
                "usage": {
                    "prompt_tokens": 1,
                    "completion_tokens": completion_tokens,
                    "total_tokens": 1 + completion_tokens,
                },
            },
        )

    return reply


class _SSE(httpx.SyncByteStream, httpx.AsyncByteStream):
    """SSE events, then either ``[DONE]`` or a broken connection after ``cut_after`` events."""

    def __init__(self, events: list[bytes], cut_after: int | None) -> None:
        self._events = events
        self._cut_after = cut_after

    def _chunks(self) -> Iterator[bytes]:
        for index, event in enumerate(self._events):
            if self._cut_after is not None and index >= self._cut_after:
                raise httpx.RemoteProtocolError("peer closed connection mid-stream (mock)")
            yield event

    def __iter__(self) -> Iterator[bytes]:
        yield from self._chunks()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks():
            yield chunk


def stream(
    pieces: Sequence[str] = ("Hello", " from", " the", " mock."),
    *,
    model: str | None = None,
    cut_after: int | None = None,
    tool_calls: Sequence[ToolCallSpec] = (),
) -> Reply:
    """A ``200`` SSE stream of chat-completion chunks, one per piece of text.

    Args:
        pieces: the content deltas, in order.
        model: as for :func:`ok`.
        cut_after: break the connection after this many chunks were sent (``0``: after
            the headers), as a crashed server or a cut network would; ``None`` ends the
            stream normally with a usage chunk and ``data: [DONE]``.
        tool_calls: tools the answer calls, after the text: each as a first piece with
            its id, type and name, then its arguments in two pieces (``finish_reason``
            is then ``"tool_calls"``).
    """

    def reply(request: httpx.Request) -> httpx.Response:
        name = _model(request, model)

        def event(**fields: Any) -> bytes:
            payload: dict[str, Any] = {"id": _request_id(request), "created": 0, "model": name}
            payload.update(object="chat.completion.chunk", **fields)
            return f"data: {json.dumps(payload)}\n\n".encode()

        def delta(content: dict[str, Any], finish: str | None = None) -> bytes:
            return event(choices=[{"index": 0, "delta": content, "finish_reason": finish}])

        events = [delta({"role": "assistant", "content": ""})]
        events += [delta({"content": piece}) for piece in pieces]
        for index, spec in enumerate(tool_calls):
            first = {"name": spec["name"], "arguments": ""}
            head = {"index": index, "id": _call_id(spec, index), "type": "function"}
            events.append(delta({"tool_calls": [{**head, "function": first}]}))
            half = len(spec["arguments"]) // 2
            for piece in (spec["arguments"][:half], spec["arguments"][half:]):
                events.append(
                    delta({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
                )
        events.append(delta({}, "tool_calls" if tool_calls else "stop"))
        # The usage chunk vLLM sends with stream_options={"include_usage": true}.
        usage = {"prompt_tokens": 1, "completion_tokens": len(pieces)}
        events.append(event(choices=[], usage={**usage, "total_tokens": 1 + len(pieces)}))
        events.append(b"data: [DONE]\n\n")
        return httpx.Response(
            200,
            headers={"content-type": "text/event-stream"},
            stream=_SSE(events, cut_after),
        )

    return reply


def _refusal(
    status: int, code: str, retry_after: float | None, message: str, **headers: str
) -> Reply:
    error_type = "rate_limit_error" if status == 429 else "service_unavailable"
    all_headers = dict(headers)
    if retry_after is not None:
        # As the gateway sends them: whole seconds rounded up, and the precise value.
        all_headers["retry-after"] = str(math.ceil(retry_after))
        all_headers["retry-after-ms"] = str(round(retry_after * 1000))
    body = {"error": {"message": message, "type": error_type, "code": code}}

    def reply(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, headers=all_headers, json=body)

    return reply


def rate_limited(retry_after: float | None = 1.0, *, code: str = "queue_full") -> Reply:
    """``429``: come back later, in ``retry_after`` seconds (``None``: no hint)."""
    return _refusal(429, code, retry_after, f"The gateway is full ({code}); retry later.")


def unavailable(retry_after: float | None = 2.0, *, code: str = "upstream_unavailable") -> Reply:
    """``503``: not serving now (the model is loading, the upstream is down)."""
    return _refusal(503, code, retry_after, f"Not serving now ({code}).")


def overloaded() -> Reply:
    """``503`` with neither a time nor a reason, as vLLM answers when its queue is full
    (``--max-num-queued-reqs``): a busy server, not a broken one."""

    def reply(request: httpx.Request) -> httpx.Response:
        body = {"error": {"message": "Service Unavailable", "type": "Service Unavailable"}}
        return httpx.Response(503, json={"error": {**body["error"], "code": 503}})

    return reply


def deadline_unattainable(status: int = 429, wait: float = 30.0) -> Reply:
    """The gateway predicts this request would wait ``wait`` seconds, longer than the
    deadline its caller sent (``X-Herdless-Deadline-Ms``): move on at once."""
    return _refusal(
        status, "deadline_unattainable", wait, f"would wait about {wait:g}s; use your fallback"
    )


def draining(retry_after: float = 30.0) -> Reply:
    """``503`` with ``X-Herdless-Drain: 1``: drained for maintenance; herdless clients
    switch to their fallback at once."""
    return _refusal(
        503, "draining", retry_after, "Draining for maintenance.", **{"x-herdless-drain": "1"}
    )


def server_error(status: int = 500, message: str = "Internal server error (mock).") -> Reply:
    """A ``5xx`` (or any status) with an OpenAI-style error body and no retry hint."""
    if not 400 <= status <= 599:
        raise ValueError(f"status must be an error status (400-599), got {status!r}")
    return _refusal(status, "server_error" if status >= 500 else "bad_request", None, message)


def hang() -> Reply:
    """The backend took the request and never answered: raises ``httpx.ReadTimeout``.

    The client sees the timeout at once; tests never wait for it.
    """

    def reply(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("no answer before the timeout (mock hang)", request=request)

    return reply


def connect_error() -> Reply:
    """Nothing listens there: raises ``httpx.ConnectError``."""

    def reply(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused (mock)", request=request)

    return reply


class MockBackend:
    """One scripted OpenAI-compatible backend on a respx router.

    Routes ``POST {base_url}/chat/completions`` and ``GET {base_url}/models``. Replies
    are played in order; the last one repeats forever. ``requests`` records every chat
    request received, oldest first.

    Args:
        router: a started respx router (``respx.mock(...)`` or the ``respx_mock`` fixture).
        base_url: the API root, ending in ``/v1``.
        model: the model ``/models`` lists.
    """

    def __init__(self, router: respx.MockRouter, base_url: str, *, model: str = "mock-model"):
        self.base_url = base_url.rstrip("/")
        self.requests: list[httpx.Request] = []
        self._replies: list[Reply] = [ok()]
        self._next = 0
        router.post(f"{self.base_url}/chat/completions").mock(side_effect=self._answer)
        router.get(f"{self.base_url}/models").mock(
            return_value=httpx.Response(
                200, json={"object": "list", "data": [{"id": model, "object": "model"}]}
            )
        )

    def script(self, *replies: Reply) -> MockBackend:
        """Replace the script: answer the next requests with ``replies``, then repeat the last."""
        if not replies:
            raise ValueError("script() needs at least one reply")
        self._replies = list(replies)
        self._next = 0
        return self

    @property
    def bodies(self) -> list[dict[str, Any]]:
        """The JSON bodies of the requests received, oldest first."""
        return [_body(request) for request in self.requests]

    def _answer(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        reply = self._replies[min(self._next, len(self._replies) - 1)]
        self._next += 1
        return reply(request)

    def __repr__(self) -> str:
        return f"MockBackend({self.base_url!r}, requests={len(self.requests)})"
