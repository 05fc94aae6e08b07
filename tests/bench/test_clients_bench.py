"""The clients scenario's figures and targets, from calls made up here (no node)."""

from __future__ import annotations

import math

from herdless.bench.clients_report import figures, table
from herdless.bench.js_clients import CallResult


def call(index: int, *, ok: bool = True, attempts: int = 1, backend: str = "upstream",
         first: float | None = 0.2, total: float = 1.0) -> CallResult:  # fmt: skip
    return CallResult(index=index, client="single", ok=ok, status=200 if ok else 429,
                      attempts=attempts, statuses=(200,) * attempts, first_byte_s=first,
                      total_s=total, chunks=0, headers={"x-herdless-backend": backend},
                      model="m", usage=None, error=None if ok else "429")  # fmt: skip


def test_the_figures_count_errors_attempts_and_the_spilled_calls_first_bytes() -> None:
    calls = [call(0), call(1, ok=False, attempts=3), call(2, backend="hosted", first=0.4)]
    got = figures(calls, hosted_p50=0.3)
    assert got["calls"] == 3
    assert got["errors"] == 1
    assert got["attempts"] == 5 / 3
    assert got["hosted"] == 1
    assert got["spill_first_byte_p95_s"] == 0.4
    assert math.isnan(figures([call(0)])["spill_first_byte_p95_s"])


def test_a_spill_slower_than_the_hosted_model_misses_its_target() -> None:
    rows: list[dict[str, object]] = [
        {
            "arm": "overload, spill: single",
            "errors": 0,
            "spill_first_byte_p95_s": 0.9,
            "hosted_p50_s": 0.3,
        },
    ]
    hosted_p95 = dict.fromkeys(("openai", "vercel", "langchain", "single"), 1.0)
    result = table({}, rows, {}, hosted_p95)
    by_label = {t.label: t for t in result.targets}
    assert by_label["overload, spill: single attempt errors"].met
    first = by_label["overload, spill key, single attempt: spilled first byte p95 - hosted p50 (s)"]
    assert not first.met
    assert abs(first.value - 0.6) < 1e-9


def test_the_default_queue_and_a_hold_are_measured_against_vllm_alone() -> None:
    rows: list[dict[str, object]] = [
        {"arm": "overload, vLLM alone: all", "errors": 0, "hosted": 0, "wall_s": 16.0},
        {"arm": "overload, spill, queue 256: all", "errors": 2, "hosted": 0, "wall_s": 17.6},
        {"arm": "overload, hold: all", "errors": 0, "hosted": 0, "wall_s": 20.0},
        {"arm": "overload, spill: all", "errors": 0, "hosted": 9, "wall_s": 40.0},
        {"arm": "window 20 s, vLLM alone: openai", "errors": 9},
        {"arm": "window 20 s, vLLM alone: vercel", "errors": 7},
        {"arm": "window 20 s, vLLM alone: langchain", "errors": 0},
        *({"arm": f"window 20 s, hold 10 s: {c}", "errors": 0} for c in ("openai", "vercel")),
        {"arm": "window 20 s, hold 10 s: langchain", "errors": 0},
    ]
    hosted_p95 = dict.fromkeys(("openai", "vercel", "langchain", "single"), 1.0)
    by_label = {t.label: t for t in table({}, rows, {}, hosted_p95).targets}
    slower = by_label["overload, queue 256: wall time of the case / vLLM alone's"]
    assert abs(slower.value - 1.1) < 1e-9
    assert not slower.met
    idle = by_label[
        "overload, every case whose calls all reached the GPU: worst wall time / vLLM alone's"
    ]
    assert (idle.value, idle.met) == (1.25, False)  # the case with errors or spills is left out
    errors = by_label["overload, queue 256: errors, all clients"]
    assert (errors.value, errors.met, errors.note) == (2, False, "vLLM alone: 0")
    window = by_label["window 20 s, hold 10 s: retrying clients' errors"]
    assert (window.value, window.met, window.note) == (0, True, "vLLM alone: 16")
