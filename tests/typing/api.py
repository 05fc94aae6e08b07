"""Type-checked by mypy (nox -s typecheck), never executed: every public signature."""

from __future__ import annotations

import herdless

version: str = herdless.__version__
