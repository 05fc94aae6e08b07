"""The demo's servers: emulated GPU, gateway and hosted model, as child processes.

Each runs as ``python -m herdless ...`` on a free 127.0.0.1 port, with its log
in the output folder; :func:`running_stack` waits until all three answer and
always stops them (SIGTERM, then SIGKILL after a grace period), also on Ctrl-C
or an error, so the demo never leaves a process behind.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx

__all__ = ["Stack", "running_stack"]

_READY_TIMEOUT = 30.0  # seconds for a child to answer; the emulator starts in about one
_STOP_GRACE = 5.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Stack:
    """Where the demo's servers listen."""

    gpu: str
    """The emulated vLLM, ``http://127.0.0.1:PORT``."""
    gateway: str
    hosted: str
    admin_token: str


def _free_port() -> int:
    # The port is free now; the child binds it a moment later. Good enough on a loopback
    # interface nobody else is racing for, and it lets us know the URL before the start.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def running_stack(
    *, speed: float, gpu_seqs: int, seed: int, drain_retry_after: float, logs: Path
) -> Iterator[Stack]:
    """Start the three servers, yield their URLs, stop them on exit.

    Args:
        speed: the emulators' time scale (answers ``speed`` times faster than real).
        gpu_seqs: sequences the GPU runs at once; the gateway admits as many.
        seed: the emulators' text seed.
        drain_retry_after: the gateway's Retry-After while draining (seconds).
        logs: folder for the children's logs.
    """
    logs.mkdir(parents=True, exist_ok=True)
    gpu_port, gw_port, hosted_port = _free_port(), _free_port(), _free_port()
    token = secrets.token_urlsafe(16)
    stack = Stack(
        gpu=f"http://127.0.0.1:{gpu_port}",
        gateway=f"http://127.0.0.1:{gw_port}",
        hosted=f"http://127.0.0.1:{hosted_port}",
        admin_token=token,
    )
    emulate = [sys.executable, "-m", "herdless", "emulate", "--speed", str(speed)]
    emulate += ["--seed", str(seed), "--no-access-log", "--log-level", "warning"]
    commands = {
        "gpu": [
            *emulate,
            "--port",
            str(gpu_port),
            "--model",
            "company-llm",
            "--max-num-seqs",
            str(gpu_seqs),
        ],
        "hosted": [*emulate, "--port", str(hosted_port), "--model", "hosted-llm"],
        "gateway": [
            *(sys.executable, "-m", "herdless", "serve", "--port", str(gw_port)),
            *("--upstream", stack.gpu, "--max-concurrency", str(gpu_seqs)),
            *("--max-queue", str(gpu_seqs), "--queue-timeout", "5"),
            *("--drain-retry-after", str(drain_retry_after)),
            *("--no-access-log", "--log-level", "warning", "--health-interval", "0.5"),
        ],
    }
    env = {"HERDLESS_GATEWAY_ADMIN_TOKEN": token}
    children: list[tuple[subprocess.Popen[bytes], IO[bytes]]] = []
    try:
        for name, command in commands.items():
            log = (logs / f"{name}.log").open("wb")
            children.append((_spawn(command, env, log), log))
        _wait_ready(f"{stack.gpu}/health", children)
        _wait_ready(f"{stack.hosted}/health", children)
        _wait_ready(f"{stack.gateway}/readyz", children)
        yield stack
    finally:
        for process, _ in children:
            if process.poll() is None:
                process.terminate()
        for process, log in children:
            try:
                process.wait(_STOP_GRACE)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            log.close()


def _spawn(command: list[str], env: dict[str, str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    # Own session: a Ctrl-C in the terminal reaches the demo only, which then stops
    # the children in order instead of all of them dying mid-request at once.
    return subprocess.Popen(
        command,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **env},
        start_new_session=True,
    )


def _wait_ready(url: str, children: list[tuple[subprocess.Popen[bytes], IO[bytes]]]) -> None:
    deadline = time.monotonic() + _READY_TIMEOUT
    while time.monotonic() < deadline:
        for process, log in children:
            if process.poll() is not None:
                code = process.returncode
                raise RuntimeError(f"a demo server exited with {code}; see {log.name}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {_READY_TIMEOUT:g} s")
