"""The responses that wait on a sequence: one JSON body, or an SSE stream.

They are pure ASGI callables (Starlette ``Response`` subclasses overriding
``__call__``) because they must watch for the client leaving while they wait
(the sequence is then aborted and its KV freed at once) and, for the
``cut_after`` fault, end a body without completing it. What the bytes look
like (chat or text completion) is the encoder's business (``wire.py``).
"""

from __future__ import annotations

import asyncio

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from herdless.emulator import text, wire
from herdless.emulator.engine import SeqState, Sequence
from herdless.emulator.state import EmulatorState

__all__ = ["JsonGeneration", "StreamGeneration", "json_response", "until_disconnect"]

_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8")]


def json_response(body: bytes, status: int = 200) -> Response:
    return Response(body, status_code=status, media_type="application/json")


async def until_disconnect(receive: Receive) -> None:
    """Return when the client has gone (the request body was already read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _send_json(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class _Generation(Response):
    """Base of the two responses that wait on a sequence."""

    def __init__(
        self,
        state: EmulatorState,
        seq: Sequence,
        seed: int,
        encoder: wire.Encoder,
        *,
        hold: float = 0.0,
    ) -> None:
        super().__init__()
        self.state, self.seq, self.seed, self.encoder = state, seq, seed, encoder
        self.hold = hold  # seconds before the first byte (the slow fault)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # One watcher per response: when the client leaves, abort and free KV at once.
        watcher = asyncio.ensure_future(until_disconnect(receive))
        watcher.add_done_callback(self._on_watcher_done)
        try:
            if self.hold:
                # Nothing is sent meanwhile; the sequence runs. A client that leaves ends
                # the wait (the watcher aborted its sequence).
                await asyncio.wait({watcher}, timeout=self.hold)
                if watcher.done():
                    return
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


class JsonGeneration(_Generation):
    """The whole answer in one JSON body, once the sequence has finished."""

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
        reason = seq.finish_reason or "stop"
        body = self.encoder.body(content, reason, seq.prompt_tokens, seq.generated)
        await _send_json(send, 200, body)


class StreamGeneration(_Generation):
    """Server-sent events as tokens come, in vLLM's order (see ``wire.ChatEncoder``)."""

    async def _respond(self, send: Send) -> None:
        seq, driver, seed, enc = self.seq, self.state.driver, self.seed, self.encoder
        cut = self.state.faults.cut_after  # decided when the stream starts
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        events: list[str] = [enc.role(seq.prompt_tokens)] if enc.has_role else []
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
