"""The ``herdless`` command: ``serve``, ``emulate``, ``maintain``, ``demo`` and ``bench``.

Each subcommand lives next to the code it runs and exposes
``main(argv: list[str]) -> int``; this module only dispatches, importing the
subcommand lazily so that ``herdless --help`` works with the core SDK alone and a
missing extra gives a clear message instead of a traceback.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence

_COMMANDS: dict[str, tuple[str, str, str]] = {
    # name: (module, extra that provides its dependencies, one-line help)
    "serve": ("herdless.gateway.cli", "server", "run the admission gateway in front of vLLM"),
    "emulate": ("herdless.emulator.cli", "server", "run an emulated vLLM server (no GPU needed)"),
    "maintain": (
        "herdless.gateway.maintain",
        "server",
        "drain, run a command (restart vLLM), wait until it answers, resume",
    ),
    "demo": (
        "herdless.demo.cli",
        "demo",
        "play a day at the office on an embedded default (below)",
    ),
    "bench": ("herdless.bench.cli", "demo", "run load scenarios and write results and plots"),
}


def _usage() -> str:
    lines = ["usage: herdless COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<9} {help_}" for name, (_, _, help_) in _COMMANDS.items()]
    lines += [
        "",
        "Embedded default: 'herdless demo' needs no servers and no configuration. It",
        "starts its own on free loopback ports (an emulated GPU, the gateway in front",
        "of it, an emulated hosted model as the fallback), plays the day against them,",
        "and stops them when the day ends.",
        "",
        "Every flag of a command is also an environment variable, shown in its help:",
        "HERDLESS_GATEWAY_* (serve), HERDLESS_EMULATOR_* (emulate), HERDLESS_DEMO_* (demo),",
        "HERDLESS_BENCH_* (bench); a flag wins over its variable.",
        "",
        "Run 'herdless COMMAND --help' for the flags of one command;",
        "'herdless --version' for the version.",
    ]
    return "\n".join(lines)


# What a shell reports for a command killed by SIGPIPE (128 + 13): `herdless ... | head`
# ends as `yes | head` does, without a traceback.
_BROKEN_PIPE_STATUS = 141


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``herdless`` command line and return its exit status.

    A reader that stops early (``herdless --help | head -5``) closes the pipe under
    stdout; that ends the command quietly with status 141, as SIGPIPE ends other
    tools, instead of a ``BrokenPipeError`` traceback.
    """
    try:
        status = _run(sys.argv[1:] if argv is None else argv)
        # Flush here: a closed pipe found by the interpreter's exit flush could no
        # longer be caught, and would print "Exception ignored ... BrokenPipeError".
        sys.stdout.flush()
    except BrokenPipeError:
        # The recipe of Python's signal docs ("Note on SIGPIPE"): point stdout at
        # /dev/null so the exit flush of what is still buffered succeeds.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return _BROKEN_PIPE_STATUS
    return status


def _run(argv: Sequence[str]) -> int:
    args = list(argv)
    if not args or args[0] in {"-h", "--help", "help"}:
        print(_usage())
        return 0
    if args[0] in {"-V", "--version"}:
        from herdless._version import __version__

        print(f"herdless {__version__}")
        return 0
    name, rest = args[0], args[1:]
    if name not in _COMMANDS:
        known = ", ".join(_COMMANDS)
        print(f"herdless: error: unknown command {name!r} (choose from {known})", file=sys.stderr)
        return 2
    module_name, extra, _ = _COMMANDS[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("herdless"):
            raise
        print(
            f"herdless {name}: error: missing dependency {exc.name!r}; "
            f"install it with: pip install 'herdless[{extra}]'",
            file=sys.stderr,
        )
        return 2
    status: int = module.main(rest)
    return status


if __name__ == "__main__":  # pragma: no cover -- exercised through the console script
    sys.exit(main())
