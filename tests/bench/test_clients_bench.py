"""The clients scenario's figures and targets, from calls made up here (no node)."""

from __future__ import annotations

import math

from herdless.bench.clients import ClientsParams, _figures, _result
from herdless.bench.js_clients import CallResult


def call(index: int, *, ok: bool = True, attempts: int = 1, backend: str = "upstream",
         first: float | None = 0.2, total: float = 1.0) -> CallResult:  # fmt: skip
    return CallResult(index=index, client="single", ok=ok, status=200 if ok else 429,
                      attempts=attempts, statuses=(200,) * attempts, first_byte_s=first,
                      total_s=total, chunks=0, headers={"x-herdless-backend": backend},
                      model="m", usage=None, error=None if ok else "429")  # fmt: skip


def test_the_figures_count_errors_attempts_and_the_spilled_calls_first_bytes() -> None:
    calls = [call(0), call(1, ok=False, attempts=3), call(2, backend="hosted", first=0.4)]
    figures = _figures(calls, hosted_p50=0.3)
    assert figures["calls"] == 3
    assert figures["errors"] == 1
    assert figures["attempts"] == 5 / 3
    assert figures["hosted"] == 1
    assert figures["spill_first_byte_p95_s"] == 0.4
    assert math.isnan(_figures([call(0)])["spill_first_byte_p95_s"])


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
    result = _result(ClientsParams(), rows, {}, hosted_p95)
    by_label = {t.label: t for t in result.targets}
    assert by_label["overload, spill: single attempt errors"].met
    first = by_label["overload, spill key, single attempt: spilled first byte p95 - hosted p50 (s)"]
    assert not first.met
    assert abs(first.value - 0.6) < 1e-9
