"""HTTP/1.1 over raw keep-alive sockets, for load an HTTP client would throttle.

A load generator in one Python process cannot outrun a server through httpx: the
client's own CPU per request is the limit. Written by hand, a request is a few bytes
and an answer is read by its length (or its chunks), so that the figure measured is
the server's.
"""

from __future__ import annotations

import asyncio
import re

__all__ = ["raw_request", "read_response"]

_LENGTH = re.compile(rb"content-length:\s*(\d+)", re.IGNORECASE)
_CHUNKED = re.compile(rb"transfer-encoding:\s*chunked", re.IGNORECASE)


def raw_request(method: str, path: str, body: bytes = b"") -> bytes:
    """One HTTP/1.1 request to 127.0.0.1, as bytes (a JSON body)."""
    head = f"{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
    return head.encode() + f"content-length: {len(body)}\r\n\r\n".encode() + body


async def read_response(reader: asyncio.StreamReader) -> int:
    """Read one HTTP/1.1 response (sized or chunked); returns its status."""
    head = await reader.readuntil(b"\r\n\r\n")
    found = _LENGTH.search(head)
    if found:
        await reader.readexactly(int(found.group(1)))
    elif _CHUNKED.search(head):
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            await reader.readexactly(size + 2)  # the chunk and its CRLF; the last is just CRLF
            if size == 0:
                break
    return int(head[9:12])
