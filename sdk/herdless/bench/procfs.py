"""A process's CPU time and resident memory, read from Linux's ``/proc``.

The benchmarks give servers' figures per CPU-second of the server (which a busy machine
or a saturated load generator does not skew, where a wall-clock rate is) and their
memory at rest and under load. Elsewhere than Linux the readings are missing (``nan``,
``0``), not errors: the other figures still stand.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

__all__ = ["cpu_seconds", "rss_bytes"]

_RSS = re.compile(r"VmRSS:\s+(\d+) kB")


def cpu_seconds(pid: int | None = None) -> float:
    """User plus system CPU seconds ``pid`` (this process when ``None``) has used so far;
    ``nan`` where ``/proc`` cannot tell."""
    try:
        stat = Path(f"/proc/{pid or 'self'}/stat").read_text()
        fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return math.nan


def rss_bytes(pid: int | None = None) -> int:
    """Resident set size of ``pid`` (this process when ``None``), bytes; ``0`` where
    ``/proc`` cannot tell."""
    try:
        status = Path(f"/proc/{pid or 'self'}/status").read_text()
    except OSError:
        return 0
    found = _RSS.search(status)
    return int(found.group(1)) * 1024 if found else 0
