"""``POST /v1/chat/completions``: validate as vLLM does, schedule, answer in JSON or SSE.

Responses here are pure ASGI callables (Starlette ``Response`` subclasses
overriding ``__call__``) because they must watch for the client leaving while
they wait (the sequence is then aborted and its KV freed at once) and, for the
``cut_after`` fault, end a body without completing it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from herdless.emulator import text, wire
from herdless.emulator.engine import SeqState, Sequence
from herdless.emulator.state import EmulatorState

__all__ = ["chat_completions", "json_response", "until_disconnect"]


def json_response(body: bytes, status: int = 200) -> Response:
    return Response(body, status_code=status, media_type="application/json")


async def until_disconnect(receive: Receive) -> None:
    """Return when the client has gone (the request body was already read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class _Generation(Response):
    """Base of the two responses that wait on a sequence."""

    def __init__(self, state: EmulatorState, seq: Sequence, req: wire.ChatRequest, seed: int):
        super().__init__()
        self.state, self.seq, self.req, self.seed = state, seq, req, seed
        self.id = wire.new_completion_id()
        self.created = int(time.time())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # One watcher per response: when the client leaves, abort and free KV at once.
        watcher = asyncio.ensure_future(until_disconnect(receive))
        watcher.add_done_callback(self._on_watcher_done)
        try:
            await self._respond(send)
        finally:
            watcher.cancel()
            # A response that ends early (cut, error) must not leave a sequence running.
            if self.seq.state is not SeqState.FINISHED:
                self.state.driver.abort(self.seq)

    def _on_watcher_done(self, watcher: asyncio.Future[None]) -> None:
        if not watcher.cancelled():
            self.state.driver.abort(self.seq)

    async def _respond(self, send: Send) -> None:
        raise NotImplementedError


class _Completion(_Generation):
    async def _respond(self, send: Send) -> None:
        seq, driver = self.seq, self.state.driver
        while seq.state is not SeqState.FINISHED:
            await driver.wait(seq, seq.max_tokens)  # wake once, at the end
        if seq.finish_reason == "abort":
            # Client gone (nobody reads this) or the model went away (the server drops
            # the connections; in-process, the 503 is what a test sees).
            body = wire.error_body("The request was aborted.", "Service Unavailable", 503)
            await _send_json(send, 503, body)
            return
        content = "".join(text.token_text(self.seed, i) for i in range(seq.text_tokens))
        body = wire.chat_completion(
            id_=self.id,
            created=self.created,
            model=self.state.settings.model,
            content=content,
            finish_reason=seq.finish_reason or "stop",
            prompt_tokens=seq.prompt_tokens,
            completion_tokens=seq.generated,
        )
        await _send_json(send, 200, body)


class _Stream(_Generation):
    async def _respond(self, send: Send) -> None:
        seq, driver, seed = self.seq, self.state.driver, self.seed
        enc = wire.StreamEncoder(
            id_=self.id,
            created=self.created,
            model=self.state.settings.model,
            include_usage=self.req.include_usage,
        )
        cut = self.state.faults.cut_after  # decided when the stream starts
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        events: list[str] = [enc.role()]
        interval = self.state.settings.stream_interval
        sent_events = sent_text = seen = 0
        while True:
            # The first token goes out at once, then every `interval` tokens (vLLM's
            # --stream-interval): fewer, larger writes when the host is the bottleneck.
            await driver.wait(seq, seen + interval if seen else 1)
            if seq.finish_reason == "abort":
                return  # client gone, or the model went away: the body never ends
            seen, upto = seq.generated, seq.text_tokens
            finished = seq.state is SeqState.FINISHED
            # finish_reason "length" rides on the event of the last token's text.
            last = upto - 1 if finished and seq.finish_reason == "length" else -1
            for i in range(sent_text, upto):
                tok = text.token_json(seed, i)
                events.append(enc.finish(tok, "length") if i == last else enc.token(tok))
            sent_text = upto
            if finished:
                if seq.finish_reason == "stop":  # EOS: its own event, empty content
                    events.append(enc.finish('""', "stop"))
                events.append(enc.end(seq.prompt_tokens, seq.generated))
            if cut is not None and sent_events + len(events) > cut:
                body = "".join(events[: cut - sent_events]).encode()
                await send({"type": "http.response.body", "body": body, "more_body": True})
                return  # ending the app before the body ends makes the server drop the connection
            sent_events += len(events)
            body = "".join(events).encode()
            events = []
            await send({"type": "http.response.body", "body": body, "more_body": not finished})
            if finished:
                return


_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8")]


async def _send_json(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _error(message: str, type_: str, status: int, param: str | None = None) -> Response:
    return json_response(wire.error_body(message, type_, status, param), status)


async def chat_completions(request: Request) -> Response:
    """The route: checks in vLLM's order, then a streaming or a JSON response."""
    state: EmulatorState = request.app.state.emulator
    settings, faults = state.settings, state.faults
    try:
        req = wire.ChatRequest.model_validate_json(await request.body())
    except ValidationError as exc:
        return json_response(wire.schema_error(exc), 400)
    if req.model is not None and req.model != settings.model:
        return _error(
            f"The model `{req.model}` does not exist. Valid aliases: {settings.model}.",
            "NotFoundError",
            404,
            "model",
        )
    if req.n != 1:
        return _error("The emulator supports n=1 only.", "BadRequestError", 400, "n")
    texts = req.texts()
    prompt = (
        sum(text.count_tokens(t) for t in texts)
        + text.MESSAGE_OVERHEAD * len(texts)
        + text.GENERATION_PROMPT
    )
    limit = settings.max_model_len
    max_tokens = req.max_completion_tokens or req.max_tokens
    if max_tokens is not None and max_tokens > limit:
        return _error(
            f"max_tokens={max_tokens} cannot be greater than max_model_len={limit}. "
            "Please request fewer output tokens.",
            "BadRequestError",
            400,
            "max_tokens",
        )
    if prompt + (max_tokens or 1) > limit:
        return _error(
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{prompt + (max_tokens or 0)} tokens ({prompt} in the messages, "
            f"{max_tokens or 0} in the completion). Please reduce the length of the messages "
            "or completion.",
            "BadRequestError",
            400,
            "messages",
        )
    if faults.should_fail(state.rng):
        return _error("Injected fault.", "InternalServerError", faults.error_status)
    cap = settings.max_num_queued_reqs
    if cap is not None and state.engine.num_waiting >= cap:
        state.engine.metrics.rejected += 1
        return _error(
            "The engine is currently busy and cannot accept new requests. "
            "Please try again later or on a different instance.",
            "Service Unavailable",
            503,
        )
    if faults.extra_latency:
        await asyncio.sleep(faults.extra_latency)
    seed = text.answer_seed(req.seed, texts)
    seq = Sequence(
        prompt_tokens=prompt,
        max_tokens=max_tokens or limit - prompt,
        content_tokens=None
        if req.ignore_eos
        else text.answer_length(seed, settings.answer_min_tokens, settings.answer_max_tokens),
        arrival=state.driver.now(),
    )
    state.driver.submit(seq)
    respond: Callable[..., Response] = _Stream if req.stream else _Completion
    return respond(state, seq, req, seed)
