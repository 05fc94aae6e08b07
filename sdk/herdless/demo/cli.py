"""``herdless demo``: play a day at the office on an embedded default, then account for it.

No arguments needed: it starts its own servers on free loopback ports, shows a
live view while the day plays, prints the summary table and the path of the
timeline PNG, and stops every process it started (also on Ctrl-C).
``--backend vllm`` makes the company GPU a real vLLM on CPU (docs/real-vllm.md).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.console import Console
from rich.live import Live

from herdless.demo.crowd import FALLBACK, PRIMARY, Crowd
from herdless.demo.day import Day
from herdless.demo.plot import timeline_png
from herdless.demo.settings import DemoSettings, parse_settings
from herdless.demo.stack import running_stack
from herdless.demo.tally import Tally
from herdless.demo.view import accounting, live_panel, phase_table, summary_table
from herdless.launch.vllm import VllmHome, VllmUnavailable, prepare

__all__ = ["main"]

_INTERRUPTED = 130  # the shell's convention for a run stopped by SIGINT
_UNAVAILABLE = 2  # --backend vllm where vLLM cannot be installed


def _parser() -> argparse.ArgumentParser:
    """Every default is ``None`` (= not given): ``DemoSettings`` fills it from the environment."""
    fields = DemoSettings.model_fields
    parser = argparse.ArgumentParser(
        prog="herdless demo",
        description="A day at the office in about a minute: a crowd chats with the company's "
        "GPU through the gateway; the GPU saturates, the model is swapped for maintenance and "
        "traffic moves to the hosted model and back. Every flag is also settable as "
        "HERDLESS_DEMO_<FLAG> (--no-fallback: HERDLESS_DEMO_FALLBACK=false).",
        argument_default=None,
    )

    def add(name: str, kind: Callable[[str], object], metavar: str | None = None) -> None:
        field = fields[name]
        parser.add_argument(
            "--" + name.replace("_", "-"),
            type=kind,
            metavar=metavar,
            help=f"{field.description} ({field.default})",
        )

    add("length", _positive(float), "SECONDS")
    add("crowd", _positive(int), "N")
    add("seed", int, "SEED")
    parser.add_argument(
        "--no-fallback",
        dest="fallback",
        action="store_const",
        const=False,
        help="no hosted model: see what the day looks like without a fallback",
    )
    add("out", Path, "DIR")
    add("speed", _positive(float))
    add("gpu_seqs", _positive(int), "N")
    add("deadline", _positive(float), "SECONDS")
    add("max_words", _positive(int), "N")
    add("max_tokens", _positive(int), "N")
    parser.add_argument(
        "--backend",
        choices=["emulator", "vllm"],
        help="the company GPU: emulated, or a real vLLM on CPU, prepared in "
        "$HERDLESS_VLLM_CACHE or ./.cache/vllm (emulator); vllm defaults to "
        "--crowd 8 --gpu-seqs 4 --max-words 40 --max-tokens 16",
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


def settings(argv: Sequence[str]) -> DemoSettings:
    """The demo's settings: flags over ``HERDLESS_DEMO_*`` over defaults (exit 2 if malformed)."""
    return parse_settings(_parser(), DemoSettings, argv)[0]


def main(argv: Sequence[str]) -> int:
    """Run ``herdless demo``; returns the exit status.

    0 after the day; 2 when ``--backend vllm`` finds no vLLM it can prepare; 130 after Ctrl-C.
    """
    opts = settings(argv)
    # The live view shows every decision; the SDK's own warnings would tear it apart.
    logging.getLogger("herdless").setLevel(logging.ERROR)
    out: Path = opts.out or Path(tempfile.mkdtemp(prefix="herdless-demo-"))
    console = Console()
    day = Day(length=opts.length, crowd=opts.crowd)
    fallback = FALLBACK if opts.fallback else None
    vllm: VllmHome | None = None
    gpu = "emulated"
    if opts.backend == "vllm":
        try:
            vllm = prepare()
        except VllmUnavailable as exc:
            print(f"herdless demo: vLLM cannot be prepared here: {exc}", file=sys.stderr)
            return _UNAVAILABLE
        gpu = "a real vLLM on CPU: it takes minutes to start"
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
        ) as stack:
            tally = Tally(start=time.monotonic(), deadline=opts.deadline)
            crowd = Crowd(
                stack=stack,
                day=day,
                tally=tally,
                seed=opts.seed,
                fallback=opts.fallback,
                deadline=opts.deadline,
                max_words=opts.max_words,
                max_tokens=opts.max_tokens,
                gpu_seqs=opts.gpu_seqs,
            )
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
    return 0
