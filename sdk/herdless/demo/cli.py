"""``herdless demo``: play a day at the office on an embedded default, then account for it.

No arguments needed: it starts its own servers on free loopback ports, shows a
live view while the day plays, prints the summary table and the path of the
timeline PNG, and stops every process it started (also on Ctrl-C).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.console import Console
from rich.live import Live

from herdless.demo.crowd import FALLBACK, PRIMARY, Crowd
from herdless.demo.day import Day
from herdless.demo.plot import timeline_png
from herdless.demo.stack import running_stack
from herdless.demo.tally import Tally
from herdless.demo.view import live_panel, summary_table

__all__ = ["main"]

_INTERRUPTED = 130  # the shell's convention for a run stopped by SIGINT


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="herdless demo",
        description="A day at the office in about a minute: a crowd chats with the company's "
        "GPU through the gateway; the GPU saturates, the model is swapped for maintenance and "
        "traffic moves to the hosted model and back.",
    )
    parser.add_argument("--length", type=_positive(float), default=60.0, help="seconds (60)")
    parser.add_argument("--crowd", type=_positive(int), default=150, help="employees (150)")
    parser.add_argument("--seed", type=int, default=1, help="random seed (1)")
    parser.add_argument(
        "--no-fallback",
        dest="fallback",
        action="store_false",
        help="no hosted model: see what the day looks like without a fallback",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="folder for the timeline PNG and server logs"
    )
    parser.add_argument(
        "--speed", type=_positive(float), default=4.0, help="the emulated GPU's time scale (4)"
    )
    parser.add_argument(
        "--gpu-seqs", type=_positive(int), default=8, help="sequences the GPU runs at once (8)"
    )
    return parser


def _positive(kind: type[int] | type[float]) -> Callable[[str], float]:
    """An argparse ``type`` that parses ``kind`` and refuses zero and negatives."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    return parse


def main(argv: Sequence[str]) -> int:
    """Run ``herdless demo``; returns the exit status (0, or 130 after Ctrl-C)."""
    opts = _parser().parse_args(list(argv))
    # The live view shows every decision; the SDK's own warnings would tear it apart.
    logging.getLogger("herdless").setLevel(logging.ERROR)
    out: Path = opts.out or Path(tempfile.mkdtemp(prefix="herdless-demo-"))
    console = Console()
    day = Day(length=opts.length, crowd=opts.crowd)
    fallback = FALLBACK if opts.fallback else None
    console.print("starting the company GPU (emulated), the gateway and the hosted model ...")
    try:
        with running_stack(
            speed=opts.speed,
            gpu_seqs=opts.gpu_seqs,
            seed=opts.seed,
            # Clients probe the primary a few times per maintenance window, so they are
            # back on it soon after it resumes instead of waiting out a fixed 30 s.
            drain_retry_after=max(1.0, (day.maintenance[1] - day.maintenance[0]) / 4),
            logs=out / "logs",
        ) as stack:
            tally = Tally(start=time.monotonic())
            crowd = Crowd(stack=stack, day=day, tally=tally, seed=opts.seed, fallback=opts.fallback)
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
    console.print(summary_table(tally, primary=PRIMARY, fallback=fallback))
    lost = crowd.started - tally.finished
    console.print(
        f"requests started: {crowd.started}, ended: {tally.finished} "
        f"({'all accounted for' if lost == 0 else f'{lost} unaccounted'})"
    )
    backends = [PRIMARY] + ([FALLBACK] if fallback else [])
    png = timeline_png(
        tally,
        out / "timeline.png",
        length=day.length,
        maintenance=day.maintenance,
        backends=backends,
    )
    console.print(f"timeline: {png.resolve()}")
    return 0
