"""In-process gateway fixtures: the gateway app over httpx.ASGITransport, a fake vLLM behind it."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from herdless.gateway.logs import JsonFormatter, TextFormatter
from herdless.gateway.runtime import Runtime

SSE = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,'
    b'"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,'
    b'"delta":{"content":"Hi"},"logprobs":null,"finish_reason":"length"}]}\n\n'
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[],'
    b'"usage":{"prompt_tokens":12,"total_tokens":13,"completion_tokens":1}}\n\n'
    b"data: [DONE]\n\n"
)
COMPLETION = (
    b'{"id":"chatcmpl-2","object":"chat.completion","model":"m","choices":[{"index":0,'
    b'"message":{"role":"assistant","content":"Hi"},"finish_reason":"length"}],'
    b'"usage":{"prompt_tokens":12,"total_tokens":13,"completion_tokens":1}}'
)

TEXT_COMPLETION = (
    b'{"id":"cmpl-3","object":"text_completion","model":"m","choices":[{"index":0,'
    b'"text":" there","logprobs":null,"finish_reason":"length","stop_reason":null}],'
    b'"usage":{"prompt_tokens":5,"total_tokens":8,"completion_tokens":3}}'
)
TEXT_SSE = (
    b'data: {"id":"cmpl-4","object":"text_completion","model":"m","choices":[{"index":0,'
    b'"text":" there","logprobs":null,"finish_reason":"length","stop_reason":null}]}\n\n'
    b'data: {"id":"cmpl-4","object":"text_completion","model":"m","choices":[],'
    b'"usage":{"prompt_tokens":5,"total_tokens":8,"completion_tokens":3}}\n\n'
    b"data: [DONE]\n\n"
)
EMBEDDING = (
    b'{"id":"embd-5","object":"list","model":"m","data":[{"index":0,"object":"embedding",'
    b'"embedding":[0.6,0.8]}],'
    b'"usage":{"prompt_tokens":7,"total_tokens":7,"completion_tokens":0}}'
)
RESPONSE = (
    b'{"id":"resp_6","object":"response","model":"m","status":"completed","output":[{'
    b'"type":"message","role":"assistant","content":[{"type":"output_text","text":"hi"}]}],'
    b'"usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":0},'
    b'"output_tokens":4,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":13},'
    b'"user":null}'
)

# Anthropic's Messages API as vLLM 0.32 writes it (vllm/entrypoints/anthropic): the stream's
# start carries the prompt and 0 output tokens, its message_delta the whole usage.
MESSAGE = (
    b'{"id":"chatcmpl-7","type":"message","role":"assistant","content":[{"type":"text",'
    b'"text":"Hi there"}],"model":"m","stop_reason":"end_turn","stop_sequence":null,'
    b'"usage":{"input_tokens":10,"output_tokens":3}}'
)
MESSAGE_SSE = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"chatcmpl-8",'
    b'"type":"message","role":"assistant","content":[],"model":"m","stop_reason":null,'
    b'"stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":0}}}\n\n'
    b'event: content_block_start\ndata: {"type":"content_block_start","content_block":'
    b'{"type":"text","text":""},"index":0}\n\n'
    b'event: content_block_delta\ndata: {"type":"content_block_delta","delta":'
    b'{"type":"text_delta","text":"Hi"},"index":0}\n\n'
    b'event: content_block_delta\ndata: {"type":"content_block_delta","delta":'
    b'{"type":"text_delta","text":" there"},"index":0}\n\n'
    b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
    b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":'
    b'"end_turn","stop_sequence":null},"usage":{"input_tokens":10,"output_tokens":3}}\n\n'
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
)
MESSAGE_TOKENS = b'{"input_tokens":10}'


class FakeVllm:
    """A scripted vLLM: records what it receives, can hold requests or answer errors."""

    def __init__(self) -> None:
        self.health_status = 200
        self.received: list[tuple[dict[str, str], bytes]] = []
        self.paths: list[str] = []  # the path of each generation request received
        self.hold: asyncio.Event | None = None
        self.error: tuple[int, dict[str, Any]] | None = None
        self.models_seen: list[dict[str, str]] = []  # headers of each GET /v1/models
        self.models_hold: asyncio.Event | None = None
        self.models_status = 200
        self.metrics: str | None = None  # the /metrics text; None: 404, as a server without
        self.metrics_status = 200
        self.tokenized: list[dict[str, Any]] = []  # each /tokenize body received
        self.token_count: int | None = None  # its count; None: 404, a server without it
        self.message_sse = MESSAGE_SSE  # what a Messages stream sends
        self.app = Starlette(
            routes=[
                Route("/health", self._health),
                Route("/metrics", self._metrics),
                Route("/v1/models", self._models),
                Route("/tokenize", self._tokenize, methods=["POST"]),
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/completions", self._chat, methods=["POST"]),
                Route("/v1/embeddings", self._chat, methods=["POST"]),
                Route("/v1/responses", self._chat, methods=["POST"]),
                Route("/v1/messages", self._chat, methods=["POST"]),
                Route("/v1/messages/count_tokens", self._chat, methods=["POST"]),
            ]
        )

    async def _health(self, request: Request) -> Response:
        return Response(b"", self.health_status)

    async def _metrics(self, request: Request) -> Response:
        if self.metrics is None:
            return Response(b"not found", 404)
        return Response(self.metrics, self.metrics_status, media_type="text/plain")

    async def _tokenize(self, request: Request) -> Response:
        self.tokenized.append(await request.json())
        if self.token_count is None:
            return Response(b"not found", 404)
        return JSONResponse({"count": self.token_count, "max_model_len": 8192, "tokens": []})

    async def _models(self, request: Request) -> Response:
        self.models_seen.append(dict(request.headers))
        if self.models_hold is not None:
            await self.models_hold.wait()
        if self.models_status != 200:
            error = {"error": {"message": "loading", "type": "x", "code": self.models_status}}
            return JSONResponse(error, self.models_status)
        return JSONResponse({"object": "list", "data": [{"id": "m", "owned_by": "vllm"}]})

    async def _chat(self, request: Request) -> Response:
        body = await request.body()
        self.received.append((dict(request.headers), body))
        path = request.url.path
        self.paths.append(path)
        if self.hold is not None:
            await self.hold.wait()
        if self.error is not None:
            status, payload = self.error
            return JSONResponse(payload, status)
        if path == "/v1/embeddings":
            return Response(EMBEDDING, media_type="application/json")
        if path == "/v1/responses":
            return Response(RESPONSE, media_type="application/json")
        data = json.loads(body)
        if path == "/v1/messages/count_tokens":
            return Response(MESSAGE_TOKENS, media_type="application/json")
        if path == "/v1/messages":
            if data.get("stream"):
                return Response(self.message_sse, media_type="text/event-stream")
            return Response(MESSAGE, media_type="application/json")
        if data.get("stream"):  # the usage event only when asked for, as vLLM
            events = TEXT_SSE if path == "/v1/completions" else SSE
            if not (data.get("stream_options") or {}).get("include_usage"):
                events = without_usage(events)
            return Response(events, media_type="text/event-stream")
        if path == "/v1/completions":
            return Response(TEXT_COMPLETION, media_type="application/json")
        return Response(COMPLETION, media_type="application/json")


class RefusingTransport(httpx.AsyncBaseTransport):
    """An upstream that refuses connections, as a vLLM still starting up does."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)


GatewayFactory = Callable[..., AbstractAsyncContextManager[tuple[httpx.AsyncClient, Runtime]]]


def without_usage(events: bytes, blank: bytes = b"\n\n") -> bytes:
    """The SSE events (each ending in ``blank``) less the usage event (``"choices":[]``):
    what vLLM streams when its client does not ask for usage."""
    return b"".join(e + blank for e in events.split(blank) if e and b'"choices":[]' not in e)


def chat_body(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hello"}], **extra}


def message_body(**extra: Any) -> dict[str, Any]:
    """A body of Anthropic's Messages API (``max_tokens`` is required there)."""
    return chat_body(**{"max_tokens": 50, **extra})


async def until(condition: Callable[[], bool], *, turns: int = 10_000) -> None:
    """Let the event loop run until ``condition()`` holds (bounded: fails, never hangs)."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


class TimingOutTransport(httpx.AsyncBaseTransport):
    """An upstream that accepts, then gives no answer in time (a busy vLLM); health is fine."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200)
        raise httpx.ReadTimeout("no answer", request=request)


def rendered(records: Iterable[logging.LogRecord]) -> str:
    """The records as both ``--log-format``s write them (caplog.text shows no fields)."""
    formatters = (TextFormatter(), JsonFormatter())
    return "\n".join(f.format(record) for record in records for f in formatters)


def json_lines(records: Iterable[logging.LogRecord], logger: str) -> list[dict[str, Any]]:
    """The records of ``logger`` as ``--log-format json`` writes them, parsed."""
    formatter = JsonFormatter()
    return [json.loads(formatter.format(r)) for r in records if r.name == logger]
