"""Prints the fuzz case counts at the end of the run (``COUNTS`` in ``_counts.py``)."""

from __future__ import annotations

import pytest
from tests.fuzz._counts import COUNTS


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not COUNTS:
        return
    terminalreporter.section("fuzz cases run")
    for family, count in sorted(COUNTS.items()):
        terminalreporter.write_line(f"{family:<40} {count:>7}")
    terminalreporter.write_line(f"{'total':<40} {sum(COUNTS.values()):>7}")
