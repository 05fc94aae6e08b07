"""Deterministic text and the emulator's tokenisation rule (pure, no I/O).

**Tokenisation rule.** A token is a run of one to four word characters, or one
character that is neither a word character nor white space::

    tokens(text) = len(re.findall(r"\\w{1,4}|[^\\w\\s]", text))

so ``"Hello, world!"`` is ``Hell`` ``o`` ``,`` ``worl`` ``d`` ``!``: 6 tokens.
A chat prompt costs the tokens of every message's text, plus
``MESSAGE_OVERHEAD`` tokens per message (the chat template's role header and
separators) plus ``GENERATION_PROMPT`` tokens (the assistant header), as a real
chat template adds a few tokens of its own.

**Generated text.** Token ``i`` of an answer is a pure function of the answer's
seed and ``i``: a word of at most four letters (one token by the rule above,
with a leading space after the first) or a full stop. Any prefix of an answer
therefore tokenises to exactly the number of tokens generated, and a stream can
render token ``i`` without keeping state. The seed is the request's ``seed``
or, without one, a hash of the prompt, so the same prompt gives the same answer
(as greedy decoding would).
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Iterable

__all__ = [
    "GENERATION_PROMPT",
    "MESSAGE_OVERHEAD",
    "answer_length",
    "answer_seed",
    "count_tokens",
    "split_tokens",
    "token_json",
    "token_text",
]

MESSAGE_OVERHEAD = 4
GENERATION_PROMPT = 3

_TOKEN = re.compile(r"\w{1,4}|[^\w\s]")

# Words of at most four letters: each is exactly one token under the rule.
_WORDS = (
    "the",
    "herd",
    "runs",
    "far",
    "and",
    "a",
    "GPU",
    "is",
    "cool",
    "it",
    "fast",
    "slow",
    "we",
    "wait",
    "back",
    "off",
    "then",
    "try",
    "once",
    "more",
    "calm",
    "load",
    "each",
    "seq",
    "gets",
    "one",
    "step",
    "so",
    "many",
    "come",
    "at",
    "noon",
    "but",
    "no",
    "fall",
    "over",
    "when",
    "says",
    "soon",
    "all",
    "good",
)
# Pieces and their JSON encodings, precomputed: streaming renders them per token.
_FIRST = tuple(w.capitalize() for w in _WORDS)
_LATER = tuple(" " + w for w in _WORDS)
_STOP = "."
_JSON_FIRST = tuple(json.dumps(p) for p in _FIRST)
_JSON_LATER = tuple(json.dumps(p) for p in _LATER)
_JSON_STOP = json.dumps(_STOP)
_MASK = (1 << 64) - 1


def count_tokens(text: str) -> int:
    """Number of tokens in ``text`` by the rule in the module docstring."""
    return len(_TOKEN.findall(text))


def split_tokens(text: str) -> list[str]:
    """The tokens of ``text`` by the rule in the module docstring."""
    return _TOKEN.findall(text)


def _mix(seed: int, i: int) -> int:
    # A cheap 64-bit integer hash (golden-ratio multiply, xor-shift): index-addressable,
    # so no per-sequence generator state is needed.
    h = ((seed & _MASK) * 0x9E3779B97F4A7C15 + (i + 1) * 0xBF58476D1CE4E5B9) & _MASK
    h ^= h >> 31
    return (h * 0x94D049BB133111EB) & _MASK


def _index(seed: int, i: int) -> int:
    """Which piece token ``i`` is: -1 for the full stop, else a word index."""
    h = _mix(seed, i) >> 16
    if i > 0 and h % 8 == 0:
        return -1
    return h % len(_WORDS)


def token_text(seed: int, i: int) -> str:
    """The text of token ``i`` (0-based) of the answer with ``seed``."""
    k = _index(seed, i)
    if k < 0:
        return _STOP
    return _FIRST[k] if i == 0 else _LATER[k]


def token_json(seed: int, i: int) -> str:
    """``json.dumps(token_text(seed, i))``, precomputed (the streaming hot path)."""
    k = _index(seed, i)
    if k < 0:
        return _JSON_STOP
    return _JSON_FIRST[k] if i == 0 else _JSON_LATER[k]


def answer_seed(seed: int | None, texts: Iterable[str]) -> int:
    """The seed of an answer: the request's ``seed``, else a stable hash of the prompt."""
    if seed is not None:
        return seed
    crc = 0
    for text in texts:
        crc = zlib.crc32(text.encode("utf-8", "surrogatepass"), crc)
    return crc


def answer_length(seed: int, low: int, high: int) -> int:
    """The natural answer length in content tokens (before EOS), in ``[low, high]``."""
    return low + _mix(seed, -2) % (high - low + 1)
