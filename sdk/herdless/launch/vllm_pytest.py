"""pytest fixtures for a real vLLM on CPU (:mod:`herdless.launch.vllm`).

Enable with ``-p herdless.launch.vllm_pytest`` or ``pytest_plugins``. Where
the server comes from, first match wins (read once, when the plugin loads):

- ``HERDLESS_TEST_VLLM_URL``: a vLLM already running there; the fixtures that
  stop and restart the server skip.
- ``HERDLESS_TEST_VLLM_HOME``: a cache folder prepared with
  ``python -m herdless.launch.vllm prepare --cache DIR``; one server is started
  for the whole session and stopped by its pid at the end.
- ``.cache/vllm`` under pytest's root folder, when an earlier ``prepare`` left
  it ready (so ``pytest -m vllm`` works after one ``nox -s tests_vllm``).

Otherwise the tests that use these fixtures skip, saying how to get a server.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from herdless.launch.vllm import VllmHome, VllmServer

__all__ = ["VLLM_ARGS", "vllm_server", "vllm_url"]

# Four sequences at most, and vLLM's own queue cap (new in 0.32) so that its
# 503 can be tested; the gateway tests keep their concurrency under both.
VLLM_ARGS = ("--max-num-seqs", "4", "--max-num-queued-reqs", "4")

_URL = os.environ.get("HERDLESS_TEST_VLLM_URL", "").rstrip("/")
_HOME = os.environ.get("HERDLESS_TEST_VLLM_HOME", "")
_HOW = "run `nox -s tests_vllm`, or set HERDLESS_TEST_VLLM_URL to a running vLLM"


def _find_home(rootdir: Path) -> VllmHome | None:
    root = Path(_HOME) if _HOME else rootdir / ".cache" / "vllm"
    try:
        status = json.loads((root / "status.json").read_text())
    except (OSError, ValueError):
        return None
    if not status.get("available"):
        return None
    return VllmHome(root=root, python=Path(status["python"]), model=Path(status["model"]))


@pytest.fixture(scope="session")
def vllm_server(pytestconfig: pytest.Config) -> Iterator[VllmServer]:
    """A vLLM this session started (and may stop and restart); stopped at the end."""
    if _URL:
        pytest.skip("HERDLESS_TEST_VLLM_URL names a server these tests cannot restart")
    home = _find_home(pytestconfig.rootpath)
    if home is None:
        pytest.skip(f"no prepared vLLM: {_HOW}")
    server = VllmServer(home, extra_args=VLLM_ARGS)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def vllm_url(request: pytest.FixtureRequest) -> str:
    """The root URL of a running vLLM serving ``SmolLM2-135M-Instruct``."""
    if _URL:
        return _URL
    server: VllmServer = request.getfixturevalue("vllm_server")
    return server.url
