"""The usage of a request: what vLLM says it used, read from its answer, and the usage
the gateway asks for on behalf of a client that streams without it (pure, no I/O).

The gateway settles every request's price (prompt plus ``max_tokens``) on its usage, and
learns from it how long answers are. vLLM sends a stream's usage only when asked
(``stream_options.include_usage``), and most apps do not ask (openai-node's and
openai-python's default): without it such a request stays counted at its ``max_tokens``,
and an app that streams with a generous one fills the GPU to a fraction of what it holds.
So the gateway asks for it itself, and leaves the usage event out of the stream its
client gets."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["UsageSniffer", "adds_usage", "asking_usage"]

_TOTAL_TOKENS = re.compile(rb'"total_tokens"\s*:\s*(\d+)')
# The Responses API names them input_tokens and output_tokens.
_PROMPT_TOKENS = re.compile(rb'"(?:prompt|input)_tokens"\s*:\s*(\d+)')
_COMPLETION_TOKENS = re.compile(rb'"(?:completion|output)_tokens"\s*:\s*(\d+)')
_EVENT_END = re.compile(rb"\r?\n\r?\n")  # an SSE event's blank line


def adds_usage(data: Mapping[str, Any], stream: bool) -> bool:
    """Whether the gateway asks vLLM for this request's usage on its client's behalf: a
    stream whose ``stream_options`` leave ``include_usage`` out or false (a malformed
    ``stream_options`` is left to vLLM to refuse)."""
    if not stream:
        return False
    options = data.get("stream_options")
    if options is None:
        return True
    return isinstance(options, dict) and options.get("include_usage") is not True


def asking_usage(body: bytes) -> bytes:
    """``body`` (a request :func:`adds_usage` marks) asking for the usage event:
    ``stream_options.include_usage`` set, ``continuous_usage_stats`` left out (it was
    moot without usage, and would put usage on every event). Written in ASCII: a lone
    surrogate a client escaped (a string cut in an emoji) stays valid JSON."""
    data = json.loads(body)
    options = dict(data.get("stream_options") or {})
    options.pop("continuous_usage_stats", None)
    data["stream_options"] = options | {"include_usage": True}
    return json.dumps(data, separators=(",", ":")).encode()


class UsageSniffer:
    """Finds the usage in a response body without parsing it all, and passes the body on.

    vLLM puts usage at the end (the last JSON object, or the last SSE event
    with ``stream_options.include_usage``), so only a bounded tail is kept.

    ``omit``: the gateway asked vLLM for the usage event on behalf of a client that did
    not (:func:`adds_usage`), so the client gets the stream vLLM sends when not asked:
    the events as vLLM wrote them, but for the usage event, whose ``system_fingerprint``
    goes back to the end of the event before it (where vLLM puts it without usage). An
    event passes on once its blank line has come, one that finishes a choice once the
    next has (vLLM writes them together: nothing waits in practice). Past ``_MOST`` bytes
    with no event's end the body is not a stream this knows, and passes on as it comes.

    It also counts the stream's events (:attr:`events`): what a stream cut short (its
    client left) used, where vLLM sent no usage.
    """

    __slots__ = ("_held", "_omit", "_rest", "_tail", "events")
    _KEEP = 4096
    _MOST = 65_536

    def __init__(self, *, omit: bool = False) -> None:
        self._tail = b""
        self._omit = omit
        self._rest = b""  # the start of an event whose end has not come (with ``omit``)
        self._held = b""  # an event that finished a choice, until the next comes
        self.events = 0
        """The events of a stream (``data: {``) fed so far: about one token each."""

    def feed(self, chunk: bytes) -> bytes:
        """Look at the next bytes of the body; returns what to pass on to the client."""
        self._tail = (self._tail + chunk)[-self._KEEP :]
        self.events += chunk.count(b"data: {")
        if not self._omit:
            return chunk
        if not (self._rest or self._held) and chunk.endswith(b"\n\n") and _plain(chunk):
            return chunk  # whole events (as vLLM writes them), none to look at
        data = self._rest + chunk
        passed: list[bytes] = []
        start = 0
        for end in _EVENT_END.finditer(data):
            passed.append(self._event(data[start : end.end()]))
            start = end.end()
        self._rest = data[start:]
        if len(self._rest) > self._MOST:
            passed.append(self.end())
            self._omit = False
        return b"".join(passed)

    def _event(self, event: bytes) -> bytes:
        """What passes on when ``event`` has come."""
        held, self._held = self._held, b""
        if b'"usage"' in event and (usage := _usage_event(event)) is not None:
            return _fingerprinted(held, usage.get("system_fingerprint"))
        if b'"finish_reason":"' in event:  # the usage event may follow, with the fingerprint
            self._held = event
            return held
        return held + event

    def end(self) -> bytes:
        """What is left to pass on when the body ends: an event held, one not ended (cut)."""
        rest = self._held + self._rest
        self._held = self._rest = b""
        return rest

    @property
    def total_tokens(self) -> int | None:
        """The last ``total_tokens`` seen, or ``None`` (no usage sent)."""
        return _last(_TOTAL_TOKENS, self._tail)

    @property
    def prompt_tokens(self) -> int | None:
        """The last ``prompt_tokens`` seen, or ``None``."""
        return _last(_PROMPT_TOKENS, self._tail)

    @property
    def completion_tokens(self) -> int | None:
        """The last ``completion_tokens`` seen, or ``None``."""
        return _last(_COMPLETION_TOKENS, self._tail)


def _plain(events: bytes) -> bool:
    """Whether no event of ``events`` is the usage event or finishes a choice."""
    return b'"usage"' not in events and b'"finish_reason":"' not in events


def _usage_event(event: bytes) -> dict[str, Any] | None:
    """The usage event's object (``data:`` an object with empty ``choices`` and a
    ``usage``), or ``None`` for any other event."""
    _, _, data = event.partition(b"data:")
    try:
        value = json.loads(data)
    except ValueError:
        return None
    if isinstance(value, dict) and value.get("choices") == [] and "usage" in value:
        return value
    return None


def _fingerprinted(event: bytes, fingerprint: object) -> bytes:
    """``event`` with ``system_fingerprint`` last in its object, as vLLM writes it when
    asked for no usage (unchanged when it has one, or there is none to give)."""
    body = event.rstrip(b"\r\n")
    if not isinstance(fingerprint, str) or b'"system_fingerprint"' in body or body[-1:] != b"}":
        return event
    field = b',"system_fingerprint":' + json.dumps(fingerprint).encode()
    return body[:-1] + field + b"}" + event[len(body) :]


def _last(pattern: re.Pattern[bytes], tail: bytes) -> int | None:
    found = pattern.findall(tail)
    return int(found[-1]) if found else None
