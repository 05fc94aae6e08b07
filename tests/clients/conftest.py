"""The pinned JavaScript clients, installed once per lock file, and the gateway they call.

Installed with ``npm ci`` into ``.cache/js-clients/<hash of the lock>`` (reused while
the lock is unchanged). Where node or npm is missing every test here is skipped with
the reason; ``nox -s tests_clients`` says so too.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from herdless.bench.js_clients import install, node_available
from herdless.launch.servers import ServerProcess, emulator_process, gateway_process

CACHE = Path(__file__).parents[2] / ".cache" / "js-clients"
MODEL = "emulated"  # test_js_clients.py asks for it by this name


def _show(server: ServerProcess) -> None:
    print(f"----- log of {server} -----\n{server.logs()}")


@pytest.fixture(scope="session")
def js_clients() -> Path:
    """The folder to run ``run.mjs`` in, with the pinned clients installed."""
    why = node_available()
    if why is not None:
        pytest.skip(f"node/npm not found: {why}")
    return install(CACHE)


@pytest.fixture(scope="module")
def gateway() -> Iterator[ServerProcess]:
    """``herdless serve`` (8 running, 16 queued) in front of an emulator of 8 sequences."""
    yield from _gateway()


@pytest.fixture
def own_gateway() -> Iterator[ServerProcess]:
    """The same, for one test: a gateway that has learned nothing from the others."""
    yield from _gateway()


def _gateway() -> Iterator[ServerProcess]:
    with emulator_process(max_num_seqs=8, model=MODEL) as vllm:
        with gateway_process(upstream=vllm.url, max_concurrency=8, max_queue=16) as server:
            yield server
            _show(server)
        _show(vllm)
