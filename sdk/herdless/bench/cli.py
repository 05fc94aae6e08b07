"""``herdless bench SCENARIO``: run load scenarios and write tables and plots.

Scenarios are registered in ``SCENARIOS``: each takes the parsed options, the
output folder and a progress callback, writes its plots, and returns its
results; this module writes every result as Markdown and JSON, prints the
tables, and collects them into ``summary.md``.
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from herdless._cli_settings import SettingsCommand, exit_status, fail
from herdless.bench.plots import table_bars
from herdless.bench.report import ScenarioResult, write_result
from herdless.bench.runner import Progress
from herdless.bench.settings import BenchSettings

__all__ = ["SCENARIOS", "Scenario", "help_text", "main", "missing_modules"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """A registered scenario: ``run(options, out, progress)`` and how many runs it makes."""

    help: str
    run: Callable[[BenchSettings, Path, Progress], list[ScenarioResult]]
    runs: Callable[[BenchSettings], int]
    needs: tuple[str, ...] = ()
    """Modules of the ``bench`` extra it imports, beyond those every scenario needs."""


# Every scenario draws a progress bar (rich) and plots (matplotlib); real-process
# scenarios also start the gateway and the emulator (starlette, uvicorn).
_ALWAYS = ("rich", "matplotlib")
_SERVERS = ("starlette", "uvicorn")


def _herd(opts: BenchSettings, out: Path, progress: Progress) -> list[ScenarioResult]:
    from herdless.bench import herd  # lazy: pulls in the gateway core and the openai client

    if opts.target:
        # Its server must refuse everyone at t=0 and recover on cue: only the built-in one can.
        print("herd: runs against its built-in server in virtual time; --target is not used")

    params = herd.HerdParams(n=opts.n, repeats=opts.repeats, seed=opts.seed)
    return herd.run(params, out, progress)


def _herd_runs(opts: BenchSettings) -> int:
    from herdless.bench.herd_arms import ARMS

    return 2 * len(ARMS) * int(opts.repeats)


def _overhead(opts: BenchSettings, out: Path, progress: Progress) -> list[ScenarioResult]:
    from herdless.bench import overhead  # lazy: starts real processes

    if opts.target:
        # Each arm compares a local server with and without the layer measured.
        print("overhead: measures local processes against a baseline; --target is not used")

    return overhead.run(overhead.OverheadSizes(), progress)


def _overload(opts: BenchSettings, out: Path, progress: Progress) -> list[ScenarioResult]:
    from herdless.bench import overload  # lazy: starts real processes

    params = overload.OverloadParams(repeats=opts.repeats, target=opts.target)
    return overload.run(params, progress)


def _shared(opts: BenchSettings, out: Path, progress: Progress) -> list[ScenarioResult]:
    from herdless.bench import shared  # lazy: starts real processes

    if opts.target:
        print("shared: measures local processes it configures itself; --target is not used")
    params = shared.SharedParams(repeats=opts.repeats, seed=opts.seed)
    return shared.run(params, out, progress)


def _spill(opts: BenchSettings, out: Path, progress: Progress) -> list[ScenarioResult]:
    from herdless.bench import spill  # lazy: starts real processes

    if opts.target:
        print("spill: stops its own upstream; --target is not used")
    return spill.run(spill.SpillParams(repeats=opts.repeats), progress)


def _fairness(opts: BenchSettings, out: Path, progress: Progress) -> list[ScenarioResult]:
    from herdless.bench import fairness  # lazy: starts real processes
    from herdless.bench.fairness_stats import FairnessParams

    if opts.target:
        print("fairness: compares the gateway's schedulers it starts itself; --target is not used")
    params = FairnessParams(repeats=opts.repeats, seed=opts.seed)
    return fairness.run(params, out, progress)


def _sizing(opts: BenchSettings, out: Path, progress: Progress) -> list[ScenarioResult]:
    from herdless.bench import sizing  # lazy: starts real processes

    if opts.target:
        print(
            "sizing: compares gateways it starts in front of its own emulator; --target is not used"
        )
    return sizing.run(sizing.SizingParams(repeats=opts.repeats, seed=opts.seed), out, progress)


def _sizing_runs(opts: BenchSettings) -> int:
    from herdless.bench.sizing import runs

    return runs(int(opts.repeats))


def _clients(opts: BenchSettings, out: Path, progress: Progress) -> list[ScenarioResult]:
    from herdless.bench import clients  # lazy: starts real processes and node

    if opts.target:
        print("clients: drains gateways it starts itself; --target is not used")
    return clients.run(clients.ClientsParams(), progress)


def _fairness_runs(opts: BenchSettings) -> int:
    from herdless.bench.fairness import ARMS, RESERVES

    # Scenario 1 and 3: every arm; scenario 2: every arm, the reserves and the baseline.
    return (3 * len(ARMS) + len(RESERVES) + 1) * int(opts.repeats)


def _outage(opts: BenchSettings, out: Path, progress: Progress) -> list[ScenarioResult]:
    if opts.target:
        # A hang has to be injected into the primary: only the local emulator can do that.
        print("outage: skipped with --target (it injects a hang into a local emulator)")
        return []
    from herdless.bench import outage  # lazy: starts real processes

    return outage.run(outage.OutageParams(repeats=opts.repeats), progress)


def _hedge(opts: BenchSettings, out: Path, progress: Progress) -> list[ScenarioResult]:
    from herdless.bench import hedge  # lazy: starts real processes

    if opts.target:
        print("hedge: injects the slow fault into its own emulated GPU; --target is not used")
    params = hedge.HedgeParams(repeats=opts.repeats, seed=opts.seed)
    return hedge.run(params, out, progress)


SCENARIOS: dict[str, Scenario] = {
    "herd": Scenario(
        help="N callers refused at t=0, then the server recovers (5 retry strategies)",
        run=_herd,
        runs=_herd_runs,
        needs=("openai", "tenacity"),
    ),
    "shared": Scenario(
        help="200 chats at once from ONE client: through the gateway, and straight at vLLM",
        run=_shared,
        runs=lambda opts: (6 + 1 + 6) * int(opts.repeats),
        needs=(*_SERVERS, "openai", "tenacity"),
    ),
    "spill": Scenario(
        help="one client, a busy GPU, a hosted fallback: what spills, how fast, and on an outage",
        run=_spill,
        runs=lambda opts: 3 * int(opts.repeats) + 1,
        needs=_SERVERS,
    ),
    "overload": Scenario(
        help="steady 0.8x, 2x and 4x capacity: goodput, p99, refusals",
        run=_overload,
        runs=lambda opts: 3 * int(opts.repeats),
        needs=_SERVERS,
    ),
    "outage": Scenario(
        help="the primary hangs, then recovers: time to fallback, added latency, time back",
        run=_outage,
        runs=lambda opts: 2 * int(opts.repeats),
        needs=_SERVERS,
    ),
    "fairness": Scenario(
        help="two users 512 vs 64 tokens; a batch user among interactive ones, with and "
        "without priorities: token-fair queueing against round-robin and FCFS",
        run=_fairness,
        runs=_fairness_runs,
        needs=_SERVERS,
    ),
    "sizing": Scenario(
        help="self-sizing from the engine's metrics against static limits (batch flood, crowd, "
        "mixes, a switch of mix, stale readings)",
        run=_sizing,
        runs=_sizing_runs,
        needs=_SERVERS,
    ),
    "hedge": Scenario(
        help="10 % of the GPU's requests stall 5 s before the first byte: hedging vs none",
        run=_hedge,
        runs=lambda opts: 4 * int(opts.repeats),
        needs=(*_SERVERS, "openai"),
    ),
    "clients": Scenario(
        help="openai-node, the Vercel AI SDK, LangChain.js and a client that never retries, "
        "through key policies: overload, maintenance windows, the hosted fallback (needs node)",
        run=_clients,
        runs=lambda opts: 9,
        needs=_SERVERS,
    ),
    "overhead": Scenario(
        help="gateway added latency and refusal rate, SDK CPU per call, emulator capacity",
        run=_overhead,
        runs=lambda opts: 3,
        needs=_SERVERS,
    ),
}


def _command() -> SettingsCommand[BenchSettings]:
    scenarios = "\n".join(
        textwrap.fill(s.help, 80, initial_indent=f"  {name:<9} ", subsequent_indent=" " * 12)
        for name, s in SCENARIOS.items()
    )
    command = SettingsCommand(
        BenchSettings,
        prog="herdless bench",
        description="Run load scenarios; each compares arms in one run and writes a Markdown "
        "table,\na JSON file and PNG plots into --out, and prints the tables.\n\n"
        f"scenarios:\n{scenarios}\n  all       every one, in this order",
        usage="[options] SCENARIO",
    )
    command.parser.add_argument(
        "scenario", choices=[*SCENARIOS, "all"], metavar="SCENARIO", help="one of the above"
    )
    return command


def help_text() -> str:
    """The ``herdless bench --help`` text (also the docs' CLI reference)."""
    return _command().format_help()


def missing_modules(names: Sequence[str]) -> list[str]:
    """The modules the scenarios ``names`` import that are not installed, sorted."""
    wanted = set(_ALWAYS).union(*(SCENARIOS[name].needs for name in names))
    return sorted(m for m in wanted if importlib.util.find_spec(m) is None)


def main(argv: Sequence[str]) -> int:
    """Run ``herdless bench``; returns the exit status (2 for a bad flag or variable)."""
    try:
        opts, args = _command().parse(argv)
    except SystemExit as exc:
        return exit_status(exc)
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    missing = missing_modules(names)
    if missing:
        return fail(
            "herdless bench",
            f"{args.scenario}: missing {', '.join(missing)}; "
            "install the bench extra: pip install 'herdless[bench]'",
        )
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

            for result in scenario.run(opts, out, advance):
                if not result.plots:  # scenarios without a plot of their own: the table's bars
                    png = table_bars(result, out / f"{result.name}.png")
                    result.plots += [png] if png is not None else []
                results.append(result)
            bar.update(task, description=f"{name}: done")
    for result in results:
        md, _ = write_result(result, out)
        console.print(f"wrote {md}")
    summary = out / "summary.md"
    summary.write_text("\n".join(r.to_markdown() for r in results), encoding="utf-8")
    sys.stdout.write(summary.read_text(encoding="utf-8"))
    console.print(f"results: {summary.resolve()}")
    return 0
