"""What the SDK costs: CPU time per call of herdless against raw httpx, same requests.

``python -m herdless.bench.sdk_overhead [--calls N] [--rounds R]`` starts
:mod:`herdless.bench.canned` in its own process on 127.0.0.1 (a canned vLLM answer, whole
or as SSE, to every chat completion) and, in this process, runs each arm ``calls`` times
per round:

* ``httpx``: a raw ``httpx.Client`` posting the same JSON with the API key, as an app
  without herdless would, and decoding the answer (the content of the first choice);
* ``herdless``: ``herdless.Client.chat()`` against the same server, default policies
  (its attempt headers included: they are part of what it costs);

and the same two with streaming (raw: ``iter_lines`` + ``json.loads`` per event), and
with ``httpx.AsyncClient`` / ``herdless.AsyncClient``. The arms take turns in blocks of
``_BLOCK`` calls, and which goes first alternates from turn to turn, so that a
neighbour that slows the machine for a while slows both alike; the figure is the median
over rounds of ``cpu(herdless) / cpu(httpx)``, where ``cpu`` is this process's CPU time
(``time.process_time``) summed over the round's calls: the server's work is in another
process and does not count. Target: at most 1.10x.

Each block starts on an empty young generation (an untimed full collection), so each arm
pays for the collector runs its own allocations trigger, and the figures count them.

A second figure does not depend on the machine's speed: the Python bytecodes one warm
call of each arm executes (``sys.settrace`` opcode events, every frame: httpx,
httpcore, h11, asyncio and herdless), and their ratio. A call now and then runs a few
hundred more than the others (a path that depends on the time that passed, in httpx as
in herdless), so the figure is the median over ``_COUNTED`` calls: what most calls run.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing import Self

import httpx

import herdless
from herdless.bench import canned
from herdless.bench.stats import median, ratio
from herdless.launch.servers import free_port

__all__ = ["ArmResult", "main", "run"]

_MESSAGES = [{"role": "user", "content": "Say hello in five words."}]


@dataclass(frozen=True, slots=True, kw_only=True)
class ArmResult:
    """One comparison: CPU microseconds per call of each arm, and their ratio."""

    name: str
    httpx_us: float
    herdless_us: float
    ratio: float
    rounds: int
    calls: int
    httpx_bytecodes: int = 0
    """Python bytecodes one warm raw httpx call executes."""
    herdless_bytecodes: int = 0
    """Python bytecodes one warm herdless call executes."""
    httpx_sweeps: float = 0.0
    """Runs of the garbage collector per 1,000 raw httpx calls (its blocks' own)."""
    herdless_sweeps: float = 0.0
    """Runs of the garbage collector per 1,000 herdless calls."""

    @property
    def bytecode_ratio(self) -> float:
        """``herdless_bytecodes / httpx_bytecodes`` (0 when not counted)."""
        return self.herdless_bytecodes / self.httpx_bytecodes if self.httpx_bytecodes else 0.0


def _raw_body(stream: bool) -> dict[str, Any]:
    # A dict, encoded by httpx on every call (json=), as a raw httpx user would send it.
    body: dict[str, Any] = {"model": "bench", "messages": _MESSAGES}
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    return body


_HEADERS = {"authorization": "Bearer sk-bench"}


# Calls an arm makes in a row. Each block starts on an empty young generation (a full
# collection before it, not timed), so the collector runs a block pays for are the ones
# its own allocations trigger. Arms of one call each shared them unfairly: the run that
# clears both arms' garbage falls to whichever call holds more objects at once when the
# count crosses the threshold (herdless's, in 217 of 251 runs of one measurement).
_BLOCK = 50


@dataclass(slots=True)
class _Round:
    """What one round measured: CPU seconds and collector runs, ``[httpx, herdless]``."""

    spent: list[float] = field(default_factory=lambda: [0.0, 0.0])
    sweeps: list[int] = field(default_factory=lambda: [0, 0])

    @contextmanager
    def block(self, arm: int) -> Iterator[None]:
        """Time one block of ``arm``'s calls, from an empty young generation."""
        gc.collect()
        sweeps, start = _sweeps(), time.process_time()
        yield
        self.spent[arm] += time.process_time() - start
        self.sweeps[arm] += _sweeps() - sweeps


def _blocks(calls: int) -> Iterator[tuple[int, int]]:
    """``(arm, calls)`` of each block of a round: the arms take turns, and which goes first
    alternates, so that a neighbour that slows the machine for a while slows both alike."""
    for turn, start in enumerate(range(0, calls, _BLOCK)):
        for arm in (0, 1) if turn % 2 == 0 else (1, 0):
            yield arm, min(_BLOCK, calls - start)


def _sweeps() -> int:
    return sum(generation["collections"] for generation in gc.get_stats())


def _round(raw: Callable[[], object], sdk: Callable[[], object], calls: int) -> _Round:
    """``calls`` calls of each arm, in blocks (see ``_BLOCK``)."""
    measured = _Round()
    for arm, size in _blocks(calls):
        call = sdk if arm else raw
        with measured.block(arm):
            for _ in range(size):
                call()
    return measured


async def _around(
    raw: Callable[[], Awaitable[object]], sdk: Callable[[], Awaitable[object]], calls: int
) -> _Round:
    """``_round`` for coroutines."""
    measured = _Round()
    for arm, size in _blocks(calls):
        call = sdk if arm else raw
        with measured.block(arm):
            for _ in range(size):
                await call()
    return measured


class _Bytecodes:
    """Counts the bytecodes this thread executes in each ``with`` block (``sys.settrace``)."""

    def __init__(self) -> None:
        self.counts: list[int] = []

    @property
    def typical(self) -> int:
        """The median count: what most blocks ran."""
        return int(median(self.counts))

    def _trace(self, frame: FrameType, event: str, arg: object) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            self.counts[-1] += 1
        return self._trace

    def __enter__(self) -> Self:
        self.counts.append(0)
        self._previous = sys.gettrace()  # a coverage tracer, say: put back after
        sys.settrace(self._trace)
        return self

    def __exit__(self, *exc_info: object) -> None:
        sys.settrace(self._previous)


# Calls counted per arm; the figure is their median (odd: one of the counts).
_COUNTED = 9


def _bytecodes(call: Callable[[], object]) -> int:
    counter = _Bytecodes()
    for _ in range(_COUNTED):
        with counter:
            call()
    return counter.typical


async def _abytecodes(call: Callable[[], Awaitable[object]]) -> int:
    counter = _Bytecodes()
    for _ in range(_COUNTED):
        with counter:
            await call()
    return counter.typical


def _sync_arms(
    url: str, *, stream: bool, stack: ExitStack
) -> tuple[Callable[[], object], Callable[[], object]]:
    raw = stack.enter_context(httpx.Client())
    client = stack.enter_context(
        herdless.Client(
            primary=herdless.Backend(name="primary", base_url=url, api_key="sk-bench"),
            model="bench",
        )
    )
    body = _raw_body(stream)

    def raw_call() -> object:
        if not stream:
            answer = raw.post(f"{url}/chat/completions", json=body, headers=_HEADERS)
            return answer.json()["choices"][0]["message"]["content"]
        with raw.stream("POST", f"{url}/chat/completions", json=body, headers=_HEADERS) as r:
            return [
                json.loads(line[6:])
                for line in r.iter_lines()
                if line.startswith("data: ") and line != "data: [DONE]"
            ]

    def herdless_call() -> object:
        if not stream:
            return client.chat(_MESSAGES).content
        with client.chat(_MESSAGES, stream=True) as chunks:
            return list(chunks)

    return raw_call, herdless_call


def _result(name: str, rounds: list[_Round], calls: int, bytecodes: tuple[int, int]) -> ArmResult:
    def per_call(arm: int) -> float:
        return median([r.spent[arm] for r in rounds]) / calls * 1e6

    def sweeps(arm: int) -> float:
        return sum(r.sweeps[arm] for r in rounds) / (calls * len(rounds)) * 1000

    return ArmResult(
        name=name,
        httpx_us=per_call(0),
        herdless_us=per_call(1),
        ratio=median([ratio(r.spent[1], r.spent[0]) for r in rounds]),
        rounds=len(rounds),
        calls=calls,
        httpx_bytecodes=bytecodes[0],
        herdless_bytecodes=bytecodes[1],
        httpx_sweeps=sweeps(0),
        herdless_sweeps=sweeps(1),
    )


def _sync_result(url: str, *, stream: bool, rounds: int, calls: int) -> ArmResult:
    with ExitStack() as stack:
        raw, sdk = _sync_arms(url, stream=stream, stack=stack)
        _round(raw, sdk, 20)  # warm both: connections, imports, caches
        spent = [_round(raw, sdk, calls) for _ in range(rounds)]
        bytecodes = (_bytecodes(raw), _bytecodes(sdk))
    return _result("sync stream" if stream else "sync", spent, calls, bytecodes)


async def _async_result(url: str, rounds: int, calls: int) -> ArmResult:
    raw_http = httpx.AsyncClient()
    body = _raw_body(False)
    async with (
        herdless.AsyncClient(
            primary=herdless.Backend(name="primary", base_url=url, api_key="sk-bench"),
            model="bench",
        ) as client,
        raw_http,
    ):

        async def raw() -> object:
            answer = await raw_http.post(f"{url}/chat/completions", json=body, headers=_HEADERS)
            return answer.json()["choices"][0]["message"]["content"]

        async def sdk() -> object:
            return (await client.chat(_MESSAGES)).content

        await _around(raw, sdk, 20)
        spent = [await _around(raw, sdk, calls) for _ in range(rounds)]
        bytecodes = (await _abytecodes(raw), await _abytecodes(sdk))
    return _result("async", spent, calls, bytecodes)


def run(*, calls: int = 300, rounds: int = 7) -> list[ArmResult]:
    """Start the tiny server, measure every arm, stop the server.

    Args:
        calls: calls per arm per round.
        rounds: interleaved rounds; the figures are medians over them.
    """
    if calls < 1 or rounds < 1:
        raise ValueError("calls and rounds must be >= 1")
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "herdless.bench.canned", str(port)],
        stdin=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        canned.wait_ready(url, server)
        return [
            _sync_result(url, stream=False, rounds=rounds, calls=calls),
            _sync_result(url, stream=True, rounds=rounds, calls=calls),
            asyncio.run(_async_result(url, rounds, calls)),
        ]
    finally:
        server.terminate()
        server.wait(10)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m herdless.bench.sdk_overhead``: print a table (or JSON) and exit 0."""
    parser = argparse.ArgumentParser(prog="python -m herdless.bench.sdk_overhead")
    parser.add_argument("--calls", type=int, default=300, help="calls per arm per round")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    results = run(calls=args.calls, rounds=args.rounds)
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=2))
        return 0
    print(
        f"{'arm':<12} {'httpx us/call':>14} {'herdless us/call':>17} {'ratio':>7}"
        f" {'httpx bytecodes':>16} {'herdless bytecodes':>19} {'ratio':>7}"
        f" {'GC runs / 1k: httpx':>20} {'herdless':>9}"
    )
    for r in results:
        print(
            f"{r.name:<12} {r.httpx_us:>14.1f} {r.herdless_us:>17.1f} {r.ratio:>6.2f}x"
            f" {r.httpx_bytecodes:>16,} {r.herdless_bytecodes:>19,} {r.bytecode_ratio:>6.3f}x"
            f" {r.httpx_sweeps:>20.1f} {r.herdless_sweeps:>9.1f}"
        )
    print(
        f"({results[0].rounds} rounds x {results[0].calls} calls per arm, in blocks of "
        f"{_BLOCK}; CPU time of this process; target <= 1.10x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
