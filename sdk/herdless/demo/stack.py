"""The demo's servers: the company GPU, gateway and hosted model, as child processes.

Started with the project's real-process harness (:mod:`herdless.launch.servers`):
each is ``python -m herdless ...`` on a free 127.0.0.1 port with its log in the
output folder, and is always stopped on exit (SIGTERM, then SIGKILL after a
grace period), also on Ctrl-C or an error, so the demo leaves no process behind.
The GPU is an emulator, or a real vLLM on CPU (:class:`herdless.launch.vllm.VllmServer`,
stopped by its process group the same way).
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from herdless.launch.servers import ServerProcess, emulator_process, flags
from herdless.launch.vllm import MODEL_NAME, VllmHome, VllmServer

__all__ = ["Stack", "running_stack"]

_GPU_MODEL = "company-llm"  # the emulated GPU's; a real vLLM serves MODEL_NAME


@dataclass(frozen=True, slots=True, kw_only=True)
class Stack:
    """Where the demo's servers listen (``http://127.0.0.1:PORT``)."""

    gpu: str
    gateway: str
    hosted: str
    admin_token: str
    app_key: str
    frontend_key: str
    gpu_model: str = _GPU_MODEL


@contextlib.contextmanager
def running_stack(
    *,
    speed: float,
    gpu_seqs: int,
    seed: int,
    drain_retry_after: float,
    logs: Path,
    vllm: VllmHome | None = None,
    fallback: bool = True,
    hold: float = 20.0,
) -> Iterator[Stack]:
    """Start the three servers, yield their URLs, stop them on exit.

    Args:
        speed: the emulators' time scale (answers ``speed`` times faster than real).
        gpu_seqs: sequences the GPU runs at once; the gateway admits as many.
        seed: the emulators' text seed.
        drain_retry_after: the gateway's Retry-After while draining (seconds).
        logs: folder for the servers' logs.
        vllm: a prepared vLLM (:func:`herdless.launch.vllm.prepare`) to serve as the
            GPU instead of an emulator; ``speed`` and ``seed`` then only apply to
            the hosted model.
        fallback: the gateway spills the chat front-end's requests to the hosted model
            where it cannot serve them within their hold.
        hold: seconds the chat front-end's requests may wait in the gateway.
    """
    logs.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(16)
    app_key, frontend_key = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
    policies = logs / "keys.toml"
    policies.write_text(_policies(app_key, frontend_key, fallback=fallback, hold=hold))
    policies.chmod(0o600)
    with contextlib.ExitStack() as stack:
        gpu: ServerProcess | VllmServer
        if vllm is None:
            gpu = stack.enter_context(
                emulator_process(
                    model=_GPU_MODEL,
                    max_num_seqs=gpu_seqs,
                    speed=speed,
                    seed=seed,
                    access_log=False,
                    log_level="warning",
                    log_path=logs / "gpu.log",
                )
            )
        else:
            gpu = VllmServer(vllm, extra_args=["--max-num-seqs", str(gpu_seqs)])
            gpu.log_path = logs / "gpu.log"  # with the other servers' logs
            stack.enter_context(gpu)  # returns once vLLM answers /health (minutes)
        hosted = stack.enter_context(
            emulator_process(
                model="hosted-llm",
                speed=speed,
                seed=seed,
                access_log=False,
                log_level="warning",
                log_path=logs / "hosted.log",
            )
        )
        # No sizing flag: the gateway sizes itself from the GPU's /metrics, as in production.
        options: dict[str, object] = {
            "key_policies": str(policies),
            "max_queue": gpu_seqs,
            "queue_timeout": 5,
            "drain_retry_after": drain_retry_after,
            "health_interval": 0.5,
            "access_log": False,
            "log_level": "warning",
        }
        if fallback:
            options |= {"fallback_url": f"{hosted.url}/v1", "fallback_model": "hosted-llm"}
        # Ready only once the gateway sees the GPU ready (/readyz), not merely alive.
        gateway = ServerProcess(
            ["serve", "--upstream", gpu.url, *flags(options)],
            ready_path="/readyz",
            log_path=logs / "gateway.log",
            env={"HERDLESS_GATEWAY_ADMIN_TOKEN": token},
        )
        stack.enter_context(gateway)
        yield Stack(
            gpu=gpu.url,
            gateway=gateway.url,
            hosted=hosted.url,
            admin_token=token,
            app_key=app_key,
            frontend_key=frontend_key,
            gpu_model=_GPU_MODEL if vllm is None else MODEL_NAME,
        )


def _policies(app_key: str, frontend_key: str, *, fallback: bool, hold: float) -> str:
    """The gateway's key policies: the apps' key (herdless clients, which fall back
    themselves) and the chat front-end's (it never retries: held, even where the queue is
    full, and spilled when ``fallback``)."""
    return (
        f'[keys.apps]\nkey = "{app_key}"\n\n'
        f'[keys.webui]\nkey = "{frontend_key}"\nfallback = {str(fallback).lower()}\n'
        f'hold = {hold:g}\nretries = false\nuser_header = "X-OpenWebUI-User-Id"\n'
    )
