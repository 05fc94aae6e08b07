"""The day's accounting as plain data: what ``herdless demo --json`` writes (pure).

The same counts the summary and phase tables print (:mod:`herdless.demo.view`),
from the same :class:`~herdless.demo.tally.Tally`, as a JSON-ready ``dict``:
numbers stay numbers (seconds as floats, shares as fractions from 0 to 1), and a
value with no sample (a percentile of no call) is ``None`` (JSON ``null``), never NaN.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from herdless.demo.day import PHASES, Day
from herdless.demo.tally import Tally

__all__ = ["day_summary"]


def _number(value: float) -> float | None:
    return None if math.isnan(value) else value


def day_summary(
    tally: Tally,
    day: Day,
    *,
    started: int,
    primary: str,
    fallback: str | None,
    timeline: Path | None = None,
) -> dict[str, Any]:
    """The day, accounted for: ``started == sum(served.values()) + failed + unaccounted``.

    Args:
        tally: the day's counts.
        day: the day's timeline (for the phases).
        started: calls the crowd started.
        primary: the company GPU's backend name.
        fallback: the hosted model's backend name, or ``None`` without one.
        timeline: the timeline PNG, when one was drawn.

    Returns:
        ``requests`` (started, ended, unaccounted), ``served`` by backend, ``failed``
        and ``failed_by`` error class, ``fallbacks_by`` reason, ``refused_by_status``
        (attempts, by HTTP status), ``retries``, ``latency_s`` of served calls (p50,
        p95, p99, max), ``deadline_s``, ``late`` and ``late_by_s``, ``attempts`` (mean,
        max), ``phases`` (per phase: served by backend, hosted share, the GPU's busy
        share overall and while spilling), ``maintenance`` (the window as ``herdless
        maintain`` reported it, or ``None``), and ``timeline`` (a path, or ``None``).
    """
    backends = [primary] + ([fallback] if fallback else [])
    failed = sum(tally.failed_by.values())
    phases = []
    for phase in PHASES:
        seconds = range(math.floor(phase.start * day.length), math.ceil(phase.end * day.length))
        served = {name: sum(tally.served[name][s] for s in seconds) for name in backends}
        total = sum(served.values())
        spilling = [s for s in seconds if tally.spilled[s]]
        phases.append(
            {
                "phase": phase.name,
                "served": served,
                "hosted_share": served[fallback] / total if fallback and total else None,
                "gpu_busy": _number(tally.busy_share(seconds)),
                "gpu_busy_while_spilling": _number(tally.busy_share(spilling)),
            }
        )
    return {
        "requests": {
            "started": started,
            "ended": tally.finished,
            "unaccounted": started - tally.finished,
        },
        "served": {name: tally.served_total[name] for name in backends},
        "failed": failed,
        "failed_by": dict(tally.failed_by.most_common()),
        "fallbacks_by": dict(tally.fallbacks_by.most_common()),
        "refused_by_status": {str(k): n for k, n in sorted(tally.refusals_by.items())},
        "retries": tally.retries,
        "latency_s": {
            ("max" if q == 100 else f"p{q}"): _number(tally.latency(q)) for q in (50, 95, 99, 100)
        },
        "deadline_s": tally.deadline if math.isfinite(tally.deadline) else None,
        "late": tally.late,
        "late_by_s": tally.late_by,
        "attempts": {
            "mean": _number(tally.mean_attempts()),
            "max": max(tally.attempts, default=0),
        },
        "frontend": {
            "started": tally.frontend_started,
            **{
                outcome: tally.frontend[outcome]
                for outcome in ("gpu", "held", "spilled", "refused")
            },
        },
        "phases": phases,
        "maintenance": tally.maintenance,
        "timeline": None if timeline is None else str(timeline.resolve()),
    }
