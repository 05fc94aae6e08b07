"""The Responses API's output items the gateway relayed, kept so that a later request may
name one instead of sending it again (pure, no I/O).

A client of OpenAI's Responses API may send a conversation's earlier answers as
references, ``{"type": "item_reference", "id": "msg_..."}``, for the server to fill in
from what it stored: the Vercel AI SDK's OpenAI provider does by default (``store``
unset). vLLM stores no response unless started with ``VLLM_ENABLE_RESPONSES_API_STORE``
(which never frees one), and refuses such an item with a 400, so the second turn of
every such conversation failed. The gateway keeps the output items it relays
(:class:`OutputItems`), under the key that asked for them, the most recently used within
a byte budget (:class:`ItemMemory`), and writes a reference it holds back as the item
itself before the request is priced. One it does not hold (its answer came through
another gateway, or before a restart, or was dropped for newer ones) is a 400 that says
how to send the item itself. The items live in the gateway's memory only, never on disk.
"""

from __future__ import annotations

import functools
import json
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from herdless.gateway.usage import UsageSniffer
from herdless.gateway.wire import BadRequest, json_object

__all__ = ["ItemMemory", "Keep", "OutputItems"]

Keep = Callable[[Mapping[str, Any]], None]
"""What keeps one output item of an answer (:meth:`ItemMemory.keeper`)."""

_REFERENCE = b'"item_reference"'
_EVENT_END = b"\n\n"  # vLLM ends each SSE event with a blank line
_ENDS = ("response.completed", "response.incomplete")  # the events that hold the response
_END_MARKS = tuple(f'"{name}"'.encode() for name in _ENDS)
_OVERHEAD = 200  # bytes a kept item costs beyond its JSON (its key, its place in the order)


class ItemMemory:
    """Output items by (key id, item id), the most recently used kept within ``max_bytes``
    (their JSON and a fixed overhead each); one larger than the budget is not kept.
    ``/metrics`` reads its figures at scrape time
    (:class:`~herdless.gateway.metrics.GatewayMetrics`)."""

    __slots__ = ("_items", "dropped", "held_bytes", "max_bytes", "references")

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes!r}")
        self.max_bytes = max_bytes
        self.held_bytes = 0
        """Bytes the kept items cost now."""
        self.dropped = 0
        """Items dropped for newer ones within the budget so far."""
        self.references = {"written": 0, "not_held": 0}
        """References met so far: written out as their item, or refused (not held)."""
        self._items: OrderedDict[tuple[str, str], tuple[dict[str, Any], int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def remember(self, key_id: str, item: Mapping[str, Any]) -> None:
        """Keep ``item`` (an output item with a string ``id``) for ``key_id``'s requests;
        the least recently used go first while the budget is passed."""
        item_id = item.get("id")
        if not isinstance(item_id, str) or not item_id:
            return
        cost = len(json.dumps(item, separators=(",", ":"))) + _OVERHEAD
        if cost > self.max_bytes:
            return
        slot = (key_id, item_id)
        if (old := self._items.pop(slot, None)) is not None:
            self.held_bytes -= old[1]
        self._items[slot] = (dict(item), cost)
        self.held_bytes += cost
        while self.held_bytes > self.max_bytes:
            _, (_, dropped) = self._items.popitem(last=False)
            self.held_bytes -= dropped
            self.dropped += 1

    def keeper(self, key_id: str) -> Keep | None:
        """What keeps the items of an answer to ``key_id``; ``None`` when this keeps none."""
        return functools.partial(self.remember, key_id) if self.max_bytes else None

    def recall(self, key_id: str, item_id: str) -> dict[str, Any] | None:
        """The item ``key_id``'s requests were answered with, or ``None``."""
        found = self._items.get((key_id, item_id))
        if found is None:
            return None
        self._items.move_to_end((key_id, item_id))
        return found[0]

    def resolve(self, key_id: str, body: bytes) -> bytes:
        """``body`` (a ``/v1/responses`` request) with each ``item_reference`` of its
        ``input`` written out as the item it names; the same bytes when it has none.

        Raises:
            BadRequest: not JSON, or a reference to an item this key was not answered
                with here (``code``: ``item_not_found``).
        """
        if _REFERENCE not in body:
            return body
        data = json_object(body)
        given = data.get("input")
        if not isinstance(given, list):
            return body
        written = []
        for index, item in enumerate(given):
            if isinstance(item, dict) and item.get("type") == "item_reference":
                item_id = item.get("id")
                found = self.recall(key_id, item_id) if isinstance(item_id, str) else None
                if found is None:
                    self.references["not_held"] += 1
                    raise BadRequest(_not_held(index, item_id), param=f"input[{index}]",
                                     code="item_not_found")  # fmt: skip
                item = found
                self.references["written"] += 1
            written.append(item)
        data["input"] = written
        return json.dumps(data, separators=(",", ":")).encode()


def _not_held(index: int, item_id: object) -> str:
    return (
        f"input[{index}] refers to item {item_id!r}, which this gateway does not hold: the "
        "model server stores no responses, and the gateway keeps the items it answered "
        "with for a while, in its memory only. Send the item itself (the Vercel AI SDK: "
        "providerOptions.openai.store = false; the openai clients: the output items as "
        "input)"
    )


class OutputItems(UsageSniffer):
    """A :class:`~herdless.gateway.usage.UsageSniffer` of a 200 ``/v1/responses``
    answer that also gives ``keep`` each of its output items, once the answer has ended
    whole: a stream at its last event (``response.completed``, or ``response.incomplete``
    when cut at its ``max_output_tokens``), which holds the whole response; a body when it
    parses. An answer past ``most`` bytes (a stream: one event past them) gives none."""

    __slots__ = ("_keep", "_most", "_parts", "_read", "_size", "_stream")

    def __init__(
        self, keep: Keep, *, stream: bool, omit: bool = False,
        most: int = 4 * 1024 * 1024,
    ) -> None:  # fmt: skip
        super().__init__(omit=omit)
        self._keep: Keep | None = keep
        self._stream = stream
        self._most = most
        self._read = b""  # a stream's event not ended yet
        self._parts: list[bytes] = []  # a whole body so far
        self._size = 0

    def feed(self, chunk: bytes) -> bytes:
        if self._keep is not None:
            self._look(chunk)
        return super().feed(chunk)

    def end(self) -> bytes:
        if self._keep is not None and not self._stream:
            try:
                response = json.loads(b"".join(self._parts))
            except ValueError:
                response = None  # cut short
            self._give(response)
        return super().end()

    def _look(self, chunk: bytes) -> None:
        if not self._stream:
            self._size += len(chunk)
            self._parts.append(chunk)
            if self._size > self._most:
                self._keep, self._parts = None, []  # too large: it passes unread
            return
        read = self._read + chunk
        if len(read) > self._most:
            self._keep, self._read = None, b""
            return
        *events, self._read = read.split(_EVENT_END)
        for raw in events:
            if not any(mark in raw for mark in _END_MARKS):
                continue  # a delta: parsed by no one here
            if (data := _data(raw)).get("type") in _ENDS:
                self._give(data.get("response"))

    def _give(self, response: object) -> None:
        keep, self._keep = self._keep, None
        output = response.get("output") if isinstance(response, dict) else None
        if keep is None or not isinstance(output, list):
            return
        for item in output:
            if isinstance(item, dict):
                keep(item)


def _data(event: bytes) -> dict[str, Any]:
    """The JSON object of an SSE event's ``data:`` (its last line, as vLLM writes it);
    ``{}`` for anything else."""
    _, _, data = event.partition(b"data:")
    try:
        value = json.loads(data)
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {}
