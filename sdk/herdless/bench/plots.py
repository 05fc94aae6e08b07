"""PNG plots for bench results (matplotlib, headless)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["rate_panels"]


def rate_panels(
    path: Path,
    series: Mapping[str, Sequence[float]],
    *,
    title: str,
    capacity: float,
    mark: float | None = None,
    bin_width: float = 0.25,
    until: float | None = None,
) -> Path:
    """One panel per series: events per second over time, binned, with a capacity line.

    Args:
        path: the PNG to write.
        series: name -> event times (seconds).
        title: the figure's title.
        capacity: requests per second the server completes (a dashed line).
        mark: a time to mark with a vertical line (the recovery), or ``None``.
        bin_width: seconds per bar.
        until: last second shown (default: the last event).
    """
    import matplotlib  # lazy: heavy; only loaded when plotting

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    end = until if until is not None else max((max(t) for t in series.values() if t), default=1.0)
    bins = [i * bin_width for i in range(int(end / bin_width) + 2)]
    fig, axes = plt.subplots(len(series), 1, sharex=True, figsize=(8, 1.6 * len(series) + 0.8))
    axes = list(axes) if len(series) > 1 else [axes]
    for ax, (name, times) in zip(axes, series.items(), strict=True):
        counts = [0.0] * (len(bins) - 1)
        for t in times:
            index = int(t / bin_width)
            if 0 <= index < len(counts):
                counts[index] += 1 / bin_width  # per bin -> per second
        # One artist for the whole series: a bar per bin is thousands of patches.
        ax.stairs(counts, bins, fill=True, color="#4c72b0")
        ax.axhline(capacity, color="#c44e52", linestyle="--", linewidth=1)
        # Log scale: a herd is 10-100x capacity; on a linear axis capacity is invisible.
        ax.set_yscale("log")
        ax.set_ylim(bottom=1)
        if mark is not None:
            ax.axvline(mark, color="#55a868", linewidth=1)
        ax.set_ylabel("req/s")
        ax.set_title(name, fontsize=9, loc="left")
    axes[-1].set_xlabel("seconds (green: server recovers; red dashed: capacity)")
    axes[-1].set_xlim(0, end)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
