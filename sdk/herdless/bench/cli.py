"""``herdless bench SCENARIO``: run load scenarios and write tables and plots.

Scenarios are registered in ``SCENARIOS``: each takes the parsed options, the
output folder and a progress callback, writes its plots, and returns its
results; this module writes every result as Markdown and JSON, prints the
tables, and collects them into ``summary.md``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from herdless.bench.report import ScenarioResult, write_result
from herdless.bench.runner import Progress

__all__ = ["SCENARIOS", "Scenario", "main"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """A registered scenario: ``run(options, out, progress)`` and how many runs it makes."""

    help: str
    run: Callable[[argparse.Namespace, Path, Progress], list[ScenarioResult]]
    runs: Callable[[argparse.Namespace], int]


def _herd(opts: argparse.Namespace, out: Path, progress: Progress) -> list[ScenarioResult]:
    from herdless.bench import herd  # lazy: pulls in the gateway core and the openai client

    if opts.target:
        # Its server must refuse everyone at t=0 and recover on cue: only the built-in one can.
        print("herd: runs against its built-in server in virtual time; --target is not used")

    params = herd.HerdParams(n=opts.n, repeats=opts.repeats, seed=opts.seed)
    return herd.run(params, out, progress)


def _herd_runs(opts: argparse.Namespace) -> int:
    from herdless.bench.herd_arms import ARMS

    return 2 * len(ARMS) * int(opts.repeats)


def _overhead(opts: argparse.Namespace, out: Path, progress: Progress) -> list[ScenarioResult]:
    from herdless.bench import overhead  # lazy: starts real processes

    return overhead.run(overhead.OverheadSizes(), progress)


def _overload(opts: argparse.Namespace, out: Path, progress: Progress) -> list[ScenarioResult]:
    from herdless.bench import overload  # lazy: starts real processes

    params = overload.OverloadParams(repeats=opts.repeats, target=opts.target)
    return overload.run(params, progress)


def _outage(opts: argparse.Namespace, out: Path, progress: Progress) -> list[ScenarioResult]:
    if opts.target:
        # A hang has to be injected into the primary: only the local emulator can do that.
        print("outage: skipped with --target (it injects a hang into a local emulator)")
        return []
    from herdless.bench import outage  # lazy: starts real processes

    return outage.run(outage.OutageParams(repeats=opts.repeats), progress)


SCENARIOS: dict[str, Scenario] = {
    "herd": Scenario(
        help="N callers refused at t=0, then the server recovers (5 retry strategies)",
        run=_herd,
        runs=_herd_runs,
    ),
    "overload": Scenario(
        help="steady 0.8x, 2x and 4x capacity: goodput, p99, refusals",
        run=_overload,
        runs=lambda opts: 3 * int(opts.repeats),
    ),
    "outage": Scenario(
        help="the primary hangs, then recovers: time to fallback, added latency, time back",
        run=_outage,
        runs=lambda opts: 2 * int(opts.repeats),
    ),
    "overhead": Scenario(
        help="gateway added latency and refusal rate, SDK CPU per call, emulator capacity",
        run=_overhead,
        runs=lambda opts: 3,
    ),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="herdless bench",
        description="Run load scenarios; each compares arms in one run and writes "
        "a Markdown table, a JSON file and PNG plots.",
    )
    names = [*SCENARIOS, "all"]
    parser.add_argument("scenario", choices=names, help="which scenario ('all': every one)")
    parser.add_argument(
        "--out", type=Path, default=Path("bench-results"), help="output folder (created)"
    )
    parser.add_argument(
        "--target",
        metavar="URL",
        help="base URL of a deployment (ending in /v1) for the client-side scenarios",
    )
    parser.add_argument("--repeats", type=_positive_int, default=3, help="repetitions per arm")
    parser.add_argument("--n", type=_positive_int, default=1000, help="callers in the herd")
    parser.add_argument("--seed", type=int, default=1, help="first seed (repetition r: seed + r)")
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def main(argv: Sequence[str]) -> int:
    """Run ``herdless bench``; returns the exit status."""
    opts = _parser().parse_args(list(argv))
    from rich.console import Console  # lazy: the demo extra
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        TaskID,
        TextColumn,
        TimeElapsedColumn,
    )
    from rich.progress import Progress as RichProgress

    console = Console(stderr=True)
    names = list(SCENARIOS) if opts.scenario == "all" else [opts.scenario]
    out: Path = opts.out
    out.mkdir(parents=True, exist_ok=True)
    results: list[ScenarioResult] = []
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with RichProgress(*columns, console=console, transient=False) as bar:
        for name in names:
            scenario = SCENARIOS[name]
            task = bar.add_task(name, total=scenario.runs(opts))

            def advance(label: str, task: TaskID = task, name: str = name) -> None:
                bar.update(task, advance=1, description=f"{name}: {label}")

            results += scenario.run(opts, out, advance)
            bar.update(task, description=f"{name}: done")
    for result in results:
        md, _ = write_result(result, out)
        console.print(f"wrote {md}")
    summary = out / "summary.md"
    summary.write_text("\n".join(r.to_markdown() for r in results), encoding="utf-8")
    sys.stdout.write(summary.read_text(encoding="utf-8"))
    console.print(f"results: {summary.resolve()}")
    return 0
