"""Real processes on 127.0.0.1: started by fixtures, always stopped, logs shown on failure.

A server's log is printed at teardown: pytest shows a test's captured output only
when it fails, so a failing test comes with the logs of the servers it used.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from herdless.launch.servers import ServerProcess, emulator_process

# Fast enough that a completion takes milliseconds, slow enough to stay realistic.
FAST = 50.0


def _show(server: ServerProcess) -> None:
    print(f"----- log of {server} -----\n{server.logs()}")


@pytest.fixture(scope="session")
def emulator_server() -> Iterator[ServerProcess]:
    """One shared emulator for tests that do not change its state (faults are reset)."""
    with emulator_process(speed=FAST, model="emulated") as server:
        yield server
        _show(server)


@pytest.fixture
def start_emulator() -> Iterator[Callable[..., ServerProcess]]:
    """A factory: ``start_emulator(**flags)`` runs a private emulator for this test only."""
    with contextlib.ExitStack() as stack:
        started: list[ServerProcess] = []

        def start(**options: Any) -> ServerProcess:
            options.setdefault("speed", FAST)
            server = stack.enter_context(emulator_process(**options))
            started.append(server)
            return server

        try:
            yield start
        finally:
            for server in started:
                server.stop()
                _show(server)
