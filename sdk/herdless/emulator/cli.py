"""``herdless emulate``: an emulated vLLM server. Flags mirror :class:`EmulatorSettings`.

Every flag, its default and its help are generated from a settings field
(``max_num_seqs`` is ``--max-num-seqs`` and ``HERDLESS_EMULATOR_MAX_NUM_SEQS``) by
:mod:`herdless._cli_settings`, so the two can never drift apart. A flag given on the
command line wins over the environment.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
from collections.abc import Sequence

from herdless._cli_settings import SettingsCommand, exit_status, fail
from herdless.emulator.settings import EmulatorSettings

__all__ = ["build_parser", "help_text", "load_settings", "main"]


def _runner() -> asyncio.Runner:
    """An event loop runner: uvloop's when it is installed (as uvicorn itself prefers)."""
    try:
        # Imported by name: uvloop is optional, and type-checked installs may lack it.
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        return asyncio.Runner()
    return asyncio.Runner(loop_factory=uvloop.new_event_loop)


_COMMAND = SettingsCommand(
    EmulatorSettings,
    prog="herdless emulate",
    description="An OpenAI-compatible server that behaves like vLLM on one GPU: "
    "a batch scheduler,\na KV cache, its /metrics, and faults to inject (no GPU needed).",
)


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``herdless emulate``: one flag per settings field."""
    return _COMMAND.parser


def help_text() -> str:
    """The ``herdless emulate --help`` text (also the docs' CLI reference)."""
    return _COMMAND.format_help()


def load_settings(argv: Sequence[str]) -> EmulatorSettings:
    """Settings from flags over ``HERDLESS_EMULATOR_*`` over the defaults.

    Raises:
        SystemExit: ``--help`` (status 0), or a bad flag or variable (status 2, the
            error on stderr naming the flag or the variable the user set).
    """
    return _COMMAND.parse(argv)[0]


def main(argv: Sequence[str]) -> int:
    """Run the emulator until SIGINT/SIGTERM; return the exit status."""
    try:
        settings = load_settings(argv)
    except SystemExit as exc:
        return exit_status(exc)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from herdless.emulator.server import serve  # uvicorn is only needed to actually serve

    try:
        with _runner() as runner:
            runner.run(serve(settings))
    except OSError as exc:  # the port is taken, the host is not ours
        where = f"{settings.host}:{settings.port}"
        return fail("herdless emulate", f"cannot listen on {where}: {exc}", status=1)
    except KeyboardInterrupt:  # pragma: no cover -- SIGINT during the loading delay
        return 130
    return 0
