"""Draw docs/img/full-jitter.png: why herdless waits ``uniform(0, min(cap, base * 2**n))``.

A toy, deterministic simulation (seeded): 300 clients hit a server at the same
instant; the server admits 20 requests per 100 ms slot and refuses the rest with
429. Each refused client waits per its policy and tries again. We count, per
slot, how many requests arrive. Run ``python docs/scripts/plot_jitter.py`` after
changing it and commit the PNG.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on build machines
import matplotlib.pyplot as plt  # after the backend is chosen

CLIENTS = 300
CAPACITY = 20  # admitted per slot
SLOT = 0.1  # seconds
HORIZON = 12.0  # seconds shown
BASE, CAP = 0.5, 8.0  # herdless's defaults for the backoff steps

Policy = Callable[[int, random.Random], float]


def fixed(attempt: int, rng: random.Random) -> float:
    return 1.0


def exponential(attempt: int, rng: random.Random) -> float:
    return min(CAP, BASE * 2**attempt)


def full_jitter(attempt: int, rng: random.Random) -> float:
    return rng.uniform(0, min(CAP, BASE * 2**attempt))


def simulate(policy: Policy, seed: int = 7) -> tuple[Counter[int], float]:
    """Arrivals per slot, and the time at which the last client was served."""
    rng = random.Random(seed)
    pending = [(0.0, 0)] * CLIENTS  # (time of next try, retries so far)
    arrivals: Counter[int] = Counter()
    done_at = 0.0
    while pending:
        by_slot: dict[int, list[tuple[float, int]]] = {}
        for when, tries in pending:
            by_slot.setdefault(round(when / SLOT), []).append((when, tries))
        slot = min(by_slot)
        tries_now = by_slot.pop(slot)
        arrivals[slot] += len(tries_now)
        rng.shuffle(tries_now)  # who gets in among simultaneous arrivals is luck
        admitted, refused = tries_now[:CAPACITY], tries_now[CAPACITY:]
        if admitted:
            done_at = slot * SLOT
        pending = [item for items in by_slot.values() for item in items]
        pending += [(slot * SLOT + SLOT + policy(tries, rng), tries + 1) for _, tries in refused]
    return arrivals, done_at


def main(out: Path = Path(__file__).parents[1] / "img" / "full-jitter.png") -> None:
    policies = [
        ("retry every 1 s", fixed),
        ("exponential backoff, no jitter", exponential),
        ("full jitter: uniform(0, min(8, 0.5·2ⁿ))", full_jitter),
    ]
    fig, axes = plt.subplots(len(policies), 1, figsize=(8, 7), sharex=True, sharey=True)
    for ax, (title, policy) in zip(axes, policies, strict=True):
        arrivals, done_at = simulate(policy)
        slots = sorted(s for s in arrivals if s * SLOT <= HORIZON)
        ax.bar([s * SLOT for s in slots], [arrivals[s] for s in slots], width=SLOT, color="#3f51b5")
        ax.axhline(CAPACITY, color="#e53935", linestyle="--", linewidth=1)
        ax.set_title(f"{title}: everyone served after {done_at:.1f} s", fontsize=10, loc="left")
        ax.set_ylabel("requests / 100 ms")
    axes[-1].set_xlabel("seconds after 300 clients were refused at once (red: server capacity)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
