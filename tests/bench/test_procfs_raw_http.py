"""The bench's /proc readings and its hand-written HTTP/1.1, without servers."""

from __future__ import annotations

import asyncio
import math
import sys

import pytest

from herdless.bench.procfs import cpu_seconds, rss_bytes
from herdless.bench.raw_http import raw_request, read_response

linux = pytest.mark.skipif(sys.platform != "linux", reason="/proc is Linux's")


@linux
def test_this_process_has_used_cpu_and_holds_memory() -> None:
    before = cpu_seconds()
    sum(i * i for i in range(300_000))  # some CPU to see
    assert cpu_seconds() > before >= 0
    assert 10 * 2**20 < rss_bytes() < 10 * 2**30  # a Python process: MiB to GiB


def test_a_process_that_is_not_there_reads_as_missing() -> None:
    assert math.isnan(cpu_seconds(2**22 + 7))  # above Linux's pid_max default
    assert rss_bytes(2**22 + 7) == 0


def test_a_request_carries_its_length() -> None:
    assert raw_request("POST", "/v1/x", b"{}") == (
        b"POST /v1/x HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        b"content-length: 2\r\n\r\n{}"
    )


def _read_all(data: bytes) -> list[int]:
    async def go() -> list[int]:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        return [await read_response(reader), await read_response(reader)]

    return asyncio.run(go())


def test_sized_and_chunked_answers_are_read_to_their_end() -> None:
    sized = b"HTTP/1.1 429 Too Many Requests\r\ncontent-length: 5\r\n\r\nhello"
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n"
    )
    # Read back to back on one socket: each read stops exactly at its answer's end.
    assert _read_all(sized + chunked) == [429, 200]
