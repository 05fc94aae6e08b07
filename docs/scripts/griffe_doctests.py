"""griffe extension: ``>>>`` examples in docstrings render as Python console blocks.

Google-style docstrings put examples in an ``Examples:`` section; herdless's
docstrings often end with a bare ``>>>`` session instead (it reads better in
``help()`` and is what the doctests run). Markdown would make those lines a nested
quote, so each session becomes a fenced ``pycon`` block, without the
``# doctest: ...`` directives (they are for the test runner, not the reader).
"""

from __future__ import annotations

import re
from typing import Any

try:
    from griffe import Extension
except ImportError:  # the docs group brings griffe; the tests import fence_sessions alone
    Extension = object  # type: ignore[assignment,misc]

_DIRECTIVE = re.compile(r"\s*#\s*doctest:.*$")


def fence_sessions(text: str) -> str:
    """``text`` with every ``>>>`` session (prompts, continuations, output up to a
    blank line) inside a fenced ``pycon`` block; other lines unchanged."""
    out: list[str] = []
    session: list[str] = []
    in_fence = False
    for line in [*text.splitlines(), ""]:
        stripped = line.strip()
        if stripped.startswith("```"):
            in_fence = not in_fence
        if not in_fence and (stripped.startswith(">>>") or (session and stripped)):
            session.append(_DIRECTIVE.sub("", line.rstrip()))
            continue
        if session:
            indent = len(session[0]) - len(session[0].lstrip())
            out += [" " * indent + "```pycon", *session, " " * indent + "```"]
            session = []
        out.append(line)
    return "\n".join(out[:-1])


class DoctestBlocks(Extension):
    """Fences the ``>>>`` sessions of every docstring griffe loads."""

    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None and ">>>" in obj.docstring.value:
            obj.docstring.value = fence_sessions(obj.docstring.value)
