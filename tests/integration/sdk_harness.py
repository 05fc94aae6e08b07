"""Shared set-up for the SDK-against-real-processes tests: emulated vLLMs and fault switches."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from herdless import Backend, BreakerPolicy, Client, FallbackPolicy, RetryPolicy, Timeouts
from herdless.launch.servers import ServerProcess

# The emulators run 50 times faster than a GPU: answers take milliseconds.
SPEED = 50
HI = [{"role": "user", "content": "hello there"}]
# Short per-attempt limits keep a hang test to a fraction of a second per attempt.
TIMEOUTS = Timeouts(connect=1.0, first_byte=0.5, read=1.0)


def set_faults(server: ServerProcess, **faults: Any) -> None:
    """Replace the emulator's faults (``hang=True``, ``error_rate=1``, ``refuse_for=2``...)."""
    response = httpx.post(server.url + "/_emulator/faults", json=faults, timeout=5)
    response.raise_for_status()


def clear_faults(server: ServerProcess) -> None:
    """Clear the steady faults; waits (bounded) while a ``refuse_for`` keeps the port shut."""
    deadline = time.monotonic() + 10.0
    while True:
        try:
            httpx.delete(server.url + "/_emulator/faults", timeout=5).raise_for_status()
            return
        except httpx.ConnectError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def hosted_backend(server: ServerProcess) -> Backend:
    return Backend(name="hosted", base_url=server.url + "/v1", model="hosted-mini", external=True)


@contextmanager
def client_for(
    primary: str,
    hosted: ServerProcess | None,
    *,
    breaker: BreakerPolicy | None = None,
    retry: RetryPolicy | None = None,
    deadline: float = 5.0,
    **kwargs: Any,
) -> Iterator[Client]:
    """A client with short timeouts and a breaker that opens after 2 failures for ~1 s."""
    with Client(
        primary=primary,
        fallback=hosted_backend(hosted) if hosted is not None else None,
        model="emulated-llama-3-8b",
        timeouts=TIMEOUTS,
        deadline=deadline,
        breaker=breaker or BreakerPolicy(consecutive_failures=2, open_for=1.0),
        retry=retry or RetryPolicy(base=0.05, cap=0.5),
        fallback_policy=kwargs.pop("fallback_policy", FallbackPolicy()),
        env_file=None,
        **kwargs,
    ) as client:
        yield client
