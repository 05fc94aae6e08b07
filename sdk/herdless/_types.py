"""The values ``chat()`` returns: results, stream chunks, usage and attempt records; and
the wait estimate a call left a busy backend on.

All are frozen and slotted: a result is a record of what happened, never a handle to
change it. ``raw`` keeps the server's decoded JSON for anything herdless does not lift
into a field; it is left out of ``repr`` because it can be large.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "AttemptRecord",
    "ChatResult",
    "Chunk",
    "FunctionCall",
    "FunctionCallDelta",
    "ToolCall",
    "ToolCallDelta",
    "Usage",
    "WaitEstimate",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class FunctionCall:
    """The function a model asks to call (openai-python's ``Function``).

    Attributes:
        name: the function's name.
        arguments: its arguments, as the JSON text the model wrote (validate it before use:
            a model can write invalid JSON).
    """

    name: str
    arguments: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCall:
    """One tool call of an answer (openai-python's ``ChatCompletionMessageToolCall``).

    Attributes:
        id: the call's id; answer it with a ``{"role": "tool", "tool_call_id": id, ...}``
            message.
        function: the function and its arguments.
        type: ``"function"``.
    """

    id: str
    function: FunctionCall
    type: str = "function"


@dataclass(frozen=True, slots=True, kw_only=True)
class FunctionCallDelta:
    """A piece of a streamed function call (openai-python's ``ChoiceDeltaToolCallFunction``):
    the name comes once, the arguments in pieces to concatenate."""

    name: str | None = None
    arguments: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallDelta:
    """A piece of a streamed tool call (openai-python's ``ChoiceDeltaToolCall``); the
    pieces with the same ``index`` make one call (``Stream.tool_calls`` joins them).

    Attributes:
        index: which call of the answer this piece belongs to.
        id: the call's id (in its first piece).
        type: ``"function"`` (in its first piece).
        function: the name and a piece of the arguments.
    """

    index: int
    id: str | None = None
    type: str | None = None
    function: FunctionCallDelta | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """Token counts as the server reported them (vLLM counts the EOS token)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptRecord:
    """One step of a call: an HTTP attempt, or a backend the call skipped.

    Attributes:
        backend: the backend's name.
        attempt: 1 for the call's first attempt, counting across backends.
        kind: ``"ok"``; ``"status"`` (the server answered with an error status);
            a transport failure kind (``"connect"``, ``"connect_timeout"``,
            ``"first_byte_timeout"``, ``"read_timeout"``, ``"read"``, ``"protocol"``);
            ``"stream_cut"``; ``"cancelled"`` (a hedge's race was won by the other
            attempt: this one was closed unanswered); or a reason the backend was not
            tried at all (``"skipped_breaker_open"``, ...).
        status: the HTTP status when the server answered, else ``None``.
        waited: seconds the call waited before this attempt (backoff, Retry-After).
        elapsed: seconds the attempt itself took (0 when skipped).
    """

    backend: str
    attempt: int
    kind: str
    status: int | None = None
    waited: float = 0.0
    elapsed: float = 0.0

    def describe(self) -> str:
        """A short form for error messages: ``primary#2 503 after 0.40s wait``."""
        what = str(self.status) if self.kind == "status" else self.kind
        wait = f" after {self.waited:.2f}s wait" if self.waited else ""
        return f"{self.backend}#{self.attempt} {what}{wait}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatResult:
    """The answer to a non-streaming ``chat()`` call.

    Attributes:
        content: the assistant's text (first choice); ``""`` when the server sent none.
        backend: the name of the backend that answered.
        model: the model the server says answered.
        usage: token counts, when the server sent them.
        attempts: every attempt of the call, oldest first (the last one is ``"ok"``).
        fallback_reason: why a fallback answered (``"breaker_open"``, ``"draining"``, ...;
            ``"hedge"``: the answer came from a hedge, ``HedgePolicy``); ``None`` when the
            primary answered.
        request_id: the call's id, sent as ``X-Request-ID`` on every attempt.
        finish_reason: ``"stop"``, ``"length"``, ``"tool_calls"``, ...; ``None`` when absent.
        tool_calls: the tools the model asks to call (first choice), in order; empty when
            it answered with text.
        raw: the server's whole JSON answer.
    """

    content: str
    backend: str
    model: str | None
    usage: Usage | None
    attempts: tuple[AttemptRecord, ...]
    fallback_reason: str | None
    request_id: str
    finish_reason: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Chunk:
    """One piece of a streamed answer.

    Attributes:
        content: the text delta of the first choice (``""`` for role-only, finish-only
            and usage chunks).
        finish_reason: set on the chunk that ends the choice (``"tool_calls"`` when the
            model called tools).
        usage: set on the final usage chunk (``stream_options.include_usage``).
        tool_calls: pieces of tool calls, as vLLM and OpenAI stream them (the
            ``Stream`` joins them into ``Stream.tool_calls``).
        raw: the chunk's decoded JSON.
    """

    content: str
    finish_reason: str | None = None
    usage: Usage | None = None
    tool_calls: tuple[ToolCallDelta, ...] = ()
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class WaitEstimate:
    """What the client expected of a call's wait at a busy backend when it told the call
    to leave (``FallbackUsed.estimate``, ``DeadlineExceeded.estimate``). Seconds.

    The call leaves when even its best case misses the time it may stay there::

        best = (1 - margin) * (wait + answer)  >  left - reserve

    Attributes:
        wait: the expected wait in the client's line for a slot (while the first
            clump of answers is not over: its best case).
        answer: the expected time from sending to the answer (an average of recent ones).
        margin: the share a best case takes off (``0.35 / sqrt(samples)``, doubled when
            no backend follows).
        samples: rounds of answers the estimate rests on: pairs of clumps, one
            clump's start to the next (``herdless._turnover``); 0 while the first
            clump gives it.
        left: what was left of the call's deadline.
        reserve: what of it is kept for the backends after this one (0 on the last).
    """

    wait: float
    answer: float
    margin: float
    samples: int
    left: float
    reserve: float

    @property
    def best(self) -> float:
        """The best case: seconds from the decision to the answer."""
        return (1 - self.margin) * (self.wait + self.answer)

    def describe(self) -> str:
        """The numbers compared, in words (an error message's)."""
        return (
            f"it would wait about {self.wait:.1f} s for a slot and {self.answer:.1f} s for "
            f"its answer (best case {self.best:.1f} s, with a {self.margin:.0%} margin, "
            f"from {self.samples} measured round(s) of answers), but {self.left:.1f} s of "
            f"its deadline were left"
            + (f", {self.reserve:.1f} s of them kept for the fallback" if self.reserve else "")
        )
