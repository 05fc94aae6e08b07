"""The ``overhead`` scenario: what the gateway, the SDK and the emulator cost.

Wires three benchmark modules (each runnable on its own with ``python -m``) into
``herdless bench``: :mod:`herdless.bench.gateway_overhead` (added latency,
refusals per second on one core, memory under overload),
:mod:`herdless.bench.sdk_overhead` (CPU per call against raw httpx) and
:mod:`herdless.bench.emulator_capacity` (the emulator is not the bottleneck).
Each measures its arms against a baseline in the same run; this module only
turns their figures into result tables with their targets.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from herdless.bench import emulator_capacity, gateway_overhead, sdk_overhead
from herdless.bench.emulator_capacity import CapacityReport
from herdless.bench.gateway_overhead import OverheadResult
from herdless.bench.report import Column, ScenarioResult, Target, knobs
from herdless.bench.runner import Progress
from herdless.bench.sdk_overhead import ArmResult

__all__ = ["STEPS", "OverheadSizes", "run"]

STEPS = 3
"""Progress steps: one per benchmark module."""


@dataclass(frozen=True, slots=True, kw_only=True)
class OverheadSizes:
    """Sizes that keep ``herdless bench all`` within 15 minutes on 2 cores.

    Attributes:
        overload_seconds: the gateway's 10x overload (the issue's figure is 60).
        sdk_calls: calls per arm per round of the SDK comparison.
        sdk_rounds: interleaved rounds of the SDK comparison.
        emulator_levels: concurrent streams per emulator level.
    """

    overload_seconds: float = 30.0
    sdk_calls: int = 300
    sdk_rounds: int = 7
    emulator_levels: tuple[int, ...] = (1, 100, 250, 500)


def run(sizes: OverheadSizes, progress: Progress | None = None) -> list[ScenarioResult]:
    """Run the three modules in turn; returns one result per module.

    A module that fails (a busy machine can time a connection out) yields a
    result that says so, and the other two still run.
    """

    def gateway() -> ScenarioResult:
        params = gateway_overhead.OverheadParams(overload_seconds=sizes.overload_seconds)
        return _gateway(gateway_overhead.run(params), sizes)

    def sdk() -> ScenarioResult:
        return _sdk(sdk_overhead.run(calls=sizes.sdk_calls, rounds=sizes.sdk_rounds), sizes)

    def emulator() -> ScenarioResult:
        return _emulator(emulator_capacity.run_capacity(levels=sizes.emulator_levels))

    results = []
    measures: tuple[tuple[str, Callable[[], ScenarioResult]], ...] = (
        ("overhead-gateway", gateway),
        ("overhead-sdk", sdk),
        ("overhead-emulator", emulator),
    )
    for name, measure in measures:
        try:
            results.append(measure())
        except Exception as exc:  # reported in the results, not swallowed
            results.append(_failed(name, exc))
        if progress is not None:
            progress(name)
    return results


def _failed(name: str, exc: Exception) -> ScenarioResult:
    return ScenarioResult(
        name=name,
        title="did not complete",
        params={},
        columns=[],
        rows=[],
        notes=[f"failed: {type(exc).__name__}: {exc}"],
    )


def _gateway(gw: OverheadResult, sizes: OverheadSizes) -> ScenarioResult:
    ms = 1000.0
    arms = (
        ("emulator directly", "direct"),
        ("through a bare relay", "relay"),
        ("through the gateway", "gateway"),
    )
    rows: list[dict[str, object]] = [
        {
            "arm": label,
            "p50": getattr(gw, f"{arm}_p50") * ms,
            "p99": getattr(gw, f"{arm}_p99") * ms,
            "cpu": getattr(gw, f"{arm}_cpu") * 1e6,
        }
        for label, arm in arms
    ]
    rows.append({"arm": "added by the gateway", "p50": gw.added_p50 * ms, "p99": gw.added_p99 * ms})
    return ScenarioResult(
        name="overhead-gateway",
        title="what the gateway adds, and what refusing costs",
        params={"streams": 100, "overload_s": sizes.overload_seconds},
        columns=[
            Column(key="p50", label="p50 (ms)"),
            Column(key="p99", label="p99 (ms)"),
            Column(key="cpu", label="its server's CPU µs / request", fmt="{:.0f}"),
        ],
        rows=rows,
        targets=[
            Target(label="added latency p50 (ms)", value=gw.added_p50 * ms, limit=1.0),
            Target(label="added latency p99 (ms)", value=gw.added_p99 * ms, limit=3.0),
            Target(
                label="gateway CPU per request / the bare relay's",
                value=gw.cpu_ratio,
                limit=1.2,
                note="what herdless's rules cost over Starlette, uvicorn and httpx",
            ),
            Target(
                label="refusals per second, one core",
                value=gw.refusals_per_s,
                limit=5000,
                at_least=True,
            ),
            Target(
                label="refusals / same server's /healthz rate",
                value=gw.refusal_ratio,
                limit=0.8,
                at_least=True,
            ),
        ],
        notes=[
            "Each request's time to the end of its stream, 100 concurrent streams, arms "
            "interleaved (herdless.bench.gateway_overhead). The bare relay "
            "(herdless.bench.relay) is the gateway's stack with none of its rules: "
            "Starlette, uvicorn with httptools, one pooled httpx client. Where three "
            "processes share two cores, latency is mostly waiting for a core; CPU per "
            "request is each server's own.",
            f"10x overload ({gw.overload_callers} callers) for {sizes.overload_seconds:g} s: "
            f"served {gw.overload_served_per_s:.0f}/s, refused {gw.overload_refused_per_s:.0f}/s, "
            f"answers {dict(sorted(gw.overload_codes.items()))}; gateway RSS "
            f"{gw.rss_at_rest / 2**20:.1f} MiB at rest, {gw.rss_peak / 2**20:.1f} MiB peak.",
            f"Refusals: {gw.refusals_per_s:,.0f}/s against /healthz {gw.healthz_per_s:,.0f}/s.",
        ],
    )


def _sdk(results: list[ArmResult], sizes: OverheadSizes) -> ScenarioResult:
    rows: list[dict[str, object]] = []
    targets = []
    for r in results:
        rows.append(
            {
                "arm": r.name,
                "httpx": r.httpx_us,
                "herdless": r.herdless_us,
                "x": r.ratio,
                "bytecodes": f"{r.herdless_bytecodes:,} / {r.httpx_bytecodes:,}",
                "bx": r.bytecode_ratio,
                "gc": f"{r.herdless_sweeps:.1f} / {r.httpx_sweeps:.1f}",
            }
        )
        targets.append(Target(label=f"herdless / httpx CPU, {r.name}", value=r.ratio, limit=1.10))
    return ScenarioResult(
        name="overhead-sdk",
        title="CPU per call: herdless against raw httpx, same requests",
        params={"calls": sizes.sdk_calls, "rounds": sizes.sdk_rounds},
        columns=[
            Column(key="httpx", label="httpx (µs CPU / call)", fmt="{:.0f}"),
            Column(key="herdless", label="herdless (µs CPU / call)", fmt="{:.0f}"),
            Column(key="x", label="ratio"),
            Column(key="bytecodes", label="bytecodes herdless / httpx", fmt="{}"),
            Column(key="bx", label="bytecode ratio", fmt="{:.3f}"),
            Column(key="gc", label="GC runs / 1,000 calls, herdless / httpx", fmt="{}"),
        ],
        rows=rows,
        targets=targets,
        notes=[
            "CPU: median over rounds; the arms take turns in blocks of calls, each block "
            "paying for its own garbage collection; bytecodes: one warm call of each arm, "
            "every Python frame (herdless.bench.sdk_overhead)."
        ],
    )


def _emulator(report: CapacityReport) -> ScenarioResult:
    rows: list[dict[str, object]] = [
        {
            "arm": f"{lv.concurrency} streams",
            "tps": lv.tokens_per_s,
            "model": lv.model_tokens_per_s,
            "eff": lv.efficiency,
            "errors": float(lv.errors),
            "cpu": lv.cpu_per_token * 1e6 if not math.isnan(lv.cpu_per_token) else math.nan,
        }
        for lv in report.levels
    ]
    return ScenarioResult(
        name="overhead-emulator",
        title="the emulator keeps up with the GPU it emulates",
        params=knobs(report.params, leave_out={"threshold", "stream_interval"}),
        columns=[
            Column(key="tps", label="tokens/s received", fmt="{:,.0f}"),
            Column(key="model", label="tokens/s modelled", fmt="{:,.0f}"),
            Column(key="eff", label="efficiency"),
            Column(key="errors", label="errors", fmt="{:.0f}"),
            Column(key="cpu", label="emulator CPU µs / token", fmt="{:.1f}"),
        ],
        rows=rows,
        targets=[
            Target(
                label="concurrent streams sustained",
                value=float(report.sustained),
                limit=500,
                at_least=True,
            )
        ],
        notes=[
            "herdless.bench.emulator_capacity; sustained = no errors, "
            f"efficiency >= {report.params.threshold:g}."
        ],
    )
