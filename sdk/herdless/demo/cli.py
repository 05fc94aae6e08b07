"""``herdless demo``: play a day at the office on an embedded default, then account for it.

No arguments needed: it starts its own servers on free loopback ports, shows a
live view while the day plays, prints the summary table and the path of the
timeline PNG, and stops every process it started (also on Ctrl-C).
``--backend vllm`` makes the company GPU a real vLLM on CPU (docs/real-vllm.md).
``--json`` writes the day's accounting to stdout as JSON for scripts (the rest
then goes to stderr).
"""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.live import Live

from herdless._cli_settings import SettingsCommand, exit_status, fail
from herdless.demo.crowd import FALLBACK, PRIMARY, Crowd
from herdless.demo.day import Day
from herdless.demo.plot import timeline_png
from herdless.demo.settings import DemoSettings
from herdless.demo.stack import running_stack
from herdless.demo.summary import day_summary
from herdless.demo.tally import Tally
from herdless.demo.view import accounting, live_panel, phase_table, summary_table
from herdless.launch.vllm import VllmHome, VllmUnavailable, prepare

__all__ = ["help_text", "main", "settings"]

_INTERRUPTED = 130  # the shell's convention for a run stopped by SIGINT
_UNAVAILABLE = 2  # --backend vllm where vLLM cannot be installed


_COMMAND = SettingsCommand(
    DemoSettings,
    prog="herdless demo",
    description="A day at the office in about a minute: a crowd chats with the company's GPU\n"
    "through the gateway; the GPU saturates, the model is swapped for maintenance and\n"
    "traffic moves to the hosted model and back. No servers to give: the demo starts\n"
    "its own (an emulated GPU, the gateway, a hosted model) on free loopback ports.",
)
_COMMAND.parser.add_argument(
    "--json",
    action="store_true",
    default=False,  # the parser's default is "absent", which a plain switch is not
    help="write the day's accounting to stdout as one JSON object, for scripts; the live "
    "view and the tables then go to stderr [default: off]",
)


def help_text() -> str:
    """The ``herdless demo --help`` text (also the docs' CLI reference)."""
    return _COMMAND.format_help()


def settings(argv: Sequence[str]) -> DemoSettings:
    """The demo's settings: flags over ``HERDLESS_DEMO_*`` over defaults.

    Raises:
        SystemExit: ``--help`` (status 0), or a bad flag or variable (status 2).
    """
    return _COMMAND.parse(argv)[0]


def main(argv: Sequence[str]) -> int:
    """Run ``herdless demo``; returns the exit status.

    0 after the day; 2 for a bad flag or variable, or when ``--backend vllm`` finds no
    vLLM it can prepare; 130 after Ctrl-C. With ``--json``, stdout holds only the day's
    accounting (:func:`~herdless.demo.summary.day_summary`) and everything else goes to
    stderr.
    """
    try:
        opts, args = _COMMAND.parse(argv)
    except SystemExit as exc:
        return exit_status(exc)
    # The live view shows every decision; the SDK's own warnings would tear it apart
    # (for the day only: a caller in the same process, a test, keeps its own level).
    sdk_log = logging.getLogger("herdless")
    level = sdk_log.level
    sdk_log.setLevel(logging.ERROR)
    try:
        return _day(opts, args.json)
    finally:
        sdk_log.setLevel(level)


def _day(opts: DemoSettings, as_json: bool) -> int:
    """Play the day with ``opts`` and print its accounting (``main``'s body)."""
    out: Path = opts.out or Path(tempfile.mkdtemp(prefix="herdless-demo-"))
    console = Console(stderr=as_json)
    day = Day(length=opts.length, crowd=opts.crowd)
    fallback = FALLBACK if opts.fallback else None
    vllm: VllmHome | None = None
    gpu = "emulated"
    if opts.backend == "vllm":
        try:
            vllm = prepare()
        except VllmUnavailable as exc:
            return fail(
                "herdless demo", f"vLLM cannot be prepared here: {exc}", status=_UNAVAILABLE
            )
        gpu = "a real vLLM on CPU: it takes minutes to start"
    # The chat front-end's hold outlasts the maintenance window: without a fallback its
    # requests wait for the resume instead of showing an error.
    hold = 1.5 * (day.maintenance[1] - day.maintenance[0])
    console.print(f"starting the company GPU ({gpu}), the gateway and the hosted model ...")
    try:
        with running_stack(
            speed=opts.speed,
            gpu_seqs=opts.gpu_seqs,
            seed=opts.seed,
            # Clients probe the primary a few times per maintenance window, so they are
            # back on it soon after it resumes instead of waiting out a fixed 30 s.
            drain_retry_after=max(1.0, (day.maintenance[1] - day.maintenance[0]) / 8),
            logs=out / "logs",
            vllm=vllm,
            fallback=opts.fallback,
            hold=hold,
        ) as stack:
            tally = Tally(start=time.monotonic(), deadline=opts.deadline)
            crowd = Crowd(stack=stack, day=day, tally=tally, settings=opts, hold=hold)
            with Live(console=console, refresh_per_second=4, transient=False) as live:

                def tick() -> None:
                    panel = live_panel(
                        tally, day, time.monotonic(), primary=PRIMARY, fallback=fallback
                    )
                    live.update(panel)

                asyncio.run(crowd.run(tick))
    except KeyboardInterrupt:
        console.print("interrupted: every demo server has been stopped.")
        return _INTERRUPTED
    console.print(summary_table(tally, primary=PRIMARY, fallback=fallback, started=crowd.started))
    console.print(phase_table(tally, day, primary=PRIMARY, fallback=fallback))
    console.print(accounting(tally, started=crowd.started, primary=PRIMARY, fallback=fallback))
    backends = [PRIMARY] + ([FALLBACK] if fallback else [])
    png = timeline_png(
        tally,
        out / "timeline.png",
        length=day.length,
        maintenance=day.maintenance,
        backends=backends,
    )
    console.print(f"timeline: {png.resolve()}")
    if as_json:
        summary = day_summary(
            tally, day, started=crowd.started, primary=PRIMARY, fallback=fallback, timeline=png
        )
        print(json.dumps(summary, indent=2))
    return 0
