"""The fault matrix: SDK -> gateway -> emulated vLLM, with an emulated hosted model behind.

Every fault is injected before, during and after a small burst of calls (a third of
them ``allow_fallback=False``, half of them streamed). For each cell: every call ends
in a result or a typed ``HerdlessError`` before its deadline (none hangs, none is
lost), no ``allow_fallback=False`` attempt reaches the external backend, the gateway
never answers a 500 of its own nor writes a traceback, frees every slot, and its
memory stays bounded. ``HERDLESS_WRITE_FAULT_TABLE=1`` writes the table of outcomes
to ``docs/reliability-matrix.md``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("starlette")

from tests.faults.burst import DEADLINE, SLACK, Clients, Tally, burst
from tests.faults.stack import Stack, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.server]

TABLE = Path(__file__).resolve().parents[2] / "docs" / "reliability-matrix.md"
RSS_LIMIT_MB = 400.0


@dataclass(frozen=True)
class Fault:
    """One fault: how to inject it, and whether the fallback can serve every call through it."""

    name: str
    inject: Callable[[Stack], None]
    served: bool  # allow_fallback=True calls must all get a result (the hosted model is up)


def _later(action: Callable[[], None]) -> None:
    """Run ``action`` in a thread (a restart takes a second; the burst goes on meanwhile)."""
    thread = threading.Thread(target=action, daemon=True)
    thread.start()
    _THREADS.append(thread)


_THREADS: list[threading.Thread] = []

FAULTS = [
    Fault("upstream hang", lambda s: s.faults(s.vllm, hang=True), served=True),
    Fault("refused connections", lambda s: s.faults(s.vllm, refuse_for=1.5), served=True),
    Fault(
        "crash and restart",
        lambda s: (s.faults(s.vllm, crash=True), _later(lambda: s.restart(s.vllm, after=1.0))),
        served=True,
    ),
    Fault("5xx burst", lambda s: s.faults(s.vllm, error_rate=1.0, error_status=500), served=True),
    Fault("slow responses", lambda s: s.faults(s.vllm, extra_latency=1.5), served=True),
    # A cut after the first chunks reached the caller cannot fall back: StreamInterrupted.
    Fault("stream cut after 2 chunks", lambda s: s.faults(s.vllm, cut_after=2), served=False),
    Fault("model-loading window", lambda s: s.faults(s.vllm, maintenance_for=1.5), served=True),
    Fault("gateway drain, then resume", lambda s: s.admin("drain"), served=True),
    Fault("gateway restart", lambda s: _later(lambda: s.restart(s.gateway)), served=True),
    Fault(
        "hosted model also failing",
        lambda s: (
            s.faults(s.vllm, error_rate=1.0, error_status=500),
            s.faults(s.hosted, error_rate=1.0, error_status=503),
        ),
        served=False,
    ),
    Fault(
        "both failing (primary hangs, hosted refuses)",
        lambda s: (s.faults(s.vllm, hang=True), s.faults(s.hosted, refuse_for=5.0)),
        served=False,
    ),
]
TIMINGS = ["before", "during", "after"]
ROWS: list[tuple[str, str, Tally, int, float, int]] = []


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    running = Stack(tmp_path_factory.mktemp("fault-matrix"))
    try:
        running.start()
        yield running
    finally:
        running.stop()
    if os.environ.get("HERDLESS_WRITE_FAULT_TABLE") == "1" and len(ROWS) == len(FAULTS) * 3:
        TABLE.write_text(render(ROWS))


@pytest.mark.parametrize("timing", TIMINGS)
@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
def test_fault(stack: Stack, fault: Fault, timing: str) -> None:
    stack.heal()
    clients = Clients(stack, seed=len(ROWS))
    tally = Tally()
    before_500s = stack.gateway_500s()
    tracebacks = stack.tracebacks()
    try:
        if timing == "before":
            fault.inject(stack)
            burst(clients, tally)
        elif timing == "during":
            burst(clients, tally, inject=lambda: fault.inject(stack))
        else:
            burst(clients, tally)
            fault.inject(stack)
            _join_restarts()
            stack.heal()  # the fault came and went: the next burst finds the stack recovered
            burst(clients, tally)
        _join_restarts()
        own_500s = max(0, stack.gateway_500s() - before_500s)
        rss = stack.gateway_rss_mb()
    finally:
        clients.close()
    new_tracebacks = stack.tracebacks() - tracebacks
    ROWS.append((fault.name, timing, tally, own_500s, rss, len(clients.strict_attempts_hosted())))

    assert tally.untyped == [], "calls ended in an exception that is not a HerdlessError"
    assert tally.hung == 0
    assert tally.late == 0, f"slowest call {tally.max_latency:.2f}s > {DEADLINE + SLACK}s"
    assert tally.calls == tally.results + tally.errors + tally.hung
    assert clients.strict_attempts_hosted() == [], "allow_fallback=False reached the hosted model"
    assert new_tracebacks == 0, stack.gateway.logs()[-3000:]
    if "5xx" not in fault.name and "hosted model also" not in fault.name:
        assert own_500s == 0  # injected upstream 500s are passed through, not made up
    assert rss < RSS_LIMIT_MB
    if timing == "after" or (fault.served and timing == "before"):
        # Recovered, or the fallback carries the load: every call that may fall back is served.
        free_failures = {k: n for k, n in tally.outcomes.items() if k not in ("gateway", "hosted")}
        assert tally.results >= tally.calls * 2 // 3 or not free_failures, tally.outcomes
    stack.heal()
    wait_for(lambda: stack.gateway_status()["inflight"] == 0, what="no slot held after the burst")


def _join_restarts() -> None:
    while _THREADS:
        _THREADS.pop().join(timeout=30.0)


def render(rows: list[tuple[str, str, Tally, int, float, int]]) -> str:
    """The Markdown table of the matrix (written by the suite, committed with the docs)."""
    lines = [
        "<!-- generated by tests/faults (HERDLESS_WRITE_FAULT_TABLE=1); do not edit -->",
        "",
        f"Each cell: {rows[0][2].calls if rows else 0} calls (a third with `allow_fallback=False`, "
        f"half streamed), deadline {DEADLINE:g} s; *after* runs a second burst once the fault "
        "is gone. Outcomes: the backend that answered, or the typed error.",
        "",
        "| fault | injected | calls | results (gateway / hosted) | typed errors | hung "
        "| slowest (s) | guard breaches | gateway 500s (relayed from vLLM) | gateway RSS (MiB) |",
        "|---|---|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, timing, tally, own_500s, rss, breaches in rows:
        errors = ", ".join(
            f"{kind} {n}"
            for kind, n in sorted(tally.outcomes.items())
            if kind not in ("gateway", "hosted")
        )
        results = f"{tally.outcomes['gateway']} / {tally.outcomes['hosted']}"
        lines.append(
            f"| {name} | {timing} | {tally.calls} | {results} | {errors or '-'} | {tally.hung} "
            f"| {tally.max_latency:.2f} | {breaches} | {own_500s} | {rss:.0f} |"
        )
    lines.append("")
    return "\n".join(lines)
