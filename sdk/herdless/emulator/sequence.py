"""One request's generation, as the scheduler, the engine and the stream reading it see it.

The counts follow vLLM V1's ``Request``: ``num_tokens`` (prompt plus generated) are
the tokens the sequence is made of, ``computed`` those whose KV has been written.
A step schedules ``num_tokens - computed`` tokens at most (a prefill chunk, or one
token when decoding); when a step leaves ``computed == num_tokens`` the model
samples the next token. A sequence that holds ``computed`` tokens of KV holds
``ceil(computed / block_size)`` blocks (``blocks``, kept by ``kvcache.py``).
"""

from __future__ import annotations

import enum
from typing import Literal

__all__ = ["FinishReason", "SeqState", "Sequence"]

FinishReason = Literal["stop", "length", "abort"]


class SeqState(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """One request's generation, shared by the engine (writer) and its stream (reader).

    Args:
        prompt_tokens: tokens of the prompt.
        max_tokens: most tokens to generate (EOS included).
        content_tokens: tokens before EOS, or ``None`` to ignore EOS.
        arrival: ``now`` when it was submitted.
        hashes: the hashes of its prompt's full blocks (:func:`.kvcache.block_hashes`),
            none where the prefix cache is off.
    """

    __slots__ = (
        "arrival",
        "blocks",
        "computed",
        "content_tokens",
        "finish_reason",
        "finished_at",
        "first_token_at",
        "generated",
        "hashes",
        "last_token_at",
        "max_tokens",
        "prompt_tokens",
        "resumed",
        "scheduled_at",
        "shared",
        "state",
        "waiter",
        "wake_at",
    )

    def __init__(
        self,
        *,
        prompt_tokens: int,
        max_tokens: int,
        content_tokens: int | None,
        arrival: float,
        hashes: tuple[int, ...] = (),
    ) -> None:
        if prompt_tokens < 1 or max_tokens < 1:
            raise ValueError("prompt_tokens and max_tokens must be >= 1")
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.content_tokens = content_tokens
        self.arrival = arrival
        self.generated = 0
        # Tokens whose KV is written; back to 0 when preempted (recomputed later).
        self.computed = 0
        # KV blocks held, and how many of them (leading) are held by their hash with
        # other sequences (written by the KV cache only).
        self.blocks = 0
        self.shared = 0
        self.hashes = hashes
        self.resumed = False  # preempted once: its prompt was looked up before
        self.state = SeqState.WAITING
        self.finish_reason: FinishReason | None = None
        self.scheduled_at: float | None = None  # the start of its first step
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.finished_at: float | None = None
        # The driver's wake-up handle for the stream reading this sequence, and the token
        # count at which to use it (opaque here).
        self.waiter: object = None
        self.wake_at = 1

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens: what the KV must hold to sample the next one."""
        return self.prompt_tokens + self.generated

    @property
    def text_tokens(self) -> int:
        """Generated tokens that carry text (the EOS token carries none)."""
        if self.content_tokens is None:
            return self.generated
        return min(self.generated, self.content_tokens)

    def __repr__(self) -> str:
        return (
            f"Sequence(state={self.state.value}, prompt={self.prompt_tokens}, "
            f"computed={self.computed}, generated={self.generated}/{self.max_tokens}, "
            f"finish={self.finish_reason})"
        )
