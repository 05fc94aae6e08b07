"""PNG plots for bench results (matplotlib, headless)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from herdless.bench.report import ScenarioResult

__all__ = ["rate_panels", "save", "service_panels", "subplots", "table_bars"]


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
    end = until if until is not None else max((max(t) for t in series.values() if t), default=1.0)
    bins = [i * bin_width for i in range(int(end / bin_width) + 2)]
    fig, axes = subplots(len(series), 1, sharex=True, figsize=(8, 1.6 * len(series) + 0.8))
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
    legend = (
        "green: server recovers; red dashed: capacity"
        if mark is not None
        else "red dashed: capacity"
    )
    axes[-1].set_xlabel(f"seconds ({legend})")
    axes[-1].set_xlim(0, end)
    return save(fig, path, title, fontsize=10)


def service_panels(
    path: Path,
    panels: Mapping[str, Mapping[str, Sequence[float]]],
    *,
    title: str,
    heavy: set[str],
    bin_width: float = 1.0,
) -> Path:
    """One panel per arm: each user's cumulative service over time, one line per user.

    Args:
        path: the PNG to write.
        panels: arm -> user -> service up to the end of each bin.
        title: the figure's title.
        heavy: users drawn in colour and named in the legend; the others, when there
            are more than four users, are thin grey lines and their sum a dashed one.
        bin_width: seconds per bin.
    """
    fig, axes = subplots(
        1, len(panels), sharey=True, figsize=(3.6 * len(panels) + 0.6, 3.4), squeeze=False
    )
    colours = ["#c44e52", "#4c72b0", "#55a868", "#8172b2"]
    for ax, (arm, users) in zip(axes[0], panels.items(), strict=True):
        named = 0
        crowd: list[float] = []
        few = len(users) <= len(colours)
        for user, totals in sorted(users.items()):
            times = [(i + 1) * bin_width for i in range(len(totals))]
            thousands = [t / 1000 for t in totals]
            if user in heavy or few:
                ax.plot(times, thousands, color=colours[named % len(colours)], label=user)
                named += 1
            else:  # one thin line per user of a crowd, and their sum
                ax.plot(times, thousands, color="#999999", linewidth=0.6)
                if crowd:
                    crowd = [a + b for a, b in zip(crowd, thousands, strict=True)]
                else:
                    crowd = thousands
        if crowd:
            times = [(i + 1) * bin_width for i in range(len(crowd))]
            ax.plot(times, crowd, color="#4c72b0", linestyle="--", label="the others, summed")
        ax.set_title(arm, fontsize=9, loc="left")
        ax.set_xlabel("seconds")
        if named or crowd:
            ax.legend(fontsize=7, loc="upper left")
        ax.tick_params(labelsize=7)
    axes[0][0].set_ylabel("weighted tokens served (thousands)")
    return save(fig, path, title, fontsize=9)


def table_bars(result: ScenarioResult, path: Path) -> Path | None:
    """The results table as a figure: one panel per column, one bar per arm.

    For scenarios whose figures are per-arm numbers (overload levels, outage arms,
    overhead baselines): the bars put each arm beside its baseline at a glance.
    Returns ``None`` (and writes nothing) when the table has no number to draw.
    """
    panels = [
        (col.label, [_number(row.get(col.key)) for row in result.rows]) for col in result.columns
    ]
    panels = [(label, values) for label, values in panels if any(map(math.isfinite, values))]
    if not panels:
        return None
    arms = [str(row["arm"]) for row in result.rows]
    width = min(4, len(panels))
    rows = math.ceil(len(panels) / width)
    fig, axes = subplots(rows, width, figsize=(3.2 * width, 0.5 * len(arms) * rows + 1.6))
    flat = list(axes.flat) if hasattr(axes, "flat") else [axes]
    for ax, (label, values) in zip(flat, panels, strict=False):
        shown = [v if math.isfinite(v) else 0.0 for v in values]
        ax.barh(range(len(arms)), shown, color="#4c72b0")
        for y, v in enumerate(values):
            if not math.isfinite(v):
                ax.text(0, y, " n/a", va="center", fontsize=7)
        ax.set_yticks(range(len(arms)), arms if ax in flat[::width] else [""] * len(arms))
        ax.invert_yaxis()  # the table's order, top to bottom
        ax.set_title(label, fontsize=8, loc="left")
        ax.tick_params(labelsize=7)
    for ax in flat[len(panels) :]:
        ax.set_visible(False)
    return save(fig, path, f"{result.name}: {result.title}", fontsize=9)


def subplots(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
    """``matplotlib.pyplot.subplots``, headless (the Agg backend). matplotlib is heavy:
    it is loaded here, by the first plot, never by importing a scenario."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(*args, **kwargs)
    return figure, axes


def save(fig: Any, path: Path, title: str | None = None, *, fontsize: int = 10) -> Path:
    """Title ``fig`` (unless ``title`` is ``None``), write it to ``path`` (a PNG) and
    free it."""
    import matplotlib.pyplot as plt  # loaded already: ``fig`` is one of its figures

    if title is not None:
        fig.suptitle(title, fontsize=fontsize)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) else math.nan
