"""deploy/kubernetes/drain.py, the GPU pod's preStop hook, against a real gateway.

The emulator answers slowly enough (200 tokens at real speed, about 2.5 s) that a
call is still running when the hook drains; the hook must return only after it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from herdless.launch.servers import ServerProcess, emulator_process, free_port, gateway_process

pytestmark = pytest.mark.integration

DRAIN = Path(__file__).parents[2] / "deploy" / "kubernetes" / "drain.py"
TOKEN = "admin-token-for-the-drain-test"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 200}


@pytest.fixture(scope="module")
def gateway() -> Iterator[ServerProcess]:
    slow = {"model": "m", "answer_min_tokens": 200, "answer_max_tokens": 200}
    with (
        emulator_process(**slow) as gpu,
        gateway_process(
            upstream=gpu.url, env={"HERDLESS_GATEWAY_ADMIN_TOKEN": TOKEN}, drain_retry_after=1
        ) as gw,
    ):
        yield gw


def _hook(*args: str, token: str | None = TOKEN) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERDLESS_")}
    if token is not None:
        env["HERDLESS_GATEWAY_ADMIN_TOKEN"] = token
    return subprocess.run(
        [sys.executable, str(DRAIN), "--interval", "0.05", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _status(gw: ServerProcess) -> dict[str, object]:
    status: dict[str, object] = httpx.get(gw.url + "/readyz", timeout=5).json()
    return status


def test_a_token_that_is_missing_or_wrong_drains_nothing(gateway):
    missing = _hook("--gateway", gateway.url, "--drain", token=None)
    assert missing.returncode == 1
    assert "HERDLESS_GATEWAY_ADMIN_TOKEN is not set" in missing.stderr
    wrong = _hook("--gateway", gateway.url, "--drain", token="not-the-token")
    assert wrong.returncode != 0
    assert "drain refused: 403" in wrong.stderr
    assert "not-the-token" not in wrong.stdout + wrong.stderr
    assert _status(gateway)["draining"] is False


def test_vllms_hook_waits_for_a_drain_only_as_long_as_told(gateway):
    started = time.monotonic()
    waited = _hook("--gateway", gateway.url, "--timeout", "0.5", token=None)
    assert waited.returncode == 0
    assert "still busy after 0.5 s" in waited.stdout  # nobody drained: it gave up
    assert time.monotonic() - started < 30
    gone = _hook("--gateway", f"http://127.0.0.1:{free_port()}", token=None)
    assert gone.returncode == 0
    assert "the gateway has exited" in gone.stdout


def test_the_hook_drains_and_returns_after_the_running_call(gateway):
    # Runs last in this module: it leaves the gateway drained.
    finished: list[tuple[float, int]] = []

    def call() -> None:
        answer = httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, timeout=60)
        finished.append((time.monotonic(), answer.status_code))

    caller = threading.Thread(target=call)
    caller.start()
    deadline = time.monotonic() + 30
    while _status(gateway)["inflight"] == 0:
        assert time.monotonic() < deadline, "the call never reached the gateway"
        time.sleep(0.02)
    hook = _hook("--gateway", gateway.url, "--drain", "--timeout", "30")
    returned = time.monotonic()
    caller.join(60)
    assert hook.returncode == 0, hook.stderr
    assert "drain: the gateway is draining" in hook.stdout
    assert "drained, nothing in flight" in hook.stdout
    ((done_at, status),) = finished
    assert status == 200  # the running call was let finish
    assert done_at <= returned  # ... before the hook let SIGTERM come
    assert TOKEN not in hook.stdout + hook.stderr
    refused = httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, timeout=10)
    assert refused.status_code == 503
    assert refused.headers["x-herdless-drain"] == "1"  # clients go to their fallback at once
    # vLLM's hook, run after the drain, returns at once.
    assert "drained, nothing in flight" in _hook("--gateway", gateway.url, token=None).stdout
