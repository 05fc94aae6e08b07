"""Prometheus text exposition (format 0.0.4): one writer for the gateway and the emulator.

Both servers render their ``/metrics`` on demand from counters they keep anyway, so a
writer of a few families is all they need. Why not prometheus-client: its
``observe`` takes a lock on every call (the gateway observes three histograms per
request on one event loop), every counter and histogram gains a ``_created`` series
unless a process-wide switch is flipped, and the emulator must answer under vLLM's
own names and labels. What prometheus-client brings besides, the standard
``process_*`` series, is :func:`process_metrics` here: the same names and sources
(``/proc/self``, as its ``ProcessCollector`` reads them).
"""

from __future__ import annotations

import os
import resource
from bisect import bisect_left
from collections.abc import Iterable, Mapping

__all__ = ["CONTENT_TYPE", "Exposition", "Histogram", "labels", "process_metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Samples = Iterable[tuple[str, float]]
"""``(labels, value)`` pairs of one family; ``labels`` as :func:`labels` writes them."""


class Histogram:
    """A histogram over fixed upper bounds: ``observe`` is one bisect and two adds; the
    counts are made cumulative when rendered."""

    __slots__ = ("_counts", "bounds", "count", "sum")

    def __init__(self, bounds: Iterable[float]) -> None:
        self.bounds = tuple(float(bound) for bound in bounds)
        self._counts = [0] * (len(self.bounds) + 1)  # the last slot is +Inf
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float, count: int = 1) -> None:
        """Record ``count`` observations of ``value``."""
        if count <= 0:
            return
        self._counts[bisect_left(self.bounds, value)] += count
        self.count += count
        self.sum += value * count

    def cumulative(self) -> list[tuple[str, int]]:
        """``(le, cumulative count)`` pairs, ``+Inf`` last."""
        out, total = [], 0
        for bound, n in zip((*map(repr, self.bounds), "+Inf"), self._counts, strict=True):
            total += n
            out.append((bound, total))
        return out


def labels(**pairs: object) -> str:
    """``{name="value",...}`` with the values escaped (``\\``, ``"``, newlines); ``""``
    for none."""
    if not pairs:
        return ""
    inner = ",".join(f'{name}="{_escape(str(value))}"' for name, value in pairs.items())
    return "{" + inner + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Exposition:
    """The lines of one scrape, family by family; :meth:`text` joins them."""

    __slots__ = ("_lines",)

    def __init__(self) -> None:
        self._lines: list[str] = []

    def family(self, name: str, kind: str, help: str, samples: Samples) -> None:
        """A metric family: its ``HELP`` and ``TYPE`` lines, then one line per sample."""
        lines = self._lines
        lines.append(f"# HELP {name} {help}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(f"{name}{labelled} {value!r}" for labelled, value in samples)

    def one(self, name: str, kind: str, help: str, value: float) -> None:
        """A family of one unlabelled sample."""
        self.family(name, kind, help, [("", value)])

    def by(self, name: str, kind: str, help: str, label: str, values: Mapping[str, float]) -> None:
        """A family with one label, a sample per value of it (in the mapping's order)."""
        self.family(name, kind, help, [(labels(**{label: key}), v) for key, v in values.items()])

    def histogram(self, name: str, help: str, histogram: Histogram, **base: object) -> None:
        """A histogram family (``_bucket``, ``_count``, ``_sum``) with ``base`` labels."""
        lines = self._lines
        lines.append(f"# HELP {name} {help}")
        lines.append(f"# TYPE {name} histogram")
        for le, n in histogram.cumulative():
            lines.append(f"{name}_bucket{labels(**base, le=le)} {n}")
        plain = labels(**base)
        lines.append(f"{name}_count{plain} {histogram.count}")
        lines.append(f"{name}_sum{plain} {histogram.sum!r}")

    def text(self) -> str:
        """The exposition, newline-terminated."""
        return "\n".join(self._lines) + "\n"


def process_metrics(out: Exposition) -> None:
    """The standard ``process_*`` families of this process, as prometheus-client's
    ``ProcessCollector`` names them: CPU seconds, resident and virtual memory, open and
    maximum file descriptors, start time. A figure the platform does not give (no
    ``/proc``) is left out, never guessed."""
    times = os.times()
    cpu = times.user + times.system
    out.one("process_cpu_seconds_total", "counter", "User and system CPU time, seconds.", cpu)
    try:
        with open("/proc/self/stat", "rb") as handle:
            # After the ")" that ends the command name: vsize is field 20, rss 21
            # (pages), starttime 19 (clock ticks after boot).
            fields = handle.read().rsplit(b")", 1)[1].split()
        with open("/proc/stat", "rb") as handle:
            boot = next(float(line.split()[1]) for line in handle if line.startswith(b"btime"))
        open_fds = len(os.listdir("/proc/self/fd"))
    except (OSError, StopIteration, IndexError, ValueError):
        return
    start = boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    rss = int(fields[21]) * resource.getpagesize()
    out.one("process_virtual_memory_bytes", "gauge", "Virtual memory size, bytes.", int(fields[20]))
    out.one("process_resident_memory_bytes", "gauge", "Resident memory size, bytes.", rss)
    out.one("process_start_time_seconds", "gauge", "Start time, seconds since the epoch.", start)
    out.one("process_open_fds", "gauge", "Open file descriptors.", open_fds)
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft != resource.RLIM_INFINITY:
        out.one("process_max_fds", "gauge", "Most open file descriptors allowed.", soft)
