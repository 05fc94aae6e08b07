"""What the contract tests share: the upstream under test and SSE reading."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx

from herdless.launch.vllm import MODEL_NAME

MAX_MODEL_LEN = 2048


@dataclass(frozen=True, slots=True)
class Upstream:
    """A vLLM-compatible server: ``url`` is its root (``/health``, ``/v1/...``)."""

    kind: str
    url: str
    model: str = MODEL_NAME

    def chat(self, content: str = "Hi", **body: Any) -> dict[str, Any]:
        """A chat request body for this upstream's model."""
        return {"model": self.model, "messages": [{"role": "user", "content": content}], **body}


def read_events(response: httpx.Response) -> list[str]:
    """The raw ``data:`` payloads of an SSE body, checking vLLM's framing on the way.

    Every event is exactly ``data: <payload>\\n\\n``: no other field, no comment.
    """
    raw = response.read().decode()
    assert raw.endswith("\n\n"), raw[-80:]
    events = raw[:-2].split("\n\n")
    for event in events:
        assert event.startswith("data: "), event
        assert "\n" not in event, event
    return [event.removeprefix("data: ") for event in events]


def decode_chunks(payloads: list[str]) -> list[dict[str, Any]]:
    """JSON chunks before ``[DONE]``, checking that each is compact and ``[DONE]`` ends it."""
    assert payloads[-1] == "[DONE]"
    chunks = []
    for payload in payloads[:-1]:
        chunk = json.loads(payload)
        # vLLM writes compact JSON (no spaces after separators), unescaped UTF-8.
        assert json.dumps(chunk, separators=(",", ":"), ensure_ascii=False) == payload
        chunks.append(chunk)
    return chunks


def named_events(raw: str) -> list[tuple[str, dict[str, Any]]]:
    """``(name, data)`` of each event of a Messages API stream, checking vLLM's framing:
    every event is ``event: NAME\ndata: DATA\n\n``, ``DATA`` compact JSON whose
    ``type`` is ``NAME``."""
    assert raw.endswith("\n\n"), raw[-80:]
    out = []
    for event in raw[:-2].split("\n\n"):
        name, data = event.split("\n")
        assert name.startswith("event: "), event
        assert data.startswith("data: "), event
        name, data = name.removeprefix("event: "), data.removeprefix("data: ")
        parsed = json.loads(data)
        assert json.dumps(parsed, separators=(",", ":"), ensure_ascii=False) == data
        assert parsed["type"] == name
        out.append((name, parsed))
    return out


def stream_named_events(
    http: httpx.Client, path: str, body: dict[str, Any]
) -> list[tuple[str, dict[str, Any]]]:
    """Post ``body`` to ``path`` and read its SSE answer with :func:`named_events`, checking
    that it is a 200 of ``text/event-stream``."""
    with http.stream("POST", path, json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        return named_events(response.read().decode())
