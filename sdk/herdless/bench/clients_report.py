"""The figures and the table of the ``clients`` scenario (pure: the clients' calls in,
the result out); :mod:`herdless.bench.clients` runs it."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from herdless._percentiles import percentile
from herdless.bench.js_clients import CHAT_CLIENTS, CallResult
from herdless.bench.report import Column, ScenarioResult, Target

__all__ = ["RETRYING", "figures", "table"]

RETRYING = ("openai", "vercel", "langchain")
"""The clients that retry a 429 or a 503 by default; ``single`` never does."""


def figures(results: Sequence[CallResult], hosted_p50: float = math.nan) -> dict[str, float]:
    """One client's figures in one case: errors, p95, attempts per call, the calls the
    hosted model answered and how soon their first byte came (``hosted_p50``: the hosted
    model's own, for the same client)."""
    done = [r.total_s for r in results]
    spilled = [r for r in results if r.headers.get("x-herdless-backend") == "hosted"]
    first = [r.first_byte_s for r in spilled if r.first_byte_s is not None]
    return {
        "calls": len(results),
        "errors": sum(not r.ok for r in results),
        "p95_s": percentile(done, 95),
        "attempts": sum(r.attempts for r in results) / len(results),
        "hosted": len(spilled),
        "spill_first_byte_p95_s": percentile(first, 95) if first else math.nan,
        "hosted_p50_s": hosted_p50,
    }


def table(
    params: dict[str, object],
    rows: list[dict[str, object]],
    runs: dict[str, list[dict[str, float]]],
    hosted_p95: Mapping[str, float],
) -> ScenarioResult:
    """The result: ``rows`` (one per case and client, ``arm`` naming both) against the
    targets; ``hosted_p95`` is each client's p95 straight at the hosted model."""
    by = {str(row["arm"]): row for row in rows}

    def value(arm: str, key: str) -> float:
        return float(by.get(arm, {}).get(key, math.nan))  # type: ignore[arg-type]

    def each(case: str, key: str, clients: Sequence[str] = CHAT_CLIENTS) -> list[float]:
        """``key`` of every one of ``clients`` in ``case`` (an arm is ``case: client``)."""
        return [value(f"{case}: {c}", key) for c in clients]

    alone = value("overload, vLLM alone: all", "wall_s")
    served_whole = [  # the overload cases in which the GPU served every call: the same work
        arm
        for arm in by
        if arm.startswith("overload, ")
        and arm.endswith(": all")
        and value(arm, "errors") == value(arm, "hosted") == 0
    ]
    targets = [
        Target(  # Claude Code's client, its own retries, beside the four
            label="overload + Claude Code, flags: errors, every client",
            value=value("overload + Claude Code, flags: all", "errors"),
            limit=0,
        ),
        Target(
            label="overload + Claude Code, flags: wall time / vLLM alone's",
            value=value("overload + Claude Code, flags: all", "wall_s")
            / value("overload + Claude Code, vLLM alone: all", "wall_s"),
            limit=1.1,
            note="the same calls, the five clients at once",
        ),
        *(  # flags: no key policy, the client shows it never retries
            Target(
                label=f"overload, {arm}: single attempt errors",
                value=value(f"overload, {arm}: single", "errors"),
                limit=0,
            )
            for arm in ("flags", "spill", "hold, retries = false", "spill, retries = false")
        ),
        Target(
            label="overload, spill key, single attempt: spilled first byte p95 - hosted p50 (s)",
            value=value("overload, spill: single", "spill_first_byte_p95_s")
            - value("overload, spill: single", "hosted_p50_s"),
            limit=0.1,
        ),
        Target(
            label="overload, hold key: calls to the hosted model",
            value=sum(each("overload, hold", "hosted")),
            limit=0,
        ),
        Target(
            label="window 20 s, spill key: errors (all clients)",
            value=sum(each("window 20 s, spill", "errors")),
            limit=0,
        ),
        Target(
            label="window 20 s, spill key: worst p95 - hosted p95 (s)",
            value=max(
                value(f"window 20 s, spill: {c}", "p95_s") - hosted_p95[c] for c in CHAT_CLIENTS
            ),
            limit=0.2,
        ),
        Target(
            label="window 20 s, hold 10 s: retrying clients' errors",
            value=sum(each("window 20 s, hold 10 s", "errors", RETRYING)),
            limit=0,
            note=f"vLLM alone: {sum(each('window 20 s, vLLM alone', 'errors', RETRYING)):.0f}",
        ),
        Target(
            label="window 20 s, hold 10 s: retrying clients' worst p95 (s)",
            value=max(each("window 20 s, hold 10 s", "p95_s", RETRYING)),
            limit=22.0,
        ),
        Target(
            label="window 90 s, hold 120 s, openai-node: errors",
            value=value("window 90 s, hold 120 s: openai", "errors"),
            limit=0,
        ),
        Target(
            label="overload, queue 256, retrying clients: worst attempts per request",
            value=max(each("overload, spill, queue 256", "attempts", RETRYING)),
            limit=1.1,
        ),
        Target(
            label="overload, queue 256, retrying clients: worst p95 / flags' p95",
            value=max(
                value(f"overload, spill, queue 256: {c}", "p95_s")
                / value(f"overload, flags: {c}", "p95_s")
                for c in RETRYING
            ),
            limit=1.0,
        ),
        Target(
            label="overload, queue 256: errors, all clients",
            value=value("overload, spill, queue 256: all", "errors"),
            limit=0,
            note=f"vLLM alone: {value('overload, vLLM alone: all', 'errors'):.0f}",
        ),
        Target(
            label="overload, queue 256: wall time of the case / vLLM alone's",
            value=value("overload, spill, queue 256: all", "wall_s") / alone,
            limit=1.05,
            note="the same calls: what the gateway costs the GPU's throughput",
        ),
        Target(
            label="overload, every case whose calls all reached the GPU: worst wall time / "
            "vLLM alone's",
            value=max((value(arm, "wall_s") / alone for arm in served_whole), default=math.nan),
            limit=1.1,
            note="a refused caller told too late a time leaves the GPU idle",
        ),
        Target(
            label="overload, queue 16, retrying clients: worst attempts per request",
            value=max(each("overload, spill", "attempts", RETRYING)),
            limit=1.1,
            note="held requests count against --max-queue: 96 in flight against 8 + 16",
        ),
        Target(
            label="herdless SDK through the spilling key: requests the gateway spilled",
            value=value("overload, spill key: herdless SDK", "gateway_spills"),
            limit=0,
        ),
    ]
    return ScenarioResult(
        name="clients",
        title="clients that do not embed herdless: key policies, holds, the hosted fallback",
        params=params,
        columns=[
            Column(key="calls", label="calls", fmt="{:.0f}"),
            Column(key="errors", label="errors", fmt="{:.0f}"),
            Column(key="p95_s", label="p95 (s)"),
            Column(key="attempts", label="attempts/call"),
            Column(key="hosted", label="to the hosted model", fmt="{:.0f}"),
            Column(key="spill_first_byte_p95_s", label="spilled first byte p95 (s)"),
            Column(key="hosted_p50_s", label="hosted alone p50 (s)"),
            Column(key="gateway_spills", label="gateway spills", fmt="{:.0f}"),
            Column(key="wall_s", label="wall time of the case (s)"),
        ],
        rows=rows,
        runs=runs,
        targets=targets,
        notes=[
            "One run; every client at once in each case (96 calls in flight against 8 running "
            "+ 16 waiting in the overload). vLLM alone: a GPU emulated alike with no gateway "
            "(vLLM queues every request itself; in the window its port closes for the swap, with "
            "no word to anyone). flags: the gateway with no key policy (each "
            "request as its client shows); spill / hold: the single-attempt client's key "
            "holds 20 s and may / may not spill, and says retries = true (a 429 at once), "
            "the retrying clients' key takes the flags; retries = false: the single-attempt "
            "client's key says its clients never retry (a full queue keeps its requests "
            "waiting for their place); queue 256: spill with the default --max-queue.",
            "single: one plain POST per call with Node's fetch, never retried (what Open "
            "WebUI's backend does); its user agent shows it never retries.",
        ],
    )
