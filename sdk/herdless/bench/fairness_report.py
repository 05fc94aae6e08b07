"""The figures and tables of the ``fairness`` scenarios (pure: records in, results out).

Each scenario has a ``*_figures(records, p)`` (one run's figures, from the clients'
records, see :mod:`herdless.bench.fairness_stats`) and a ``*_table(runs, p)`` (the
medians per arm, the targets and the notes).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from herdless._percentiles import percentile
from herdless.bench.fairness_stats import (
    CallRecord,
    FairnessParams,
    service,
    throughput,
    window_jain,
)
from herdless.bench.report import Column, Medians, ScenarioResult, Target
from herdless.bench.runner import Runs
from herdless.bench.stats import ratio
from herdless.gateway.core.service import jain_index

__all__ = [
    "priority_figures",
    "priority_table",
    "tokens_figures",
    "tokens_table",
    "window_figures",
    "window_table",
]

_MEASURED = (
    "Real processes on 127.0.0.1; every arm in the same run, against the same emulator; "
    "a gateway per arm, differing only in --scheduler; 'vLLM alone': the same clients "
    "straight at the emulator (its own FCFS queue), no gateway."
)
_SERVICE = (
    "Tokens served = 1 x prompt + 2 x completion tokens (the gateway's weights), spread over "
    "the time each call ran (its end less completion x the emulator's step time)."
)


def _params(p: FairnessParams, **extra: object) -> dict[str, object]:
    sizes = {"slots": p.slots, "queue": p.queue, "speed": p.speed, "seconds": p.seconds}
    return {**sizes, **extra, "repeats": p.repeats}


def _params_ok(p: FairnessParams) -> None:
    if p.seconds < p.window:
        raise ValueError(f"seconds ({p.seconds}) must be at least one window ({p.window})")


# -- scenario 1: two backlogged users, 512 against 64 tokens ----------------------------------


def tokens_figures(records: Sequence[CallRecord], p: FairnessParams) -> dict[str, float]:
    """One run of scenario 1."""
    _params_ok(p)
    served = service(records, start=p.warmup, end=p.end, step=p.step)
    long, short = served.get("long", 0.0), served.get("short", 0.0)
    windows = window_jain(
        records, start=p.warmup, end=p.end, window=p.window, step=p.step, stop=p.stop
    )
    return {
        "long": long / p.seconds,
        "short": short / p.seconds,
        "ratio": ratio(max(long, short), min(long, short)),
        "jain": jain_index([long, short]),
        "window_jain_min": min(j for j, _ in windows),
        "errors": float(sum(not r.ok and r.ended is not None for r in records)),
    }


def tokens_table(runs: Runs, p: FairnessParams, *, stops: bool = False) -> ScenarioResult:
    """Scenario 1's table, or (``stops``) scenario 4's."""
    table = Medians(runs)
    vtc, rr = table["vtc"], table["round-robin"]
    title = (
        f"two backlogged users of one key, {p.long_tokens}-token against "
        f"{p.short_tokens}-token answers"
    )
    long, short = f"{p.long_tokens}-token user", f"{p.short_tokens}-token user"
    if stops:
        long, short = f"user reading {p.long_tokens} tokens", f"user stopping at {p.short_tokens}"
        title = (
            f"two backlogged users of one key asking {p.long_tokens} tokens, one stopping "
            f"each answer at {p.short_tokens}"
        )
    return table.result(
        name="fairness-stops" if stops else "fairness-tokens",
        title=title,
        params=_params(p, backlog=p.backlog, long_tokens=p.long_tokens, short=p.short_tokens),
        columns=[
            Column(key="long", label=f"{long} (tokens/s)", fmt="{:.0f}"),
            Column(key="short", label=f"{short} (tokens/s)", fmt="{:.0f}"),
            Column(key="ratio", label="larger / smaller"),
            Column(key="jain", label="Jain (run)", fmt="{:.3f}"),
            Column(key="window_jain_min", label="Jain (worst window)", fmt="{:.3f}"),
            Column(key="errors", label="errors", fmt="{:.0f}"),
        ],
        targets=[
            Target(label="vtc: larger / smaller service", value=vtc["ratio"], limit=1.10),
            Target(label="vtc: Jain over the two", value=vtc["jain"], limit=0.99, at_least=True),
            Target(
                label="round-robin: larger / smaller (the issue measured ~8)",
                value=rr["ratio"],
                limit=4.0,
                at_least=True,
                note="the reference order's unfairness, for scale",
            ),
        ],
        notes=[
            _MEASURED,
            _SERVICE,
            f"Each user keeps {p.backlog} calls outstanding (ignore_eos: every answer is as "
            f"long as its max_tokens), sent with the OpenAI user field; measured over "
            f"{p.seconds:g} s after {p.warmup:g} s of warm-up (the load goes on until the "
            "calls running at the end have finished).",
            *_STOPS_NOTE[:stops],
        ],
    )


_STOPS_NOTE = (
    "The stopping user streams each answer and closes it after its tokens (one an event), "
    "as an employee presses stop; its prompt tokens are vLLM's count of the same messages. "
    "Before the gateway settled a stream cut short on its events, it charged such a call "
    "its whole max_tokens: tokens served larger / smaller was 7 under vtc too.",
)


# -- scenario 2: a batch user and interactive users, with priorities -------------------------


def _chats(records: Sequence[CallRecord], p: FairnessParams) -> list[CallRecord]:
    """The interactive calls sent within the measured interval."""
    return [r for r in records if r.user != "batch" and p.warmup <= r.sent < p.end]


def priority_figures(records: Sequence[CallRecord], p: FairnessParams) -> dict[str, float]:
    """One run of scenario 2 (or its baseline, without the batch user)."""
    chats = _chats(records, p)
    latencies = [r.ended - r.sent for r in chats if r.ok and r.ended is not None]
    batch = [r for r in records if r.user == "batch"]
    return {
        "p50": percentile(latencies, 50),
        "p95": percentile(latencies, 95),
        "chat_errors": float(sum(not r.ok and r.ended is not None for r in chats)),
        "batch_errors": float(sum(not r.ok and r.ended is not None for r in batch)),
        "batch_spilled": float(sum(r.ok and r.backend != "primary" for r in batch)),
        "batch_served": float(sum(r.ok and r.backend == "primary" for r in batch)),
        "throughput": throughput(records, start=p.warmup, end=p.end, step=p.step),
    }


def priority_table(runs: Runs, p: FairnessParams, *, baseline: str) -> ScenarioResult:
    """Scenario 2's table: latency against the baseline arm, throughput against fcfs."""
    base_p95 = statistics.median(run["p95"] for run in runs[baseline])
    fcfs = statistics.median(run["throughput"] for run in runs["fcfs"])
    for arm, figures in runs.items():
        for run in figures:
            run["p95_x"] = ratio(run["p95"], base_p95)
            run["throughput_x"] = math.nan if arm == baseline else ratio(run["throughput"], fcfs)
    table = Medians(runs)
    vtc = table["vtc"]
    return table.result(
        name="fairness-priority",
        title=(
            f"{p.users} interactive users and one batch user ({p.batch_calls} calls "
            f"outstanding, priority=batch), emulator {p.slots} sequences, "
            f"gateway {p.slots}+{p.queue}"
        ),
        params=_params(
            p,
            users=p.users,
            think=p.think,
            batch_calls=p.batch_calls,
            batch_tokens=p.batch_tokens,
        ),
        columns=[
            Column(key="p50", label="chat p50 (s)"),
            Column(key="p95", label="chat p95 (s)"),
            Column(key="p95_x", label="p95 / without batch"),
            Column(key="chat_errors", label="chat errors", fmt="{:.0f}"),
            Column(key="batch_served", label="batch calls served", fmt="{:.0f}"),
            Column(key="batch_errors", label="batch errors", fmt="{:.0f}"),
            Column(key="batch_spilled", label="batch spilled", fmt="{:.0f}"),
            Column(key="throughput", label="GPU tokens/s", fmt="{:.0f}"),
            Column(key="throughput_x", label="throughput / fcfs"),
        ],
        targets=[
            Target(label="vtc: chat p95 / without batch", value=vtc["p95_x"], limit=1.2),
            Target(label="vtc: batch errors seen by its code", value=vtc["batch_errors"], limit=0),
            Target(label="vtc: batch calls spilled outside", value=vtc["batch_spilled"], limit=0),
            Target(
                label="vtc: GPU throughput / fcfs",
                value=vtc["throughput_x"],
                limit=0.95,
                at_least=True,
            ),
        ],
        notes=[
            _MEASURED,
            f"Chats: each user thinks Exp({p.think:g} s) then asks for one of "
            f"{list(p.chat_tokens)} tokens (the same draws in every arm), from one shared "
            "herdless.AsyncClient; latency is the call's, retries included, for chats sent "
            "in the measured interval.",
            f"Batch: {p.batch_calls} calls of {p.batch_tokens} tokens always outstanding from "
            "a herdless.AsyncClient(priority='batch') whose fallback is an external hosted "
            "emulator; its errors are exceptions its code saw; 'spilled': answered by the "
            "fallback.",
            f"'{baseline}': the chats alone, on the vtc gateway, in the same run. "
            "'vtc, static, reserve N': the vtc gateway with --sizing static (its limit the "
            f"operator's {p.slots}) and --interactive-reserve N (its default at {p.slots} "
            f"slots: {math.ceil(p.slots / 8)}); 'vtc' sizes itself from the engine's "
            "metrics, and measures the room it leaves the chats (the flag is for static "
            "limits).",
            "GPU throughput: completion tokens per second, from the usage of the answers.",
        ],
    )


# -- scenario 3: the same without classes ------------------------------------------------------


def window_figures(records: Sequence[CallRecord], p: FairnessParams) -> dict[str, float]:
    """One run of scenario 3: the Jain index per window, and the chats' latency."""
    _params_ok(p)
    windows = window_jain(
        records, start=p.warmup, end=p.end, window=p.window, step=p.step, stop=p.stop
    )
    chats = _chats(records, p)
    latencies = [r.ended - r.sent for r in chats if r.ok and r.ended is not None]
    return {
        "jain_min": min(j for j, _ in windows),
        "jain_median": statistics.median(j for j, _ in windows),
        "backlogged": statistics.mean(n for _, n in windows),
        "p95": percentile(latencies, 95),
        "throughput": throughput(records, start=p.warmup, end=p.end, step=p.step),
    }


def window_table(runs: Runs, p: FairnessParams) -> ScenarioResult:
    """Scenario 3's table."""
    table = Medians(runs)
    vtc = table["vtc"]
    return table.result(
        name="fairness-no-priority",
        title=(
            f"the same {p.users} interactive users and batch user, no priority set "
            "(all interactive)"
        ),
        params=_params(p, window=p.window, users=p.users, batch_calls=p.batch_calls),
        columns=[
            Column(key="jain_min", label=f"Jain, worst {p.window:g} s window", fmt="{:.3f}"),
            Column(key="jain_median", label="Jain, median window", fmt="{:.3f}"),
            Column(key="backlogged", label="users backlogged per window", fmt="{:.1f}"),
            Column(key="p95", label="chat p95 (s)"),
            Column(key="throughput", label="GPU tokens/s", fmt="{:.0f}"),
        ],
        targets=[
            Target(
                label=f"vtc: Jain over the backlogged users, every {p.window:g} s window",
                value=vtc["jain_min"],
                limit=0.95,
                at_least=True,
            )
        ],
        notes=[
            _MEASURED,
            _SERVICE,
            "A user is backlogged in a window when a call of its was outstanding at every "
            "instant of it; Jain's index is taken over those users' service in the window "
            "(1 when fewer than two were).",
        ],
    )
