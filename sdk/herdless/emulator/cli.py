"""``herdless emulate``: an emulated vLLM server. Flags mirror :class:`EmulatorSettings`.

Every flag is generated from a settings field (``max_num_seqs`` is
``--max-num-seqs`` and ``HERDLESS_EMULATOR_MAX_NUM_SEQS``), so the two can
never drift apart. A flag given on the command line wins over the environment.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import sys
import types
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from herdless.emulator.settings import EmulatorSettings

__all__ = ["build_parser", "main"]


def _flag_type(annotation: Any) -> tuple[Any, list[Any] | None]:
    """The argparse ``type`` and ``choices`` of a settings field's annotation."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return str, list(typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType) and len(args) == 1:
        return _flag_type(args[0])
    return annotation, None


def _runner() -> asyncio.Runner:
    """An event loop runner: uvloop's when it is installed (as uvicorn itself prefers)."""
    try:
        # Imported by name: uvloop is optional, and type-checked installs may lack it.
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        return asyncio.Runner()
    return asyncio.Runner(loop_factory=uvloop.new_event_loop)


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``herdless emulate``; every default is ``None`` (= not given)."""
    parser = argparse.ArgumentParser(
        prog="herdless emulate",
        description="An OpenAI-compatible server that behaves like vLLM on one GPU. "
        "Every flag is also settable as HERDLESS_EMULATOR_<FLAG>.",
        argument_default=None,
    )
    for name, field in EmulatorSettings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        default = field.default
        help_ = f"{field.description} (default: {default}; env HERDLESS_EMULATOR_{name.upper()})"
        kind, choices = _flag_type(field.annotation)
        if kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, help=help_)
        else:
            parser.add_argument(flag, type=kind, choices=choices, help=help_, metavar=name.upper())
    return parser


def main(argv: Sequence[str]) -> int:
    """Run the emulator until SIGINT/SIGTERM; return the exit status."""
    args = build_parser().parse_args(list(argv))
    given = {k: v for k, v in vars(args).items() if v is not None}
    try:
        settings = EmulatorSettings(**given)
    except ValidationError as exc:
        for error in exc.errors():
            where = ".".join(str(p) for p in error["loc"]) or "settings"
            print(f"herdless emulate: {where}: {error['msg']}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from herdless.emulator.server import serve  # uvicorn is only needed to actually serve

    try:
        with _runner() as runner:
            runner.run(serve(settings))
    except OSError as exc:  # the port is taken, the host is not ours
        print(
            f"herdless emulate: cannot listen on {settings.host}:{settings.port}: {exc}",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:  # pragma: no cover -- SIGINT during the loading delay
        return 130
    return 0
