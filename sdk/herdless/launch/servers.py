"""Real herdless processes for tests, demos and benchmarks: emulator and gateway on loopback.

Usage::

    from herdless.launch.servers import emulator_process, gateway_process

    with emulator_process(speed=50, max_num_seqs=64) as vllm:
        with gateway_process(upstream=vllm.url, max_concurrency=32) as gateway:
            httpx.post(gateway.url + "/v1/chat/completions", json=...)

Each process is ``python -m herdless ...`` on a free port of 127.0.0.1, with its
output in a log file; the context manager waits until it answers its readiness
URL (with a ceiling), and always stops it on exit: SIGTERM, then SIGKILL to the
same pid after a grace period (``stop_process``, which ``herdless.launch.vllm`` shares).
Nothing here needs the server extras.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import httpx

from herdless.launch._process import Launched

__all__ = [
    "ServerProcess",
    "ServerStartError",
    "emulator_process",
    "flags",
    "free_port",
    "gateway_process",
    "stop_process",
]


def stop_process(proc: subprocess.Popen[bytes], grace: float) -> int:
    """SIGTERM ``proc``, wait up to ``grace`` seconds, then SIGKILL the same pid; return
    its exit status (at once if it already exited)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


class ServerStartError(RuntimeError):
    """A server process exited or did not become ready in time; the message has its log."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the OS picks it; the race is accepted)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def flags(options: Mapping[str, object]) -> list[str]:
    """``{"max_num_seqs": 8, "hang": True}`` as ``["--max-num-seqs", "8", "--hang"]``.

    ``None`` and ``False`` leave a flag out (``False`` gives ``--no-NAME``).
    """
    out: list[str] = []
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if value is None:
            continue
        if value is True:
            out.append(flag)
        elif value is False:
            out.append("--no-" + flag[2:])
        else:
            out += [flag, str(value)]
    return out


class ServerProcess(Launched):
    """One ``python -m herdless COMMAND ...`` process on ``127.0.0.1:port``.

    Args:
        command: the subcommand and its flags, without ``--host``/``--port``.
        module: the module run with ``python -m`` (another one takes ``--host`` and
            ``--port`` too, as :mod:`herdless.bench.relay` does).
        ready_path: the path that answers 200 once the server is ready.
        ready_timeout: seconds to wait for readiness before giving up.
        port: the port to use (default: a free one).
        log_path: where to write the process's output (default: a temporary file).
        env: extra environment variables for the process.
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        ready_path: str = "/health",
        ready_timeout: float = 30.0,
        port: int | None = None,
        log_path: str | Path | None = None,
        env: Mapping[str, str] | None = None,
        module: str = "herdless",
    ) -> None:
        if ready_timeout <= 0:
            raise ValueError(f"ready_timeout must be > 0, got {ready_timeout!r}")
        self.command = list(command)
        self.module = module
        self.ready_path = ready_path
        self.ready_timeout = ready_timeout
        self.host = "127.0.0.1"
        self._auto_port = port is None
        self.port = port or free_port()
        self.env = dict(env or {})
        if log_path is None:
            what = self.command[0] if module == "herdless" else module.rpartition(".")[2]
            fd, name = tempfile.mkstemp(prefix=f"herdless-{what}-", suffix=".log")
            os.close(fd)
            log_path = name
        self.log_path = Path(log_path)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (no trailing slash)."""
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The process id once started (``None`` before)."""
        return None if self.process is None else self.process.pid

    def start(self, *, wait: bool = True) -> ServerProcess:
        """Start the process; with ``wait``, return once it is ready.

        A free port can be taken by another process between the moment it was
        picked and the moment the server binds it: with an automatic port and
        ``wait``, that case is retried on a new port (three tries).

        Raises:
            ServerStartError: it exited, or was not ready within ``ready_timeout``.
        """
        if self.process is not None:
            raise RuntimeError("already started")
        for attempt in range(3):
            logged = self.log_path.stat().st_size if self.log_path.exists() else 0
            self._spawn()
            if not wait:
                return self
            try:
                self.wait_ready()
                return self
            except ServerStartError:
                self.stop()
                with self.log_path.open("rb") as log:
                    log.seek(logged)
                    raced = b"address already in use" in log.read().lower()
                if not (self._auto_port and raced and attempt < 2):
                    raise
                self.process, self.port = None, free_port()
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")  # pragma: no cover -- the loop returns or raises

    def _spawn(self) -> None:
        argv = [sys.executable, "-m", self.module, *self.command]
        argv += ["--host", self.host, "--port", str(self.port)]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
            )

    def wait_ready(self, timeout: float | None = None) -> None:
        """Poll the readiness URL until it answers 200.

        Raises:
            ServerStartError: the process exited, or ``timeout`` (default
                ``ready_timeout``) seconds passed.
        """
        deadline = time.monotonic() + (self.ready_timeout if timeout is None else timeout)
        with httpx.Client(timeout=2.0) as client:
            while True:
                code = self.returncode()
                if code is not None:
                    raise ServerStartError(f"{self} exited with status {code}\n{self.logs()}")
                try:
                    if client.get(self.url + self.ready_path).status_code == 200:
                        return
                except httpx.TransportError:
                    pass  # not listening yet (loading), or busy
                if time.monotonic() > deadline:
                    raise ServerStartError(
                        f"{self} not ready after {self.ready_timeout} s\n{self.logs()}"
                    )
                time.sleep(0.05)

    def returncode(self) -> int | None:
        """The exit status, or ``None`` while it runs (or before it starts)."""
        return None if self.process is None else self.process.poll()

    def wait_exit(self, timeout: float) -> int:
        """Wait for the process to exit on its own; return its status.

        Raises:
            subprocess.TimeoutExpired: it is still running after ``timeout`` seconds.
        """
        if self.process is None:
            raise RuntimeError("not started")
        return self.process.wait(timeout)

    def stop(self, grace: float = 5.0) -> int | None:
        """SIGTERM, wait up to ``grace`` seconds, then SIGKILL the same pid. Idempotent."""
        return None if self.process is None else stop_process(self.process, grace)

    def logs(self, tail: int = 20_000) -> str:
        """The last ``tail`` characters of the process's output."""
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except FileNotFoundError:
            return ""

    def __repr__(self) -> str:
        return f"ServerProcess({' '.join(self.command[:1])}, url={self.url}, pid={self.pid})"


@contextlib.contextmanager
def emulator_process(
    *,
    ready_timeout: float = 30.0,
    log_path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    **options: object,
) -> Iterator[ServerProcess]:
    """A running ``herdless emulate`` with ``options`` as flags (``max_num_seqs=8``).

    A ``startup_delay`` is added to the readiness ceiling.
    """
    delay = options.get("startup_delay")
    server = ServerProcess(
        ["emulate", *flags(options)],
        ready_path="/health",
        ready_timeout=ready_timeout + (delay if isinstance(delay, int | float) else 0.0),
        log_path=log_path,
        env=env,
    )
    with server:
        yield server


@contextlib.contextmanager
def gateway_process(
    *,
    upstream: str,
    ready_timeout: float = 30.0,
    log_path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    **options: object,
) -> Iterator[ServerProcess]:
    """A running ``herdless serve --upstream URL`` with ``options`` as flags.

    Ready when ``GET /healthz`` answers 200.
    """
    server = ServerProcess(
        ["serve", "--upstream", upstream, *flags(options)],
        ready_path="/healthz",
        ready_timeout=ready_timeout,
        log_path=log_path,
        env=env,
    )
    with server:
        yield server
