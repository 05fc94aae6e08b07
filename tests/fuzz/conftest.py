"""Prints the fuzz case counts and the hostile connections' outcomes at the end of the run."""

from __future__ import annotations

import pytest
from tests.fuzz._counts import COUNTS, OUTCOMES


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not COUNTS:
        return
    terminalreporter.section("fuzz cases run")
    for family, count in sorted(COUNTS.items()):
        terminalreporter.write_line(f"{family:<40} {count:>7}")
    terminalreporter.write_line(f"{'total':<40} {sum(COUNTS.values()):>7}")
    if OUTCOMES["probes"]:
        terminalreporter.section("hostile connections")
        for name in ("probes", "5xx seen", "hung", "late"):
            terminalreporter.write_line(f"{name:<40} {OUTCOMES[name]:>7}")
