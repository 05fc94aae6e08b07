"""Render the ``--help`` of every ``herdless`` command for the CLI reference page.

The help is generated from the settings models (``herdless._cli_settings``), and
this page shows that same text, so it cannot drift from what ``--help`` prints.
Run ``python docs/scripts/cli_reference.py`` to print it.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
from collections.abc import Iterator

MARKER = "<!-- herdless:cli -->"

# The command, and the module whose help_text() prints its --help.
COMMANDS = {
    "herdless serve": "herdless.gateway.cli",
    "herdless emulate": "herdless.emulator.cli",
    "herdless maintain": "herdless.gateway.maintain",
    "herdless demo": "herdless.demo.cli",
    "herdless bench": "herdless.bench.cli",
}
_WIDTH = "88"  # argparse wraps at the terminal's width: pin it, so the page is stable


@contextlib.contextmanager
def _columns() -> Iterator[None]:
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = _WIDTH
    try:
        yield
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved


def _top_level() -> str:
    from herdless.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["--help"])
    return out.getvalue()


def render() -> str:
    """Markdown: the top-level help, then one section per command with its ``--help``."""
    parts = ["## `herdless`\n", "```text", _top_level().rstrip(), "```", ""]
    with _columns():
        for command, module in COMMANDS.items():
            help_text = importlib.import_module(module).help_text
            parts += [f"## `{command}`\n", "```text", help_text().rstrip(), "```", ""]
    return "\n".join(parts)


if __name__ == "__main__":
    print(render())
