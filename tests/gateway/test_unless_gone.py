"""``unless_gone``: a request's work against its client's disconnect, in plain asyncio
tasks. Each ending (the work's, the client's, the server's) leaves no task behind."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from herdless.gateway.edge import unless_gone


class Client:
    """An ASGI ``receive`` whose next message comes when the test says so."""

    def __init__(self) -> None:
        self.messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.waiting = 0

    async def receive(self) -> dict[str, Any]:
        self.waiting += 1
        try:
            return await self.messages.get()
        finally:
            self.waiting -= 1

    def leaves(self) -> None:
        self.messages.put_nowait({"type": "http.disconnect"})


class Work:
    """A request's work that ends when the test says so, and says how it ended."""

    def __init__(self) -> None:
        self.done = asyncio.Event()
        self.cancelled = False

    async def run(self) -> str:
        try:
            await self.done.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return "answered"


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def others() -> set[asyncio.Task[Any]]:
    return {task for task in asyncio.all_tasks() if task is not asyncio.current_task()}


async def test_the_work_that_ends_first_is_the_answer_and_the_watch_stops() -> None:
    client, work = Client(), Work()
    answer = asyncio.create_task(unless_gone(client.receive, work.run()))
    await settle()
    assert client.waiting == 1  # the disconnect is watched while the work runs
    work.done.set()
    assert await answer == "answered"
    await settle()
    assert (client.waiting, work.cancelled, others()) == (0, False, set())


async def test_a_client_that_leaves_cancels_the_work_and_gets_nothing() -> None:
    client, work = Client(), Work()
    client.messages.put_nowait({"type": "http.request", "body": b"", "more_body": False})
    answer = asyncio.create_task(unless_gone(client.receive, work.run()))
    await settle()
    assert not answer.done()  # a message other than the disconnect is passed over
    client.leaves()
    assert await answer is None
    assert work.cancelled
    assert others() == set()


async def test_a_request_cancelled_from_outside_cancels_its_work_and_stays_cancelled() -> None:
    client, work = Client(), Work()
    answer = asyncio.create_task(unless_gone(client.receive, work.run()))
    await settle()
    answer.cancel()  # the server stops
    with pytest.raises(asyncio.CancelledError):
        await answer
    await settle()
    assert work.cancelled
    assert (client.waiting, others()) == (0, set())


async def test_the_works_error_is_raised_and_a_broken_receive_is_not_taken_for_a_leave() -> None:
    async def fails() -> str:
        raise ValueError("upstream")

    with pytest.raises(ValueError, match="upstream"):
        await unless_gone(Client().receive, fails())

    async def broken() -> dict[str, Any]:
        raise RuntimeError("receive")

    work = Work()
    with pytest.raises(RuntimeError, match="receive"):
        await unless_gone(broken, work.run())
    assert work.cancelled
