"""Which prompts the engine's prefix cache will share: their leading text, in links (pure).

vLLM's prefix cache keys each full KV block by a hash of every token up to its end, so
two prompts that begin with the same text (a long system prompt, a batch job's
instructions, the earlier turns of one conversation) share the blocks of that text,
and the engine holds them once while any request that uses them runs. The gateway
sees text, not tokens: a prompt's :func:`chain` hashes it in links of :data:`LINK`
characters, each over everything before it, so two chains agree exactly as far as
their texts do (to the link). :class:`Held` counts the links of the requests the
engine has taken in: a new request whose leading links are held finds those blocks in
the cache, and only the rest of its prompt takes new KV.
"""

from __future__ import annotations

import bisect
import json
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final

__all__ = ["LINK", "LINK_TOKENS", "MAX_LINKS", "Held", "chain", "chat_links", "rendering"]

LINK: Final = 256
"""Characters of prompt text one link covers."""
LINK_TOKENS: Final = LINK // 4
"""The tokens of a link at the gateway's estimate (four characters a token)."""
MAX_LINKS: Final = 1024
"""Links hashed at most (the first 256 KiB of text): text beyond is never counted shared."""


def chain(seed: str, parts: Iterable[str]) -> tuple[int, ...]:
    """The links of a prompt rendered as ``seed`` then ``parts`` (joined): one hash per
    whole :data:`LINK` characters, each over every character before its end. ``seed``
    holds what changes the engine's rendering or cache without showing in the text (the
    model, a ``cache_salt``, the tools); a partial last link has no hash."""
    most = LINK * MAX_LINKS
    pieces, size = [seed], len(seed)
    for part in parts:
        if size >= most:
            break
        pieces.append(part)
        size += len(part)
    text = "".join(pieces)
    links: list[int] = []
    link = hash(seed)  # two seeds that differ never share a link, whatever their text
    for start in range(0, min(size, most) - LINK + 1, LINK):
        link = hash((link, text[start : start + LINK]))
        links.append(link)
    return tuple(links)


def chat_links(data: Mapping[str, Any], messages: list[dict[str, Any]]) -> tuple[int, ...]:
    """The links of a chat request's prompt (``data``, its body; ``messages``, checked)."""
    return chain(rendering(data), _message_texts(messages))


# Body fields that change what the engine renders or caches, beside the messages' text.
_RENDERING = (
    "model",
    "cache_salt",
    "tools",
    "chat_template",
    "chat_template_kwargs",
    "documents",
    "mm_processor_kwargs",
)


def rendering(data: Mapping[str, Any]) -> str:
    """The seed of a prompt's links: the body fields beside its text that change what the
    engine renders or caches (two requests that differ in one share no block)."""
    return json.dumps({name: data[name] for name in _RENDERING if name in data}, default=str)


def _message_texts(messages: list[dict[str, Any]]) -> Iterator[str]:
    """Each message as text, in order, up to the first that holds more than text (an
    image's blocks are keyed by its bytes, not by anything the gateway reads)."""
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            texts = [part.get("text") if isinstance(part, dict) else None for part in content]
            strings = [text for text in texts if isinstance(text, str)]
            if len(strings) < len(texts):
                return
            content = "\x1f".join(strings)
        extra = {name: value for name, value in message.items() if name not in _MESSAGE_TEXT}
        tail = json.dumps(extra, sort_keys=True, default=str) if extra else ""
        yield f"\x1e{message['role']}\x1f{content or ''}{tail}"


_MESSAGE_TEXT = frozenset({"role", "content"})


class Held:
    """The links whose blocks the engine holds for the running requests, counted (a link
    stays held while one request that holds it runs)."""

    __slots__ = ("_count",)

    def __init__(self) -> None:
        self._count: Counter[int] = Counter()

    def add(self, links: tuple[int, ...]) -> None:
        self._count.update(links)

    def remove(self, links: tuple[int, ...]) -> None:
        count = self._count
        for link in links:
            if count[link] <= 1:
                count.pop(link, None)
            else:
                count[link] -= 1

    def depth(self, links: tuple[int, ...]) -> int:
        """How many of ``links``' leading links are held. A link hashes all before it, so
        the held ones are a run from the start: found by halving."""
        count = self._count
        return bisect.bisect_left(range(len(links)), True, key=lambda i: links[i] not in count)
