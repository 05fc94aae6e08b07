"""Real JavaScript clients from npm, run against a gateway: openai-node, the Vercel ``ai``
SDK (its openai-compatible provider), LangChain.js and one plain ``fetch`` on the chat
completions API; Anthropic's SDK (``@anthropic-ai/sdk``, Claude Code's client) on the
Messages API; openai-node and the Vercel ``ai`` SDK's OpenAI provider
(``@ai-sdk/openai``) on the Responses API.

Usage::

    from herdless.bench.js_clients import Scenario, install, node_available, run_clients

    if (why := node_available()) is None:
        directory = install(Path(".cache/js-clients"))
        results = run_clients(
            Scenario(client="openai", base_url=gateway.url, api_key="k", model="m", calls=48,
                     concurrency=24, max_tokens=(32, 64)),
            directory=directory,
        )

The clients' versions are pinned in ``js/package.json`` and ``js/package-lock.json``
(package data); :func:`install` runs ``npm ci`` once per lock file into a cache
folder, and :func:`run_clients` runs ``js/run.mjs`` there with ``node``: each client
keeps its default retry rules, and a wrapped ``fetch`` counts the HTTP requests it
makes. docs/clients.md says what each client retries and how it reads ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib.resources
import json
import math
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

__all__ = [
    "CHAT_CLIENTS",
    "CLIENTS",
    "CONVERSING",
    "CallResult",
    "Client",
    "JsClientsError",
    "Scenario",
    "Usage",
    "install",
    "node_available",
    "run_clients",
    "run_clients_async",
]

Client = Literal[
    "openai", "vercel", "langchain", "single", "anthropic", "responses", "vercel-responses"
]
"""openai-node, the Vercel ``ai`` SDK, LangChain.js, one ``fetch`` POST and no retry (the
chat completions API), Anthropic's SDK (``/v1/messages``), or the Responses API
(``/v1/responses``) through openai-node or the Vercel ``ai`` SDK's OpenAI provider."""

CLIENTS: tuple[Client, ...] = get_args(Client)
CHAT_CLIENTS: tuple[Client, ...] = ("openai", "vercel", "langchain", "single")
"""The clients of the chat completions API (not Anthropic's, not the Responses API's)."""
CONVERSING: tuple[Client, ...] = ("vercel", "vercel-responses")
"""The clients that hold a conversation of several ``turns`` (the Vercel ``ai`` SDK's)."""

# run.mjs uses the global fetch and ReadableStream iteration (node 18+); the pinned
# openai-node declares node >= 22 but runs on 20, where it is tested.
MIN_NODE = 20

_FILES = ("package.json", "package-lock.json")
_INSTALLED = ".herdless-installed"  # written last: a folder without it is an interrupted install


class JsClientsError(RuntimeError):
    """``npm ci`` or ``node run.mjs`` failed or ran past its time; the message has their output."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """What ``run.mjs`` runs: ``calls`` chat completions (Anthropic's: messages; ``responses``:
    responses, ``max_tokens`` sent as ``max_output_tokens``), at most
    ``concurrency`` at once.

    Args:
        client: which client sends them, with its default retry settings.
        base_url: the server's root (``http://127.0.0.1:PORT``); ``/v1`` is added.
        api_key: sent as the bearer token (Anthropic's client: as ``x-api-key``).
        model: the model name in each request.
        calls: how many completions in all.
        turns: requests in each call's conversation: each next turn sends the earlier
            ones and their answers as the client gives them back (the Vercel ``ai`` SDK's
            ``response.messages``; its two clients only). ``attempts`` counts them all.
        concurrency: the most in flight at once.
        max_tokens: each call's ``max_tokens``, or ``(low, high)``: spread over that
            range in a fixed order, the same in every run.
        stream: stream the answers.
        usage: a stream asks for its usage (``stream_options.include_usage``; the Vercel
            AI SDK's ``includeUsage``, LangChain.js's ``streamUsage``; a Messages or
            Responses stream always carries it).
        start_spacing_ms: call ``i`` starts no earlier than ``i * start_spacing_ms`` after
            the first.
        start_at: the wall-clock time (``time.time()``) of the first call's start, so
            that runs in separate processes start together (default: at once).
        headers: extra request headers (a user header, ``X-Herdless-Priority`` ...).
        timeout_s: the longest one call may take, its retries and turns included.
        prompt: the user message; each call sends it numbered (``... (3)``): requests differ.
    """

    client: Client
    base_url: str
    api_key: str = field(repr=False)
    model: str
    calls: int = 1
    turns: int = 1
    concurrency: int = 1
    max_tokens: int | tuple[int, int] = 32
    stream: bool = False
    usage: bool = True
    start_spacing_ms: float = 0.0
    start_at: float | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 180.0
    prompt: str = "Tell me about the weather in one paragraph."

    def __post_init__(self) -> None:
        if self.client not in CLIENTS:
            raise ValueError(f"client must be one of {CLIENTS}, got {self.client!r}")
        for name in ("calls", "turns", "concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.turns > 1 and self.client not in CONVERSING:
            raise ValueError(f"turns > 1 is for the clients {CONVERSING}, not {self.client!r}")
        low, high = self._token_range()
        if not 1 <= low <= high:
            raise ValueError(f"max_tokens must be >= 1 (low <= high), got {self.max_tokens!r}")
        if self.start_spacing_ms < 0:
            raise ValueError(f"start_spacing_ms must be >= 0, got {self.start_spacing_ms!r}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s!r}")

    def _token_range(self) -> tuple[int, int]:
        spec = self.max_tokens
        return (spec, spec) if isinstance(spec, int) else spec

    def to_json(self) -> dict[str, Any]:
        """The scenario as ``run.mjs`` reads it on stdin."""
        low, high = self._token_range()
        return {
            "client": self.client,
            "base_url": self.base_url,
            "api_key": self.api_key,
            "model": self.model,
            "calls": self.calls,
            "turns": self.turns,
            "concurrency": self.concurrency,
            "max_tokens": low if low == high else [low, high],
            "stream": self.stream,
            "usage": self.usage,
            "start_spacing_ms": self.start_spacing_ms,
            "start_at": self.start_at,
            "headers": dict(self.headers),
            "timeout_s": self.timeout_s,
            "prompt": self.prompt,
        }

    def process_timeout(self) -> float:
        """A ceiling for the whole run, from now: the wait for ``start_at``, every wave of
        calls at its longest, and a margin."""
        waves = math.ceil(self.calls / self.concurrency)
        delay = 0.0 if self.start_at is None else max(0.0, self.start_at - time.time())
        spacing = self.calls * self.start_spacing_ms / 1000
        return delay + waves * self.timeout_s + spacing + 30.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """Token counts as the client reported them (``None`` where it did not)."""

    prompt_tokens: int | None
    completion_tokens: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class CallResult:
    """One call as the client saw it.

    Attributes:
        index: its place in the scenario (0-based).
        client: the client that made it.
        ok: the client returned an answer (for a stream: read to its end).
        status: the final HTTP status (0: no answer at all).
        attempts: HTTP requests the client sent for this call, its retries included.
        statuses: each attempt's status, in order (0: no answer).
        first_byte_s: seconds from the call's start to its first streamed text, or to
            the final answer's headers when not streaming; ``None`` when not ``ok``.
        total_s: seconds from the call's start to its end, successful or not.
        chunks: streamed pieces of text received (0 when not streaming).
        headers: the final answer's ``x-herdless-backend``, ``x-herdless-fallback-reason``,
            ``retry-after``, ``retry-after-ms`` and ``x-should-retry``, where present.
        model: the answer's ``model`` field.
        usage: the answer's token counts, where the client gave them.
        error: the client's error message when not ``ok``.
    """

    index: int
    client: Client
    ok: bool
    status: int
    attempts: int
    statuses: tuple[int, ...]
    first_byte_s: float | None
    total_s: float
    chunks: int
    headers: Mapping[str, str]
    model: str | None
    usage: Usage | None
    error: str | None

    @property
    def retried(self) -> bool:
        """The client sent more than one request for this call."""
        return self.attempts > 1

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CallResult:
        """One line of ``run.mjs``'s output."""
        usage = data.get("usage")
        return cls(
            index=int(data["index"]),
            client=data["client"],
            ok=bool(data["ok"]),
            status=int(data["status"]),
            attempts=int(data["attempts"]),
            statuses=tuple(int(s) for s in data["statuses"]),
            first_byte_s=data.get("first_byte_s"),
            total_s=float(data["total_s"]),
            chunks=int(data.get("chunks", 0)),
            headers={str(k): str(v) for k, v in (data.get("headers") or {}).items()},
            model=data.get("model"),
            usage=None
            if not usage
            else Usage(
                prompt_tokens=usage.get("prompt_tokens"),
                completion_tokens=usage.get("completion_tokens"),
            ),
            error=data.get("error"),
        )


def node_available() -> str | None:
    """``None`` when ``node`` (>= 20) and ``npm`` can run here, else why not."""
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            return f"{tool} is not on PATH"
    try:
        done = subprocess.run(
            ["node", "--version"], capture_output=True, text=True, timeout=30, check=True
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"node --version failed: {exc}"
    found = re.match(r"v(\d+)\.", done.stdout.strip())
    if found is None:
        return f"node --version printed {done.stdout.strip()!r}"
    if int(found.group(1)) < MIN_NODE:
        return f"node {done.stdout.strip()} is older than {MIN_NODE}"
    return None


def _sources() -> dict[str, bytes]:
    folder = importlib.resources.files("herdless.bench").joinpath("js")
    return {name: folder.joinpath(name).read_bytes() for name in (*_FILES, "run.mjs")}


def _write_if_changed(path: Path, content: bytes) -> None:
    if path.exists() and path.read_bytes() == content:
        return
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_bytes(content)
    os.replace(temporary, path)  # a node process reading the old file is not cut short


def install(cache_dir: Path, *, time_limit: float = 600.0) -> Path:
    """Install the pinned clients under ``cache_dir`` once; return the folder to run in.

    The folder is ``cache_dir/<hash of package.json and the lock>``: a new lock gets a
    new folder, and an unchanged one is reused without running npm. The install runs
    ``npm ci --no-audit --no-fund`` in a staging folder that is renamed into place
    when it succeeded, so an interrupted install is never taken for a finished one.
    ``run.mjs`` is copied in on every call (it is not part of the hash).

    Raises:
        JsClientsError: ``npm ci`` failed or ran past ``time_limit`` seconds.
    """
    sources = _sources()
    digest = hashlib.sha256(sources["package.json"] + b"\0" + sources["package-lock.json"])
    target = Path(cache_dir) / digest.hexdigest()[:16]
    if not (target / _INSTALLED).exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        staging.chmod(0o755)  # mkdtemp's 0700 would keep other users from running it
        try:
            for name in _FILES:
                (staging / name).write_bytes(sources[name])
            _npm_ci(staging, time_limit)
            (staging / _INSTALLED).write_text("npm ci done\n")
            if target.exists() and not (target / _INSTALLED).exists():
                shutil.rmtree(target)  # not one this function made: it writes the mark first
            with contextlib.suppress(OSError):  # another process finished first: keep its
                staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    _write_if_changed(target / "run.mjs", sources["run.mjs"])
    return target


def _npm_ci(folder: Path, timeout: float) -> None:
    command = ["npm", "ci", "--no-audit", "--no-fund"]
    try:
        done = subprocess.run(
            command, cwd=folder, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise JsClientsError(f"{' '.join(command)} ran past {timeout} s in {folder}") from exc
    if done.returncode != 0:
        output = (done.stdout + done.stderr)[-4000:]
        raise JsClientsError(f"{' '.join(command)} failed ({done.returncode}):\n{output}")


def _parse(scenario: Scenario, code: int | None, stdout: str, stderr: str) -> list[CallResult]:
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    results = [CallResult.from_json(line) for line in lines if not line.get("summary")]
    if code != 0 or len(results) != scenario.calls:
        raise JsClientsError(
            f"run.mjs ({scenario.client}) exited {code} with {len(results)} of "
            f"{scenario.calls} calls:\n{stderr[-4000:]}"
        )
    return sorted(results, key=lambda result: result.index)


def run_clients(
    scenario: Scenario, *, directory: Path, time_limit: float | None = None
) -> list[CallResult]:
    """Run ``scenario`` with ``node run.mjs`` in ``directory`` (from :func:`install`).

    Returns one result per call, in call order. ``time_limit`` (seconds) bounds the
    whole run (default: :meth:`Scenario.process_timeout`); the process is killed past it.

    Raises:
        JsClientsError: node failed, did not report every call, or ran past ``time_limit``.
    """
    limit = scenario.process_timeout() if time_limit is None else time_limit
    try:
        done = subprocess.run(
            ["node", "run.mjs"],
            cwd=directory,
            input=json.dumps(scenario.to_json()),
            capture_output=True,
            text=True,
            timeout=limit,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise JsClientsError(f"run.mjs ({scenario.client}) ran past {limit} s") from exc
    return _parse(scenario, done.returncode, done.stdout, done.stderr)


async def run_clients_async(
    scenario: Scenario, *, directory: Path, time_limit: float | None = None
) -> list[CallResult]:
    """:func:`run_clients` without blocking the loop: several clients can run at once
    (``asyncio.gather``) against one gateway."""
    limit = scenario.process_timeout() if time_limit is None else time_limit
    process = await asyncio.create_subprocess_exec(
        "node",
        "run.mjs",
        cwd=directory,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    payload = json.dumps(scenario.to_json()).encode()
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(payload), limit)
    except TimeoutError as exc:
        process.kill()
        await process.wait()
        raise JsClientsError(f"run.mjs ({scenario.client}) ran past {limit} s") from exc
    finally:
        if process.returncode is None:  # cancelled: never leave node running
            process.kill()
            await process.wait()
    return _parse(scenario, process.returncode, stdout.decode(), stderr.decode())
