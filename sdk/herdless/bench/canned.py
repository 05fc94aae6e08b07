"""A tiny HTTP/1.1 server of canned vLLM answers, for benchmarks of what a client costs.

``python -m herdless.bench.canned PORT`` answers every ``POST /v1/chat/completions`` on
127.0.0.1 with the same chat completion, whole or as SSE (with usage), and a ``GET``
with an empty 200. Standard library only: its own CPU is not what is measured.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from herdless.bench.answers import chat_completion

__all__ = ["serve", "wait_ready"]

_COMPLETION = json.dumps(
    chat_completion(
        id_="chatcmpl-bench",
        model="bench",
        content="Hello there, how are you?",
        prompt_tokens=12,
        completion_tokens=7,
    ),
    separators=(",", ":"),
).encode()
_STREAM = b"".join(
    b"data: "
    + json.dumps(
        {
            "id": "c",
            "model": "bench",
            "choices": [{"index": 0, "delta": delta, "finish_reason": end}],
        },
        separators=(",", ":"),
    ).encode()
    + b"\n\n"
    for delta, end in [
        ({"role": "assistant", "content": ""}, None),
        *(({"content": word}, None) for word in ("Hello", " there,", " how", " are", " you?")),
        ({"content": ""}, "stop"),
    ]
) + (
    b'data: {"id":"c","model":"bench","choices":[],"usage":{"prompt_tokens":12,'
    b'"completion_tokens":7,"total_tokens":19}}\n\ndata: [DONE]\n\n'
)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as vLLM behind uvicorn
    # Head and body are two writes: without this, Nagle + delayed ACK add 40 ms a call.
    disable_nagle_algorithm = True

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        payload, kind = (
            (_STREAM, "text/event-stream")
            if body.get("stream")
            else (_COMPLETION, "application/json")
        )
        self.send_response(200)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:  # readiness
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return


def serve(port: int) -> None:
    """Answer on 127.0.0.1:``port`` until killed."""
    ThreadingHTTPServer(("127.0.0.1", port), _Handler).serve_forever()


def wait_ready(url: str, server: subprocess.Popen[bytes]) -> None:
    """Return once the server at ``url`` answers; raise if it exits or stays silent."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError("the benchmark server exited")
        try:
            httpx.get(url, timeout=1.0)
            return
        except httpx.TransportError:
            time.sleep(0.05)
    raise RuntimeError("the benchmark server did not start within 10 s")


if __name__ == "__main__":
    serve(int(sys.argv[1]))
