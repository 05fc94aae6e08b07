"""Maintenance benchmarks (issue 26): a model swap, a reload under load, sleep and wake.

``python -m herdless.bench.maintenance [--window 20] [--out DIR]`` runs, on real processes
on 127.0.0.1 (an emulated GPU, the gateway, an emulated hosted model):

* **swap**: the GPU restarted for a model swap taking ``--window`` seconds under a steady
  load, once with ``herdless maintain`` and once by today's manual runbook (drain with no
  announced window, poll until idle, restart, poll until loaded, resume), in the same
  run. Clients: herdless ``AsyncClient`` s with the hosted fallback (they may spill), a
  front-end key whose policy spills (single attempts, never retried), and a front-end key
  that may not spill and holds 60 s (single attempts). Reported per arm and client: the
  requests and the failed ones, and the longest wait of a request the gateway held,
  against the window's actual length (drain to resume);
* **reload**: ``max_queue`` changed in the settings file by ``SIGHUP`` ten times under
  load: failed requests and dropped connections;
* **sleep**: the GPU put to sleep after 1 s idle, woken by a streamed request, five
  times: its first byte against the wake time.

It prints a Markdown table of each and writes ``maintenance.json`` into ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx

import herdless
from herdless.gateway.maintain import MaintainSettings, maintain
from herdless.launch.servers import ServerProcess, emulator_process, free_port, gateway_process

__all__ = ["main"]

TOKEN = "bench-admin"
_KEYS = """
[keys.apps]
key = "sk-apps"

[keys.spill]
key = "sk-spill"
fallback = true
hold = 2

[keys.patient]
key = "sk-patient"
hold = 60
"""
_MESSAGES = [{"role": "user", "content": "hello there, how are you"}]
_BODY = {"messages": _MESSAGES, "max_tokens": 16}


def _gpu(port: int, delay: float = 0.0, *, wake: float = 0.5) -> ServerProcess:
    argv = ["emulate", "--speed", "20", "--max-num-seqs", "16", "--model", "gpu"]
    argv += ["--startup-delay", str(delay), "--wake-time", str(wake), "--log-level", "warning"]
    return ServerProcess(argv, port=port, ready_timeout=30 + delay)


class _Load:
    """Closed-loop clients of three kinds until stopped; what each got."""

    def __init__(self, gateway: str, hosted: str, *, per_kind: int = 4) -> None:
        self.gateway, self.hosted, self.per_kind = gateway, hosted, per_kind
        self.sent: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self.spilled: Counter[str] = Counter()
        self.waits: list[tuple[float, float]] = []  # (sent at, seconds) of the patient ones
        self.stop = asyncio.Event()

    async def _single(self, http: httpx.AsyncClient, kind: str, key: str) -> None:
        while not self.stop.is_set():
            sent = time.monotonic()
            self.sent[kind] += 1
            try:
                answer = await http.post(
                    f"{self.gateway}/v1/chat/completions",
                    json=_BODY,
                    headers={"authorization": f"Bearer {key}"},
                    timeout=90,
                )
            except httpx.HTTPError:
                self.failed[kind] += 1
                continue
            if answer.status_code != 200:
                self.failed[kind] += 1
            elif answer.headers.get("x-herdless-backend") == "hosted":
                self.spilled[kind] += 1
            if kind == "patient":
                self.waits.append((sent, time.monotonic() - sent))
            await asyncio.sleep(0.1)

    async def _sdk(self, http: httpx.AsyncClient) -> None:
        client = herdless.AsyncClient(
            primary=herdless.Backend(
                name="gpu", base_url=f"{self.gateway}/v1", model="gpu", api_key="sk-apps"
            ),
            fallback=herdless.Backend(
                name="hosted", base_url=f"{self.hosted}/v1", model="hosted", external=True
            ),
            deadline=20,
            env_file=None,
            http_client=http,
        )
        async with client:
            while not self.stop.is_set():
                self.sent["sdk"] += 1
                try:
                    answer = await client.chat(_MESSAGES, max_tokens=16)
                    if answer.backend == "hosted":
                        self.spilled["sdk"] += 1
                except herdless.HerdlessError:
                    self.failed["sdk"] += 1
                await asyncio.sleep(0.1)

    async def run(self) -> None:
        async with httpx.AsyncClient() as http:
            tasks = [self._sdk(http) for _ in range(self.per_kind)]
            tasks += [self._single(http, "spill", "sk-spill") for _ in range(self.per_kind)]
            tasks += [self._single(http, "patient", "sk-patient") for _ in range(self.per_kind)]
            await asyncio.gather(*tasks)


@contextmanager
def _stack(port: int) -> Iterator[tuple[ServerProcess, ServerProcess, list[ServerProcess]]]:
    """The hosted model, the gateway in front of the GPU's port, and the GPUs started."""
    with ExitStack() as stack:
        gpus = [_gpu(port).start()]
        stack.callback(lambda: [gpu.stop() for gpu in gpus])
        hosted = stack.enter_context(emulator_process(model="hosted", speed=20))
        keys = Path(stack.enter_context(_tempdir())) / "keys.toml"
        keys.write_text(_KEYS)
        gateway = stack.enter_context(
            gateway_process(
                upstream=f"http://127.0.0.1:{port}",
                key_policies=keys,
                fallback_url=f"{hosted.url}/v1",
                fallback_model="hosted",
                health_interval=0.25,
                env={"HERDLESS_GATEWAY_ADMIN_TOKEN": TOKEN},
            )
        )
        yield gateway, hosted, gpus


@contextmanager
def _tempdir() -> Iterator[str]:
    import tempfile

    with tempfile.TemporaryDirectory() as name:
        yield name


async def _swap_arm(arm: str, window: float) -> dict[str, Any]:
    port = free_port()
    with _stack(port) as (gateway, hosted, gpus):
        load = _Load(gateway.url, hosted.url)
        running = asyncio.create_task(load.run())
        await asyncio.sleep(3)  # steady state first
        delay = max(0.0, window - 2.5)  # the restart's load; the rest is the process start

        def restart(argv: object = None) -> int:
            gpus[-1].stop()
            gpus.append(_gpu(port, delay).start(wait=False))
            return 0

        began = time.monotonic()
        if arm == "maintain":
            settings = MaintainSettings(
                gateway=gateway.url,  # type: ignore[arg-type]
                upstream=f"http://127.0.0.1:{port}",  # type: ignore[arg-type]
                expect=window,
                admin_token=TOKEN,  # type: ignore[arg-type]
            )
            report = await asyncio.to_thread(
                maintain, settings, ["restart"], say=lambda line: None, run=restart
            )
            length = report.window
        else:
            length = await asyncio.to_thread(_manual, gateway.url, port, restart)
        end = began + length
        await asyncio.sleep(3)
        load.stop.set()
        await running
    held = [wait for sent, wait in load.waits if sent < end and sent + wait > began]
    return {
        "arm": arm,
        "window_s": round(length, 2),
        "sent": dict(load.sent),
        "failed": dict(load.failed),
        "spilled": dict(load.spilled),
        "longest_held_s": round(max(held, default=0.0), 2),
    }


def _manual(gateway: str, port: int, restart: Any) -> float:
    """Today's six manual steps, as docs/operations.md had them."""
    admin = {"authorization": f"Bearer {TOKEN}"}
    start = time.monotonic()
    httpx.post(f"{gateway}/admin/drain", headers=admin).raise_for_status()
    while httpx.get(f"{gateway}/readyz").json()["inflight"] > 0:
        time.sleep(0.25)
    restart()
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    httpx.post(f"{gateway}/admin/resume", headers=admin).raise_for_status()
    return time.monotonic() - start


async def _reload() -> dict[str, Any]:
    port = free_port()
    with ExitStack() as stack:
        gpu = stack.enter_context(_gpu(port))
        folder = Path(stack.enter_context(_tempdir()))
        config = folder / "gateway.toml"
        config.write_text("max_queue = 64\n")
        gateway = stack.enter_context(gateway_process(upstream=gpu.url, config=config))
        assert gateway.process is not None
        sent = failed = dropped = 0
        stop = asyncio.Event()

        async def client() -> None:
            nonlocal sent, failed, dropped
            async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
                while not stop.is_set():
                    sent += 1
                    try:
                        answer = await http.post("/v1/chat/completions", json=_BODY)
                    except httpx.HTTPError:
                        dropped += 1
                        continue
                    failed += answer.status_code != 200

        tasks = [asyncio.create_task(client()) for _ in range(8)]
        for n in range(10):
            await asyncio.sleep(1.0)
            config.write_text(f"max_queue = {128 if n % 2 == 0 else 64}\n")
            gateway.process.send_signal(signal.SIGHUP)
        await asyncio.sleep(1.0)
        stop.set()
        await asyncio.gather(*tasks)
        reloads = gateway.log_path.read_text().count(" reloaded ")
    return {"reloads": reloads, "sent": sent, "failed": failed, "dropped_connections": dropped}


def _sleep(wake: float = 1.0, rounds: int = 5) -> dict[str, Any]:
    port = free_port()
    firsts = []
    with (
        _gpu(port, wake=wake) as gpu,
        gateway_process(upstream=gpu.url, upstream_sleep=1) as gateway,
    ):
        body = {**_BODY, "stream": True}
        for _ in range(rounds):
            while httpx.get(f"{gpu.url}/_emulator/sleep").json()["level"] == 0:
                time.sleep(0.05)
            start = time.monotonic()
            with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", json=body) as answer:
                chunks = answer.iter_bytes()
                next(chunks)
                firsts.append(time.monotonic() - start)
                for _chunk in chunks:
                    pass
        reached = httpx.get(f"{gpu.url}/_emulator/sleep").json()["reached_asleep"]
    over = [first - wake for first in firsts]
    return {
        "wake_s": wake,
        "first_byte_s": [round(f, 3) for f in firsts],
        "over_wake_median_s": round(statistics.median(over), 3),
        "over_wake_max_s": round(max(over), 3),
        "reached_asleep": reached,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the three benchmarks; print their tables; write maintenance.json."""
    parser = argparse.ArgumentParser(prog="python -m herdless.bench.maintenance")
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parts = ("swap", "reload", "sleep")
    parser.add_argument("parts", nargs="*", choices=[*parts, []], default=list(parts))
    args = parser.parse_args(argv)
    swap: list[dict[str, Any]] = []
    if "swap" in args.parts:
        swap = [asyncio.run(_swap_arm(arm, args.window)) for arm in ("maintain", "manual")]
    reload = asyncio.run(_reload()) if "reload" in args.parts else None
    sleep = _sleep() if "sleep" in args.parts else None
    print("| arm | window (s) | longest held (s) | sdk | spill key | patient key |")
    print("|---|---|---|---|---|---|")
    for row in swap:
        cells = [
            f"{row['sent'].get(k, 0)} / {row['failed'].get(k, 0)} / {row['spilled'].get(k, 0)}"
            for k in ("sdk", "spill", "patient")
        ]
        head = f"| {row['arm']} | {row['window_s']} | {row['longest_held_s']} | "
        print(head + " | ".join(cells) + " |")
    print("(each client: sent / failed / spilled)")
    print()
    print(f"reload: {reload}")
    print(f"sleep: {sleep}")
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"swap": swap, "reload": reload, "sleep": sleep}
    (args.out / "maintenance.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":  # pragma: no cover -- a benchmark, run by hand
    sys.exit(main())
