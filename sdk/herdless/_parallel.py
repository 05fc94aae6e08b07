"""The drivers' half of a hedge's race: a call's sends running side by side.

The flow (``herdless._call.race``) decides; a driver only performs its ``Race`` actions
(``herdless._actions``): start a send without waiting for it, report whichever of the
running sends ends first (``Ended``), and cancel what is still running when the flow
moves on. ``AsyncSends`` runs each send as an asyncio task; ``SyncSends`` on a worker
thread (the caller's thread waits, and drives the flow alone), since a blocked thread
cannot wait for two sockets at once.

**Cancelling.** A task is cancelled: httpcore closes a connection whose response was
not read to its end, so the server sees the client leave (vLLM frees the sequence; a
herdless gateway passes the disconnect on). A thread cannot be interrupted, so the sync
client's own HTTP client reads a racing send's socket in slices of ``_SLICE`` seconds
(``_sockets.AttemptLimit.watch``) and gives up between two slices once cancelled,
closing the connection the same way. With an HTTP client of the user's, a cancelled
send runs until its own limits end it; its answer is then closed unread. A send that
ended but was not reported yet (the loser of a close race) is closed unread too.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Final

from herdless._actions import Ended, Outcome, Race, Response, Send

if TYPE_CHECKING:
    from herdless._outcomes import OpenStream
    from herdless._sockets import AttemptLimit

__all__ = ["AsyncSends", "SyncSends", "Workers"]

_MAX_WORKERS: Final = 256
"""Threads a sync client may run racing sends on at once: two per call that races (the
pool starts none until needed and reuses the idle ones). Past it, a send waits for a
thread, which only delays it."""


def _open_stream(send: Send, outcome: Outcome) -> OpenStream | None:
    """The open stream an accepted streaming ``outcome`` of ``send`` carries, if any."""
    if send.stream and type(outcome) is Response and 200 <= outcome.status < 300:
        stream: OpenStream = outcome.opened
        return stream
    return None


class AsyncSends:
    """One async call's sends running at once, as tasks.

    Args:
        perform: performs one send (the driver's attempt, with its time limit).
    """

    __slots__ = ("_perform", "_tasks")

    def __init__(self, perform: Callable[[Send], Coroutine[Any, Any, Outcome]]) -> None:
        self._perform = perform
        self._tasks: list[tuple[asyncio.Task[Outcome], Send]] = []  # in start order

    async def race(self, action: Race) -> Ended | None:
        """Perform ``action``: start its send, then wait for the first running one to end."""
        if action.send is not None:
            task: asyncio.Task[Outcome] = asyncio.get_running_loop().create_task(
                self._perform(action.send)
            )
            self._tasks.append((task, action.send))
        if not self._tasks:
            raise RuntimeError("the flow waits on a race with nothing running")
        done, _ = await asyncio.wait(
            [task for task, _ in self._tasks],
            timeout=action.timeout,
            return_when=asyncio.FIRST_COMPLETED,
        )
        for index, (task, send) in enumerate(self._tasks):  # the earlier send first
            if task in done:
                del self._tasks[index]
                return Ended(send=send, outcome=task.result())
        return None  # the time ran out first

    async def cancel(self) -> None:
        """Cancel every send still running (closing its connection); close the answer of
        one that ended unreported. Waits until they are closed."""
        tasks, self._tasks = self._tasks, []
        if not tasks:
            return
        for task, _ in tasks:
            task.cancel()
        # Until they are closed (a cancelled task closes its connection at once); a
        # cancellation of the caller's own passes through asyncio.wait.
        await asyncio.wait([task for task, _ in tasks])
        for task, send in tasks:
            if task.cancelled() or task.exception() is not None:
                continue  # a loser's failure is nobody's business now
            stream = _open_stream(send, task.result())
            if stream is not None:  # it ended before the cancel: close it unread
                await stream.response.aclose()


class Workers:
    """A sync client's threads for racing sends, started at the first race (most
    clients never hedge), shared with its ``with_options`` clients."""

    __slots__ = ("_lock", "_pool")

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def submit(self, job: Callable[[], None]) -> None:
        """Run ``job`` on a worker thread."""
        pool = self._pool
        if pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(
                        max_workers=_MAX_WORKERS, thread_name_prefix="herdless-race"
                    )
                pool = self._pool
        pool.submit(job)

    def shutdown(self) -> None:
        """Let the threads end once their sends do (the client is closed)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


class _Running:
    """One send on a worker thread; ``cancelled`` is read by the thread's socket reads
    (``_sockets._WatchedStream``) between two slices."""

    __slots__ = ("cancelled", "lock", "send")

    def __init__(self, send: Send) -> None:
        self.send = send
        self.cancelled = False
        self.lock = threading.Lock()


class SyncSends:
    """One sync call's sends running at once, each on a worker thread.

    Args:
        perform: performs one send (the driver's attempt, on the calling thread).
        workers: the client's threads.
        limit: the client's per-thread socket limit, when its HTTP client is its own
            (then a cancelled send stops reading at once).
    """

    __slots__ = ("_limit", "_perform", "_queue", "_running", "_workers")

    def __init__(
        self, perform: Callable[[Send], Outcome], workers: Workers, limit: AttemptLimit | None
    ) -> None:
        self._perform = perform
        self._workers = workers
        self._limit = limit
        self._running: list[_Running] = []
        self._queue: queue.SimpleQueue[tuple[_Running, Outcome | BaseException]] = (
            queue.SimpleQueue()
        )

    def race(self, action: Race) -> Ended | None:
        """Perform ``action``: start its send, then wait for the first running one to end.

        Raises:
            BaseException: what a send raised that is not a transport failure (a bug).
        """
        if action.send is not None:
            running = _Running(action.send)
            self._running.append(running)
            self._workers.submit(lambda: self._run(running))
        if not self._running:
            raise RuntimeError("the flow waits on a race with nothing running")
        try:
            running, outcome = self._queue.get(timeout=action.timeout)
        except queue.Empty:
            return None  # the time ran out first
        self._running.remove(running)
        if isinstance(outcome, BaseException):
            raise outcome
        return Ended(send=running.send, outcome=outcome)

    def _run(self, running: _Running) -> None:  # on a worker thread
        limit = self._limit
        outcome: Outcome | BaseException
        if limit is not None:
            limit.watch = running
        try:
            outcome = self._perform(running.send)
        except BaseException as exc:  # handed to the caller's thread, raised there
            outcome = exc
        finally:
            if limit is not None:
                limit.watch = None
        with running.lock:
            if not running.cancelled:
                self._queue.put((running, outcome))
                return
        if not isinstance(outcome, BaseException):
            _close(running.send, outcome)  # nobody waits for it any more

    def cancel(self) -> None:
        """Cancel every send still running; close the answer of one that ended unreported."""
        running, self._running = self._running, []
        for each in running:
            with each.lock:
                each.cancelled = True
        while True:
            try:
                ended, outcome = self._queue.get_nowait()
            except queue.Empty:
                return
            if not isinstance(outcome, BaseException):
                _close(ended.send, outcome)


def _close(send: Send, outcome: Outcome) -> None:
    stream = _open_stream(send, outcome)
    if stream is not None:
        with contextlib.suppress(Exception):  # a loser's close must not fail anything
            stream.response.close()
