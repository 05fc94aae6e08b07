"""What the demo shows: the live panel while the day plays, and the summary at its end."""

from __future__ import annotations

import math

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from herdless.demo.day import PHASES, Day
from herdless.demo.tally import Tally

__all__ = ["accounting", "live_panel", "phase_table", "summary_table"]


def live_panel(
    tally: Tally, day: Day, now: float, *, primary: str, fallback: str | None
) -> RenderableType:
    """The live view at monotonic time ``now``."""
    t = now - tally.start
    phase = day.phase(t)
    head = Text.assemble(
        (f"{min(t, day.length):5.1f}s / {day.length:g}s  ", "bold"),
        (f"{phase.name}: ", "bold cyan"),
        phase.caption,
        f"   employees chatting: {day.active(t)}",
    )
    bar = ProgressBar(total=day.length, completed=min(t, day.length), width=60)
    grid = Table.grid(padding=(0, 3))
    grid.add_column(justify="left")
    grid.add_column(justify="right")
    backends = [primary] + ([fallback] if fallback else [])
    for name in backends:
        rate = tally.rate(tally.served[name], now)
        grid.add_row(f"served by {name} (req/s)", f"{rate:6.1f}")
    grid.add_row("refused with 429 (per s)", f"{tally.rate(tally.refused, now):6.1f}")
    grid.add_row("failed (per s)", f"{tally.rate(tally.failed, now):6.1f}")
    grid.add_row("retries scheduled", f"{tally.retries:6d}")
    grid.add_row("gateway queue depth", _gauge(tally, "queue_depth"))
    grid.add_row("gateway running upstream", _gauge(tally, "inflight"))
    open_ = tally.breakers["open"] + tally.breakers["half_open"]
    grid.add_row("clients with an open breaker", f"{open_:6d}")
    reasons = ", ".join(f"{r}: {n}" for r, n in tally.fallbacks_by.most_common()) or "none"
    grid.add_row("fallbacks (why)", reasons)
    return Panel(Group(head, bar, Text(""), grid), title="herdless demo: a day at the office")


def summary_table(
    tally: Tally, *, primary: str, fallback: str | None, started: int | None = None
) -> Table:
    """The final accounting: who served, who failed and why, latency and attempts."""
    table = Table(title="the day, accounted for", show_header=True)
    table.add_column("")
    table.add_column("value", justify="right")
    total = tally.finished
    if started is not None:
        table.add_row("requests started", str(started))
    table.add_row("requests ended (served or failed)", str(total))
    table.add_row(f"served by {primary} (primary)", _share(tally.served_total[primary], total))
    if fallback:
        table.add_row(
            f"served by {fallback} (fallback)", _share(tally.served_total[fallback], total)
        )
    failed = sum(tally.failed_by.values())
    table.add_row("failed", _share(failed, total))
    for error, n in tally.failed_by.most_common():
        table.add_row(f"  failed: {error}", str(n))
    for reason, n in tally.fallbacks_by.most_common():
        table.add_row(f"  fallback: {reason}", str(n))
    for status, n in sorted(tally.refusals_by.items()):
        table.add_row(f"attempts refused with {status}", str(n))
    table.add_row("retries scheduled", str(tally.retries))
    for q in (50, 95, 99, 100):
        table.add_row(
            f"latency {'max' if q == 100 else f'p{q}'} (served)", _seconds(tally.latency(q))
        )
    if math.isfinite(tally.deadline):
        late = f"{tally.late} (by {tally.late_by:.2f} s at most)" if tally.late else "0"
        table.add_row(f"ended after the {tally.deadline:g} s deadline", late)
    table.add_row("attempts per request (mean)", _number(tally.mean_attempts()))
    table.add_row("attempts per request (max)", str(max(tally.attempts, default=0)))
    window = tally.maintenance
    if window is not None:
        table.add_row("maintenance window (herdless maintain)", f"{window['window']:.1f} s")
        for count in ("held", "spilled", "refused"):
            table.add_row(f"  requests {count} during it", str(window[count]))
    if tally.frontend_started:
        asked = tally.frontend_started
        table.add_row("chat front-end: asked once each, never retried", str(asked))
        for outcome, label in _FRONTEND.items():
            table.add_row(f"  {label}", _share(tally.frontend[outcome], asked))
    return table


_FRONTEND = {
    "gpu": "answered by the GPU at once",
    "held": "held in the gateway, then the GPU's answer",
    "spilled": "spilled to the hosted model",
    "refused": "refused: an error on the screen",
}


def _gauge(tally: Tally, name: str) -> str:
    value = tally.gauges.get(name)
    return "   n/a" if value is None else f"{value:6.0f}"


def _share(n: int, total: int) -> str:
    return f"{n} ({n / total:.1%})" if total else str(n)


def _seconds(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.2f} s"


def _number(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.2f}"


def accounting(tally: Tally, *, started: int, primary: str, fallback: str | None) -> Text:
    """One line that adds up: started = served by each backend + failed, and none late."""
    parts = [f"{tally.served_total[primary]} by {primary}"]
    if fallback:
        parts.append(f"{tally.served_total[fallback]} by {fallback}")
    failed = sum(tally.failed_by.values())
    parts.append(f"{failed} failed")
    lost = started - tally.finished
    verdict = "all accounted for" if lost == 0 else f"{lost} unaccounted"
    line = f"requests started: {started} = {' + '.join(parts)} ({verdict}"
    if math.isfinite(tally.deadline):
        late = "none" if tally.late == 0 else str(tally.late)
        line += f"; {late} ended after the {tally.deadline:g} s deadline"
        if tally.late:
            line += f", by {tally.late_by:.2f} s at most"
    return Text(line + ")", style="bold green" if lost == 0 and tally.late == 0 else "bold red")


def phase_table(tally: Tally, day: Day, *, primary: str, fallback: str | None) -> Table:
    """Per phase of the day: who served, and how busy the GPU was, overall and in the
    seconds in which calls spilled to the fallback. Outside maintenance a call should
    go to the hosted model only while the GPU is full."""
    table = Table(title="the day, phase by phase", show_header=True)
    for header in ("phase", f"by {primary}", f"by {fallback or '-'}", "hosted share"):
        table.add_column(header, justify="right")
    table.add_column("GPU busy", justify="right")
    table.add_column("GPU busy while spilling", justify="right")
    for phase in PHASES:
        seconds = range(math.floor(phase.start * day.length), math.ceil(phase.end * day.length))
        by_primary = sum(tally.served[primary][s] for s in seconds)
        by_fallback = sum(tally.served[fallback][s] for s in seconds) if fallback else 0
        served = by_primary + by_fallback
        spilling = [s for s in seconds if tally.spilled[s]]
        table.add_row(
            phase.name,
            str(by_primary),
            str(by_fallback),
            f"{by_fallback / served:.1%}" if served else "n/a",
            _percent(tally.busy_share(seconds)),
            _percent(tally.busy_share(spilling)) if spilling else "no spill",
        )
    return table


def _percent(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.0%}"
