"""Every example's README commands, run as written, against real processes.

A reader pastes an example's ``bash`` blocks into a terminal. These tests do the
same, in a bash of their own, from a scratch folder that has ``examples/`` in it
(the reader's repository root, without the files a command writes landing in ours).
Three things differ from the reader's terminal, and nothing else:

- ``pip install`` lines are not run: the examples session has installed
  ``.[all]`` and every example's ``requirements.txt``, which is what they install
  (checked below, line by line).
- The README's ports become free ports (the tests share the machine with others),
  the same number for the same port wherever it appears.
- A command the reader leaves running in the foreground (a server, a worker)
  runs in the background, as if in a second terminal; every server, started
  either way, is waited for until it listens before the next line runs.

The GPU (an emulator), its gateway and the hosted model (a second emulator) are
started by the test where the README assumes them, on the ports it names. Each
run is bounded, and everything it started is stopped with its process group.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from herdless.bench.js_clients import node_available
from herdless.launch.servers import emulator_process, gateway_process

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).parent
README_PORTS = (5000, 6379, 8000, 8080, 9000, 9464)


def free_ports(wanted: Iterable[int]) -> dict[int, int]:
    """A free port for each README port, all different: bound at once, then released
    (picked one at a time, two could be the same port, and a README's server would then
    answer another's requests)."""
    with contextlib.ExitStack() as stack:
        socks = {p: stack.enter_context(socket.socket()) for p in wanted}
        for sock in socks.values():
            sock.bind(("127.0.0.1", 0))
        return {p: sock.getsockname()[1] for p, sock in socks.items()}


# How long one README may take, start to last check (a cold import of LangChain,
# Django or Celery on a busy two-core machine is a few seconds each).
RUN_TIMEOUT = 120.0

# The helper the injected wait lines call: poll a URL (HTTP 200) or a port (tcp://).
WAIT_SCRIPT = """\
import socket, sys, time, urllib.request
target, deadline = sys.argv[1], time.monotonic() + float(sys.argv[2])
while time.monotonic() < deadline:
    try:
        if target.startswith("tcp://"):
            host, port = target[6:].rsplit(":", 1)
            socket.create_connection((host, int(port)), timeout=1).close()
            sys.exit(0)
        with urllib.request.urlopen(target, timeout=2) as answer:
            if answer.status == 200:
                sys.exit(0)
    except OSError:
        pass
    time.sleep(0.1)
sys.exit(f"not ready after {sys.argv[2]} s: {target}")
"""


def readme_commands(folder: str) -> list[str]:
    """The commands of every ``bash`` block of ``folder``'s README, in order
    (continuation lines joined; blank lines and whole-line comments left out)."""
    text = (EXAMPLES / folder / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```bash\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)
    lines = "\n".join(blocks).replace("\\\n", " ").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def _without_comment(line: str) -> str:
    """``line`` without a trailing ``# comment`` (a ``#`` inside quotes stays)."""
    quote = ""
    for index, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            return line[:index].rstrip()
    return line


def _swap_ports(line: str, ports: Mapping[int, int]) -> str:
    # A port follows ':' (URLs) or a space (``--port 8080``); nothing else in the
    # READMEs is one of these numbers, and the test below checks none is left over.
    return re.sub(
        r"(?<=[: ])(\d{4})\b",
        lambda m: str(ports.get(int(m.group(1)), m.group(1))),
        line,
    )


def _wait_target(line: str) -> str | None:
    """What to poll before the line after ``line`` runs: the server it starts."""
    port = re.search(r"--(?:metrics-)?port (\d+)", line)
    if port is None:
        return None
    base = f"http://127.0.0.1:{port.group(1)}"
    if line.startswith("herdless emulate"):
        return base + "/health"
    if line.startswith("herdless serve"):
        return base + "/readyz"
    return f"tcp://127.0.0.1:{port.group(1)}"


@dataclass
class Script:
    """The bash script for one README: its lines as they will run, and what was left out."""

    lines: list[str]
    skipped: list[str] = field(default_factory=list)

    @classmethod
    def build(cls, folder: str, ports: Mapping[int, int], *, foreground: str | None) -> Script:
        """``foreground``: the start of the command the reader leaves running."""
        script = cls(["set -euo pipefail"])
        for raw in readme_commands(folder):
            line = _swap_ports(_without_comment(raw), ports)
            if line.startswith("pip install"):
                script.skipped.append(line)
                continue
            runs_on = line.endswith("&") or (foreground is not None and line.startswith(foreground))
            script.lines.append(line if line.endswith("&") or not runs_on else line + " &")
            target = _wait_target(line) if runs_on else None
            if target:
                script.lines.append(f'python "$HERDLESS_README_WAIT" {target} 60')
        return script

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


class Run:
    """One README's script running in its own process group."""

    def __init__(
        self, script: Script, workdir: Path, env: Mapping[str, str], *, copy: str | None = None
    ) -> None:
        self.script = script
        self.workdir = workdir
        self.log = workdir / "output.log"
        if copy is not None:  # its commands write into this example's folder: a copy of it
            shutil.copytree(
                EXAMPLES / copy,
                workdir / "examples" / copy,
                ignore=shutil.ignore_patterns("node_modules"),
            )
        else:
            (workdir / "examples").symlink_to(EXAMPLES)
        (workdir / "wait_ready.py").write_text(WAIT_SCRIPT)
        bin_dir = str(Path(sys.executable).parent)
        base = {k: v for k, v in os.environ.items() if not k.startswith("HERDLESS_")}
        self.env = {
            **base,
            # The examples session's tools (python, herdless, uvicorn, celery) come first.
            "PATH": bin_dir + os.pathsep + base.get("PATH", ""),
            "PYTHONUNBUFFERED": "1",
            "HERDLESS_README_WAIT": str(workdir / "wait_ready.py"),
            **env,
        }
        self.started = time.monotonic()
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                ["bash", "-c", script.text()],
                cwd=workdir,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stopped as one below
            )

    def left(self) -> float:
        return max(1.0, RUN_TIMEOUT - (time.monotonic() - self.started))

    def finish(self) -> str:
        """Wait for the script's last line; its output. Fails on a non-zero status."""
        try:
            code = self.process.wait(self.left())
        except subprocess.TimeoutExpired:
            pytest.fail(f"the README's commands ran past {RUN_TIMEOUT} s:\n{self.output()}")
        assert code == 0, f"the README's commands failed ({code}):\n{self.output()}"
        return self.output()

    def alive(self) -> bool:
        """Whether anything the script started still runs (a server, a worker)."""
        try:
            os.killpg(self.process.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM to the whole group (servers left running), SIGKILL after a grace."""
        group = self.process.pid
        for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, sig)
            end = time.monotonic() + grace
            while time.monotonic() < end:
                try:
                    os.killpg(group, 0)  # anyone left in the group?
                except ProcessLookupError:
                    self.process.wait()
                    return
                time.sleep(0.1)
        self.process.wait()


@pytest.fixture
def readme(tmp_path: Path) -> Iterator[Callable[..., Run]]:
    """Runs a README (one per test): ``readme(folder, ports, foreground=..., env=...)``."""
    runs: list[Run] = []

    def run(
        folder: str,
        ports: Mapping[int, int],
        *,
        foreground: str | None = None,
        env: Mapping[str, str] | None = None,
        copy: bool = False,
    ) -> Run:
        script = Script.build(folder, ports, foreground=foreground)
        for line in script.skipped:
            _check_install_line(folder, line)
        leftover = [
            p for p in README_PORTS if any(re.search(rf"[: ]{p}\b", ln) for ln in script.lines)
        ]
        assert not leftover, f"README ports not swapped: {leftover}"
        started = Run(script, tmp_path, env or {}, copy=folder if copy else None)
        runs.append(started)
        return started

    yield run
    for started in runs:
        started.stop()


def _check_install_line(folder: str, line: str) -> None:
    """A skipped ``pip install`` asks for what the examples session installed."""
    words = line.split()[2:]
    assert words[:2] == ["-e", "'.[all]'"], line
    extra = set(words[2:]) - {"-r", f"examples/{folder}/requirements.txt", "uvicorn"}
    assert not extra, f"{line}: the examples session does not install {extra}"


@dataclass
class Stack:
    """The GPU (emulator), its gateway and the hosted model, on free ports."""

    ports: dict[int, int]
    gpu_url: str


@pytest.fixture
def stack() -> Iterator[Stack]:
    """What the READMEs assume runs: the gateway on 8080 in front of an emulated
    GPU on 8000, serving ``gemma-4``; a hosted model ``hosted-mini`` on 9000."""
    with (
        emulator_process(model="gemma-4", speed=20) as gpu,
        gateway_process(upstream=gpu.url) as gateway,
        emulator_process(model="hosted-mini", speed=20) as hosted,
    ):
        ports = {8000: gpu.port, 8080: gateway.port, 9000: hosted.port}
        ports |= free_ports(p for p in README_PORTS if p not in ports)
        yield Stack(ports, gpu.url)


def _served(emulator_url: str) -> float:
    """How many requests the emulator finished (vLLM's own counter)."""
    text = httpx.get(emulator_url + "/metrics", timeout=5).text
    values = re.findall(r"^vllm:request_success_total\{[^}]*\} ([\d.e+]+)$", text, re.MULTILINE)
    return sum(float(v) for v in values)


# --- one test per example with commands ------------------------------------------------


def test_asyncio_batch(readme, stack):
    run = readme("asyncio_batch", stack.ports)
    run.finish()
    answers = (run.workdir / "answers.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in answers]
    assert len(rows) == 300
    assert all(row["error"] is None and row["answer"] for row in rows), rows[:3]


def test_celery_worker(readme, stack):
    pytest.importorskip("fakeredis", reason="the broker for the Celery worker")
    from celery import Celery
    from fakeredis import TcpFakeServer

    broker = TcpFakeServer(("127.0.0.1", stack.ports[6379]), server_type="redis")
    thread = threading.Thread(target=broker.serve_forever, daemon=True)
    thread.start()
    try:
        run = readme("celery_worker", stack.ports, foreground="celery ")
        run.finish()  # the exports ran and the worker was started
        sender = Celery(broker=f"redis://127.0.0.1:{stack.ports[6379]}/0")
        sender.send_task("tasks.summarize", args=["The GPU is back after the upgrade."])
        deadline = time.monotonic() + run.left()
        while _served(stack.gpu_url) < 1:
            assert run.alive(), f"the worker exited:\n{run.output()}"
            assert time.monotonic() < deadline, f"no task reached the GPU:\n{run.output()}"
            time.sleep(0.2)
        out = run.output()
        assert "Unable to load celery application" not in out
        assert "concurrency: 4 (prefork)" in out
    finally:
        broker.shutdown()
        broker.server_close()


def test_django(readme, stack):
    out = readme("django", stack.ports, foreground="uvicorn ").finish()
    assert '{"answer": "' in out


def test_fastapi(readme):
    # The README starts its own GPU, gateway and hosted model: only ports are given.
    ports = free_ports(README_PORTS)
    out = readme("fastapi", ports, foreground="uvicorn ").finish()
    assert "x-herdless-backend: primary" in out.lower()  # curl -si: the headers
    assert 'data: {"delta": ' in out  # curl -N: the SSE stream
    assert re.search(r'"succeeded":\s*2\b', out), out[-2000:]  # /stats: both calls


def test_flask(readme, stack):
    out = readme("flask", stack.ports, foreground="flask ").finish()
    assert "HTTP/1.1 200" in out
    assert '"answer"' in out


def test_langchain(readme, stack):
    out = readme("langchain", stack.ports).finish()
    assert _served(stack.gpu_url) == 2  # invoke and ainvoke, each through herdless
    assert out.strip()


def test_observability(readme, stack):
    out = readme("observability", stack.ports, foreground="python ").finish()
    assert "herdless_client_attempts_total" in out


def test_javascript(readme, stack):
    why = node_available()
    if why is not None:
        pytest.skip(f"node/npm not usable: {why}")
    out = readme("javascript", stack.ports, copy=True).finish()
    assert out.count("[answered by upstream for ") == 2, out[-2000:]
    assert _served(stack.gpu_url) == 2


def test_openai_drop_in(readme, stack):
    out = readme("openai_drop_in", stack.ports).finish()
    assert _served(stack.gpu_url) == 1
    assert out.strip()


def test_every_example_with_commands_has_its_test():
    tested = {name.removeprefix("test_") for name in globals() if name.startswith("test_")}
    with_commands = {
        folder.name
        for folder in EXAMPLES.iterdir()
        if (folder / "README.md").exists() and readme_commands(folder.name)
    }
    assert with_commands <= tested, f"README commands nobody runs: {with_commands - tested}"
