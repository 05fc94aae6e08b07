"""The demo's timeline: requests served by backend per second, 429s, the maintenance window."""

from __future__ import annotations

from pathlib import Path

from herdless.demo.tally import Tally

__all__ = ["timeline_png"]


def timeline_png(
    tally: Tally,
    path: Path,
    *,
    length: float,
    maintenance: tuple[float, float],
    backends: list[str],
) -> Path:
    """Write the timeline PNG to ``path`` and return it."""
    import matplotlib  # lazy: heavy, and only needed at the end

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seconds = list(range(int(length) + 1))
    fig, ax = plt.subplots(figsize=(9, 3.6))
    ax.axvspan(*maintenance, color="#f0e0a0", alpha=0.6, label="maintenance (gateway drains)")
    colors = ["#4c72b0", "#dd8452", "#8172b3"]
    for name, color in zip(backends, colors, strict=False):
        counts = tally.served[name]
        served = [counts[s] for s in seconds]
        ax.step(seconds, served, where="post", color=color, label=f"served by {name}")
    ax.plot(
        seconds,
        [tally.refused[s] for s in seconds],
        color="#c44e52",
        linestyle=":",
        label="refused with 429 (retried later)",
    )
    if tally.failed:
        ax.plot(seconds, [tally.failed[s] for s in seconds], color="black", label="failed")
    ax.set_xlabel("seconds into the day")
    ax.set_ylabel("requests per second")
    ax.set_xlim(0, length)
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title("herdless demo: requests by backend over the day")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
