"""The ``clients`` scenario: every employee's client, not only Python apps, through the gateway.

Real clients from npm (:mod:`herdless.bench.js_clients`: openai-node, the Vercel AI SDK
with its OpenAI-compatible provider, LangChain.js, each with its default retries) and
a client that sends each request once and never retries (``single``: what Open WebUI's
backend does), at once, against ``herdless serve --max-concurrency 8 --max-queue 16``
on an emulated GPU of 8 sequences, with an emulated hosted model at ``--speed 8``:

- ``overload``: 48 calls per client, 24 at once, ``max_tokens`` 32-64, the four clients
  at once (96 in flight against 8 running + 16 waiting); straight at a GPU emulated alike
  with no gateway (``vLLM alone``: it queues them all itself); on a gateway with no key policy
  (``flags``: each request as its client shows; Node's fetch shows it never retries),
  and on one where the single-attempt client's key holds 20 s and may spill (``spill``)
  or may not (``hold``), its key saying ``retries = true`` (a 429 at once, what every
  client got before), while the retrying clients' key takes the flags; both again with
  ``retries = false`` on the single-attempt client's key (a full queue keeps its
  requests waiting for their place);
  then ``spill`` with the default ``--max-queue`` (256); then the five at once, Claude
  Code's client (Anthropic's SDK, on ``/v1/messages``) beside the four, straight at vLLM
  alone and on the gateway with no key policy (``overload + Claude Code``: 120 in
  flight). Per client: errors, p95,
  attempts per request, calls that reached the hosted model, and the spilled calls'
  first byte against the hosted model's own p50 (the same client straight at it, in the
  same run);
- ``window 20 s``: a model swap of 20 s, 10 calls per client spread over it: on vLLM
  alone (its port closed for the swap, nothing announced), then announced at the gateway
  (``/admin/drain?expect=20``, resumed after 20 s) for keys that may spill, then keys
  that may not (hold 10 s: the retrying clients are told the window's end);
- ``window 90 s``: openai-node (2 retries) on a key that may not spill, hold 120 s;
- ``sdk``: herdless's own client through the spilling gateway under the overload: the
  gateway spills none of its requests (they carry ``X-Herdless-Deadline-Ms``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from herdless._percentiles import percentile
from herdless.bench.clients_report import figures, table
from herdless.bench.js_clients import (
    CHAT_CLIENTS,
    CallResult,
    Client,
    Scenario,
    install,
    node_available,
    run_clients_async,
)
from herdless.bench.report import ScenarioResult, knobs
from herdless.bench.runner import Progress
from herdless.launch.servers import ServerProcess, emulator_process, gateway_process

__all__ = ["ClientsParams", "run"]

_ADMIN = "bench-admin"
_KEYS = {  # key -> (fallback, hold, retries); the retrying clients' key, "apps", the flags
    "spill": (True, 20.0, True),
    "hold": (False, 20.0, True),
    "wait": (False, 20.0, False),
    "spill-wait": (True, 20.0, False),
    "hold10": (False, 10.0, True),
    "long": (False, 120.0, True),
}
_MODEL = "company-llm"
_WITH_CLAUDE: tuple[Client, ...] = (*CHAT_CLIENTS, "anthropic")


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientsParams:
    """Sizes of the scenario.

    Attributes:
        calls: calls per client in the overload (``concurrency`` at once).
        concurrency: calls in flight per client.
        window: seconds of the short maintenance window; ``long_window`` the long one.
        window_calls: calls per client spread over the short window.
        cache: where the npm clients are installed.
    """

    calls: int = 48
    concurrency: int = 24
    window: float = 20.0
    long_window: float = 90.0
    window_calls: int = 10
    cache: Path = Path(".cache/js-clients")


@dataclass(slots=True)
class _Stack:
    gpu: ServerProcess
    alone: ServerProcess  # a GPU emulated alike, no gateway in front: the clients at vLLM
    hosted: ServerProcess
    flags: ServerProcess
    keyed: ServerProcess
    roomy: ServerProcess


@contextlib.contextmanager
def _stack(folder: Path) -> Iterator[_Stack]:
    policies = folder / "keys.toml"
    policies.write_text(
        "".join(
            f'[keys.{name}]\nkey = "{name}-key"\nfallback = {str(spill).lower()}\n'
            f"hold = {hold:g}\nretries = {str(retries).lower()}\nqueue_share = 1.0\n\n"
            for name, (spill, hold, retries) in _KEYS.items()
        )
        + '[keys.apps]\nkey = "apps-key"\n'
    )

    with (
        emulator_process(max_num_seqs=8, model=_MODEL, access_log=False) as gpu,
        emulator_process(max_num_seqs=8, model=_MODEL, access_log=False) as alone,
        emulator_process(speed=8, model="hosted-llm", access_log=False) as hosted,
        gateway_process(
            upstream=gpu.url, max_concurrency=8, max_queue=16, access_log=False
        ) as flags,
        gateway_process(**_keyed(policies, gpu, hosted), max_queue=16) as keyed,
        gateway_process(**_keyed(policies, gpu, hosted)) as roomy,  # the default --max-queue
    ):
        yield _Stack(gpu=gpu, alone=alone, hosted=hosted, flags=flags, keyed=keyed, roomy=roomy)


def _keyed(policies: Path, gpu: ServerProcess, hosted: ServerProcess) -> dict[str, Any]:
    """The options of a gateway with the key policies and the hosted fallback."""
    return {
        "upstream": gpu.url,
        "key_policies": str(policies),
        "fallback_url": f"{hosted.url}/v1",
        "fallback_model": "hosted-llm",
        "env": {"HERDLESS_GATEWAY_ADMIN_TOKEN": _ADMIN},
        "max_concurrency": 8,
        "access_log": False,
    }


def _scenario(client: str, url: str, key: str, **more: object) -> Scenario:
    options: dict[str, object] = {"calls": 48, "concurrency": 24, "max_tokens": (32, 64)}
    options |= {"model": _MODEL} | more
    return Scenario(client=client, base_url=url, api_key=key, **options)  # type: ignore[arg-type]


async def _all(scenarios: Sequence[Scenario], directory: Path) -> list[list[CallResult]]:
    return list(
        await asyncio.gather(*(run_clients_async(s, directory=directory) for s in scenarios))
    )


async def _window(
    stack: _Stack,
    directory: Path,
    key: str | None,
    clients: Sequence[str],
    window: float,
    calls: int,
) -> list[list[CallResult]]:
    """Swap the model for ``window`` seconds, sending ``calls`` per client spread over it;
    returns each client's results. With a ``key``, the window is announced at the keyed
    gateway (drained, then resumed at its end); with none, the same swap on vLLM alone
    (no gateway: its port closes for the window, with no word to anyone)."""
    url, api_key = (stack.keyed.url, f"{key}-key") if key else (stack.alone.url, "any-key")
    spacing = 1000 * window / calls
    scenarios = [
        _scenario(c, url, api_key, calls=calls, concurrency=calls, start_spacing_ms=spacing)
        for c in clients
    ]
    async with httpx.AsyncClient(base_url=url, timeout=10) as control:
        if key is None:
            swap = {"maintenance_for": window}  # it serves again when the window ends
            (await control.post("/_emulator/faults", json=swap)).raise_for_status()
            return await _all(scenarios, directory)
        auth = {"authorization": f"Bearer {_ADMIN}"}
        (await control.post(f"/admin/drain?expect={window:g}", headers=auth)).raise_for_status()
        started = time.monotonic()
        running = asyncio.ensure_future(_all(scenarios, directory))
        await asyncio.sleep(max(0.0, window - (time.monotonic() - started)))
        (await control.post("/admin/resume", headers=auth)).raise_for_status()
        return await running


async def _sdk(stack: _Stack) -> dict[str, float]:
    """herdless's client (with a hosted fallback of its own) through the spilling key."""
    import herdless

    url = stack.keyed.url
    before = await _spills(url)
    async with herdless.AsyncClient(
        primary=herdless.Backend(
            name="gpu", base_url=f"{url}/v1", model=_MODEL, api_key="spill-key"
        ),
        fallback=herdless.Backend(
            name="hosted", base_url=f"{stack.hosted.url}/v1", model="hosted-llm", external=True
        ),
        deadline=60,
        env_file=None,
    ) as client:
        results = await asyncio.gather(
            *(
                client.chat([{"role": "user", "content": "hello"}], max_tokens=48)
                for _ in range(48)
            ),
            return_exceptions=True,
        )
    spilled = await _spills(url) - before
    return {"errors": sum(isinstance(r, BaseException) for r in results), "gateway_spills": spilled}


async def _spills(url: str) -> float:
    """The gateway's spills of the ``spill`` key so far."""
    async with httpx.AsyncClient(timeout=10) as http:
        metrics = (await http.get(f"{url}/metrics")).text
    prefix = 'herdless_gateway_spills_total{key="spill"'
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith(prefix)
    )


def run(params: ClientsParams, progress: Progress) -> list[ScenarioResult]:
    """Run the scenario once (every client at once per case); [] where node is missing."""
    missing = node_available()
    if missing is not None:
        print(f"clients: skipped: {missing}")
        return []
    directory = install(params.cache)
    with (
        tempfile.TemporaryDirectory(prefix="herdless-clients-") as folder,
        _stack(Path(folder)) as stack,
    ):
        return asyncio.run(_measure(params, stack, directory, progress))


async def _measure(
    params: ClientsParams, stack: _Stack, directory: Path, progress: Progress
) -> list[ScenarioResult]:
    rows: list[dict[str, object]] = []
    runs: dict[str, list[dict[str, float]]] = {}
    # The hosted model's own latency, per client, straight at it: the spill's yardstick.
    straight = await _all(
        [_scenario(c, stack.hosted.url, "x", model="hosted-llm") for c in CHAT_CLIENTS], directory
    )
    hosted_p50: dict[str, float] = {
        c: percentile([r.first_byte_s or r.total_s for r in rs], 50)
        for c, rs in zip(CHAT_CLIENTS, straight, strict=True)
    }
    hosted_p95: dict[str, float] = {
        c: percentile([r.total_s for r in rs], 95)
        for c, rs in zip(CHAT_CLIENTS, straight, strict=True)
    }
    progress("hosted model alone")
    # The four at once (96 in flight against 8 running + 16 waiting); the retrying clients
    # on a key of the flags ("apps"), the single-attempt one on the case's key. Then the
    # five, Claude Code's client (Anthropic's SDK, on /v1/messages) beside them.
    cases = [
        ("overload, vLLM alone", stack.alone.url, "any-key", CHAT_CLIENTS),
        ("overload, flags", stack.flags.url, "any-key", CHAT_CLIENTS),
        ("overload, spill", stack.keyed.url, "spill-key", CHAT_CLIENTS),
        ("overload, hold", stack.keyed.url, "hold-key", CHAT_CLIENTS),
        ("overload, hold, retries = false", stack.keyed.url, "wait-key", CHAT_CLIENTS),
        ("overload, spill, retries = false", stack.keyed.url, "spill-wait-key", CHAT_CLIENTS),
        ("overload, spill, queue 256", stack.roomy.url, "spill-key", CHAT_CLIENTS),
        ("overload + Claude Code, vLLM alone", stack.alone.url, "any-key", _WITH_CLAUDE),
        ("overload + Claude Code, flags", stack.flags.url, "any-key", _WITH_CLAUDE),
    ]
    for case, url, key, clients in cases:
        keys = {c: (key if c == "single" or key == "any-key" else "apps-key") for c in clients}
        started = time.monotonic()
        results = await _all([_scenario(c, url, keys[c]) for c in clients], directory)
        wall = time.monotonic() - started
        for client, result in zip(clients, results, strict=True):
            row = figures(result, hosted_p50.get(client, math.nan))
            rows.append({"arm": f"{case}: {client}", **row})
            runs[f"{case}: {client}"] = [row]
        # Every call of the case: where the GPU answered them all (the same work in each
        # case), the wall time says what the GPU got through.
        everyone = figures([r for result in results for r in result]) | {"wall_s": wall}
        rows.append({"arm": f"{case}: all", **everyone})
        runs[f"{case}: all"] = [everyone]
        progress(case)
    windows: tuple[tuple[str, str | None], ...] = (
        ("window 20 s, vLLM alone", None),
        ("window 20 s, spill", "spill"),
        ("window 20 s, hold 10 s", "hold10"),
    )
    for case, window_key in windows:
        results = await _window(
            stack, directory, window_key, CHAT_CLIENTS, params.window, params.window_calls
        )
        for client, result in zip(CHAT_CLIENTS, results, strict=True):
            row = figures(result, hosted_p50[client]) | {"hosted_p95_s": hosted_p95[client]}
            rows.append({"arm": f"{case}: {client}", **row})
            runs[f"{case}: {client}"] = [row]
        progress(case)
    [long] = await _window(
        stack, directory, "long", ["openai"], params.long_window, params.window_calls
    )
    rows.append({"arm": "window 90 s, hold 120 s: openai", **figures(long)})
    progress("window 90 s")
    sdk = await _sdk(stack)
    rows.append({"arm": "overload, spill key: herdless SDK", **sdk})
    progress("sdk")
    return [table(knobs(params, leave_out={"window_calls", "cache"}), rows, runs, hosted_p95)]
